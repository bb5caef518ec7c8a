"""Q4_1: 32 values in 20 bytes — d, m (fp16) | qs[16]; d = (max - min) / 15, m = min, unsigned 4-bit q;
x = d * q + m. The shared 32-value loops, kind 2.
"""

from __future__ import annotations

from typing import Any

import numpy as np
from gguf import GGMLQuantizationType as Q
from gguf import LlamaFileType as F

from dflashkit.quant_types import FileType

from ..base import fp16_col, unpack_nibbles
from ..blocks import Block32


class Q4_1(Block32, ggml_type=Q.Q4_1, kind=2, fp16_fields=(0, 2)):
    """d (fp16) = (max - min) / 15, m (fp16) = min; unsigned 4-bit levels; x = d * q + m."""

    file_types = (FileType("Q4_1", F.MOSTLY_Q4_1, Q.Q4_1, rank=43),)

    def dequantize_blocks(self, q: np.ndarray) -> np.ndarray:
        return fp16_col(q, 0) * unpack_nibbles(q[:, 4:], 16).astype(np.float32) + fp16_col(q, 2)

    def dequantize_torch(self, ops: Any, blocks: Any, out: Any) -> None:
        ops.scaled(out, ops.nibbles(blocks[:, 4:], 16), ops.fp16_field(blocks, 0)).add_(ops.fp16_field(blocks, 2))
