"""The Q3_K lane kernel: quantize_row_q3_K_ref with make_q3_quants run on 128 sub-blocks side by side.

make_q3_quants refines one sub-block's levels value by value (each accepted change moves the sums the next value
is judged by) for up to five passes: a chain of dependent float32 operations, latency bound when run one sub-block
at a time (`_kernels_lowbit.q3_k_scalar`, the statement-by-statement mirror). Here column j of a [16, lanes] tile
is one sub-block: every lane still visits its values in C's order with C's operations, so the floats are the same
bit for bit, while the lane loop vectorises. A branch becomes a per-lane mask; a lane whose pass changed nothing
stops (C's ``break``) and keeps its levels. The scale codes are `_kernels_lowbit.q3_k_put_scales`, as the mirror's.

Takes ``x[n_blocks, 256]`` float32 and writes ``out[n_blocks, 110]`` uint8.
"""

from __future__ import annotations

import numpy as np

from ._kernels_c_ops import (
    _F0, _F1, _GROUP_MAX_EPS, _JIT, fp16_to_fp32, nearest_int_f, njit, require_recorded_sha256,
)
from ._kernels_lowbit import q3_k_get_scale, q3_k_put_scales
from ._kernels_tiles import clampf, gather_sub16, max_abs_lanes, pack_2bit_lanes
from . import _kernels_lowbit, _kernels_make, _kernels_tiles

#: sha256 of ``_kernels_c_ops.py``, ``_kernels_lowbit.py``, ``_kernels_tiles.py`` and ``_kernels_make.py``, whose
#: helpers this kernel inlines (numba's cache is keyed on this file's text only)
C_OPS_SHA256 = "7b23dae62d456d5e0b8c1772218738daa90cff1db2a739219283c3ae8a2c3ea2"
require_recorded_sha256(C_OPS_SHA256, __name__)
LOWBIT_SHA256 = "88baac598305efa33e7aeea8e8cc348008264502aeb1adbce859b7cf03f55533"
require_recorded_sha256(LOWBIT_SHA256, __name__, _kernels_lowbit.__file__)
TILES_SHA256 = "e1386752de51dbef5f49c9e8dd06f956f8cfa9ec6ed02e9ce6f023e7c9627444"
require_recorded_sha256(TILES_SHA256, __name__, _kernels_tiles.__file__)
MAKE_SHA256 = "90a2551bf0a17ad9b26077267a1ed48512c3f625b789bdbc46804d94e7593c6d"
require_recorded_sha256(MAKE_SHA256, __name__, _kernels_make.__file__)

_SB_3 = 8  # super-blocks per tile (16 lanes each -> 128 lanes)
_NL_3 = 16 * _SB_3
_FM4 = np.float32(-4.0)
_F3 = np.float32(3.0)
_F4 = np.float32(4.0)


@njit(**_JIT)
def _q3_refine_pass(xT, L, sumlx, suml2, active, changed):  # type: ignore[no-untyped-def]
    """One of make_q3_quants' refinement passes on every active lane: each value in turn tries the level its
    sums without it suggest, kept when it improves sumlx² / suml2 (its own function: inlined into the pass loop,
    LLVM does not vectorise it)."""
    nl = xT.shape[1]
    for i in range(16):
        for j in range(nl):
            xi = xT[i, j]
            w = xi * xi
            fli = L[i, j]
            slx = sumlx[j] - w * xi * fli
            sl2 = suml2[j] - w * fli * fli
            fnew = clampf(nearest_int_f(xi * sl2 / slx), _FM4, _F3)
            slx_new = slx + w * xi * fnew
            sl2_new = sl2 + w * fnew * fnew
            # C: if (slx > 0) { …; if (new_l != L[i]) { …; if (sl2 > 0 && slx*slx*suml2 > sumlx*sumlx*sl2) } },
            # as one mask (`&`, not `and`: no branch, so the lane loop vectorises)
            ok = ((active[j] != _F0) & (slx > _F0) & (fnew != fli) & (sl2_new > _F0)
                  & (slx_new * slx_new * suml2[j] > sumlx[j] * sumlx[j] * sl2_new))
            L[i, j] = fnew if ok else fli
            sumlx[j] = slx_new if ok else sumlx[j]
            suml2[j] = sl2_new if ok else suml2[j]
            changed[j] = _F1 if ok else changed[j]


@njit(**_JIT)
def _q3_lanes(xT, L, st):  # type: ignore[no-untyped-def]
    """make_q3_quants(16, 4, x, L, do_rmse = true) on every column of xT [16, lanes]: levels (float, 0..7, or 0 for
    a sub-block below GROUP_MAX_EPS) in L, the scale in st[0]; the other st rows are scratch."""
    nl = xT.shape[1]
    scale = st[0]
    amax = st[1]
    mx = st[2]
    sumlx = st[3]
    suml2 = st[4]
    active = st[5]
    changed = st[6]
    iscale = st[7]
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
    for _itry in range(5):
        for j in range(nl):
            changed[j] = _F0
        _q3_refine_pass(xT, L, sumlx, suml2, active, changed)
        still = False
        for j in range(nl):
            if changed[j] == _F0:
                active[j] = _F0  # C's `if (!n_changed) break;`, for this lane alone
            still = still or active[j] != _F0
        if not still:
            break
    for j in range(nl):
        flat = amax[j] < _GROUP_MAX_EPS
        scale[j] = _F0 if flat or not suml2[j] > _F0 else sumlx[j] / suml2[j]
        active[j] = _F1 if flat else _F0
    for i in range(16):
        for j in range(nl):
            L[i, j] = _F0 if active[j] != _F0 else L[i, j] + _F4


@njit(**_JIT)
def q3_k_kernel(x, out):  # type: ignore[no-untyped-def]
    """quantize_row_q3_K_ref on every super-block: lane 16 * g + j = sub-block j of super-block g of a tile (a short
    last tile repeats its last super-block; those lanes are discarded). The last pass (levels again from the
    decoded 6-bit scales where d is not 0, the high-bit mask, the 2-bit packing) runs on the lanes too."""
    xT = np.zeros((16, _NL_3), np.float32)
    L = np.zeros((16, _NL_3), np.float32)
    st = np.zeros((8, _NL_3), np.float32)
    vd = np.zeros(_NL_3, np.float32)
    nb = x.shape[0]
    for b0 in range(0, nb, _SB_3):
        ng = gather_sub16(x, b0, _SB_3, xT)
        _q3_lanes(xT, L, st)
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
                L[i, j] = L[i, j] if d == _F0 else clampf(nearest_int_f(xT[i, j] / d), _FM4, _F3) + _F4
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
