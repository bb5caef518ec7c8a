"""ggml's scale searches for the low-bit and importance-weighted quantizers, statement by statement.

Transcriptions of ``ggml/src/ggml-quants.c``: ``make_qx_quants`` (every ``rmse_type``, optional weights),
``make_q3_quants``, ``make_qkx2_quants`` (``use_mad`` included), ``make_qkx3_quants`` (mainline b11549's form: a
trial level of a non-finite or out-of-range value is clamped before ``nearest_int`` — the pinned 0.3.36 build
reads it as garbage there; both agree on every finite weight), ``make_qp_quants`` and ``best_index_int8``. Each
works on ``x[off:off+n]`` of a 1-D float32 array (C's pointer arithmetic) and writes levels into an int64 ``L``
at its own offset ``lo``; where C keeps levels in ``uint8_t`` the value stored is masked to 8 bits and read back so,
exactly as C wraps it. Every sum is float32 and sequential, every int → float conversion explicit (module doc of
``loops``).

Also the pieces several quantizers share verbatim in C: a running maximum of sub-block scales (`running_max`) and
Q6_K's last pass (`q6_k_finish`, quantize_row_q6_K_ref's and _impl's alike).
"""

from __future__ import annotations

import numpy as np

from .c_ops import (_F0, _F1, _F_HALF, _F_TENTH, _GROUP_MAX_EPS, _JIT, as_int8, fp16_to_fp32, fp32_to_fp16,
                    nearest_int, njit, put16, require_inlined)

#: sha256 of the files whose helpers these kernels inline: numba's cache is keyed on this file's text only, so a
#: change there has to change this line (`require_inlined`; python tools/rehash_kernels.py sets them)
INLINED_SHA256 = {"c_ops": "d0fe70f014628680"}
require_inlined(__name__, INLINED_SHA256)


@njit(**_JIT)
def qx_weight(x, off, i, qw, qoff, has_w, rmse_type):  # type: ignore[no-untyped-def]
    """``qw ? qw[i] : rmse_type == 1 ? x*x : rmse_type == 2 ? 1 : rmse_type == 3 ? fabsf(x) : sqrtf(fabsf(x))``."""
    if has_w:
        return qw[qoff + i]
    xi = x[off + i]
    if rmse_type == 1:
        return xi * xi
    if rmse_type == 2:
        return _F1
    if rmse_type == 3:
        return abs(xi)
    return np.sqrt(abs(xi))


@njit(**_JIT)
def max_abs(x, off, n):  # type: ignore[no-untyped-def]
    """(the largest |x|, the value that has it — the first on a tie, a NaN never) over x[off:off+n], C's
    ``if (ax > amax) { amax = ax; max = x[i]; }`` from 0."""
    mx = _F0
    amax = _F0
    for i in range(n):
        ax = abs(x[off + i])
        if ax > amax:
            amax = ax
            mx = x[off + i]
    return amax, mx


@njit(**_JIT)
def make_qx_quants(x, off, n, nmax, L, lo, rmse_type, qw, qoff, has_w):  # type: ignore[no-untyped-def]
    """make_qx_quants(n, nmax, x + off, L + lo, rmse_type, has_w ? qw + qoff : NULL); int8 levels + nmax."""
    amax, mx = max_abs(x, off, n)
    if amax < _GROUP_MAX_EPS:
        L[lo : lo + n] = 0
        return _F0
    fnmax = np.float32(nmax)
    iscale = np.float32(-nmax) / mx
    if rmse_type == 0:
        for i in range(n):
            l = nearest_int(iscale * x[off + i])
            L[lo + i] = nmax + max(-nmax, min(nmax - 1, l))
        return _F1 / iscale
    return_early = False
    if rmse_type < 0:
        rmse_type = -rmse_type
        return_early = True
    sumlx = _F0
    suml2 = _F0
    for i in range(n):
        xi = x[off + i]
        l = max(-nmax, min(nmax - 1, nearest_int(iscale * xi)))
        L[lo + i] = l + nmax
        w = qx_weight(x, off, i, qw, qoff, has_w, rmse_type)
        fl = np.float32(l)
        sumlx += w * xi * fl
        suml2 += w * fl * fl
    scale = sumlx / suml2 if suml2 != _F0 else _F0
    if return_early:
        return _F_HALF * (scale + _F1 / iscale) if suml2 > _F0 else _F1 / iscale
    best = scale * sumlx
    for step in range(-9, 10):
        if step == 0:
            continue
        iscale = -(fnmax + _F_TENTH * np.float32(step)) / mx
        sumlx = _F0
        suml2 = _F0
        for i in range(n):
            xi = x[off + i]
            fl = np.float32(max(-nmax, min(nmax - 1, nearest_int(iscale * xi))))
            w = qx_weight(x, off, i, qw, qoff, has_w, rmse_type)
            sumlx += w * xi * fl
            suml2 += w * fl * fl
        if suml2 > _F0 and sumlx * sumlx > best * suml2:
            for i in range(n):
                L[lo + i] = nmax + max(-nmax, min(nmax - 1, nearest_int(iscale * x[off + i])))
            scale = sumlx / suml2
            best = scale * sumlx
    return scale


@njit(**_JIT)
def make_q3_quants(x, off, n, nmax, L, lo, do_rmse):  # type: ignore[no-untyped-def]
    """make_q3_quants(n, nmax, x + off, L + lo, do_rmse): weights x*x, 5 passes of per-value refinement."""
    amax, mx = max_abs(x, off, n)
    if amax < _GROUP_MAX_EPS:
        L[lo : lo + n] = 0
        return _F0
    iscale = np.float32(-nmax) / mx
    if do_rmse:
        sumlx = _F0
        suml2 = _F0
        for i in range(n):
            xi = x[off + i]
            l = max(-nmax, min(nmax - 1, nearest_int(iscale * xi)))
            L[lo + i] = l
            w = xi * xi
            fl = np.float32(l)
            sumlx += w * xi * fl
            suml2 += w * fl * fl
        for _itry in range(5):
            n_changed = 0
            for i in range(n):
                xi = x[off + i]
                w = xi * xi
                fli = np.float32(L[lo + i])
                slx = sumlx - w * xi * fli
                if slx > _F0:
                    sl2 = suml2 - w * fli * fli
                    new_l = max(-nmax, min(nmax - 1, nearest_int(xi * sl2 / slx)))
                    if new_l != L[lo + i]:
                        fnew = np.float32(new_l)
                        slx += w * xi * fnew
                        sl2 += w * fnew * fnew
                        if sl2 > _F0 and slx * slx * suml2 > sumlx * sumlx * sl2:
                            L[lo + i] = new_l
                            sumlx = slx
                            suml2 = sl2
                            n_changed += 1
            if n_changed == 0:
                break
        for i in range(n):
            L[lo + i] += nmax
        return sumlx / suml2 if suml2 > _F0 else _F0
    for i in range(n):
        L[lo + i] = nmax + max(-nmax, min(nmax - 1, nearest_int(iscale * x[off + i])))
    return _F1 / iscale


@njit(**_JIT)
def make_qkx2_quants(x, off, n, nmax, w, L, lo, Laux, rmin, rdelta, nstep, use_mad):  # type: ignore[no-untyped-def]
    """make_qkx2_quants(n, nmax, x + off, w, L + lo, &the_min, Laux, rmin, rdelta, nstep, use_mad): (scale, the_min)."""
    return _make_qkx(x, off, n, nmax, w, L, lo, Laux, rmin, rdelta, nstep, use_mad, False)


@njit(**_JIT)
def make_qkx3_quants(x, off, n, nmax, w, L, lo, Laux, rmin, rdelta, nstep):  # type: ignore[no-untyped-def]
    """make_qkx3_quants(n, nmax, x + off, w, L + lo, &the_min, Laux, rmin, rdelta, nstep, use_mad = false):
    (scale, the_min). Weights are always given here (every caller passes them)."""
    return _make_qkx(x, off, n, nmax, w, L, lo, Laux, rmin, rdelta, nstep, False, True)


@njit(**_JIT)
def _make_qkx(x, off, n, nmax, w, L, lo, Laux, rmin, rdelta, nstep, use_mad, x3):  # type: ignore[no-untyped-def]
    """The body make_qkx2_quants and make_qkx3_quants share, statement by statement; ``x3`` picks qkx3's two
    differences: ``mx <= mn`` for ``mx == mn``, and a step's level ``MIN(v, nmax)`` rounded (v when below nmax) for
    ``MAX(0, MIN(nmax, nearest_int(v)))``. ``mn`` is updated in place by an accepted step and the later steps'
    iscale / (x - min) use the updated value, exactly as in C."""
    mn = x[off]
    mx = x[off]
    sum_w = w[0]
    sum_x = sum_w * x[off]
    for i in range(1, n):
        xi = x[off + i]
        if xi < mn:
            mn = xi
        if xi > mx:
            mx = xi
        sum_w += w[i]
        sum_x += w[i] * xi
    if mn > _F0:
        mn = _F0
    if (mx <= mn) if x3 else (mx == mn):
        for i in range(n):
            L[lo + i] = 0
        return _F0, -mn
    fnmax = np.float32(nmax)
    iscale = fnmax / (mx - mn)
    scale = _F1 / iscale
    best_error = _F0
    for i in range(n):
        xi = x[off + i]
        l = max(0, min(nmax, nearest_int(iscale * (xi - mn))))
        L[lo + i] = l
        diff = scale * np.float32(l) + mn - xi
        diff = abs(diff) if use_mad else diff * diff
        best_error += w[i] * diff
    if nstep < 1:
        return scale, -mn
    for step in range(nstep + 1):
        iscale = (rmin + rdelta * np.float32(step) + fnmax) / (mx - mn)
        sum_l = _F0
        sum_l2 = _F0
        sum_xl = _F0
        for i in range(n):
            xi = x[off + i]
            v = iscale * (xi - mn)
            if x3:
                l = nearest_int(v if v < fnmax else fnmax) if v > _F0 else 0  # MIN(v, nmax): v, unless v >= nmax
            else:
                l = max(0, min(nmax, nearest_int(v)))
            Laux[i] = l
            wl = w[i] * np.float32(l)
            sum_l += wl
            sum_l2 += wl * np.float32(l)
            sum_xl += wl * xi
        D = sum_w * sum_l2 - sum_l * sum_l
        if D > _F0:
            this_scale = (sum_w * sum_xl - sum_x * sum_l) / D
            this_min = (sum_l2 * sum_x - sum_l * sum_xl) / D
            if this_min > _F0:
                this_min = _F0
                this_scale = sum_xl / sum_l2
            cur_error = _F0
            for i in range(n):
                diff = this_scale * np.float32(Laux[i]) + this_min - x[off + i]
                diff = abs(diff) if use_mad else diff * diff
                cur_error += w[i] * diff
            if cur_error < best_error:
                for i in range(n):
                    L[lo + i] = Laux[i]
                best_error = cur_error
                scale = this_scale
                mn = this_min
    return scale, -mn


@njit(**_JIT)
def make_qp_quants(n, nmax, x, L, qw):  # type: ignore[no-untyped-def]
    """make_qp_quants(n, nmax, x, L, quant_weights) on x[0:n] (the sub-block scales or mins), uint8 levels."""
    mx = _F0
    for i in range(n):
        mx = mx if mx > x[i] else x[i]
    if mx < _GROUP_MAX_EPS:
        for i in range(n):
            L[i] = 0
        return _F0
    fnmax = np.float32(nmax)
    iscale = fnmax / mx
    for i in range(n):
        L[i] = nearest_int(iscale * x[i]) & 0xFF
    scale = _F1 / iscale
    best_mse = _F0
    for i in range(n):
        diff = x[i] - scale * np.float32(L[i])
        best_mse += qw[i] * diff * diff
    for step in range(-4, 5):
        if step == 0:
            continue
        iscale_is = (_F_TENTH * np.float32(step) + fnmax) / mx
        scale_is = _F1 / iscale_is
        mse = _F0
        for i in range(n):
            l = min(nmax, nearest_int(iscale_is * x[i]))
            diff = x[i] - scale_is * np.float32(l)
            mse += qw[i] * diff * diff
        if mse < best_mse:
            best_mse = mse
            iscale = iscale_is
    sumlx = _F0
    suml2 = _F0
    for i in range(n):
        l = min(nmax, nearest_int(iscale * x[i]))
        L[i] = l & 0xFF
        fl = np.float32(l)
        sumlx += qw[i] * x[i] * fl
        suml2 += qw[i] * fl * fl
    for _itry in range(5):
        n_changed = 0
        for i in range(n):
            w = qw[i]
            fli = np.float32(L[i])
            slx = sumlx - w * x[i] * fli
            sl2 = suml2 - w * fli * fli
            if slx > _F0 and sl2 > _F0:
                new_l = min(nmax, nearest_int(x[i] * sl2 / slx))
                if new_l != L[i]:
                    fnew = np.float32(new_l)
                    slx += w * x[i] * fnew
                    sl2 += w * fnew * fnew
                    if slx * slx * suml2 > sumlx * sumlx * sl2:
                        L[i] = new_l & 0xFF
                        sumlx = slx
                        suml2 = sl2
                        n_changed += 1
        if n_changed == 0:
            break
    return sumlx / suml2 if suml2 > _F0 else _F0


@njit(**_JIT)
def best_index_int8(n, val, x):  # type: ignore[no-untyped-def]
    """best_index_int8(n, val, x): the index of the value of ``val`` (sorted int8 levels) nearest to x."""
    if x <= np.float32(val[0]):
        return 0
    if x >= np.float32(val[n - 1]):
        return n - 1
    ml = 0
    mu = n - 1
    while mu - ml > 1:
        mav = (ml + mu) // 2
        if x < np.float32(val[mav]):
            mu = mav
        else:
            ml = mav
    return mu - 1 if x - np.float32(val[mu - 1]) < np.float32(val[mu]) - x else mu


@njit(**_JIT)
def k_scratch(nsub, sub):  # type: ignore[no-untyped-def]
    """A K-quant super-block's scratch: levels L[256], trial levels Laux[sub], weights[sub], and per sub-block
    scales, mins, weight sums and the scales' and mins' codes ([nsub] each)."""
    return (np.zeros(256, np.int64), np.zeros(sub, np.int64), np.zeros(sub, np.float32), np.zeros(nsub, np.float32),
            np.zeros(nsub, np.float32), np.zeros(nsub, np.float32), np.zeros(nsub, np.int64), np.zeros(nsub, np.int64))


@njit(**_JIT)
def running_max(a, n):  # type: ignore[no-untyped-def]
    """``max = 0; for j: if (a[j] > max) max = a[j]`` over a[0:n] (a NaN never wins), as C keeps max_scale."""
    mx = _F0
    for j in range(n):
        if a[j] > mx:
            mx = a[j]
    return mx


@njit(**_JIT)
def q6_k_finish(x, off, o, pos, L, scales, sc8):  # type: ignore[no-untyped-def]
    """Q6_K's last pass on the block x[off:off+256] → o[pos:pos+210] (ql[128] qh[64] scales[16] d[2]) from its 16
    sub-block ``scales``: all zeros when the largest is below GROUP_MAX_EPS, else int8 scales from the largest by
    magnitude, every level again from its stored scale (a zero d keeps the search's), then the 4 + 2-bit packing."""
    max_abs_scale, max_scale = max_abs(scales, 0, 16)
    if max_abs_scale < _GROUP_MAX_EPS:
        o[pos : pos + 210] = 0
        return
    iscale = np.float32(-128.0) / max_scale
    d16 = fp32_to_fp16(_F1 / iscale)
    put16(o, pos + 208, d16)
    for ib in range(16):
        s8 = as_int8(min(127, nearest_int(iscale * scales[ib])))
        sc8[ib] = s8
        o[pos + 192 + ib] = s8 & 0xFF
    dh = fp16_to_fp32(d16)
    for j in range(16):
        d = dh * np.float32(sc8[j])
        if d == _F0:
            continue
        for ii in range(16):
            L[16 * j + ii] = max(-32, min(31, nearest_int(x[off + 16 * j + ii] / d))) + 32
    for half in range(2):
        j = 128 * half
        for l in range(32):
            q1 = L[j + l] & 0xF
            q2 = L[j + l + 32] & 0xF
            q3 = L[j + l + 64] & 0xF
            q4 = L[j + l + 96] & 0xF
            o[pos + 64 * half + l] = q1 | (q3 << 4)
            o[pos + 64 * half + l + 32] = q2 | (q4 << 4)
            o[pos + 128 + 32 * half + l] = ((L[j + l] >> 4) | ((L[j + l + 32] >> 4) << 2)
                                            | ((L[j + l + 64] >> 4) << 4) | ((L[j + l + 96] >> 4) << 6))
