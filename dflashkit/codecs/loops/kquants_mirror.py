"""The statement-by-statement mirror of ggml's K-quant quantizers: Q4_K, Q5_K and Q6_K one block at a time.

Transcriptions of ``quantize_row_q{4,5,6}_K_ref`` over ``make``'s ``make_qkx2_quants`` and ``make_qx_quants``
(rmse_type 1).
Not used by the QuantTypes (the lane kernels of ``kquants`` are several times faster): a readable
spec of what those compute, and the tests check both agree.
"""

from __future__ import annotations

import numpy as np

from .c_ops import _F0, _F_TENTH, _JIT, nearest_int, njit, put_d_dmin, put_k4_scale_min, require_inlined

from .make import make_qkx2_quants as _make_qkx2_quants
from .make import make_qx_quants as _make_qx_quants
from .make import q6_k_finish, running_max

#: sha256 of the files whose helpers these kernels inline: numba's cache is keyed on this file's text only, so a
#: change there has to change this line (`require_inlined`; python tools/rehash_kernels.py sets them)
INLINED_SHA256 = {"c_ops": "d0fe70f014628680", "make": "876b8b417226f1d1"}
require_inlined(__name__, INLINED_SHA256)


@njit(**_JIT)
def make_qkx2_quants(x, b, off, n, nmax, weights, L, Laux, rmin, rdelta, nstep):  # type: ignore[no-untyped-def]
    """ggml-quants.c make_qkx2_quants (use_mad = false) on x[b, off:off+n]; fills L[off:off+n]; returns (scale,
    the_min). The one transcription is ``make``'s (``mn`` updated in place by an accepted step, the later
    steps' iscale / (x - min) using the updated value, exactly as in C)."""
    return _make_qkx2_quants(x[b], off, n, nmax, weights, L, off, Laux, rmin, rdelta, nstep, False)


@njit(**_JIT)
def _qkx_superblock(x, b, out, nmax, rmin, rdelta, nstep, L, Laux, weights, scales, mins, ls, lm):  # type: ignore[no-untyped-def]
    """Shared body of quantize_row_q4_K_ref / q5_K_ref up to the final L (nmax = 15 or 31).

    Writes d, dmin and the 12 packed 6-bit scale/min bytes to out[b, 0:16]; leaves the quant levels in L.
    """
    for j in range(8):
        sum_x2 = _F0
        for l in range(32):
            v = x[b, 32 * j + l]
            sum_x2 += v * v
        av_x = np.sqrt(sum_x2 / np.float32(32))
        for l in range(32):
            weights[l] = av_x + abs(x[b, 32 * j + l])
        scales[j], mins[j] = make_qkx2_quants(x, b, 32 * j, 32, nmax, weights, L, Laux, rmin, rdelta, nstep)
    max_scale, max_min = running_max(scales, 8), running_max(mins, 8)
    inv_scale = np.float32(63) / max_scale if max_scale > _F0 else _F0
    inv_min = np.float32(63) / max_min if max_min > _F0 else _F0
    for k in range(12):
        out[b, 4 + k] = 0
    for j in range(8):
        s = min(63, nearest_int(inv_scale * scales[j]) & 0xFF)  # uint8_t ls = nearest_int(..); MIN(63, ls)
        m = min(63, nearest_int(inv_min * mins[j]) & 0xFF)
        ls[j] = s
        lm[j] = m
        put_k4_scale_min(out[b], 4, j, s, m)
    dh, dminh = put_d_dmin(out[b], 0, max_scale, max_min)
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
    _qk_scalar(x, out, 15, np.float32(-1.0), 20)


@njit(**_JIT)
def q5_k_scalar(x, out):  # type: ignore[no-untyped-def]
    """quantize_row_q5_K_ref: make_qkx2_quants(31, -0.5, 0.1, 15), low nibbles in qs, 5th bits in qh."""
    _qk_scalar(x, out, 31, np.float32(-0.5), 15)


@njit(**_JIT)
def _qk_scalar(x, out, nmax, rmin, nstep):  # type: ignore[no-untyped-def]
    """Q4_K (``nmax`` 15: 4-bit levels in qs) or Q5_K (31: low nibbles in qs, the 5th bits in qh), block by block."""
    L, Laux, weights, scales, mins, ls, lm = _qkx_scratch()
    for b in range(x.shape[0]):
        _qkx_superblock(x, b, out, nmax, rmin, _F_TENTH, nstep, L, Laux, weights, scales, mins, ls, lm)
        if nmax == 15:
            for jj in range(4):
                j = 64 * jj
                for l in range(32):
                    out[b, 16 + 32 * jj + l] = L[j + l] | (L[j + l + 32] << 4)
            continue
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
    """ggml-quants.c make_qx_quants with rmse_type = 1 and qw = NULL (weights x*x); fills L[off:off+n]
    (``make``'s transcription; the row itself stands in for the absent weights)."""
    return _make_qx_quants(x[b], off, n, nmax, L, off, 1, x[b], 0, False)


@njit(**_JIT)
def q6_k_scalar(x, out):  # type: ignore[no-untyped-def]
    """quantize_row_q6_K_ref: 16 sub-blocks of 16 via make_qx_quants(32, rmse 1), int8 scales, 6-bit levels.

    Layout: ql[128] qh[64] scales[16] d[2].
    """
    L = np.zeros(256, np.int64)
    scales = np.zeros(16, np.float32)
    sc8 = np.zeros(16, np.int64)
    for b in range(x.shape[0]):
        for ib in range(16):
            scales[ib] = make_qx_quants_rmse1(x, b, 16 * ib, 16, 32, L)
        q6_k_finish(x[b], 0, out[b], 0, L, scales, sc8)
