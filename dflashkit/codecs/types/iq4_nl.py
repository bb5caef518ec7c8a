"""IQ4_NL: 32 values in 18 bytes — d (fp16) | qs[16]: 4-bit indices into the 16 non-linear levels kvalues_iq4nl;
x = d * kvalues[q].

Quantized by `loops.lowbit.iq4_kernel` (quantize_row_iq4_nl_ref, 32-value blocks) and with weights by
`loops.weighted.iq4_w_kernel`; dequantized by gguf-py.
"""

from __future__ import annotations

from typing import Any

from gguf import GGMLQuantizationType as Q
from gguf import LlamaFileType as F

from dflashkit.quant_types import FileType

from ..blocks import IQ4NL_VALUES, GgufDequantized


class IQ4_NL(GgufDequantized, ggml_type=Q.IQ4_NL, fp16_fields=(0,)):
    """Layout: d (fp16), qs[16]: 4-bit indices into the 16 non-linear levels kvalues_iq4nl."""

    _kernel = "iq4_kernel"
    _weighted = ("iq4_w_kernel", (32,))
    file_types = (FileType("IQ4_NL", F.MOSTLY_IQ4_NL, Q.IQ4_NL, rank=41),)

    def dequantize_torch(self, ops: Any, blocks: Any, out: Any) -> None:
        values = ops.table(IQ4NL_VALUES, blocks.device)[ops.nibbles(blocks[:, 2:], 16).long()]
        out.copy_(values).mul_(ops.fp16_field(blocks, 0))
