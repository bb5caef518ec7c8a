"""The statement-by-statement mirror of ggml's K-quant quantizers: Q4_K, Q5_K and Q6_K one block at a time.

Transcriptions of ``make_qkx2_quants``, ``make_qx_quants`` (rmse_type 1) and ``quantize_row_q{4,5,6}_K_ref``.
Not used by the QuantTypes (the lane kernels of ``_kernels_kquants`` are several times faster): a readable
spec of what those compute, and the tests check both agree.
"""

from __future__ import annotations

import numpy as np

from ._kernels_c_ops import (
    _F0, _F1, _F_TENTH, _GROUP_MAX_EPS, _JIT, as_int8, fp16_to_fp32, fp32_to_fp16, nearest_int, njit, put_d_dmin,
    put_u16, require_recorded_sha256,
)

#: sha256 of ``_kernels_c_ops.py``, whose helpers these kernels inline: numba's cache is keyed on this file's text,
#: so a change there has to change this line (see ``_kernels_c_ops``)
C_OPS_SHA256 = "7b23dae62d456d5e0b8c1772218738daa90cff1db2a739219283c3ae8a2c3ea2"
require_recorded_sha256(C_OPS_SHA256, __name__)


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
    dh, dminh = put_d_dmin(out, b, max_scale, max_min)
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
