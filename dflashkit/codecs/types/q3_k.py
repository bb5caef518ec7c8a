"""Q3_K: 256 values in 110 bytes — hmask[32] (3rd bits) | qs[64] (low 2 bits) | 12 bytes of 6-bit scales (offset 32)
| d (fp16); x = (d * sc) * (q - 4 * !hbit) per 16-value sub-block.

Quantized by the lane loop `loops.lowbit_lanes` (through `loops.lowbit.q3_k_kernel`, quantize_row_q3_K_ref) and with
weights by `loops.weighted.q23_k_w_kernel`; dequantized by gguf-py.
"""

from __future__ import annotations

from typing import Any

from gguf import GGMLQuantizationType as Q
from gguf import LlamaFileType as F

from dflashkit.quant_types import FileType

from ..blocks import GgufDequantized


class Q3_K(GgufDequantized, ggml_type=Q.Q3_K, fallback=Q.Q4_0, fp16_fields=(108,)):
    """Layout: hmask[32] (3rd bits), qs[64] (low 2 bits), 12 bytes of 6-bit signed scales, d (fp16)."""

    _kernel = "q3_k_kernel"
    _weighted = ("q23_k_w_kernel", (3,))
    file_types = (FileType("Q3_K_L", F.MOSTLY_Q3_K_L, Q.Q3_K, rank=36),
                  FileType("Q3_K_M", F.MOSTLY_Q3_K_M, Q.Q3_K, rank=35, aliases=("Q3_K",)),
                  FileType("Q3_K_S", F.MOSTLY_Q3_K_S, Q.Q3_K, rank=34))

    def dequantize_torch(self, ops: Any, blocks: Any, out: Any) -> None:
        torch = ops.torch
        n = blocks.shape[0]
        s = blocks[:, 96:108]
        low = torch.stack([s[:, :8] & 0x0F, s[:, :8] >> 4], dim=1).reshape(n, 16)
        high = ops.bits(s[:, 8:12], 2, 4).reshape(n, 4, 4).reshape(n, 16)
        scales = ((low | (high << 4)).to(torch.int16) - 32).float()
        dl = (ops.fp16_field(blocks, 108) * scales).unsqueeze(-1)
        ql = ops.bits(blocks[:, 32:96], 2, 32).to(torch.int16)
        qh = ops.bits(blocks[:, :32], 1, 32).to(torch.int16)  # bit f of byte j -> value 32 f + j
        ops.scaled(out, ql - ((qh ^ 1) << 2), dl)
