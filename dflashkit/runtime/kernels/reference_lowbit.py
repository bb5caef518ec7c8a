"""Torch dequantizers of Q4_1, Q2_K, Q3_K, IQ4_NL and IQ4_XS, bit-identical to ``gguf.quants`` in float32: the same
products in the same order (d * sc first, then times the level, then minus the min), registered in
`reference.TORCH_DEQUANT` beside the other types. Kept in their own module: ``reference`` holds the shared
helpers and the types the Triton / Metal kernels also run."""

from __future__ import annotations

import torch
from gguf import GGMLQuantizationType

from .reference import TorchDequant, bits, fp16_field, nibbles, scaled

#: kvalues_iq4nl (ggml-common.h)
IQ4NL_VALUES = (-127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113)
_TABLES: dict[torch.device, torch.Tensor] = {}


def _iq4_values(device: torch.device) -> torch.Tensor:
    table = _TABLES.get(device)
    if table is None:
        table = torch.tensor(IQ4NL_VALUES, dtype=torch.float32, device=device)
        _TABLES[device] = table
    return table


class Q4_1(TorchDequant, ggml_type=GGMLQuantizationType.Q4_1):
    """block_q4_1: d, m (fp16) | qs[16]; unsigned 4-bit q; x = d * q + m."""

    fp16_fields = (0, 2)

    def dequantize_blocks(self, blocks: torch.Tensor, out: torch.Tensor) -> None:
        scaled(out, nibbles(blocks[:, 4:], 16), fp16_field(blocks, 0)).add_(fp16_field(blocks, 2))


class Q2_K(TorchDequant, ggml_type=GGMLQuantizationType.Q2_K):
    """block_q2_K: scales[16] (scale | min << 4) | qs[64] (2-bit) | d, dmin; x = (d * sc) * q - dmin * m."""

    fp16_fields = (80, 82)

    def dequantize_blocks(self, blocks: torch.Tensor, out: torch.Tensor) -> None:
        sc = blocks[:, :16]
        dl = (fp16_field(blocks, 80) * (sc & 0xF).float()).unsqueeze(-1)  # [n, 16, 1]
        ml = (fp16_field(blocks, 82) * (sc >> 4).float()).unsqueeze(-1)
        scaled(out, bits(blocks[:, 16:80], 2, 32), dl).sub_(ml)


class Q3_K(TorchDequant, ggml_type=GGMLQuantizationType.Q3_K):
    """block_q3_K: hmask[32] | qs[64] | scales[12] (6-bit, offset 32) | d; x = (d * sc) * (q - 4 * !hbit)."""

    fp16_fields = (108,)

    def dequantize_blocks(self, blocks: torch.Tensor, out: torch.Tensor) -> None:
        n = blocks.shape[0]
        s = blocks[:, 96:108]
        low = torch.stack([s[:, :8] & 0x0F, s[:, :8] >> 4], dim=1).reshape(n, 16)
        high = bits(s[:, 8:12], 2, 4).reshape(n, 4, 4).reshape(n, 16)
        scales = ((low | (high << 4)).to(torch.int16) - 32).float()
        dl = (fp16_field(blocks, 108) * scales).unsqueeze(-1)
        ql = bits(blocks[:, 32:96], 2, 32).to(torch.int16)
        qh = bits(blocks[:, :32], 1, 32).to(torch.int16)  # bit f of byte j -> value 32 f + j
        scaled(out, ql - ((qh ^ 1) << 2), dl)


class IQ4_NL(TorchDequant, ggml_type=GGMLQuantizationType.IQ4_NL):
    """block_iq4_nl: d (fp16) | qs[16]: 4-bit indices into kvalues_iq4nl; x = d * value."""

    fp16_fields = (0,)

    def dequantize_blocks(self, blocks: torch.Tensor, out: torch.Tensor) -> None:
        values = _iq4_values(blocks.device)[nibbles(blocks[:, 2:], 16).long()]
        out.copy_(values).mul_(fp16_field(blocks, 0))


class IQ4_XS(TorchDequant, ggml_type=GGMLQuantizationType.IQ4_XS):
    """block_iq4_xs: d | scales_h (uint16) | scales_l[4] | qs[128]; 6-bit sub-block scales offset 32."""

    fp16_fields = (0,)

    def dequantize_blocks(self, blocks: torch.Tensor, out: torch.Tensor) -> None:
        n = blocks.shape[0]
        low = torch.stack([blocks[:, 4:8] & 0x0F, blocks[:, 4:8] >> 4], dim=-1).reshape(n, 8)
        h16 = blocks[:, 2].to(torch.int32) | (blocks[:, 3].to(torch.int32) << 8)
        high = (h16.unsqueeze(-1) >> torch.arange(0, 16, 2, device=blocks.device, dtype=torch.int32)) & 3
        scales = ((low.to(torch.int32) | (high << 4)) - 32).float()
        dl = (fp16_field(blocks, 0) * scales).unsqueeze(-1)  # [n, 8, 1]
        values = _iq4_values(blocks.device)[nibbles(blocks[:, 8:], 16).long()]
        out.view(n, 8, 32).copy_(values.view(n, 8, 32)).mul_(dl)
