"""IQ4_XS: 256 values in 136 bytes — d (fp16) | scales_h (uint16) | scales_l[4] | qs[128]: 6-bit sub-block scales
(offset 32) and 4-bit indices into kvalues_iq4nl; x = (d * sc) * kvalues[q] per 32-value sub-block.

Quantized by `loops.lowbit.iq4_kernel` (quantize_row_iq4_xs_ref, 256-value super-blocks) and with weights by
`loops.weighted.iq4_w_kernel`; dequantized by gguf-py.
"""

from __future__ import annotations

from typing import Any

from gguf import GGMLQuantizationType as Q
from gguf import LlamaFileType as F

from dflashkit.quant_types import FileType

from ..blocks import IQ4NL_VALUES, GgufDequantized


class IQ4_XS(GgufDequantized, ggml_type=Q.IQ4_XS, fallback=Q.IQ4_NL, fp16_fields=(0,)):
    """Layout: d (fp16), scales_h (uint16), scales_l[4], qs[128]: 6-bit sub-block scales, 4-bit level indices."""

    _kernel = "iq4_kernel"
    _weighted = ("iq4_w_kernel", (256,))
    file_types = (FileType("IQ4_XS", F.MOSTLY_IQ4_XS, Q.IQ4_XS, rank=40),)

    def dequantize_torch(self, ops: Any, blocks: Any, out: Any) -> None:
        torch = ops.torch
        n = blocks.shape[0]
        low = torch.stack([blocks[:, 4:8] & 0x0F, blocks[:, 4:8] >> 4], dim=-1).reshape(n, 8)
        h16 = blocks[:, 2].to(torch.int32) | (blocks[:, 3].to(torch.int32) << 8)
        high = (h16.unsqueeze(-1) >> torch.arange(0, 16, 2, device=blocks.device, dtype=torch.int32)) & 3
        scales = ((low.to(torch.int32) | (high << 4)) - 32).float()
        dl = (ops.fp16_field(blocks, 0) * scales).unsqueeze(-1)  # [n, 8, 1]
        values = ops.table(IQ4NL_VALUES, blocks.device)[ops.nibbles(blocks[:, 8:], 16).long()]
        out.view(n, 8, 32).copy_(values.view(n, 8, 32)).mul_(dl)
