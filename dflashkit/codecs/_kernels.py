"""Numba kernels that reproduce ggml's reference quantizers bit for bit.

Every kernel here mirrors one C function of ggml (``ggml/src/ggml-quants.c``, ``ggml-impl.h``) in float32 and
in the same per-element operation order, because that is what makes the bytes equal:

- all arithmetic stays float32 (float32 constants below; int -> float conversions are explicit);
- sums run sequentially over element positions, as C's loops do (no pairwise / reassociated sums);
- no fast-math, so LLVM neither reassociates nor contracts a*b+c into an FMA (the golden files
  confirm ggml's reference build does not contract either);
- ``nearest_int`` is ggml's 12582912 bit trick (round-half-even, garbage beyond 2**22 exactly as C);
  ``roundf`` is round-half-away; C float -> int casts follow x86 ``cvttss2si`` (NaN / out of range -> INT_MIN).

The 32-value types and the scalar ``*_scalar`` K-quant kernels are statement-by-statement transcriptions.
The K-quant kernels used for real work run many sub-blocks side by side ("lanes", see the K-quants section)
so the sequential sums vectorise across blocks; each lane still performs C's exact sequence of operations.

All numba code lives in this one module on purpose: numba's on-disk cache is keyed on the source file of the
function being compiled, so keeping helpers and kernels together means editing a helper invalidates every
kernel that inlined it.

Kernels take C-contiguous ``x[n_blocks, block_size]`` float32 and write ``out[n_blocks, type_size]`` uint8;
they release the GIL so ``base.run_chunked`` can split blocks across threads.
"""

from __future__ import annotations

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
def put_u16(out, b, pos, v):  # type: ignore[no-untyped-def]
    """Store a little-endian uint16 (fp16 bits) at out[b, pos:pos+2]."""
    out[b, pos] = v & 0xFF
    out[b, pos + 1] = (v >> 8) & 0xFF


# ----------------------------------------------------------------------------------------- element-wise
@njit(**_JIT)
def f32_to_f16_kernel(x, out):  # type: ignore[no-untyped-def]
    """ggml_fp32_to_fp16_row over a flat float32 array into uint16."""
    for i in range(x.shape[0]):
        out[i] = fp32_to_fp16(x[i])


@njit(**_JIT)
def bf16_to_f16_kernel(bits, out):  # type: ignore[no-untyped-def]
    """bfloat16 bits → IEEE half bits in one pass, as numpy's ``astype(float16)`` of the exact float32 value
    (gguf-py's and llama.cpp's converter's F16 output): round-to-nearest-even (`fp32_to_fp16`), and a NaN
    keeps its sign and top payload bits (numpy's rule; ggml's own conversion would write 0x7E00)."""
    for i in range(bits.shape[0]):
        b = np.int64(bits[i])
        if (b & 0x7F80) == 0x7F80 and (b & 0x007F) != 0:
            payload = ((b & 0x007F) << 16) >> 13  # float32 mantissa bits 22..13
            out[i] = ((b & 0x8000) | 0x7C00 | payload) if payload != 0 else ((b & 0x8000) | 0x7C01)
        else:
            out[i] = fp32_to_fp16(u32_as_f32(b << 16))


@njit(**_JIT)
def bf16_f16_specials(bits):  # type: ignore[no-untyped-def]
    """(NaN / inf values, finite values that round past F16's 65504) among bfloat16 ``bits``: a magnitude at or
    above 0x7F80 is not finite; a finite one at or above 0x4780 (65536; the bfloat16 below it is 65280) overflows."""
    nonfinite = 0
    beyond = 0
    for i in range(bits.shape[0]):
        m = bits[i] & 0x7FFF
        if m >= 0x4780:
            beyond += 1
            if m >= 0x7F80:
                nonfinite += 1
    return nonfinite, beyond - nonfinite


@njit(**_JIT)
def count_exponent_all_ones(bits, mask):  # type: ignore[no-untyped-def]
    """Values among float ``bits`` (uint16 / uint32 / uint64) whose exponent field ``mask`` is all ones: NaN and ±inf.
    One pass and no temporaries (numpy's masked compare makes two, at a third of the speed)."""
    n = 0
    for i in range(bits.shape[0]):
        if (bits[i] & mask) == mask:
            n += 1
    return n


@njit(**_JIT)
def f32_to_bf16_kernel(x, out):  # type: ignore[no-untyped-def]
    """ggml_fp32_to_bf16_row_ref / ggml_compute_fp32_to_bf16 over flat uint32 bits into uint16."""
    for i in range(x.shape[0]):
        u = np.int64(x[i])
        if (u & 0x7FFFFFFF) > 0x7F800000:
            out[i] = (u >> 16) | 64  # NaN: keep sign and payload top, force quiet
        else:
            out[i] = ((u + (0x7FFF + ((u >> 16) & 1))) >> 16) & 0xFFFF


# ----------------------------------------------------------------------------------------- 32-element types
@njit(**_JIT)
def q8_0_kernel(x, out):  # type: ignore[no-untyped-def]
    """quantize_row_q8_0_ref: d = amax/127 (fp16), q = roundf(x/d)."""
    for b in range(x.shape[0]):
        amax = _F0
        for j in range(32):
            av = abs(x[b, j])
            amax = amax if amax > av else av  # MAX(amax, fabsf(v))
        d = amax / np.float32(127)
        idv = _F1 / d if d != _F0 else _F0
        put_u16(out, b, 0, fp32_to_fp16(d))
        for j in range(32):
            out[b, 2 + j] = c_roundf(x[b, j] * idv) & 0xFF


@njit(**_JIT)
def _signed_absmax(x, b, n):  # type: ignore[no-untyped-def]
    """The element of largest magnitude (first one on ties), as quantize_row_q4_0_ref / q5_0 find it."""
    amax = _F0
    mx = _F0
    for j in range(n):
        v = x[b, j]
        if amax < abs(v):
            amax = abs(v)
            mx = v
    return mx


@njit(**_JIT)
def _min_max(x, b, n):  # type: ignore[no-untyped-def]
    """min / max from FLT_MAX / -FLT_MAX as quantize_row_q4_1_ref / q5_1 do."""
    mn = np.float32(3.4028234663852886e38)
    mx = -mn
    for j in range(n):
        v = x[b, j]
        if v < mn:
            mn = v
        if v > mx:
            mx = v
    return mn, mx


@njit(**_JIT)
def _signed_scale(x, b, out, divisor):  # type: ignore[no-untyped-def]
    """q4_0 / q5_0: d = the signed absmax / divisor, stored as fp16 at the block's start; returns 1/d (0 for 0)."""
    d = _signed_absmax(x, b, 32) / divisor
    put_u16(out, b, 0, fp32_to_fp16(d))
    return _F1 / d if d != _F0 else _F0


@njit(**_JIT)
def q4_0_kernel(x, out):  # type: ignore[no-untyped-def]
    """quantize_row_q4_0_ref: d = max/-8, q = MIN(15, (int8_t)(x/d + 8.5))."""
    for b in range(x.shape[0]):
        idv = _signed_scale(x, b, out, np.float32(-8))
        for j in range(16):
            xi0 = min(15, as_int8(c_f32_to_i32(x[b, j] * idv + np.float32(8.5)))) & 0xFF
            xi1 = min(15, as_int8(c_f32_to_i32(x[b, j + 16] * idv + np.float32(8.5)))) & 0xFF
            out[b, 2 + j] = (xi0 | (xi1 << 4)) & 0xFF


@njit(**_JIT)
def _pack_q5(out, b, pos_qh, pos_qs, j, xi0, xi1, qh):  # type: ignore[no-untyped-def]
    """Shared q5_0 / q5_1 packing: low nibbles into qs, the 5th bits into qh (returned)."""
    out[b, pos_qs + j] = (xi0 & 0x0F) | ((xi1 & 0x0F) << 4)
    qh |= ((xi0 & 0x10) >> 4) << j
    qh |= ((xi1 & 0x10) >> 4) << (j + 16)
    return qh


@njit(**_JIT)
def _put_u32(out, b, pos, v):  # type: ignore[no-untyped-def]
    for k in range(4):
        out[b, pos + k] = (v >> (8 * k)) & 0xFF


@njit(**_JIT)
def q5_0_kernel(x, out):  # type: ignore[no-untyped-def]
    """quantize_row_q5_0_ref: d = max/-16, q = MIN(31, (int8_t)(x/d + 16.5))."""
    for b in range(x.shape[0]):
        idv = _signed_scale(x, b, out, np.float32(-16))
        qh = 0
        for j in range(16):
            xi0 = min(31, as_int8(c_f32_to_i32(x[b, j] * idv + np.float32(16.5)))) & 0xFF
            xi1 = min(31, as_int8(c_f32_to_i32(x[b, j + 16] * idv + np.float32(16.5)))) & 0xFF
            qh = _pack_q5(out, b, 2, 6, j, xi0, xi1, qh)
        _put_u32(out, b, 2, qh)


@njit(**_JIT)
def q5_1_kernel(x, out):  # type: ignore[no-untyped-def]
    """quantize_row_q5_1_ref: d = (max-min)/31, m = min, q = (uint8_t)((x-min)/d + 0.5)."""
    for b in range(x.shape[0]):
        mn, mx = _min_max(x, b, 32)
        d = (mx - mn) / np.float32(31)
        idv = _F1 / d if d != _F0 else _F0
        put_u16(out, b, 0, fp32_to_fp16(d))
        put_u16(out, b, 2, fp32_to_fp16(mn))
        qh = 0
        for j in range(16):
            xi0 = c_f32_to_i32((x[b, j] - mn) * idv + _F_HALF) & 0xFF
            xi1 = c_f32_to_i32((x[b, j + 16] - mn) * idv + _F_HALF) & 0xFF
            qh = _pack_q5(out, b, 4, 8, j, xi0, xi1, qh)
        _put_u32(out, b, 4, qh)


# ----------------------------------------------------------------------------------------- K-quants (fast)
# The K-quant searches (make_qkx2_quants, make_qx_quants) are chains of sequential float32 sums: run one
# block at a time they are latency bound. These kernels run many independent sub-blocks side by side as
# "lanes" (column j of a [positions, lanes] tile): every lane still sums its own elements one position after
# another, in C's order, so results are bit-identical, while the lane loop vectorises (AVX2/AVX-512) and the
# many independent chains hide the add latency. Branches become per-lane masks; a lane's "accept this trial"
# updates only that lane. Tiles are padded with a copy of the last super-block whose results are discarded.
# The scalar ``*_scalar`` kernels further down are the statement-by-statement mirror, kept as a readable
# spec and as a cross-check in the tests.

_SB_K = 16  # super-blocks per tile for Q4_K / Q5_K (8 lanes each -> 128 lanes)
_NL_K = 8 * _SB_K
_SB_6 = 8  # super-blocks per tile for Q6_K (16 lanes each -> 128 lanes)
_NL_6 = 16 * _SB_6


@njit(**_JIT)
def _clampf(v, lo, hi):  # type: ignore[no-untyped-def]
    """MAX(lo, MIN(hi, v)) on float-valued levels (v is never NaN: it comes from nearest_int_f)."""
    if v < lo:
        v = lo
    if v > hi:
        v = hi
    return v


@njit(**_JIT)
def _qkx2_lanes(xT, wT, L, Laux, nmax, rmin, rdelta, nstep, st):  # type: ignore[no-untyped-def]
    """make_qkx2_quants (use_mad = false) on every column of xT [32, lanes] with weights wT.

    Levels (float) go to L; st[0] = scale, st[1] = the_min per lane; other st rows are scratch.
    """
    nl = xT.shape[1]
    fnmax = np.float32(nmax)
    out_scale = st[0]
    out_min = st[1]
    mn = st[2]
    mx = st[3]
    sum_w = st[4]
    sum_x = st[5]
    scale = st[6]
    best = st[7]
    iscale = st[8]
    sum_l = st[9]
    sum_l2 = st[10]
    sum_xl = st[11]
    tsc = st[12]
    tmn = st[13]
    cur = st[14]
    acc = st[15]
    flat = st[16]
    for j in range(nl):
        mn[j] = xT[0, j]
        mx[j] = xT[0, j]
        sum_w[j] = wT[0, j]
        sum_x[j] = wT[0, j] * xT[0, j]
    for i in range(1, 32):
        for j in range(nl):
            xi = xT[i, j]
            if xi < mn[j]:
                mn[j] = xi
            if xi > mx[j]:
                mx[j] = xi
            w = wT[i, j]
            sum_w[j] += w
            sum_x[j] += w * xi
    for j in range(nl):
        if mn[j] > _F0:
            mn[j] = _F0
        flat[j] = _F1 if mx[j] == mn[j] else _F0  # C returns early: L = 0, scale 0, the_min = -min
        out_min[j] = -mn[j]
        iscale[j] = fnmax / (mx[j] - mn[j])
        scale[j] = _F1 / iscale[j]
        best[j] = _F0
    for i in range(32):
        for j in range(nl):
            xi = xT[i, j]
            l = _clampf(nearest_int_f(iscale[j] * (xi - mn[j])), _F0, fnmax)
            L[i, j] = l
            diff = scale[j] * l + mn[j] - xi
            best[j] += wT[i, j] * (diff * diff)
    for step in range(nstep + 1):
        for j in range(nl):
            # mn is the lane's current min: an accepted step changes it for the following steps, as in C
            iscale[j] = (rmin + rdelta * np.float32(step) + fnmax) / (mx[j] - mn[j])
            sum_l[j] = _F0
            sum_l2[j] = _F0
            sum_xl[j] = _F0
        for i in range(32):
            for j in range(nl):
                xi = xT[i, j]
                l = _clampf(nearest_int_f(iscale[j] * (xi - mn[j])), _F0, fnmax)
                Laux[i, j] = l
                w = wT[i, j]
                sum_l[j] += w * l
                sum_l2[j] += w * l * l
                sum_xl[j] += w * l * xi
        for j in range(nl):
            D = sum_w[j] * sum_l2[j] - sum_l[j] * sum_l[j]
            ts = (sum_w[j] * sum_xl[j] - sum_x[j] * sum_l[j]) / D
            tm = (sum_l2[j] * sum_x[j] - sum_l[j] * sum_xl[j]) / D
            if tm > _F0:
                tm = _F0
                ts = sum_xl[j] / sum_l2[j]
            tsc[j] = ts
            tmn[j] = tm
            cur[j] = _F0
            acc[j] = _F1 if D > _F0 else _F0
        for i in range(32):
            for j in range(nl):
                diff = tsc[j] * Laux[i, j] + tmn[j] - xT[i, j]
                cur[j] += wT[i, j] * (diff * diff)
        for j in range(nl):
            if acc[j] != _F0 and cur[j] < best[j]:
                best[j] = cur[j]
                scale[j] = tsc[j]
                mn[j] = tmn[j]
            else:
                acc[j] = _F0
        for i in range(32):
            for j in range(nl):
                if acc[j] != _F0:
                    L[i, j] = Laux[i, j]
    for j in range(nl):
        if flat[j] != _F0:
            out_scale[j] = _F0
        else:
            out_scale[j] = scale[j]
            out_min[j] = -mn[j]
    for i in range(32):
        for j in range(nl):
            if flat[j] != _F0:
                L[i, j] = _F0


@njit(**_JIT)
def _qkx_tile(x, b0, ng, out, nmax, rmin, rdelta, nstep, xT, wT, L, Laux, st, vd, vdm):  # type: ignore[no-untyped-def]
    """quantize_row_q4_K_ref / q5_K_ref for super-blocks b0 .. b0+ng-1 (lane 8*g + j = sub-block j of b0+g).

    Writes d, dmin and the 12 scale bytes; leaves the final levels (float) in L for the caller to pack.
    """
    nl = xT.shape[1]
    for g in range(nl // 8):
        bb = b0 + min(g, ng - 1)
        for j in range(8):
            for i in range(32):
                xT[i, 8 * g + j] = x[bb, 32 * j + i]
    av_x = st[0]
    for j in range(nl):
        av_x[j] = _F0
    for i in range(32):
        for j in range(nl):
            av_x[j] += xT[i, j] * xT[i, j]  # sum_x2
    for j in range(nl):
        av_x[j] = np.sqrt(av_x[j] / np.float32(32))
    for i in range(32):
        for j in range(nl):
            wT[i, j] = av_x[j] + abs(xT[i, j])
    _qkx2_lanes(xT, wT, L, Laux, nmax, rmin, rdelta, nstep, st)
    scales = st[0]
    mins = st[1]
    for g in range(ng):
        b = b0 + g
        max_scale = _F0
        max_min = _F0
        for j in range(8):
            if scales[8 * g + j] > max_scale:
                max_scale = scales[8 * g + j]
            if mins[8 * g + j] > max_min:
                max_min = mins[8 * g + j]
        inv_scale = np.float32(63) / max_scale if max_scale > _F0 else _F0
        inv_min = np.float32(63) / max_min if max_min > _F0 else _F0
        d16 = fp32_to_fp16(max_scale / np.float32(63))
        dmin16 = fp32_to_fp16(max_min / np.float32(63))
        put_u16(out, b, 0, d16)
        put_u16(out, b, 2, dmin16)
        dh = fp16_to_fp32(d16)
        dminh = fp16_to_fp32(dmin16)
        for k in range(12):
            out[b, 4 + k] = 0
        for j in range(8):
            s = min(63, nearest_int(inv_scale * scales[8 * g + j]) & 0xFF)  # uint8_t ls = nearest_int(); MIN(63)
            m = min(63, nearest_int(inv_min * mins[8 * g + j]) & 0xFF)
            if j < 4:
                out[b, 4 + j] = s
                out[b, 8 + j] = m
            else:
                out[b, 8 + j] = (s & 0xF) | ((m & 0xF) << 4)
                out[b, j] |= (s >> 4) << 6
                out[b, 4 + j] |= (m >> 4) << 6
            # get_scale_min_k4 decodes exactly (s, m)
            vd[8 * g + j] = dh * np.float32(s)
            vdm[8 * g + j] = dminh * np.float32(m)
    fnmax = np.float32(nmax)
    for i in range(32):
        for j in range(8 * ng):
            if vd[j] != _F0:  # d == 0 keeps make_qkx2_quants' levels, as C does
                L[i, j] = _clampf(nearest_int_f((xT[i, j] + vdm[j]) / vd[j]), _F0, fnmax)


@njit(**_JIT)
def qk_kernel(x, out, nmax, rmin, rdelta, nstep):  # type: ignore[no-untyped-def]
    """quantize_row_q4_K_ref (nmax 15, rmin -1, rdelta 0.1, nstep 20) or q5_K_ref (31, -0.5, 0.1, 15).

    One compiled kernel serves both (the parameters are runtime values), halving JIT time.
    """
    xT = np.zeros((32, _NL_K), np.float32)
    wT = np.zeros((32, _NL_K), np.float32)
    L = np.zeros((32, _NL_K), np.float32)
    Laux = np.zeros((32, _NL_K), np.float32)
    st = np.zeros((17, _NL_K), np.float32)
    vd = np.zeros(_NL_K, np.float32)
    vdm = np.zeros(_NL_K, np.float32)
    nb = x.shape[0]
    for b0 in range(0, nb, _SB_K):
        ng = min(_SB_K, nb - b0)
        _qkx_tile(x, b0, ng, out, nmax, rmin, rdelta, nstep, xT, wT, L, Laux, st, vd, vdm)
        for g in range(ng):
            b = b0 + g
            if nmax == 15:
                # Q4_K qs: byte 32*jj + l = level(64*jj + l) | level(64*jj + 32 + l) << 4
                for jj in range(4):
                    for l in range(32):
                        lo = np.int64(L[l, 8 * g + 2 * jj])
                        hi = np.int64(L[l, 8 * g + 2 * jj + 1])
                        out[b, 16 + 32 * jj + l] = lo | (hi << 4)
            else:
                # Q5_K: 5th bits of levels 64*nn + j and 64*nn + 32 + j go to qh[j] bits 2*nn and 2*nn+1
                for j in range(32):
                    qh = 0
                    for nn in range(4):
                        l1 = np.int64(L[j, 8 * g + 2 * nn])
                        l2 = np.int64(L[j, 8 * g + 2 * nn + 1])
                        qh |= ((l1 >> 4) << (2 * nn)) | ((l2 >> 4) << (2 * nn + 1))
                        out[b, 48 + 32 * nn + j] = (l1 & 0xF) | ((l2 & 0xF) << 4)
                    out[b, 16 + j] = qh


@njit(**_JIT)
def _qx_sums(xT, iscale, sumlx, suml2):  # type: ignore[no-untyped-def]
    """One make_qx_quants trial (rmse_type 1, weights x*x, nmax 32) for every lane: sequential sums over i."""
    nl = xT.shape[1]
    for j in range(nl):
        sumlx[j] = _F0
        suml2[j] = _F0
    for i in range(16):
        for j in range(nl):
            xi = xT[i, j]
            l = _clampf(nearest_int_f(iscale[j] * xi), np.float32(-32), np.float32(31))
            w = xi * xi
            sumlx[j] += w * xi * l
            suml2[j] += w * l * l


@njit(**_JIT)
def q6_k_kernel(x, out):  # type: ignore[no-untyped-def]
    """quantize_row_q6_K_ref: 16 sub-blocks of 16 via make_qx_quants(16, 32, rmse_type 1), int8 scales.

    Layout: ql[128] qh[64] scales[16] d[2]. Lane 16*g + ib = sub-block ib of super-block b0 + g.
    """
    nl = _NL_6
    xT = np.zeros((16, nl), np.float32)
    L = np.zeros((16, nl), np.float32)
    amax = np.zeros(nl, np.float32)
    mx = np.zeros(nl, np.float32)
    iscale = np.zeros(nl, np.float32)
    sumlx = np.zeros(nl, np.float32)
    suml2 = np.zeros(nl, np.float32)
    scale = np.zeros(nl, np.float32)
    best = np.zeros(nl, np.float32)
    best_iscale = np.zeros(nl, np.float32)
    vd = np.zeros(nl, np.float32)
    zero_block = np.zeros(_SB_6, np.bool_)
    nb = x.shape[0]
    for b0 in range(0, nb, _SB_6):
        ng = min(_SB_6, nb - b0)
        for g in range(_SB_6):
            bb = b0 + min(g, ng - 1)
            for ib in range(16):
                for i in range(16):
                    xT[i, 16 * g + ib] = x[bb, 16 * ib + i]
        for j in range(nl):
            amax[j] = _F0
            mx[j] = _F0
        for i in range(16):
            for j in range(nl):
                ax = abs(xT[i, j])
                if ax > amax[j]:
                    amax[j] = ax
                    mx[j] = xT[i, j]
        # first trial: iscale = -nmax / max, scale = suml2 ? sumlx / suml2 : 0, best = scale * sumlx
        for j in range(nl):
            iscale[j] = np.float32(-32) / mx[j]
        _qx_sums(xT, iscale, sumlx, suml2)
        for j in range(nl):
            scale[j] = sumlx[j] / suml2[j] if suml2[j] != _F0 else _F0
            best[j] = scale[j] * sumlx[j]
            best_iscale[j] = iscale[j]
        for step in range(-9, 10):
            if step == 0:
                continue
            for j in range(nl):
                iscale[j] = -(np.float32(32) + _F_TENTH * np.float32(step)) / mx[j]
            _qx_sums(xT, iscale, sumlx, suml2)
            for j in range(nl):
                if suml2[j] > _F0 and sumlx[j] * sumlx[j] > best[j] * suml2[j]:
                    scale[j] = sumlx[j] / suml2[j]
                    best[j] = scale[j] * sumlx[j]
                    best_iscale[j] = iscale[j]
        for j in range(nl):
            if amax[j] < _GROUP_MAX_EPS:  # all-zero sub-block: L = 0, scale 0
                scale[j] = _F0
        for g in range(ng):
            b = b0 + g
            max_scale = _F0
            max_abs_scale = _F0
            for ib in range(16):
                s = scale[16 * g + ib]
                if abs(s) > max_abs_scale:
                    max_abs_scale = abs(s)
                    max_scale = s
            zero_block[g] = max_abs_scale < _GROUP_MAX_EPS
            if zero_block[g]:
                for k in range(210):
                    out[b, k] = 0
                for ib in range(16):
                    vd[16 * g + ib] = _F0
                continue
            isc = np.float32(-128) / max_scale
            d16 = fp32_to_fp16(_F1 / isc)
            put_u16(out, b, 208, d16)
            dh = fp16_to_fp32(d16)
            for ib in range(16):
                s8 = as_int8(min(127, nearest_int(isc * scale[16 * g + ib])))
                out[b, 192 + ib] = s8 & 0xFF
                vd[16 * g + ib] = dh * np.float32(s8)
        for i in range(16):
            for j in range(16 * ng):
                xi = xT[i, j]
                if vd[j] != _F0:
                    L[i, j] = _clampf(nearest_int_f(xi / vd[j]), np.float32(-32), np.float32(31)) + np.float32(32)
                elif amax[j] < _GROUP_MAX_EPS:
                    L[i, j] = _F0
                else:  # d == 0 keeps make_qx_quants' levels (from the last accepted iscale), as C does
                    L[i, j] = _clampf(nearest_int_f(best_iscale[j] * xi), np.float32(-32), np.float32(31)) + np.float32(32)
        for g in range(ng):
            b = b0 + g
            if zero_block[g]:  # already written as all zero bytes
                continue
            for half in range(2):
                for l in range(32):
                    # level(128*half + 32*k + l) lives at sub-block 8*half + 2*k + l // 16, position l % 16
                    sb = 16 * g + 8 * half + l // 16
                    q1 = np.int64(L[l % 16, sb])
                    q2 = np.int64(L[l % 16, sb + 2])
                    q3 = np.int64(L[l % 16, sb + 4])
                    q4 = np.int64(L[l % 16, sb + 6])
                    out[b, 64 * half + l] = (q1 & 0xF) | ((q3 & 0xF) << 4)
                    out[b, 64 * half + l + 32] = (q2 & 0xF) | ((q4 & 0xF) << 4)
                    out[b, 128 + 32 * half + l] = (q1 >> 4) | ((q2 >> 4) << 2) | ((q3 >> 4) << 4) | ((q4 >> 4) << 6)


# ----------------------------------------------------------------------------------------- K-quants (mirror)
# Statement-by-statement transcriptions of the C functions, one block at a time. Not used by the QuantTypes
# (the lane kernels above are several times faster); the tests check both agree.
@njit(**_JIT)
def make_qkx2_quants(x, b, off, n, nmax, weights, L, Laux, rmin, rdelta, nstep):  # type: ignore[no-untyped-def]
    """ggml-quants.c make_qkx2_quants (use_mad = false) on x[b, off:off+n]; fills L[off:off+n].

    Returns (scale, the_min). Note ``mn`` is updated in place by an accepted step and the later steps'
    iscale / (x - min) use the updated value, exactly as in C.
    """
    mn = x[b, off]
    mx = x[b, off]
    sum_w = weights[0]
    sum_x = sum_w * x[b, off]
    for i in range(1, n):
        xi = x[b, off + i]
        if xi < mn:
            mn = xi
        if xi > mx:
            mx = xi
        w = weights[i]
        sum_w += w
        sum_x += w * xi
    if mn > _F0:
        mn = _F0
    if mx == mn:
        for i in range(n):
            L[off + i] = 0
        return _F0, -mn
    fnmax = np.float32(nmax)
    iscale = fnmax / (mx - mn)
    scale = _F1 / iscale
    best_error = _F0
    for i in range(n):
        xi = x[b, off + i]
        l = max(0, min(nmax, nearest_int(iscale * (xi - mn))))
        L[off + i] = l
        diff = scale * np.float32(l) + mn - xi
        diff = diff * diff
        best_error += weights[i] * diff
    for step in range(nstep + 1):
        iscale = (rmin + rdelta * np.float32(step) + fnmax) / (mx - mn)
        sum_l = _F0
        sum_l2 = _F0
        sum_xl = _F0
        for i in range(n):
            xi = x[b, off + i]
            l = max(0, min(nmax, nearest_int(iscale * (xi - mn))))
            Laux[i] = l
            w = weights[i]
            fl = np.float32(l)
            sum_l += w * fl
            sum_l2 += w * fl * fl
            sum_xl += w * fl * xi
        D = sum_w * sum_l2 - sum_l * sum_l
        if D > _F0:
            this_scale = (sum_w * sum_xl - sum_x * sum_l) / D
            this_min = (sum_l2 * sum_x - sum_l * sum_xl) / D
            if this_min > _F0:
                this_min = _F0
                this_scale = sum_xl / sum_l2
            cur_error = _F0
            for i in range(n):
                diff = this_scale * np.float32(Laux[i]) + this_min - x[b, off + i]
                diff = diff * diff
                cur_error += weights[i] * diff
            if cur_error < best_error:
                for i in range(n):
                    L[off + i] = Laux[i]
                best_error = cur_error
                scale = this_scale
                mn = this_min
    return scale, -mn


@njit(**_JIT)
def _qkx_superblock(x, b, out, nmax, rmin, rdelta, nstep, L, Laux, weights, scales, mins, ls, lm):  # type: ignore[no-untyped-def]
    """Shared body of quantize_row_q4_K_ref / q5_K_ref up to the final L (nmax = 15 or 31).

    Writes d, dmin and the 12 packed 6-bit scale/min bytes to out[b, 0:16]; leaves the quant levels in L.
    """
    max_scale = _F0
    max_min = _F0
    for j in range(8):
        sum_x2 = _F0
        for l in range(32):
            v = x[b, 32 * j + l]
            sum_x2 += v * v
        av_x = np.sqrt(sum_x2 / np.float32(32))
        for l in range(32):
            weights[l] = av_x + abs(x[b, 32 * j + l])
        sc, m = make_qkx2_quants(x, b, 32 * j, 32, nmax, weights, L, Laux, rmin, rdelta, nstep)
        scales[j] = sc
        mins[j] = m
        if sc > max_scale:
            max_scale = sc
        if m > max_min:
            max_min = m
    inv_scale = np.float32(63) / max_scale if max_scale > _F0 else _F0
    inv_min = np.float32(63) / max_min if max_min > _F0 else _F0
    for k in range(12):
        out[b, 4 + k] = 0
    for j in range(8):
        s = min(63, nearest_int(inv_scale * scales[j]) & 0xFF)  # uint8_t ls = nearest_int(..); MIN(63, ls)
        m = min(63, nearest_int(inv_min * mins[j]) & 0xFF)
        ls[j] = s
        lm[j] = m
        if j < 4:
            out[b, 4 + j] = s
            out[b, 4 + j + 4] = m
        else:
            out[b, 4 + j + 4] = (s & 0xF) | ((m & 0xF) << 4)
            out[b, 4 + j - 4] |= (s >> 4) << 6
            out[b, 4 + j] |= (m >> 4) << 6
    d16 = fp32_to_fp16(max_scale / np.float32(63))
    dmin16 = fp32_to_fp16(max_min / np.float32(63))
    put_u16(out, b, 0, d16)
    put_u16(out, b, 2, dmin16)
    dh = fp16_to_fp32(d16)
    dminh = fp16_to_fp32(dmin16)
    for j in range(8):  # get_scale_min_k4 would decode exactly ls[j], lm[j]
        d = dh * np.float32(ls[j])
        if d == _F0:
            continue  # keeps make_qkx2_quants' levels, as C does
        dm = dminh * np.float32(lm[j])
        for ii in range(32):
            L[32 * j + ii] = max(0, min(nmax, nearest_int((x[b, 32 * j + ii] + dm) / d)))


@njit(**_JIT)
def _qkx_scratch():  # type: ignore[no-untyped-def]
    """The per-row scratch of `_qkx_superblock` (levels, their trial copy, weights, scales, mins, 6-bit codes)."""
    return (np.zeros(256, np.int64), np.zeros(32, np.int64), np.zeros(32, np.float32), np.zeros(8, np.float32),
            np.zeros(8, np.float32), np.zeros(8, np.int64), np.zeros(8, np.int64))


@njit(**_JIT)
def q4_k_scalar(x, out):  # type: ignore[no-untyped-def]
    """quantize_row_q4_K_ref: 8 sub-blocks of 32, make_qkx2_quants(15, -1, 0.1, 20), 4-bit levels."""
    L, Laux, weights, scales, mins, ls, lm = _qkx_scratch()
    for b in range(x.shape[0]):
        _qkx_superblock(x, b, out, 15, np.float32(-1.0), _F_TENTH, 20, L, Laux, weights, scales, mins, ls, lm)
        for jj in range(4):
            j = 64 * jj
            for l in range(32):
                out[b, 16 + 32 * jj + l] = L[j + l] | (L[j + l + 32] << 4)


@njit(**_JIT)
def q5_k_scalar(x, out):  # type: ignore[no-untyped-def]
    """quantize_row_q5_K_ref: make_qkx2_quants(31, -0.5, 0.1, 15), low nibbles in qs, 5th bits in qh."""
    L, Laux, weights, scales, mins, ls, lm = _qkx_scratch()
    for b in range(x.shape[0]):
        _qkx_superblock(x, b, out, 31, np.float32(-0.5), _F_TENTH, 15, L, Laux, weights, scales, mins, ls, lm)
        for j in range(32):
            out[b, 16 + j] = 0
        m1 = 1
        m2 = 2
        for nn in range(4):
            n = 64 * nn
            for j in range(32):
                l1 = L[n + j]
                if l1 > 15:
                    l1 -= 16
                    out[b, 16 + j] |= m1
                l2 = L[n + j + 32]
                if l2 > 15:
                    l2 -= 16
                    out[b, 16 + j] |= m2
                out[b, 48 + 32 * nn + j] = l1 | (l2 << 4)
            m1 <<= 2
            m2 <<= 2


@njit(**_JIT)
def make_qx_quants_rmse1(x, b, off, n, nmax, L):  # type: ignore[no-untyped-def]
    """ggml-quants.c make_qx_quants with rmse_type = 1 and qw = NULL (weights x*x); fills L[off:off+n]."""
    mx = _F0
    amax = _F0
    for i in range(n):
        ax = abs(x[b, off + i])
        if ax > amax:
            amax = ax
            mx = x[b, off + i]
    if amax < _GROUP_MAX_EPS:
        for i in range(n):
            L[off + i] = 0
        return _F0
    fnmax = np.float32(nmax)
    iscale = -fnmax / mx
    sumlx = _F0
    suml2 = _F0
    for i in range(n):
        xi = x[b, off + i]
        l = max(-nmax, min(nmax - 1, nearest_int(iscale * xi)))
        L[off + i] = l + nmax
        w = xi * xi
        fl = np.float32(l)
        sumlx += w * xi * fl
        suml2 += w * fl * fl
    scale = sumlx / suml2 if suml2 != _F0 else _F0
    best = scale * sumlx
    for step in range(-9, 10):
        if step == 0:
            continue
        iscale = -(fnmax + _F_TENTH * np.float32(step)) / mx
        sumlx = _F0
        suml2 = _F0
        for i in range(n):
            xi = x[b, off + i]
            l = max(-nmax, min(nmax - 1, nearest_int(iscale * xi)))
            w = xi * xi
            fl = np.float32(l)
            sumlx += w * xi * fl
            suml2 += w * fl * fl
        if suml2 > _F0 and sumlx * sumlx > best * suml2:
            for i in range(n):
                L[off + i] = nmax + max(-nmax, min(nmax - 1, nearest_int(iscale * x[b, off + i])))
            scale = sumlx / suml2
            best = scale * sumlx
    return scale


@njit(**_JIT)
def q6_k_scalar(x, out):  # type: ignore[no-untyped-def]
    """quantize_row_q6_K_ref: 16 sub-blocks of 16 via make_qx_quants(32, rmse 1), int8 scales, 6-bit levels.

    Layout: ql[128] qh[64] scales[16] d[2].
    """
    L = np.zeros(256, np.int64)
    scales = np.zeros(16, np.float32)
    sc8 = np.zeros(16, np.int64)
    for b in range(x.shape[0]):
        max_scale = _F0
        max_abs_scale = _F0
        for ib in range(16):
            s = make_qx_quants_rmse1(x, b, 16 * ib, 16, 32, L)
            scales[ib] = s
            if abs(s) > max_abs_scale:
                max_abs_scale = abs(s)
                max_scale = s
        if max_abs_scale < _GROUP_MAX_EPS:
            for k in range(210):
                out[b, k] = 0
            continue
        iscale = np.float32(-128) / max_scale
        d16 = fp32_to_fp16(_F1 / iscale)
        put_u16(out, b, 208, d16)
        for ib in range(16):
            s8 = as_int8(min(127, nearest_int(iscale * scales[ib])))
            sc8[ib] = s8
            out[b, 192 + ib] = s8 & 0xFF
        dh = fp16_to_fp32(d16)
        for j in range(16):
            d = dh * np.float32(sc8[j])
            if d == _F0:
                continue  # keeps make_qx_quants' levels, as C does
            for ii in range(16):
                L[16 * j + ii] = max(-32, min(31, nearest_int(x[b, 16 * j + ii] / d))) + 32
        for half in range(2):
            j = 128 * half
            for l in range(32):
                q1 = L[j + l] & 0xF
                q2 = L[j + l + 32] & 0xF
                q3 = L[j + l + 64] & 0xF
                q4 = L[j + l + 96] & 0xF
                out[b, 64 * half + l] = q1 | (q3 << 4)
                out[b, 64 * half + l + 32] = q2 | (q4 << 4)
                out[b, 128 + 32 * half + l] = (
                    (L[j + l] >> 4) | ((L[j + l + 32] >> 4) << 2) | ((L[j + l + 64] >> 4) << 4) | ((L[j + l + 96] >> 4) << 6)
                )
