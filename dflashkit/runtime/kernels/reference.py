"""Reference dequantization in torch (any device), bit-identical to ``gguf.quants.dequantize`` in float32.

Organised like ``dflashkit.quantize``: one small class per ggml type, registered by ``ggml_type`` in
``TORCH_DEQUANT``, each turning raw blocks (uint8 ``[n_blocks, type_size]``) into float32
``[n_blocks, block_size]`` with whole-tensor ops (no Python loop per block). Every float32 operation is done
in the same order as gguf-py / ggml's ``dequantize_row_*`` (one rounding per op, no fused multiply-add), so
the results are equal bit for bit; integer unpacking is exact whatever the order.
"""

from __future__ import annotations

from typing import ClassVar, Sequence

import numpy as np
import torch
from gguf import GGMLQuantizationType

from dflashkit.errors import DFlashError
from dflashkit.codecs.base import BlockFormat

QK_K = 256
TORCH_DEQUANT: dict[GGMLQuantizationType, "TorchDequant"] = {}


# ----------------------------------------------------------------------------------------- byte helpers
def empty_f32(shape: Sequence[int], device: torch.device) -> torch.Tensor:
    """An uninitialised float32 tensor; on CPU backed by numpy, whose large buffers are madvised for huge pages.

    First-touch page faults dominate filling a fresh large torch CPU allocation (~8x slower than numpy's on
    the 2-core CI machine), and a dequantize output is always fresh memory.
    """
    if device.type == "cpu":
        return torch.from_numpy(np.empty(tuple(shape), dtype=np.float32))
    return torch.empty(tuple(shape), dtype=torch.float32, device=device)


def fp16_field(blocks: torch.Tensor, pos: int) -> torch.Tensor:
    """The little-endian fp16 at byte ``pos`` of each block as float32 ``[n, 1]`` (exact widening).

    The 2-byte column is gathered first: torch's strided fp16 -> fp32 cast is ~25x slower than a contiguous one.
    """
    return blocks[:, pos:pos + 2].contiguous().view(torch.float16).float()


def nibbles(qs: torch.Tensor, group: int) -> torch.Tensor:
    """Per ``group`` bytes: low nibbles are the first ``group`` values, high nibbles the next ``group`` (uint8)."""
    n = qs.shape[0]
    g = qs.reshape(n, -1, 1, group)
    out = torch.empty((n, g.shape[1], 2, group), dtype=torch.uint8, device=qs.device)
    torch.bitwise_and(g, 0x0F, out=out[:, :, :1])
    torch.bitwise_right_shift(g, 4, out=out[:, :, 1:])
    return out.reshape(n, -1)


def bits(qh: torch.Tensor, width: int, group: int) -> torch.Tensor:
    """Split each byte of ``qh`` into ``8 // width`` fields of ``width`` bits, least significant first.

    Per ``group`` bytes, field f of byte j becomes value ``f * group + j`` (uint8, 0 .. 2**width - 1): the
    K-quant layouts (Q5_K qh: group 32, width 1; Q6_K qh: group 32, width 2).
    """
    n = qh.shape[0]
    shifts = torch.arange(0, 8, width, dtype=torch.uint8, device=qh.device).reshape(1, 1, -1, 1)
    return ((qh.reshape(n, -1, 1, group) >> shifts) & ((1 << width) - 1)).reshape(n, -1)


_BYTE_BITS: dict[torch.device, torch.Tensor] = {}


def bits_of_bytes(qh: torch.Tensor) -> torch.Tensor:
    """Bit i of byte j -> value 8j + i (uint8 0 / 1): a little-endian word read bit by bit (Q5_0 / Q5_1 qh).

    A 256 x 8 table lookup: the broadcast shift with an 8-wide inner dimension is ~4x slower on CPU.
    """
    table = _BYTE_BITS.get(qh.device)
    if table is None:
        table = ((torch.arange(256).reshape(256, 1) >> torch.arange(8)) & 1).to(torch.uint8).to(qh.device)
        _BYTE_BITS[qh.device] = table
    return table.index_select(0, qh.reshape(-1).int()).reshape(qh.shape[0], -1)


def scaled(out: torch.Tensor, levels: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    """``out = scale * levels`` in float32, one rounding, with ``scale`` [n, 1] or per sub-block [n, groups, 1].

    The integer levels are widened into ``out`` first: a mixed-dtype mul would cast to a temporary (and is
    ~10x slower on CPU). Returns ``out`` viewed as ``scale``'s rank, for a following in-place op.
    """
    o = out.view(scale.shape[0], scale.shape[1], -1) if scale.dim() == 3 else out
    o.copy_(levels.view(o.shape))
    return o.mul_(scale)


# ----------------------------------------------------------------------------------------- registry
class TorchDequant(BlockFormat):
    """One ggml type: ``dequantize_blocks`` (override) plus row-level checks shared here.

    ``class Q4_K(TorchDequant, ggml_type=...)`` takes ``block_size`` / ``type_size`` from
    ``gguf.GGML_QUANT_SIZES`` and registers an instance in ``TORCH_DEQUANT``.
    """

    registry = TORCH_DEQUANT
    row_verb = "dequantize"
    fp16_fields: ClassVar[tuple[int, ...]] = ()  # byte offsets of the block's fp16 scale fields

    def dequantize_blocks(self, blocks: torch.Tensor, out: torch.Tensor) -> None:
        """uint8 ``[n_blocks, type_size]`` -> ``out``, float32 ``[n_blocks, block_size]``."""
        raise NotImplementedError


class Reinterpret(TorchDequant):
    """Plain float types (identity / exact widening), so a model kept quantized can mix them in."""

    dtype: ClassVar[torch.dtype]

    def dequantize_blocks(self, blocks: torch.Tensor, out: torch.Tensor) -> None:
        out.copy_(blocks.contiguous().view(self.dtype))


class F32(Reinterpret, ggml_type=GGMLQuantizationType.F32):
    dtype = torch.float32


class F16(Reinterpret, ggml_type=GGMLQuantizationType.F16):
    dtype = torch.float16


class BF16(Reinterpret, ggml_type=GGMLQuantizationType.BF16):
    dtype = torch.bfloat16


#: ggml type name → torch dtype of the plain float types (a file's bytes viewed as it, then widened exactly)
FLOAT_VIEWS: dict[str, torch.dtype] = {cls.ggml_type.name: cls.dtype for cls in (F32, F16, BF16)}


# --- 32-value blocks
class Q8_0(TorchDequant, ggml_type=GGMLQuantizationType.Q8_0):
    """block_q8_0: d (fp16) | qs int8[32]; x = qs * d."""

    fp16_fields = (0,)

    def dequantize_blocks(self, blocks: torch.Tensor, out: torch.Tensor) -> None:
        scaled(out, blocks[:, 2:].view(torch.int8), fp16_field(blocks, 0))


class Q4_0(TorchDequant, ggml_type=GGMLQuantizationType.Q4_0):
    """block_q4_0: d (fp16) | qs[16] (value j: low nibble of qs[j], value j+16: high nibble); x = d * (q - 8)."""

    fp16_fields = (0,)

    def dequantize_blocks(self, blocks: torch.Tensor, out: torch.Tensor) -> None:
        levels = nibbles(blocks[:, 2:], 16).view(torch.int8).sub_(8)
        scaled(out, levels, fp16_field(blocks, 0))


def q5_levels(blocks: torch.Tensor, qh_at: int) -> torch.Tensor:
    """Q5_0 / Q5_1 5-bit levels (uint8): qs nibbles after the 4-byte little-endian ``qh`` (bit j -> value j)."""
    levels = nibbles(blocks[:, qh_at + 4:], 16)
    return levels.bitwise_or_(bits_of_bytes(blocks[:, qh_at:qh_at + 4]).bitwise_left_shift_(4))


class Q5_0(TorchDequant, ggml_type=GGMLQuantizationType.Q5_0):
    """block_q5_0: d (fp16) | qh (uint32) | qs[16]; x = d * (q - 16)."""

    fp16_fields = (0,)

    def dequantize_blocks(self, blocks: torch.Tensor, out: torch.Tensor) -> None:
        scaled(out, q5_levels(blocks, 2).view(torch.int8).sub_(16), fp16_field(blocks, 0))


class Q5_1(TorchDequant, ggml_type=GGMLQuantizationType.Q5_1):
    """block_q5_1: d, m (fp16) | qh (uint32) | qs[16]; unsigned 5-bit q; x = d * q + m."""

    fp16_fields = (0, 2)

    def dequantize_blocks(self, blocks: torch.Tensor, out: torch.Tensor) -> None:
        scaled(out, q5_levels(blocks, 4), fp16_field(blocks, 0)).add_(fp16_field(blocks, 2))


# --- 256-value super-blocks
def scale_min_k4(scales: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """ggml get_scale_min_k4: 12 bytes -> eight 6-bit scales and eight 6-bit mins (float32 ``[n, 8]`` each).

    Bytes 0-3 / 4-7 hold scales / mins 0-3 in their low 6 bits and the top 2 bits of scales / mins 4-7 in
    their high 2 bits; bytes 8-11 hold the low 4 bits of scales 4-7 (low nibble) and mins 4-7 (high nibble).
    """
    s = scales.reshape(-1, 3, 4)
    lo, mid, hi = s[:, 0], s[:, 1], s[:, 2]
    sc = torch.cat([lo & 0x3F, (hi & 0x0F) | ((lo >> 6) << 4)], dim=-1)
    mn = torch.cat([mid & 0x3F, (hi >> 4) | ((mid >> 6) << 4)], dim=-1)
    return sc.float(), mn.float()


def qkx_dequant(blocks: torch.Tensor, levels: torch.Tensor, out: torch.Tensor) -> None:
    """Q4_K / Q5_K: per 32-value sub-block x = (d * sc) * q - (dmin * m), as ggml's dequantize_row_q{4,5}_K."""
    sc, mn = scale_min_k4(blocks[:, 4:16])
    d = (fp16_field(blocks, 0) * sc).unsqueeze(-1)  # float32 [n, 8, 1]
    dm = (fp16_field(blocks, 2) * mn).unsqueeze(-1)
    scaled(out, levels, d).sub_(dm)


class Q4_K(TorchDequant, ggml_type=GGMLQuantizationType.Q4_K):
    """block_q4_K: d, dmin (fp16) | scales[12] | qs[128]: per 32 bytes, low nibbles = sub-block 2i, high = 2i+1."""

    fp16_fields = (0, 2)

    def dequantize_blocks(self, blocks: torch.Tensor, out: torch.Tensor) -> None:
        qkx_dequant(blocks, nibbles(blocks[:, 16:], 32), out)


class Q5_K(TorchDequant, ggml_type=GGMLQuantizationType.Q5_K):
    """block_q5_K: d, dmin | scales[12] | qh[32] (bit i of qh[j] = 5th bit of value 32i + j) | qs[128]."""

    fp16_fields = (0, 2)

    def dequantize_blocks(self, blocks: torch.Tensor, out: torch.Tensor) -> None:
        levels = nibbles(blocks[:, 48:], 32).bitwise_or_(bits(blocks[:, 16:48], 1, 32).bitwise_left_shift_(4))
        qkx_dequant(blocks, levels, out)


class Q6_K(TorchDequant, ggml_type=GGMLQuantizationType.Q6_K):
    """block_q6_K: ql[128] (low 4 bits) | qh[64] (high 2 bits) | int8 scales[16] | d (fp16); x = d*sc * (q - 32).

    Per 128-value half: ql bytes 0-63 give values 0-63 (low nibbles) and 64-127 (high nibbles); qh bytes
    0-31 give the top bits of values j, j+32, j+64, j+96 in bit pairs 0-1, 2-3, 4-5, 6-7.
    """

    fp16_fields = (208,)

    def dequantize_blocks(self, blocks: torch.Tensor, out: torch.Tensor) -> None:
        levels = nibbles(blocks[:, :128], 64).bitwise_or_(bits(blocks[:, 128:192], 2, 32).bitwise_left_shift_(4))
        d = (fp16_field(blocks, 208) * blocks[:, 192:208].view(torch.int8).float()).unsqueeze(-1)  # [n, 16, 1]
        scaled(out, levels.view(torch.int8).sub_(32), d)


# ----------------------------------------------------------------------------------------- entry point
# On CPU, blocks are expanded this many values at a time: the uint8 temporaries then come from reused heap
# memory (a fresh large allocation costs more in page faults than the arithmetic) and stay in cache.
CPU_CHUNK_VALUES = 1 << 20


def get_dequant(ggml_type: GGMLQuantizationType | int | str) -> TorchDequant:
    """The registered TorchDequant for a ggml type (enum, int value or name)."""
    try:
        if isinstance(ggml_type, str):
            key = GGMLQuantizationType[ggml_type.strip().upper()]
        else:
            key = GGMLQuantizationType(int(ggml_type))
    except (KeyError, ValueError, TypeError):
        raise DFlashError(f"unknown ggml type {ggml_type!r}") from None
    dq = TORCH_DEQUANT.get(key)
    if dq is None:
        names = ", ".join(t.name for t in TORCH_DEQUANT)
        raise DFlashError(f"no torch dequantizer for {key.name} (supported: {names})")
    return dq


def dequantize_torch(data: torch.Tensor, ggml_type: GGMLQuantizationType | int | str,
                     shape: Sequence[int]) -> torch.Tensor:
    """Raw ggml blocks (uint8 tensor, any shape holding exactly the bytes of ``shape``) -> float32 ``shape``.

    The last dimension of ``shape`` is the row length (GGUF ne0). Runs on ``data``'s device; the result equals
    ``gguf.quants.dequantize`` bit for bit.
    """
    dq = get_dequant(ggml_type)
    shape = tuple(int(s) for s in shape)
    if not shape:
        raise DFlashError(f"cannot dequantize {dq.name} to a scalar shape")
    if data.dtype != torch.uint8:
        raise DFlashError(f"{dq.name} data must be a uint8 tensor of raw blocks, got {data.dtype}")
    rows = 1
    for s in shape[:-1]:
        rows *= s
    want = rows * dq.row_bytes(shape[-1])
    if data.numel() != want:
        raise DFlashError(f"{dq.name} data of shape {tuple(data.shape)} holds {data.numel()} bytes; "
                          f"shape {shape} needs {want}")
    blocks = data.reshape(-1, dq.type_size)
    out = empty_f32((blocks.shape[0], dq.block_size), data.device)
    n = blocks.shape[0]
    step = max(1, CPU_CHUNK_VALUES // dq.block_size) if data.device.type == "cpu" else max(n, 1)
    for a in range(0, n, step):
        dq.dequantize_blocks(blocks[a:a + step], out[a:a + step])
    return out.reshape(shape)
