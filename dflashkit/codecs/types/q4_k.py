"""Q4_K: 256 values in 144 bytes — d, dmin (fp16) | 12 bytes of eight 6-bit (scale, min) pairs | qs[128] (per 32
bytes: low nibbles sub-block 2i, high nibbles 2i + 1); x = (d * sc) * q - (dmin * m) per 32-value sub-block.

Quantized by the K-quant lane loop shared with Q5_K (`loops.kquants.qk_kernel`: make_qkx2_quants with 15 levels,
-1.0, 0.1, 20 trials, as quantize_row_q4_K_ref) and with weights by `loops.weighted.q45_k_w_kernel`.
"""

from __future__ import annotations

from typing import Any

import numpy as np
from gguf import GGMLQuantizationType as Q
from gguf import LlamaFileType as F

from dflashkit.quant_types import FileType

from ..base import KernelQuantType, unpack_nibbles
from ..blocks import dequant_qkx, dequant_qkx_torch


class Q4_K(KernelQuantType, ggml_type=Q.Q4_K, fallback=Q.Q5_0, fp16_fields=(0, 2)):
    """Layout: d, dmin (fp16), 12 bytes of 6-bit scales/mins, 128 bytes of 4-bit levels."""

    # quantize_row_q4_K_ref: make_qkx2_quants(32, 15, x, w, L, &min, Laux, -1.f, 0.1f, 20, false)
    _kernel = ("qk_kernel", (15, np.float32(-1.0), np.float32(0.1), 20))
    _weighted = ("q45_k_w_kernel", (15,))
    _cost = 40  # ~20 scale trials per sub-block
    file_types = (FileType("Q4_K_M", F.MOSTLY_Q4_K_M, Q.Q4_K, rank=45, aliases=("Q4_K",)),
                  FileType("Q4_K_S", F.MOSTLY_Q4_K_S, Q.Q4_K, rank=44))

    def dequantize_blocks(self, q: np.ndarray) -> np.ndarray:
        return dequant_qkx(q, unpack_nibbles(q[:, 16:], 32))

    def dequantize_torch(self, ops: Any, blocks: Any, out: Any) -> None:
        dequant_qkx_torch(ops, blocks, ops.nibbles(blocks[:, 16:], 32), out)
