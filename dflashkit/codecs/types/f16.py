"""F16: IEEE half, as ggml_fp32_to_fp16_row (round to nearest even, overflow to inf, NaN to 0x7E00 | sign) by the
numba loop of `codecs.float16`; read back by exact widening."""

from __future__ import annotations

import numpy as np
from gguf import GGMLQuantizationType as Q
from gguf import LlamaFileType as F

from dflashkit.quant_types import FileType

from ..blocks import FloatType
from ..float16 import f32_to_f16_bits


class F16(FloatType, ggml_type=Q.F16):
    encode, decode = f32_to_f16_bits, lambda q: q.view(np.float16).astype(np.float32)  # exact widening
    needs_numba = True  # the conversion is a numba kernel
    torch_view = "float16"
    file_types = (FileType("F16", F.MOSTLY_F16, Q.F16, rank=160, converter_writes=True),)
