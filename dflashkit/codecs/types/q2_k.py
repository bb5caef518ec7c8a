"""Q2_K: 256 values in 84 bytes — scales[16] (4-bit scale | 4-bit min << 4) | qs[64] (2-bit levels) | d, dmin (fp16);
x = (d * sc) * q - (dmin * m) per 16-value sub-block.

Quantized by `loops.kquants.q2_k_kernel` (quantize_row_q2_K_ref) and with weights by `loops.weighted.q23_k_w_kernel`;
dequantized by gguf-py. Q2_K_S is written only with an importance matrix.
"""

from __future__ import annotations

from typing import Any

from gguf import GGMLQuantizationType as Q
from gguf import LlamaFileType as F

from dflashkit.quant_types import FileType

from ..blocks import GgufDequantized


class Q2_K(GgufDequantized, ggml_type=Q.Q2_K, fallback=Q.Q4_0, fp16_fields=(80, 82)):
    """Layout: scales[16] (4-bit scale | 4-bit min), qs[64] (2-bit levels), d, dmin (fp16)."""

    _kernel = "q2_k_kernel"
    _weighted = ("q23_k_w_kernel", (2,))
    file_types = (FileType("Q2_K", F.MOSTLY_Q2_K, Q.Q2_K, rank=25),
                  FileType("Q2_K_S", F.MOSTLY_Q2_K_S, Q.Q2_K, rank=24, needs_imatrix=True))

    def dequantize_torch(self, ops: Any, blocks: Any, out: Any) -> None:
        sc = blocks[:, :16]
        dl = (ops.fp16_field(blocks, 80) * (sc & 0xF).float()).unsqueeze(-1)  # [n, 16, 1]
        ml = (ops.fp16_field(blocks, 82) * (sc >> 4).float()).unsqueeze(-1)
        ops.scaled(out, ops.bits(blocks[:, 16:80], 2, 32), dl).sub_(ml)
