"""Numba kernels of ggml's importance-weighted quantizers: what ``ggml_quantize_chunk`` runs when llama-quantize has
an importance matrix (``quantize_row_*_impl`` of ``ggml-quants.c``) — Q4_0, Q4_1, Q5_0, Q5_1, Q2_K, Q3_K, Q4_K, Q5_K,
Q6_K, IQ4_NL and IQ4_XS. (Q8_0 takes no weights: ggml ignores them.)

Row kernels: ``kernel(x[rows, n], qw[n], out[rows, row_bytes])`` — the importance matrix holds one weight per
column, the same for every row, and the 32-value types' ``sigma2`` is the mean square of the whole row, so a row is
the unit here (`base.run_chunked` splits rows across threads). Statement-by-statement transcriptions; the shared
searches are `make`'s, the low-bit bodies `lowbit`'s.
"""

from __future__ import annotations

import numpy as np

from .c_ops import (_F0, _JIT, fp16_to_fp32, fp32_to_fp16, get_k4_scale_min, nearest_int, njit, put16,
                    put_k4_scale_min, require_inlined)
from .legacy import BLOCK_BYTES, pack_q4, pack_q5
from .lowbit import iq4_superblock, q2_k_finish, q3_k_finish, q3_k_put_scale
from .make import k_scratch, make_qkx3_quants, make_qp_quants, make_qx_quants, q6_k_finish

#: sha256 of the files whose helpers these kernels inline: numba's cache is keyed on this file's text only, so a
#: change there has to change this line (`require_inlined`; python tools/rehash_kernels.py sets them)
INLINED_SHA256 = {"c_ops": "d0fe70f014628680", "make": "876b8b417226f1d1", "lowbit": "412c81c01bfeb8be", "legacy": "7f2ab094f00e47eb"}
require_inlined(__name__, INLINED_SHA256)

_F_M09 = np.float32(-0.9)
_F_005 = np.float32(0.05)
_F2 = np.float32(2.0)
_F256 = np.float32(256.0)


@njit(**_JIT)
def _row_sigma2(xr):  # type: ignore[no-untyped-def]
    """``sum_x2 / n_per_row`` of the 32-value types' impls: the mean square of the whole row."""
    s = _F0
    for j in range(xr.shape[0]):
        s += xr[j] * xr[j]
    return s / np.float32(xr.shape[0])


@njit(**_JIT)
def _sigma_weights(xr, off, qw, n, sigma2, weight):  # type: ignore[no-untyped-def]
    """``weight[j] = qw[j] * sqrtf(sigma2 + x[j]*x[j])`` over x[off:off+n] and qw[off:off+n]; returns their sum
    (``sumw += weight[l]`` in order, as the K impls sum them after)."""
    for j in range(n):
        xj = xr[off + j]
        weight[j] = qw[off + j] * np.sqrt(sigma2 + xj * xj)
    sumw = _F0
    for j in range(n):
        sumw += weight[j]
    return sumw


@njit(**_JIT)
def _sum_sq(xr, off, n):  # type: ignore[no-untyped-def]
    """``sumx2 += x[j]*x[j]`` over x[off:off+n]."""
    s = _F0
    for j in range(n):
        s += xr[off + j] * xr[off + j]
    return s


@njit(**_JIT)
def legacy_w_kernel(x, qw, out, kind):  # type: ignore[no-untyped-def]
    """quantize_row_{q4_0,q4_1,q5_0,q5_1}_impl with weights (``kind`` 1, 2, 3, 4: `legacy_from_f16`'s numbering)."""
    L = np.zeros(32, np.int64)
    Laux = np.zeros(32, np.int64)
    weight = np.zeros(32, np.float32)
    ts = BLOCK_BYTES[kind]
    for r in range(x.shape[0]):
        xr = x[r]
        o = out[r]
        sigma2 = _row_sigma2(xr)
        for ib in range(xr.shape[0] // 32):
            _sigma_weights(xr, 32 * ib, qw, 32, sigma2, weight)
            pos = ib * ts
            if kind == 1 or kind == 3:
                d = make_qx_quants(xr, 32 * ib, 32, 8 if kind == 1 else 16, L, 0, 1, weight, 0, True)
                put16(o, pos, fp32_to_fp16(d))
                if kind == 1:
                    pack_q4(o, pos + 2, L)
                else:
                    pack_q5(o, pos + 2, pos + 6, L)
            else:
                d, mn = make_qkx3_quants(xr, 32 * ib, 32, 15 if kind == 2 else 31, weight, L, 0, Laux, _F_M09,
                                         _F_005, 36)
                put16(o, pos, fp32_to_fp16(d))
                put16(o, pos + 2, fp32_to_fp16(-mn))
                if kind == 2:
                    pack_q4(o, pos + 4, L)
                else:
                    pack_q5(o, pos + 4, pos + 8, L)


@njit(**_JIT)
def q23_k_w_kernel(x, qw, out, kind):  # type: ignore[no-untyped-def]
    """quantize_row_q2_K_impl (``kind`` 2) / quantize_row_q3_K_impl (3) over every super-block of every row."""
    scratch = k_scratch(16, 16)
    for r in range(x.shape[0]):
        for i in range(x.shape[1] // 256):
            if kind == 2:
                _q2_k_w_block(x[r], 256 * i, qw, out[r], 84 * i, scratch)
            else:
                _q3_k_w_block(x[r], 256 * i, qw, out[r], 110 * i, scratch)


@njit(**_JIT)
def _q2_k_w_block(xr, off, qw, o, pos, scratch):  # type: ignore[no-untyped-def]
    """quantize_row_q2_K_impl on one super-block: make_qkx3_quants per 16 with sigma-weights, make_qp_quants for
    the scales and the mins."""
    L, Laux, weight, scales, mins, sw, Ls, Lm = scratch
    sigma2 = _sum_sq(xr, off, 256) / _F256
    for j in range(16):
        sw[j] = _sigma_weights(xr, off + 16 * j, qw, 16, sigma2, weight)
        scales[j], mins[j] = make_qkx3_quants(xr, off + 16 * j, 16, 3, weight, L, 16 * j, Laux, _F_M09, _F_005, 36)
    d16 = fp32_to_fp16(make_qp_quants(16, 15, scales, Ls, sw))
    m16 = fp32_to_fp16(make_qp_quants(16, 15, mins, Lm, sw))
    put16(o, pos + 80, d16)
    put16(o, pos + 82, m16)
    for j in range(16):
        o[pos + j] = (Ls[j] | (Lm[j] << 4)) & 0xFF
    q2_k_finish(xr, off, o, pos, L, fp16_to_fp32(d16), fp16_to_fp32(m16))


@njit(**_JIT)
def _q3_k_w_block(xr, off, qw, o, pos, scratch):  # type: ignore[no-untyped-def]
    """quantize_row_q3_K_impl on one super-block: make_qx_quants(16, 4) per 16 with sigma-weights, the scales by
    make_qx_quants(32)."""
    L, _, weight, scales, _, sw, Ls, _ = scratch
    sigma2 = _F2 * _sum_sq(xr, off, 256) / _F256
    for j in range(16):
        sw[j] = _sigma_weights(xr, off + 16 * j, qw, 16, sigma2, weight)
        scales[j] = make_qx_quants(xr, off + 16 * j, 16, 4, L, 16 * j, 1, weight, 0, True)
    o[pos + 96 : pos + 108] = 0
    d_block = make_qx_quants(scales, 0, 16, 32, Ls, 0, 1, sw, 0, True)
    for j in range(16):
        q3_k_put_scale(o, pos + 96, j, Ls[j])
    put16(o, pos + 108, fp32_to_fp16(d_block))
    q3_k_finish(xr, off, o, pos, L)


@njit(**_JIT)
def q45_k_w_kernel(x, qw, out, nmax):  # type: ignore[no-untyped-def]
    """quantize_row_q4_K_impl (nmax 15) / q5_K_impl (nmax 31) with weights."""
    L, Laux, weight, scales, mins, sw, Ls, Lm = k_scratch(8, 32)
    ts = 144 if nmax == 15 else 176
    for r in range(x.shape[0]):
        xr = x[r]
        o = out[r]
        for i in range(xr.shape[0] // 256):
            off = 256 * i
            pos = ts * i
            sigma2 = _F2 * _sum_sq(xr, off, 256) / _F256
            for j in range(8):
                sw[j] = _sigma_weights(xr, off + 32 * j, qw, 32, sigma2, weight)
                scales[j], mins[j] = make_qkx3_quants(xr, off + 32 * j, 32, nmax, weight, L, 32 * j, Laux, _F_M09,
                                                      _F_005, 36)
            d_block = make_qp_quants(8, 63, scales, Ls, sw)
            m_block = make_qp_quants(8, 63, mins, Lm, sw)
            for k in range(12):
                o[pos + 4 + k] = 0
            for j in range(8):
                ls = Ls[j]
                lm = Lm[j]
                if nmax == 31:  # q5_K_impl clamps; q4_K_impl stores the uint8 as it is
                    ls = min(63, ls)
                    lm = min(63, lm)
                put_k4_scale_min(o, pos + 4, j, ls, lm)
            d16 = fp32_to_fp16(d_block)
            m16 = fp32_to_fp16(m_block)
            put16(o, pos, d16)
            put16(o, pos + 2, m16)
            dh = fp16_to_fp32(d16)
            mh = fp16_to_fp32(m16)
            for j in range(8):
                sc, m = get_k4_scale_min(o, pos + 4, j)
                d = dh * np.float32(sc)
                if d == _F0:
                    continue
                dm = mh * np.float32(m)
                for ii in range(32):
                    L[32 * j + ii] = max(0, min(nmax, nearest_int((xr[off + 32 * j + ii] + dm) / d)))
            if nmax == 15:
                for jj in range(4):
                    for l in range(32):
                        o[pos + 16 + 32 * jj + l] = (L[64 * jj + l] | (L[64 * jj + l + 32] << 4)) & 0xFF
            else:
                for j in range(32):
                    o[pos + 16 + j] = 0
                m1 = 1
                m2 = 2
                for nn in range(4):
                    for j in range(32):
                        l1 = L[64 * nn + j]
                        if l1 > 15:
                            l1 -= 16
                            o[pos + 16 + j] |= m1
                        l2 = L[64 * nn + j + 32]
                        if l2 > 15:
                            l2 -= 16
                            o[pos + 16 + j] |= m2
                        o[pos + 48 + 32 * nn + j] = l1 | (l2 << 4)
                    m1 <<= 2
                    m2 <<= 2


@njit(**_JIT)
def q6_k_w_kernel(x, qw, out):  # type: ignore[no-untyped-def]
    """quantize_row_q6_K_impl: make_qx_quants(16, 32, rmse 1) with the importance weights themselves."""
    L = np.zeros(256, np.int64)
    scales = np.zeros(16, np.float32)
    sc8 = np.zeros(16, np.int64)
    for r in range(x.shape[0]):
        xr = x[r]
        o = out[r]
        for i in range(xr.shape[0] // 256):
            off = 256 * i
            pos = 210 * i
            for ib in range(16):
                scales[ib] = make_qx_quants(xr, off + 16 * ib, 16, 32, L, 16 * ib, 1, qw, off + 16 * ib, True)
            q6_k_finish(xr, off, o, pos, L, scales, sc8)


@njit(**_JIT)
def iq4_w_kernel(x, qw, out, sbs):  # type: ignore[no-untyped-def]
    """quantize_iq4_nl (sbs 32) / quantize_iq4_xs (sbs 256) with weights."""
    L = np.zeros(sbs, np.int64)
    weight = np.zeros(32, np.float32)
    scales = np.zeros(sbs // 32, np.float32)
    trials = np.zeros((3, 16), np.float32)
    ts = 18 if sbs == 32 else 136
    for r in range(x.shape[0]):
        for ibl in range(x.shape[1] // sbs):
            iq4_superblock(x[r], sbs * ibl, sbs, out[r], ts * ibl, qw, sbs * ibl, True, L, weight, scales, trials)
