"""Q5_1: 32 values in 24 bytes — d, m (fp16) | qh (uint32) | qs[16]; d = (max - min) / 31, m = min, unsigned
5-bit q; x = d * q + m. The shared 32-value loops, kind 4.
"""

from __future__ import annotations

from typing import Any

import numpy as np
from gguf import GGMLQuantizationType as Q
from gguf import LlamaFileType as F

from dflashkit.quant_types import FileType

from ..base import fp16_col, unpack_nibbles
from ..blocks import Block32, fifth_bits, q5_levels_torch


class Q5_1(Block32, ggml_type=Q.Q5_1, kind=4, fp16_fields=(0, 2)):
    """d (fp16) = (max - min) / 31, m (fp16) = min; unsigned 5-bit levels; x = d * q + m."""

    file_types = (FileType("Q5_1", F.MOSTLY_Q5_1, Q.Q5_1, rank=53),)

    def dequantize_blocks(self, q: np.ndarray) -> np.ndarray:
        levels = unpack_nibbles(q[:, 8:], 16) | (fifth_bits(q[:, 4:8]) << np.uint8(4))
        return fp16_col(q, 0) * levels.astype(np.float32) + fp16_col(q, 2)

    def dequantize_torch(self, ops: Any, blocks: Any, out: Any) -> None:
        ops.scaled(out, q5_levels_torch(ops, blocks, 4), ops.fp16_field(blocks, 0)).add_(ops.fp16_field(blocks, 2))
