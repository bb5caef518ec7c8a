"""Reference dequantization in torch (any device), bit-identical to ``gguf.quants.dequantize`` in float32.

Each type's dequantizer is the ``dequantize_torch`` of its module in ``dflashkit.codecs.types`` (one module per
type), registered here in ``TORCH_DEQUANT`` for every type that has one; it turns raw blocks (uint8
``[n_blocks, type_size]``) into float32 ``[n_blocks, block_size]`` with whole-tensor ops (no Python loop per block),
calling the byte helpers of this module (passed in as ``ops``: the codecs never import torch). Every float32
operation is done in the same order as gguf-py / ggml's ``dequantize_row_*`` (one rounding per op, no fused
multiply-add), so the results are equal bit for bit; integer unpacking is exact whatever the order.
"""

from __future__ import annotations

import sys
from typing import Sequence

import numpy as np
import torch
from gguf import GGMLQuantizationType

from dflashkit.errors import DFlashError
from dflashkit.codecs import QUANT_TYPES, QuantType
from dflashkit.codecs.base import BlockFormat

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


_TABLES: dict[tuple[tuple[int, ...], torch.device], torch.Tensor] = {}


def table(values: tuple[int, ...], device: torch.device) -> torch.Tensor:
    """A small lookup table of float32 levels (IQ4_NL's kvalues), made once per device."""
    key = (values, device)
    found = _TABLES.get(key)
    if found is None:
        found = _TABLES[key] = torch.tensor(values, dtype=torch.float32, device=device)
    return found


# ----------------------------------------------------------------------------------------- registry
class TorchDequant(BlockFormat):
    """One ggml type's dequantizer in torch: its `QuantType`'s ``dequantize_torch`` (in the type's module in
    ``dflashkit.codecs.types``), given this module's helpers, plus the row-level checks of `BlockFormat`."""

    row_verb = "dequantize"

    def __init__(self, quant_type: QuantType) -> None:
        self.quant_type = quant_type
        self.ggml_type, self.block_size = quant_type.ggml_type, quant_type.block_size
        self.type_size = quant_type.type_size
        self.fp16_fields = quant_type.fp16_fields

    def dequantize_blocks(self, blocks: torch.Tensor, out: torch.Tensor) -> None:
        """uint8 ``[n_blocks, type_size]`` -> ``out``, float32 ``[n_blocks, block_size]``."""
        self.quant_type.dequantize_torch(_OPS, blocks, out)


_OPS = sys.modules[__name__]  # what a type's dequantize_torch calls: torch and the helpers above
TORCH_DEQUANT.update((t, TorchDequant(qt)) for t, qt in QUANT_TYPES.items() if qt.has_torch_dequantizer)

#: ggml type name → torch dtype of the plain float types (a file's bytes viewed as it, then widened exactly)
FLOAT_VIEWS: dict[str, torch.dtype] = {qt.name: getattr(torch, qt.torch_view) for qt in QUANT_TYPES.values()
                                       if getattr(qt, "torch_view", None)}


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
