"""Q4_0: 32 values in 18 bytes — d (fp16) | qs[16] (value j: low nibble of qs[j], value j+16: its high nibble);
d = max / -8 (max: the signed value of largest magnitude), x = d * (q - 8). The shared 32-value loops, kind 1.
"""

from __future__ import annotations

from typing import Any

import numpy as np
from gguf import GGMLQuantizationType as Q
from gguf import LlamaFileType as F

from dflashkit.quant_types import FileType

from ..base import fp16_col, unpack_nibbles
from ..blocks import Block32


class Q4_0(Block32, ggml_type=Q.Q4_0, kind=1, fp16_fields=(0,)):
    """d (fp16) = max / -8; 4-bit levels with offset 8."""

    file_types = (FileType("Q4_0", F.MOSTLY_Q4_0, Q.Q4_0, rank=42),)

    def dequantize_blocks(self, q: np.ndarray) -> np.ndarray:
        levels = unpack_nibbles(q[:, 2:], 16).astype(np.int8) - np.int8(8)
        return fp16_col(q, 0) * levels.astype(np.float32)

    def dequantize_torch(self, ops: Any, blocks: Any, out: Any) -> None:
        levels = ops.nibbles(blocks[:, 2:], 16).view(ops.torch.int8).sub_(8)
        ops.scaled(out, levels, ops.fp16_field(blocks, 0))
