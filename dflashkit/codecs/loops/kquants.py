"""Numba kernels of the K-quants Q4_K, Q5_K (`qk_kernel`), Q6_K (`q6_k_kernel`) and Q2_K without weights
(`q2_k_kernel`), as the codecs run them.

The K-quant searches (make_qkx2_quants, make_qx_quants) are chains of sequential float32 sums: run one
block at a time they are latency bound. These kernels run many independent sub-blocks side by side as
"lanes" (column j of a [positions, lanes] tile): every lane still sums its own elements one position after
another, in C's order, so results are bit-identical, while the lane loop vectorises (AVX2/AVX-512) and the
many independent chains hide the add latency. Branches become per-lane masks; a lane's "accept this trial"
updates only that lane. Tiles are padded with a copy of the last super-block whose results are discarded.
The scalar ``*_scalar`` kernels of ``kquants_mirror`` (and ``lowbit.q2_k_scalar``) are the
statement-by-statement mirror, kept as a readable spec and as a cross-check in the tests.

Kernels take ``x[n_blocks, 256]`` float32 and write ``out[n_blocks, type_size]`` uint8.
"""

from __future__ import annotations

import numpy as np

from .c_ops import (
    _F0, _F1, _F_TENTH, _GROUP_MAX_EPS, _JIT, as_int8, fp16_to_fp32, fp32_to_fp16, nearest_int, nearest_int_f, njit,
    put16, put_d_dmin, put_k4_scale_min, require_inlined,
)
from .lowbit import q2_k_scale_codes
from .make import max_abs
from .tiles import clampf, gather_sub16, max_abs_lanes, pack_2bit_lanes, pick

#: sha256 of the files whose helpers these kernels inline: numba's cache is keyed on this file's text only, so a
#: change there has to change this line (`require_inlined`; python tools/rehash_kernels.py sets them)
INLINED_SHA256 = {"c_ops": "d0fe70f014628680", "tiles": "d0083257960fde1a", "make": "876b8b417226f1d1", "lowbit": "412c81c01bfeb8be"}
require_inlined(__name__, INLINED_SHA256)


_SB_K = 16  # super-blocks per tile for Q4_K / Q5_K (8 lanes each -> 128 lanes)
_NL_K = 8 * _SB_K
_SB_6 = 8  # super-blocks per tile for Q6_K (16 lanes each -> 128 lanes)
_NL_6 = 16 * _SB_6
_SB_2 = 8  # super-blocks per tile for Q2_K (16 lanes each -> 128 lanes)
_NL_2 = 16 * _SB_2
_F3 = np.float32(3.0)
_F15 = np.float32(15.0)


@njit(**_JIT)
def _qkx_levels(xT, Lv, iscale, mn, fnmax):  # type: ignore[no-untyped-def]
    """A make_qkx2_quants trial's levels: MAX(0, MIN(nmax, nearest_int(iscale * (x - min)))) in every lane."""
    for i in range(xT.shape[0]):
        for j in range(xT.shape[1]):
            Lv[i, j] = clampf(nearest_int_f(iscale[j] * (xT[i, j] - mn[j])), _F0, fnmax)


@njit(**_JIT)
def _qkx_error(xT, wT, Lv, sc, mnv, err, use_mad):  # type: ignore[no-untyped-def]
    """err[j] += w * |d| (use_mad) or w * d * d over the lane's values in C's order, d = sc * l + min - x."""
    for i in range(xT.shape[0]):
        for j in range(xT.shape[1]):
            diff = sc[j] * Lv[i, j] + mnv[j] - xT[i, j]
            err[j] += wT[i, j] * (abs(diff) if use_mad else diff * diff)


@njit(**_JIT)
def _qkx2_lanes(xT, wT, L, Laux, nmax, rmin, rdelta, nstep, st, use_mad):  # type: ignore[no-untyped-def]
    """make_qkx2_quants on every column of xT [n, lanes] (n = 32: Q4_K / Q5_K, use_mad false; n = 16: Q2_K,
    use_mad true) with weights wT.

    Levels (float) go to L; st[0] = scale, st[1] = the_min per lane; other st rows are scratch.
    """
    n = xT.shape[0]
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
    kept_iscale = st[17]  # the trial whose levels are kept: its iscale and min, and whether any was
    kept_min = st[18]
    kept = st[19]
    for j in range(nl):
        mn[j] = xT[0, j]
        mx[j] = xT[0, j]
        sum_w[j] = wT[0, j]
        sum_x[j] = wT[0, j] * xT[0, j]
    for i in range(1, n):
        for j in range(nl):
            xi = xT[i, j]
            mn[j] = pick(xi < mn[j], xi, mn[j])
            mx[j] = pick(xi > mx[j], xi, mx[j])
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
        kept[j] = _F0
        kept_iscale[j] = _F0
        kept_min[j] = _F0
    _qkx_levels(xT, L, iscale, mn, fnmax)
    _qkx_error(xT, wT, L, scale, mn, best, use_mad)
    for step in range(nstep + 1):
        for j in range(nl):
            # mn is the lane's current min: an accepted step changes it for the following steps, as in C
            iscale[j] = (rmin + rdelta * np.float32(step) + fnmax) / (mx[j] - mn[j])
            sum_l[j] = _F0
            sum_l2[j] = _F0
            sum_xl[j] = _F0
        _qkx_levels(xT, Laux, iscale, mn, fnmax)
        for i in range(n):
            for j in range(nl):
                xi = xT[i, j]
                l = Laux[i, j]
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
        _qkx_error(xT, wT, Laux, tsc, tmn, cur, use_mad)
        for j in range(nl):
            ok = (acc[j] != _F0) & (cur[j] < best[j])
            best[j] = pick(ok, cur[j], best[j])
            scale[j] = pick(ok, tsc[j], scale[j])
            # C copies this trial's levels into L; they are a function of (iscale, min) alone, so the pair is kept
            # and the levels made once after the last trial (a copy per trial was a masked store of every level)
            kept_iscale[j] = pick(ok, iscale[j], kept_iscale[j])
            kept_min[j] = pick(ok, mn[j], kept_min[j])
            kept[j] = pick(ok, _F1, kept[j])
            mn[j] = pick(ok, tmn[j], mn[j])
    _qkx_levels(xT, Laux, kept_iscale, kept_min, fnmax)
    for i in range(n):
        for j in range(nl):
            L[i, j] = pick(kept[j] != _F0, Laux[i, j], L[i, j])
    for j in range(nl):
        if flat[j] != _F0:
            out_scale[j] = _F0
        else:
            out_scale[j] = scale[j]
            out_min[j] = -mn[j]
    for i in range(n):
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
    _qkx2_lanes(xT, wT, L, Laux, nmax, rmin, rdelta, nstep, st, False)
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
        dh, dminh = put_d_dmin(out[b], 0, max_scale, max_min)
        for k in range(12):
            out[b, 4 + k] = 0
        for j in range(8):
            s = min(63, nearest_int(inv_scale * scales[8 * g + j]) & 0xFF)  # uint8_t ls = nearest_int(); MIN(63)
            m = min(63, nearest_int(inv_min * mins[8 * g + j]) & 0xFF)
            put_k4_scale_min(out[b], 4, j, s, m)
            # get_scale_min_k4 decodes exactly (s, m)
            vd[8 * g + j] = dh * np.float32(s)
            vdm[8 * g + j] = dminh * np.float32(m)
    fnmax = np.float32(nmax)
    for i in range(32):
        for j in range(8 * ng):
            if vd[j] != _F0:  # d == 0 keeps make_qkx2_quants' levels, as C does
                L[i, j] = clampf(nearest_int_f((xT[i, j] + vdm[j]) / vd[j]), _F0, fnmax)


@njit(**_JIT)
def qk_kernel(x, out, nmax, rmin, rdelta, nstep):  # type: ignore[no-untyped-def]
    """quantize_row_q4_K_ref (nmax 15, rmin -1, rdelta 0.1, nstep 20) or q5_K_ref (31, -0.5, 0.1, 15).

    One compiled kernel serves both (the parameters are runtime values), halving JIT time.
    """
    xT = np.zeros((32, _NL_K), np.float32)
    wT = np.zeros((32, _NL_K), np.float32)
    L = np.zeros((32, _NL_K), np.float32)
    Laux = np.zeros((32, _NL_K), np.float32)
    st = np.zeros((20, _NL_K), np.float32)
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
def q2_k_kernel(x, out):  # type: ignore[no-untyped-def]
    """quantize_row_q2_K_ref: each sub-block of 16 through make_qkx2_quants(3, -0.5, 0.1, 15, use_mad, weights
    |x|), lane 16 * g + j = sub-block j of super-block g of a tile; then 4-bit scales and mins, each sub-block's
    levels again from its stored scale and min (``d == 0`` keeps the search's), 2-bit packing."""
    xT = np.zeros((16, _NL_2), np.float32)
    wT = np.zeros((16, _NL_2), np.float32)
    L = np.zeros((16, _NL_2), np.float32)
    Laux = np.zeros((16, _NL_2), np.float32)
    st = np.zeros((20, _NL_2), np.float32)
    nb = x.shape[0]
    for b0 in range(0, nb, _SB_2):
        ng = gather_sub16(x, b0, _SB_2, xT)
        for i in range(16):
            for j in range(_NL_2):
                wT[i, j] = abs(xT[i, j])
        _qkx2_lanes(xT, wT, L, Laux, 3, np.float32(-0.5), _F_TENTH, 15, st, True)
        for g in range(ng):
            b = b0 + g
            for j in range(16):
                out[b, j] = 0
            dh = q2_k_scale_codes(out[b], 0, st[0], 16 * g, 0)
            mh = q2_k_scale_codes(out[b], 0, st[1], 16 * g, 4)
            for j in range(16):
                d = dh * np.float32(out[b, j] & 0xF)
                if d == _F0:
                    continue
                m = mh * np.float32(out[b, j] >> 4)
                for i in range(16):
                    L[i, 16 * g + j] = clampf(nearest_int_f((xT[i, 16 * g + j] + m) / d), _F0, _F3)
            pack_2bit_lanes(L, g, out, b, 16)


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
            l = clampf(nearest_int_f(iscale[j] * xi), np.float32(-32), np.float32(31))
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
        ng = gather_sub16(x, b0, _SB_6, xT)
        max_abs_lanes(xT, amax, mx)
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
                ok = (suml2[j] > _F0) & (sumlx[j] * sumlx[j] > best[j] * suml2[j])
                sc = sumlx[j] / suml2[j]
                scale[j] = pick(ok, sc, scale[j])
                best[j] = pick(ok, sc * sumlx[j], best[j])
                best_iscale[j] = pick(ok, iscale[j], best_iscale[j])
        for j in range(nl):
            if amax[j] < _GROUP_MAX_EPS:  # all-zero sub-block: L = 0, scale 0
                scale[j] = _F0
        for g in range(ng):
            b = b0 + g
            max_abs_scale, max_scale = max_abs(scale, 16 * g, 16)
            zero_block[g] = max_abs_scale < _GROUP_MAX_EPS
            if zero_block[g]:
                for k in range(210):
                    out[b, k] = 0
                for ib in range(16):
                    vd[16 * g + ib] = _F0
                continue
            isc = np.float32(-128) / max_scale
            d16 = fp32_to_fp16(_F1 / isc)
            put16(out[b], 208, d16)
            dh = fp16_to_fp32(d16)
            for ib in range(16):
                s8 = as_int8(min(127, nearest_int(isc * scale[16 * g + ib])))
                out[b, 192 + ib] = s8 & 0xFF
                vd[16 * g + ib] = dh * np.float32(s8)
        for i in range(16):
            for j in range(16 * ng):
                xi = xT[i, j]
                if vd[j] != _F0:
                    L[i, j] = clampf(nearest_int_f(xi / vd[j]), np.float32(-32), np.float32(31)) + np.float32(32)
                elif amax[j] < _GROUP_MAX_EPS:
                    L[i, j] = _F0
                else:  # d == 0 keeps make_qx_quants' levels (from the last accepted iscale), as C does
                    L[i, j] = clampf(nearest_int_f(best_iscale[j] * xi), np.float32(-32), np.float32(31)) + np.float32(32)
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
