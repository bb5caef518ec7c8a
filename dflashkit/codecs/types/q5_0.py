"""Q5_0: 32 values in 22 bytes — d (fp16) | qh (uint32: bit j is the 5th bit of value j) | qs[16] (low nibbles);
d = max / -16, x = d * (q - 16). The shared 32-value loops, kind 3.
"""

from __future__ import annotations

from typing import Any

import numpy as np
from gguf import GGMLQuantizationType as Q
from gguf import LlamaFileType as F

from dflashkit.quant_types import FileType

from ..base import fp16_col, unpack_nibbles
from ..blocks import Block32, fifth_bits, q5_levels_torch


class Q5_0(Block32, ggml_type=Q.Q5_0, kind=3, fp16_fields=(0,)):
    """d (fp16) = max / -16; 5-bit levels with offset 16 (low nibbles in qs, 5th bits in qh)."""

    file_types = (FileType("Q5_0", F.MOSTLY_Q5_0, Q.Q5_0, rank=52),)

    def dequantize_blocks(self, q: np.ndarray) -> np.ndarray:
        levels = unpack_nibbles(q[:, 6:], 16) | (fifth_bits(q[:, 2:6]) << np.uint8(4))
        return fp16_col(q, 0) * (levels.astype(np.int8) - np.int8(16)).astype(np.float32)

    def dequantize_torch(self, ops: Any, blocks: Any, out: Any) -> None:
        ops.scaled(out, q5_levels_torch(ops, blocks, 2).view(ops.torch.int8).sub_(16), ops.fp16_field(blocks, 0))
