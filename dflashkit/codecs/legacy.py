"""32-value block types: Q8_0, Q4_0, Q4_1, Q5_0, Q5_1.

Quantization is the numba kernels in ``loops`` (mirroring quantize_row_*_ref), except Q8_0's, which is numpy
(`q8_0_numpy`, see there why); dequantization is numpy with the same float32 operation order as ggml's
dequantize_row_* (and gguf-py), so values are bit-identical.
"""

from __future__ import annotations

from typing import Any, ClassVar

import numpy as np
from gguf import GGMLQuantizationType

from .base import K, KernelQuantType, fp16_col, unpack_nibbles


def _fifth_bits(qh: np.ndarray) -> np.ndarray:
    """The little-endian uint32 ``qh`` of Q5_0 / Q5_1: bit j is the 5th bit of value j."""
    return np.unpackbits(qh, axis=-1, bitorder="little")


#: blocks per pass of `q8_0_numpy`: its five float32 scratch arrays (2.5 MB) stay in the L2 cache
_Q8_0_STEP = 4096
_HALF_BELOW = np.nextafter(np.float32(0.5), np.float32(0.0))  # 0.49999997: trunc(v + this, signed) == roundf(v)
_HALF_BELOW_BITS = _HALF_BELOW.view(np.int32)
_SIGN_BIT = np.int32(-0x80000000)
_F1, _F127 = np.float32(1.0), np.float32(127.0)
_FLT_MIN = np.finfo(np.float32).tiny  # smallest normal float32


def q8_0_numpy(x: np.ndarray, out: np.ndarray) -> None:
    """quantize_row_q8_0_ref in numpy, for x float32 [n, 32] (C-contiguous) into out uint8 [n, 34].

    Why numpy and not a numba kernel like the other types: Q8_0 is simple enough for whole-array numpy
    operations (about 1.3 ns per value on two threads, as fast as the numba mirror), and `import numba` plus
    loading a cached kernel costs ~0.4 s of start-up, more than quantizing a 67 M-value tensor takes.

    Same float32 operations as C, so the same bytes: amax = max |x| (order-free for finite values),
    d = amax / 127, id = 1 / d (0 when d is 0), d stored as fp16 (numpy's round-to-nearest-even conversion,
    ggml's too), q = roundf(x * id) computed as trunc(x * id + copysign(0.49999997, x)), which equals
    round-half-away for every |v| < 2**23, then C's float -> int8 truncation. Blocks where C relies on
    platform behaviour — NaN / inf inputs, or a subnormal d whose reciprocal overflows or whose levels
    can leave int8 — go to the numba mirror of the C code (`loops.legacy_kernel`), a pass of blocks at a time.
    """
    n = x.shape[0]
    step = min(n, _Q8_0_STEP)
    absx = np.empty(step * 32, np.float32)
    pairs = np.empty(step * 16, np.float32)
    inv = np.empty(step, np.float32)
    v = np.empty((step, 32), np.float32)
    half = np.empty((step, 32), np.int32)
    out_d = out.view(np.uint16)[:, 0]  # the fp16 scale: first 2 bytes of each 34-byte block (rows stay 2-aligned)
    with np.errstate(all="ignore"):
        for lo in range(0, n, step):
            hi = min(n, lo + step)
            nb = hi - lo
            xs = x[lo:hi]
            a = absx[: nb * 32]
            np.abs(xs.reshape(-1), out=a)
            # per-block max by halving (pairs of neighbours stay inside a block): flat ops, no per-row loop
            m = pairs[: nb * 16]
            np.maximum(a[0::2], a[1::2], out=m)
            k = nb * 16
            while k > nb:
                k //= 2
                np.maximum(m[0 : 2 * k : 2], m[1 : 2 * k : 2], out=m[:k])
            amax = m[:nb]
            d = amax / _F127
            if not (np.isfinite(amax).all() and ((d == 0) | (d >= _FLT_MIN)).all()):
                K.legacy_kernel(xs, out[lo:hi], 0)  # K imports numba on this first use only
                continue
            iv = inv[:nb]
            np.divide(_F1, d, out=iv)
            iv[d == 0] = 0
            out_d[lo:hi] = d.astype(np.float16).view(np.uint16)
            vs, hs = v[:nb], half[:nb]
            np.multiply(xs, iv[:, None], out=vs)
            np.bitwise_and(xs.view(np.int32), _SIGN_BIT, out=hs)  # sign of x, which is the sign of x * id
            np.bitwise_or(hs, _HALF_BELOW_BITS, out=hs)
            np.add(vs, hs.view(np.float32), out=vs)
            np.copyto(out[lo:hi, 2:].view(np.int8), vs, casting="unsafe")  # |vs| < 128: truncation toward 0


class _Block32(KernelQuantType):
    """A 32-value type: its ``kind`` picks its branch of the kernels that serve them all, straight from F16 bits
    (`loops.legacy_f16.legacy_from_f16`), from float32 (`loops.legacy.legacy_kernel`, unless the type names
    another) and with weights (`loops.weighted.legacy_w_kernel`, Q8_0 has none)."""

    kind: ClassVar[int]  # 0 Q8_0, 1 Q4_0, 2 Q4_1, 3 Q5_0, 4 Q5_1

    def __init_subclass__(cls, **kw: Any) -> None:
        super().__init_subclass__(**kw)
        cls.from_f16 = ("legacy_from_f16", (cls.kind,))
        if cls.kind:
            cls._weighted = ("legacy_w_kernel", (cls.kind,))
        if "_kernel" not in cls.__dict__:
            cls._kernel = ("legacy_kernel", (cls.kind,))


class Q8_0(_Block32, ggml_type=GGMLQuantizationType.Q8_0):
    """d (fp16) = absmax / 127; qs = roundf(x / d) as int8."""

    kind = 0
    _kernel = q8_0_numpy
    needs_numba = False

    def dequantize_blocks(self, q: np.ndarray) -> np.ndarray:
        out = np.empty((q.shape[0], self.block_size), dtype=np.float32)
        self.dequantize_blocks_into(q, out)
        return out

    def dequantize_blocks_into(self, q: np.ndarray, out: np.ndarray) -> None:
        # float(qs) * d in float32; the ufunc casts the int8 levels in small buffers: one pass, no temporary array
        np.multiply(q[:, 2:].view(np.int8), fp16_col(q, 0), out=out, dtype=np.float32)


class Q4_0(_Block32, ggml_type=GGMLQuantizationType.Q4_0):
    """d (fp16) = max / -8 (max: signed value of largest magnitude); 4-bit levels with offset 8."""

    kind = 1

    def dequantize_blocks(self, q: np.ndarray) -> np.ndarray:
        levels = unpack_nibbles(q[:, 2:], 16).astype(np.int8) - np.int8(8)
        return fp16_col(q, 0) * levels.astype(np.float32)


class Q4_1(_Block32, ggml_type=GGMLQuantizationType.Q4_1):
    """d (fp16) = (max - min) / 15, m (fp16) = min; unsigned 4-bit levels; x = d * q + m."""

    kind = 2

    def dequantize_blocks(self, q: np.ndarray) -> np.ndarray:
        return fp16_col(q, 0) * unpack_nibbles(q[:, 4:], 16).astype(np.float32) + fp16_col(q, 2)


class Q5_0(_Block32, ggml_type=GGMLQuantizationType.Q5_0):
    """d (fp16) = max / -16; 5-bit levels with offset 16 (low nibbles in qs, 5th bits in qh)."""

    kind = 3

    def dequantize_blocks(self, q: np.ndarray) -> np.ndarray:
        levels = unpack_nibbles(q[:, 6:], 16) | (_fifth_bits(q[:, 2:6]) << np.uint8(4))
        return fp16_col(q, 0) * (levels.astype(np.int8) - np.int8(16)).astype(np.float32)


class Q5_1(_Block32, ggml_type=GGMLQuantizationType.Q5_1):
    """d (fp16) = (max - min) / 31, m (fp16) = min; unsigned 5-bit levels; x = d * q + m."""

    kind = 4

    def dequantize_blocks(self, q: np.ndarray) -> np.ndarray:
        levels = unpack_nibbles(q[:, 8:], 16) | (_fifth_bits(q[:, 4:8]) << np.uint8(4))
        return fp16_col(q, 0) * levels.astype(np.float32) + fp16_col(q, 2)
