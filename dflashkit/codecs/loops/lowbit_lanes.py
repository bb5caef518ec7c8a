"""The Q3_K lane kernel: quantize_row_q3_K_ref with make_q3_quants run on 128 sub-blocks side by side.

make_q3_quants refines one sub-block's levels value by value (each accepted change moves the sums the next value
is judged by) for up to five passes: a chain of dependent float32 operations, latency bound when run one sub-block
at a time (`lowbit.q3_k_scalar`, the statement-by-statement mirror). Here column j of a [16, lanes] tile
is one sub-block: every lane still visits its values in C's order with C's operations, so the floats are the same
bit for bit, while the lane loop vectorises. A branch becomes a per-lane mask; a lane whose pass changed nothing
stops (C's ``break``) and keeps its levels. The scale codes are `lowbit.q3_k_put_scales`, as the mirror's.

Takes ``x[n_blocks, 256]`` float32 and writes ``out[n_blocks, 110]`` uint8.
"""

from __future__ import annotations

import numpy as np

from .c_ops import (
    _F0, _F1, _GROUP_MAX_EPS, _JIT, fp16_to_fp32, nearest_int_f, njit, require_inlined,
)
from .lowbit import q3_k_get_scale, q3_k_put_scales
from .tiles import clampf, gather_sub16, max_abs_lanes, pack_2bit_lanes, pick

#: sha256 of the files whose helpers these kernels inline: numba's cache is keyed on this file's text only, so a
#: change there has to change this line (`require_inlined`; python tools/rehash_kernels.py sets them)
INLINED_SHA256 = {"c_ops": "d0fe70f014628680", "lowbit": "412c81c01bfeb8be", "tiles": "d0083257960fde1a", "make": "876b8b417226f1d1"}
require_inlined(__name__, INLINED_SHA256)

_SB_3 = 32  # super-blocks per tile (16 lanes each -> 512 lanes: the later passes' compact tile is fuller)
_NL_3 = 16 * _SB_3
_FM4 = np.float32(-4.0)
_F3 = np.float32(3.0)
_F4 = np.float32(4.0)


@njit(**_JIT)
def _q3_refine_pass(xT, L, L_out, sums, active, changed):  # type: ignore[no-untyped-def]
    """One of make_q3_quants' refinement passes on every active lane: each value in turn tries the level its
    sums without it suggest, kept when it improves sumlx² / suml2 (its own function: inlined into the pass loop,
    LLVM does not vectorise it). Levels are read from ``L`` and every one written to ``L_out``; value i reads
    sumlx / suml2 from rows 2·(i % 2), 2·(i % 2) + 1 of ``sums`` and writes the other two (they end in rows 0, 1):
    a store of "the new value or the old one" back where the old one was is turned by LLVM into a masked store,
    which AMD's cores run ~5× slower than the whole pass otherwise takes."""
    nl = xT.shape[1]
    for i in range(16):
        a = 2 * (i & 1)
        sumlx, suml2, sumlx_out, suml2_out = sums[a], sums[a + 1], sums[2 - a], sums[3 - a]
        for j in range(nl):
            xi = xT[i, j]
            w = xi * xi
            fli = L[i, j]
            sx = sumlx[j]
            s2 = suml2[j]
            slx = sx - w * xi * fli
            sl2 = s2 - w * fli * fli
            fnew = clampf(nearest_int_f(xi * sl2 / slx), _FM4, _F3)
            slx_new = slx + w * xi * fnew
            sl2_new = sl2 + w * fnew * fnew
            # C: if (slx > 0) { …; if (new_l != L[i]) { …; if (sl2 > 0 && slx*slx*suml2 > sumlx*sumlx*sl2) } },
            # as one mask (`&`, not `and`: no branch, so the lane loop vectorises)
            ok = ((active[j] != _F0) & (slx > _F0) & (fnew != fli) & (sl2_new > _F0)
                  & (slx_new * slx_new * s2 > sx * sx * sl2_new))
            L_out[i, j] = pick(ok, fnew, fli)
            sumlx_out[j] = pick(ok, slx_new, sx)
            suml2_out[j] = pick(ok, sl2_new, s2)
            changed[j] = changed[j] + pick(ok, _F1, _F0)


@njit(**_JIT)
def _q3_later_passes(xT, L, sums, active, m, lanes, scratch):  # type: ignore[no-untyped-def]
    """Passes 2 … 5 of make_q3_quants on the ``m`` lanes still active, gathered into their own tile: their levels
    and sums are refined there and put back into ``L`` / ``sums``; a lane that changes nothing in a pass stops.
    ``lanes`` (int64, a tile's lanes) and ``scratch`` (float32, 54 per lane) are the caller's: the compact tile's
    arrays are views of them (an allocation per tile cost a sixth of the kernel)."""
    nl = xT.shape[1]
    k = 0
    for j in range(nl):
        if active[j] != _F0:
            lanes[k] = j
            k += 1
    cx = scratch[: 16 * m].reshape(16, m)
    cl = scratch[16 * m: 32 * m].reshape(16, m)
    cl_alt = scratch[32 * m: 48 * m].reshape(16, m)
    csums = scratch[48 * m: 52 * m].reshape(4, m)
    cact = scratch[52 * m: 53 * m]
    cchanged = scratch[53 * m: 54 * m]
    for i in range(16):
        for c in range(m):
            cx[i, c] = xT[i, lanes[c]]
            cl[i, c] = L[i, lanes[c]]
    for c in range(m):
        csums[0, c] = sums[0, lanes[c]]
        csums[1, c] = sums[1, lanes[c]]
        cact[c] = _F1
    odd = False  # the levels are in cl_alt after an odd number of passes
    for _itry in range(4):
        for c in range(m):
            cchanged[c] = _F0
        if odd:
            _q3_refine_pass(cx, cl_alt, cl, csums, cact, cchanged)
        else:
            _q3_refine_pass(cx, cl, cl_alt, csums, cact, cchanged)
        odd = not odd
        still = False
        for c in range(m):
            if cchanged[c] == _F0:
                cact[c] = _F0
            still = still or cact[c] != _F0
        if not still:
            break
    for i in range(16):
        for c in range(m):
            L[i, lanes[c]] = cl_alt[i, c] if odd else cl[i, c]
    for c in range(m):
        sums[0, lanes[c]] = csums[0, c]
        sums[1, lanes[c]] = csums[1, c]


@njit(**_JIT)
def _q3_lanes(xT, L, L_alt, sums, st, lanes, scratch):  # type: ignore[no-untyped-def]
    """make_q3_quants(16, 4, x, L, do_rmse = true) on every column of xT [16, lanes]: levels (float, 0..7, or 0 for
    a sub-block below GROUP_MAX_EPS) in L, the scale in st[0]; the other st rows, ``L_alt`` [16, lanes],
    ``sums`` [4, lanes] and `_q3_later_passes`' ``lanes`` / ``scratch`` are scratch."""
    nl = xT.shape[1]
    scale = st[0]
    amax = st[1]
    mx = st[2]
    sumlx = sums[0]
    suml2 = sums[1]
    active = st[3]
    changed = st[4]
    iscale = st[5]
    max_abs_lanes(xT, amax, mx)
    for j in range(nl):
        active[j] = _F0 if amax[j] < _GROUP_MAX_EPS else _F1  # C returns early: L = 0, scale 0
        iscale[j] = _FM4 / mx[j]
        sumlx[j] = _F0
        suml2[j] = _F0
    for i in range(16):
        for j in range(nl):
            xi = xT[i, j]
            fl = clampf(nearest_int_f(iscale[j] * xi), _FM4, _F3)
            L[i, j] = fl
            w = xi * xi
            sumlx[j] += w * xi * fl
            suml2[j] += w * fl * fl
    # the first pass on every lane; about a fifth of the lanes change a level in it and go on, so the later passes
    # run on those lanes alone, gathered into a tile of their own (each lane's operations are the same wherever
    # it sits: the floats do not change)
    for j in range(nl):
        changed[j] = _F0
    _q3_refine_pass(xT, L, L_alt, sums, active, changed)
    m = 0
    for j in range(nl):
        if changed[j] == _F0:
            active[j] = _F0  # C's `if (!n_changed) break;`, for this lane alone
        else:
            m += 1
    for i in range(16):
        for j in range(nl):
            L[i, j] = L_alt[i, j]
    if m > 0:
        _q3_later_passes(xT, L, sums, active, m, lanes, scratch)
    for j in range(nl):
        flat = amax[j] < _GROUP_MAX_EPS
        scale[j] = _F0 if flat or not suml2[j] > _F0 else sumlx[j] / suml2[j]
        active[j] = _F1 if flat else _F0
    for i in range(16):
        for j in range(nl):
            L[i, j] = pick(active[j] != _F0, _F0, L[i, j] + _F4)


@njit(**_JIT)
def q3_k_kernel(x, out):  # type: ignore[no-untyped-def]
    """quantize_row_q3_K_ref on every super-block: lane 16 * g + j = sub-block j of super-block g of a tile (a short
    last tile repeats its last super-block; those lanes are discarded). The last pass (levels again from the
    decoded 6-bit scales where d is not 0, the high-bit mask, the 2-bit packing) runs on the lanes too."""
    xT = np.zeros((16, _NL_3), np.float32)
    L = np.zeros((16, _NL_3), np.float32)
    L_alt = np.zeros((16, _NL_3), np.float32)
    sums = np.zeros((4, _NL_3), np.float32)
    st = np.zeros((6, _NL_3), np.float32)
    lanes = np.zeros(_NL_3, np.int64)
    scratch = np.zeros(54 * _NL_3, np.float32)
    vd = np.zeros(_NL_3, np.float32)
    nb = x.shape[0]
    for b0 in range(0, nb, _SB_3):
        ng = gather_sub16(x, b0, _SB_3, xT)
        _q3_lanes(xT, L, L_alt, sums, st, lanes, scratch)
        scales = st[0]
        for g in range(ng):
            b = b0 + g
            q3_k_put_scales(out[b], 0, scales, 16 * g)
            dh = fp16_to_fp32(np.int64(out[b, 108]) | (np.int64(out[b, 109]) << 8))
            for j in range(16):
                vd[16 * g + j] = dh * np.float32(q3_k_get_scale(out[b], 96, j))
        for i in range(16):
            for j in range(16 * ng):
                d = vd[j]  # d == 0 keeps the search's levels, as C does
                L[i, j] = pick(d == _F0, L[i, j], clampf(nearest_int_f(xT[i, j] / d), _FM4, _F3) + _F4)
        for g in range(ng):
            b = b0 + g
            # value k = 16 j + i: its third bit in hmask[k % 32] bit k // 32, its low two bits in qs
            for m in range(32):
                h = 0
                for s in range(8):
                    k = 32 * s + m
                    h |= np.int64(L[k % 16, 16 * g + k // 16] > _F3) << s
                out[b, m] = h
            pack_2bit_lanes(L, g, out, b, 32)
