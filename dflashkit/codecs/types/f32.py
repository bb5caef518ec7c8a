"""F32: the identity (float32 bytes), so callers treat every output type alike; llama.cpp's converter writes it.
For contiguous float32 input the bytes are a view sharing memory with it (no copy)."""

from __future__ import annotations

import numpy as np
from gguf import GGMLQuantizationType as Q
from gguf import LlamaFileType as F

from dflashkit.quant_types import FileType

from ..blocks import FloatType


def _as_f32(x: np.ndarray, threads: int | None = None) -> np.ndarray:
    return np.ascontiguousarray(x, dtype=np.float32)


class F32(FloatType, ggml_type=Q.F32):
    encode, decode = _as_f32, lambda q: q.view(np.float32)
    torch_view = "float32"
    file_types = (FileType("F32", F.ALL_F32, Q.F32, rank=320, converter_writes=True, quantize_target=False),)
