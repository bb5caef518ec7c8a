"""Q6_K: 256 values in 210 bytes — ql[128] (low 4 bits) | qh[64] (high 2 bits) | int8 scales[16] | d (fp16);
x = (d * sc) * (q - 32) per 16-value sub-block.

Per 128-value half: ql bytes 0-63 give values 0-63 (low nibbles) and 64-127 (high nibbles); qh bytes 0-31 give the
top bits of values j, j+32, j+64, j+96 in bit pairs 0-1, 2-3, 4-5, 6-7. Quantized by `loops.kquants.q6_k_kernel`
(quantize_row_q6_K_ref) and with weights by `loops.weighted.q6_k_w_kernel`.
"""

from __future__ import annotations

from typing import Any

import numpy as np
from gguf import GGMLQuantizationType as Q
from gguf import LlamaFileType as F

from dflashkit.quant_types import FileType

from ..base import KernelQuantType, fp16_col, unpack_nibbles
from ..blocks import QK_K

_Q6_SHIFT = np.array([0, 2, 4, 6], dtype=np.uint8).reshape(1, 1, 4, 1)


class Q6_K(KernelQuantType, ggml_type=Q.Q6_K, fallback=Q.Q8_0, fp16_fields=(208,)):
    """Layout: ql[128] (low 4 bits), qh[64] (high 2 bits), int8 scales[16], d (fp16); levels offset 32."""

    _kernel = "q6_k_kernel"
    _weighted = ("q6_k_w_kernel", ())
    _cost = 20
    file_types = (FileType("Q6_K", F.MOSTLY_Q6_K, Q.Q6_K, rank=60),)

    def dequantize_blocks(self, q: np.ndarray) -> np.ndarray:
        n = q.shape[0]
        low = unpack_nibbles(q[:, :128], 64)
        high = ((q[:, 128:192].reshape(n, 2, 1, 32) >> _Q6_SHIFT) & np.uint8(3)).reshape(n, QK_K)
        levels = (low | (high << np.uint8(4))).astype(np.int8) - np.int8(32)
        d = (fp16_col(q, 208) * q[:, 192:208].view(np.int8).astype(np.float32)).reshape(n, 16, 1)
        return (d * levels.reshape(n, 16, 16).astype(np.float32)).reshape(n, QK_K)

    def dequantize_torch(self, ops: Any, blocks: Any, out: Any) -> None:
        high = ops.bits(blocks[:, 128:192], 2, 32).bitwise_left_shift_(4)
        levels = ops.nibbles(blocks[:, :128], 64).bitwise_or_(high)
        d = (ops.fp16_field(blocks, 208) * blocks[:, 192:208].view(ops.torch.int8).float()).unsqueeze(-1)  # [n, 16, 1]
        ops.scaled(out, levels.view(ops.torch.int8).sub_(32), d)
