"""What several quant types' modules (``dflashkit.codecs.types``) share: the 32-value base class whose ``kind``
picks its branch of the shared loops, the K-quants' 6-bit scale unpacking and reconstruction, gguf-py's
dequantizer for the low-bit types, the plain float types' base, and the same pieces in torch (written against the
``ops`` module the runtime passes in, so that no codec imports torch).
"""

from __future__ import annotations

from typing import Any, Callable, ClassVar

import numpy as np

from .base import KernelQuantType, QuantType, fp16_col

QK_K = 256
#: kvalues_iq4nl (ggml-common.h): the 16 non-linear levels of IQ4_NL / IQ4_XS, for their torch dequantizers
#: (`loops.lowbit.KVALUES_IQ4NL` keeps them in its own text: numba's cache is keyed on that file alone)
IQ4NL_VALUES = (-127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113)


class Block32(KernelQuantType):
    """A 32-value type: its ``kind`` picks its branch of the loops that serve them all, straight from F16 bits
    (`loops.legacy_f16.legacy_from_f16`), from float32 (`loops.legacy.legacy_kernel`, unless the type names
    another) and with weights (`loops.weighted.legacy_w_kernel`, Q8_0 has none)."""

    kind: ClassVar[int]  # 0 Q8_0, 1 Q4_0, 2 Q4_1, 3 Q5_0, 4 Q5_1 (`loops.legacy.BLOCK_BYTES`)

    def __init_subclass__(cls, **kw: Any) -> None:
        super().__init_subclass__(**kw)
        cls.from_f16 = ("legacy_from_f16", (cls.kind,))
        if cls.kind:
            cls._weighted = ("legacy_w_kernel", (cls.kind,))
        if "_kernel" not in cls.__dict__:
            cls._kernel = ("legacy_kernel", (cls.kind,))


def fifth_bits(qh: np.ndarray) -> np.ndarray:
    """The little-endian uint32 ``qh`` of Q5_0 / Q5_1: bit j is the 5th bit of value j."""
    return np.unpackbits(qh, axis=-1, bitorder="little")


def q5_levels_torch(ops: Any, blocks: Any, qh_at: int) -> Any:
    """Q5_0 / Q5_1 5-bit levels (uint8): qs nibbles after the 4-byte little-endian ``qh`` (bit j -> value j)."""
    levels = ops.nibbles(blocks[:, qh_at + 4:], 16)
    return levels.bitwise_or_(ops.bits_of_bytes(blocks[:, qh_at:qh_at + 4]).bitwise_left_shift_(4))


# --- K-quants (Q4_K / Q5_K)
def get_scale_min_k4(scales: Any, cat: Any = np.concatenate) -> tuple[Any, Any]:
    """Unpack the 12 bytes of eight 6-bit (scale, min) pairs (ggml-quants.c get_scale_min_k4) -> 2 x [n, 8].

    Bytes 0-3 / 4-7 hold scales / mins 0-3 in their low 6 bits and the top 2 bits of scales / mins 4-7 in their
    high 2 bits; bytes 8-11 hold the low 4 bits of scales 4-7 (low nibble) and mins 4-7 (high nibble). The same
    integer operations on torch tensors, given torch's concatenation as ``cat``."""
    s = scales.reshape(-1, 3, 4)
    lo, mid, hi = s[:, 0], s[:, 1], s[:, 2]
    sc = cat([lo & 0x3F, (hi & 0x0F) | ((lo >> 6) << 4)], axis=-1)
    mn = cat([mid & 0x3F, (hi >> 4) | ((mid >> 6) << 4)], axis=-1)
    return sc, mn


def dequant_qkx(q: np.ndarray, levels: np.ndarray) -> np.ndarray:
    """Q4_K / Q5_K reconstruction: per 32-value sub-block (d * sc) * q - (dmin * m), in float32."""
    n = q.shape[0]
    sc, mn = get_scale_min_k4(q[:, 4:16])
    d = (fp16_col(q, 0) * sc.astype(np.float32)).reshape(n, 8, 1)
    dm = (fp16_col(q, 2) * mn.astype(np.float32)).reshape(n, 8, 1)
    return (d * levels.reshape(n, 8, 32).astype(np.float32) - dm).reshape(n, QK_K)


def dequant_qkx_torch(ops: Any, blocks: Any, levels: Any, out: Any) -> None:
    """`dequant_qkx` in torch, the same products in the same order (dequantize_row_q{4,5}_K)."""
    sc, mn = get_scale_min_k4(blocks[:, 4:16], lambda parts, axis: ops.torch.cat(parts, dim=axis))
    d = (ops.fp16_field(blocks, 0) * sc.float()).unsqueeze(-1)  # float32 [n, 8, 1]
    dm = (ops.fp16_field(blocks, 2) * mn.float()).unsqueeze(-1)
    ops.scaled(out, levels, d).sub_(dm)


class GgufDequantized(KernelQuantType):
    """A low-bit type (Q2_K, Q3_K, IQ4_NL, IQ4_XS) whose numpy dequantization is gguf-py's own
    (``gguf.quants``): the reference every reader of these files is compared with, used as it is."""

    _cost = 20  # every one searches scales per sub-block: many times a plain type's work per value

    def dequantize_blocks(self, q: np.ndarray) -> np.ndarray:
        import gguf.quants

        return gguf.quants.dequantize(np.ascontiguousarray(q), self.ggml_type).astype(np.float32, copy=False)


class FloatType(QuantType):
    """F32 / F16 / BF16: ``encode`` (float32 -> the type's elements, ``threads`` wide) and ``decode`` (the stored
    elements -> float32, exactly) as functions of the type's module; the runtime views their bytes as
    ``torch_view`` and widens them exactly."""

    encode: ClassVar[Callable[..., np.ndarray]]
    decode: ClassVar[Callable[[np.ndarray], np.ndarray]]
    torch_view: ClassVar[str]  # the torch dtype's name

    def quantize_blocks(self, x: np.ndarray, threads: int | None = None) -> np.ndarray:
        return type(self).encode(x, threads=threads).view(np.uint8)

    def dequantize_blocks(self, q: np.ndarray) -> np.ndarray:
        return type(self).decode(np.ascontiguousarray(q))

    def dequantize_torch(self, ops: Any, blocks: Any, out: Any) -> None:
        out.copy_(blocks.contiguous().view(getattr(ops.torch, self.torch_view)))
