"""C's scalar arithmetic, done as ggml's reference quantizers do it, for the numba kernels of every type family.

The kernel modules (``floats``, ``legacy``, ``kquants``, ``kquants_mirror``)
all reproduce ggml's bytes through the same few operations, so those exist once, here: the numba options
(``_JIT``), the float32 constants, bit casts between a float32 and its uint32 pattern, ggml's ``nearest_int``,
C's ``roundf`` and float -> int casts (x86 ``cvttss2si``), the fp16 conversions of ``ggml-impl.h`` and a
little-endian uint16 store. See ``loops`` for the rules that make the bytes equal.

numba's cache directory is configured here before numba is imported (numba reads ``NUMBA_CACHE_DIR`` then);
the kernel modules take ``njit`` from this module, so that happens first whichever of them is imported.

numba's on-disk cache is keyed on the text of the file that defines a kernel, and a cached kernel carries the
code of the helpers it inlined from this file. So that a change here still recompiles them, every kernel module
records this file's sha256 (``INLINED_SHA256``) and calls `require_inlined` on import: after editing this file,
run ``python tools/rehash_kernels.py`` (the error names the value too).
"""

from __future__ import annotations

import functools
import hashlib
import os

import numpy as np

from dflashkit._numba_cache import configure as _configure_numba_cache

_configure_numba_cache(os.path.dirname(__file__))  # before numba is imported: it reads NUMBA_CACHE_DIR then
from llvmlite import ir  # noqa: E402
from numba import njit, types  # noqa: E402
from numba.extending import intrinsic  # noqa: E402

_JIT = dict(cache=True, nogil=True, error_model="numpy", boundscheck=False)

# float32 constants (a Python float literal would promote the expression to float64)
_F0 = np.float32(0.0)
_F_HALF = np.float32(0.5)
_F1 = np.float32(1.0)
_MAGIC = np.float32(12582912.0)  # 1.5 * 2**23, nearest_int's trick
_GROUP_MAX_EPS = np.float32(1e-15)
_F_TENTH = np.float32(0.1)
_F2_23 = np.float32(8388608.0)
_F_I32_LO = np.float32(-2147483648.0)
_F_I32_HI = np.float32(2147483648.0)
_F_SCALE_TO_INF = np.float32(2.0**112)
_F_SCALE_TO_ZERO = np.float32(2.0**-110)
_F_2M24 = np.float32(2.0**-24)
_INT_MIN = -2147483648


# ----------------------------------------------------------------------------------------- bit casts
@intrinsic
def f32_as_u32(typingctx, x):  # type: ignore[no-untyped-def]
    """Reinterpret a float32 as its uint32 bit pattern (C's memcpy / union)."""
    if x != types.float32:
        return None  # refuse float64: catches accidental promotions at compile time

    def codegen(context, builder, sig, args):  # type: ignore[no-untyped-def]
        return builder.bitcast(args[0], ir.IntType(32))

    return types.uint32(types.float32), codegen


@intrinsic
def u32_as_f32(typingctx, x):  # type: ignore[no-untyped-def]
    """Reinterpret the low 32 bits of an integer as a float32."""
    if not isinstance(x, types.Integer):
        return None

    def codegen(context, builder, sig, args):  # type: ignore[no-untyped-def]
        v = args[0]
        if x.bitwidth > 32:
            v = builder.trunc(v, ir.IntType(32))
        elif x.bitwidth < 32:
            v = builder.zext(v, ir.IntType(32))
        return builder.bitcast(v, ir.FloatType())

    return types.float32(x), codegen


# ----------------------------------------------------------------------------------------- scalar helpers
@njit(**_JIT)
def nearest_int(fval):  # type: ignore[no-untyped-def]
    """ggml-quants.c nearest_int: add 1.5*2**23, read the mantissa bits (round-half-even for |f| < 2**22)."""
    val = fval + _MAGIC
    i = np.int64(f32_as_u32(val))
    return (i & 0x007FFFFF) - 0x00400000


@intrinsic
def nearest_int_f(typingctx, x):  # type: ignore[no-untyped-def]
    """float(nearest_int(x)) computed in 32-bit lanes (vectorisable): identical to nearest_int for every input."""
    if x != types.float32:
        return None

    def codegen(context, builder, sig, args):  # type: ignore[no-untyped-def]
        f32, i32 = ir.FloatType(), ir.IntType(32)
        val = builder.fadd(args[0], ir.Constant(f32, 12582912.0))
        i = builder.and_(builder.bitcast(val, i32), ir.Constant(i32, 0x007FFFFF))
        return builder.sitofp(builder.sub(i, ir.Constant(i32, 0x00400000)), f32)

    return types.float32(types.float32), codegen


@njit(**_JIT)
def c_f32_to_i32(f):  # type: ignore[no-untyped-def]
    """C (int)f on x86 (cvttss2si): truncate toward zero; NaN or out of int32 range gives INT_MIN."""
    if f >= _F_I32_LO and f < _F_I32_HI:
        return np.int64(np.int32(f))
    return np.int64(_INT_MIN)


@njit(**_JIT)
def c_roundf(f):  # type: ignore[no-untyped-def]
    """C (int)roundf(f): round half away from zero, then the C cast."""
    if not (abs(f) < _F2_23):
        return c_f32_to_i32(f)  # already integral (or inf / NaN)
    i = np.int64(np.int32(f))  # trunc; f - i is exact here
    r = f - np.float32(i)
    if r >= _F_HALF:
        i += 1
    elif r <= -_F_HALF:
        i -= 1
    return i


@njit(**_JIT)
def as_int8(v):  # type: ignore[no-untyped-def]
    """C int -> int8_t conversion (modular)."""
    return ((v + 128) & 0xFF) - 128


@njit(**_JIT)
def fp32_to_fp16(f):  # type: ignore[no-untyped-def]
    """ggml-impl.h ggml_compute_fp32_to_fp16: round-to-nearest-even, NaN -> 0x7E00 | sign."""
    base = (abs(f) * _F_SCALE_TO_INF) * _F_SCALE_TO_ZERO
    w = np.int64(f32_as_u32(f))
    shl1_w = (w + w) & 0xFFFFFFFF
    sign = w & 0x80000000
    bias = shl1_w & 0xFF000000
    if bias < 0x71000000:
        bias = 0x71000000
    base = u32_as_f32((bias >> 1) + 0x07800000) + base
    bits = np.int64(f32_as_u32(base))
    exp_bits = (bits >> 13) & 0x00007C00
    mantissa_bits = bits & 0x00000FFF
    nonsign = exp_bits + mantissa_bits
    if shl1_w > 0xFF000000:
        nonsign = 0x7E00
    return (sign >> 16) | nonsign


@njit(**_JIT)
def fp16_to_fp32(h):  # type: ignore[no-untyped-def]
    """ggml_compute_fp16_to_fp32 (exact): the value of half-precision bits ``h``."""
    sign = (h & 0x8000) << 16
    e = (h >> 10) & 0x1F
    m = h & 0x3FF
    if e == 0:
        v = np.float32(m) * _F_2M24  # subnormal or zero: exact in float32
        return u32_as_f32(np.int64(f32_as_u32(v)) | sign)
    if e == 31:
        return u32_as_f32(sign | 0x7F800000 | (m << 13))
    return u32_as_f32(sign | ((e + 112) << 23) | (m << 13))


@njit(**_JIT)
def put16(o, pos, v):  # type: ignore[no-untyped-def]
    """A little-endian uint16 (fp16 bits) at o[pos:pos+2]."""
    o[pos] = v & 0xFF
    o[pos + 1] = (v >> 8) & 0xFF


@njit(**_JIT)
def put_d_dmin(o, pos, max_scale, max_min):  # type: ignore[no-untyped-def]
    """A Q4_K / Q5_K super-block's d and dmin (max / 63 as fp16) stored at o[pos:pos+4]; returns them as float32,
    the values get_scale_min_k4's decoding multiplies by (quantize_row_q4_K_ref / q5_K_ref)."""
    d16 = fp32_to_fp16(max_scale / np.float32(63))
    dmin16 = fp32_to_fp16(max_min / np.float32(63))
    put16(o, pos, d16)
    put16(o, pos + 2, dmin16)
    return fp16_to_fp32(d16), fp16_to_fp32(dmin16)


@njit(**_JIT)
def put_k4_scale_min(o, pos, j, s, m):  # type: ignore[no-untyped-def]
    """Sub-block j's 6-bit scale s and min m into the 12 scale bytes of a Q4_K / Q5_K super-block at o[pos:pos+12]
    (zeroed by the caller): the packing get_scale_min_k4 reads back."""
    if j < 4:
        o[pos + j] = s
        o[pos + j + 4] = m
    else:
        o[pos + j + 4] = ((s & 0xF) | ((m & 0xF) << 4)) & 0xFF
        o[pos + j - 4] = (o[pos + j - 4] | ((s >> 4) << 6)) & 0xFF
        o[pos + j] = (o[pos + j] | ((m >> 4) << 6)) & 0xFF


@njit(**_JIT)
def get_k4_scale_min(o, pos, j):  # type: ignore[no-untyped-def]
    """get_scale_min_k4(j, scales at o[pos:pos+12]): sub-block j's 6-bit scale and min."""
    if j < 4:
        return o[pos + j] & 63, o[pos + j + 4] & 63
    return (o[pos + j + 4] & 0xF) | ((o[pos + j - 4] >> 6) << 4), (o[pos + j + 4] >> 4) | ((o[pos + j] >> 6) << 4)


# ----------------------------------------------------------------------------------------- the cache's dependency
@functools.cache
def file_sha256(path: str) -> str | None:
    """sha256 of a kernel module's text (line ends as \\n, whatever a checkout made them), or None where there is no
    source to read (numba caches nothing then)."""
    if not path.endswith(".py"):
        return None
    try:
        with open(path, "rb") as f:
            return hashlib.sha256(f.read().replace(b"\r\n", b"\n")).hexdigest()
    except OSError:
        return None


#: hex digits of a sha256 a kernel module records (enough to tell one text of a file from the next)
RECORDED_DIGITS = 16


def require_inlined(module: str, recorded: dict[str, str]) -> None:
    """Refuse to load ``module``'s kernels when a file whose helpers they inline is not the text the module
    records (``recorded``: ``"c_ops"`` for ``c_ops.py`` → the first `RECORDED_DIGITS` of its sha256):
    its cached kernels may still run the helpers as they were (module docstring)."""
    here = os.path.dirname(__file__)
    for short, digest in recorded.items():
        current = file_sha256(os.path.join(here, f"{short}.py"))
        if current is not None and digest != current[:RECORDED_DIGITS]:
            raise RuntimeError(
                f"{module}: the sha256 it records for dflashkit/codecs/loops/{short}.py, whose helpers its numba "
                f"kernels inline, does not match; set it to {current[:RECORDED_DIGITS]!r} so numba recompiles them "
                "(python tools/rehash_kernels.py sets every one)"
            )
