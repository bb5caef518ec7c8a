"""Q5_K: 256 values in 176 bytes — d, dmin | 12 scale bytes | qh[32] (bit i of qh[j]: the 5th bit of value 32 i + j)
| qs[128]; x = (d * sc) * q - (dmin * m) per 32-value sub-block.

Quantized by the K-quant lane loop shared with Q4_K (`loops.kquants.qk_kernel`: make_qkx2_quants with 31 levels,
-0.5, 0.1, 15 trials, as quantize_row_q5_K_ref) and with weights by `loops.weighted.q45_k_w_kernel`.
"""

from __future__ import annotations

from typing import Any

import numpy as np
from gguf import GGMLQuantizationType as Q
from gguf import LlamaFileType as F

from dflashkit.quant_types import FileType

from ..base import KernelQuantType, unpack_nibbles
from ..blocks import QK_K, dequant_qkx, dequant_qkx_torch


class Q5_K(KernelQuantType, ggml_type=Q.Q5_K, fallback=Q.Q5_1, fp16_fields=(0, 2)):
    """Layout: d, dmin, 12 scale bytes, qh[32] (bit i of qh[j] = 5th bit of value 32*i + j), qs[128]."""

    # quantize_row_q5_K_ref: make_qkx2_quants(32, 31, x, w, L, &min, Laux, -0.5f, 0.1f, 15, false)
    _kernel = ("qk_kernel", (31, np.float32(-0.5), np.float32(0.1), 15))
    _weighted = ("q45_k_w_kernel", (31,))
    _cost = 30
    file_types = (FileType("Q5_K_M", F.MOSTLY_Q5_K_M, Q.Q5_K, rank=55, aliases=("Q5_K",)),
                  FileType("Q5_K_S", F.MOSTLY_Q5_K_S, Q.Q5_K, rank=54))

    def dequantize_blocks(self, q: np.ndarray) -> np.ndarray:
        n = q.shape[0]
        high = np.unpackbits(q[:, 16:48], axis=-1, bitorder="little").reshape(n, 32, 8).transpose(0, 2, 1)
        return dequant_qkx(q, unpack_nibbles(q[:, 48:], 32) | (high.reshape(n, QK_K) << np.uint8(4)))

    def dequantize_torch(self, ops: Any, blocks: Any, out: Any) -> None:
        levels = ops.nibbles(blocks[:, 48:], 32).bitwise_or_(ops.bits(blocks[:, 16:48], 1, 32).bitwise_left_shift_(4))
        dequant_qkx_torch(ops, blocks, levels, out)
