"""Numba kernels of Q2_K, Q3_K, IQ4_NL and IQ4_XS as ``ggml_quantize_chunk`` runs them without an importance
matrix: ``quantize_row_q2_K_ref`` (block by block: the codec runs
``kquants.q2_k_kernel``'s lanes), ``quantize_row_q3_K_ref`` (likewise: ``lowbit_lanes``), and for the IQ4 types
``quantize_iq4_nl`` / ``quantize_iq4_xs`` (``quantize_row_iq4_nl_impl`` with 7 trial scales: what
llama-quantize writes; ``quantize_row_iq4_nl_ref``'s single pass is not). The per-block bodies take a 1-D input
and output with offsets (C's pointers), so `weighted`'s row kernels run the same bodies with weights.

Block kernels take ``x[n_blocks, block]`` float32 and write ``out[n_blocks, type_size]`` uint8.
"""

from __future__ import annotations

import numpy as np

from .c_ops import (
    _F0, _F1, _F_TENTH, _JIT, as_int8, fp16_to_fp32, fp32_to_fp16, nearest_int, njit,
    put16, require_inlined,
)
from .make import best_index_int8, k_scratch, make_q3_quants, make_qkx2_quants, max_abs, running_max

#: sha256 of the files whose helpers these kernels inline: numba's cache is keyed on this file's text only, so a
#: change there has to change this line (`require_inlined`; python tools/rehash_kernels.py sets them)
INLINED_SHA256 = {"c_ops": "d0fe70f014628680", "make": "876b8b417226f1d1"}
require_inlined(__name__, INLINED_SHA256)

KVALUES_IQ4NL = np.array([-127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113], dtype=np.int8)
_F15 = np.float32(15.0)


@njit(**_JIT)
def pack_2bit(L, o, pos):  # type: ignore[no-untyped-def]
    """Q2_K / Q3_K qs: ``qs[j/4 + l] = L[j+l] | L[j+l+32] << 2 | L[j+l+64] << 4 | L[j+l+96] << 6``."""
    for j in range(0, 256, 128):
        for l in range(32):
            o[pos + j // 4 + l] = (L[j + l] | (L[j + l + 32] << 2) | (L[j + l + 64] << 4) | (L[j + l + 96] << 6)) & 0xFF


@njit(**_JIT)
def q2_k_ref_block(x, off, o, pos, L, Laux, weights, scales, mins):  # type: ignore[no-untyped-def]
    """quantize_row_q2_K_ref on one super-block x[off:off+256] into o[pos:pos+84] (scales, qs, d, dmin)."""
    for j in range(16):
        for l in range(16):
            weights[l] = abs(x[off + 16 * j + l])
        scales[j], mins[j] = make_qkx2_quants(x, off + 16 * j, 16, 3, weights, L, 16 * j, Laux, np.float32(-0.5),
                                              _F_TENTH, 15, True)
    for j in range(16):
        o[pos + j] = 0
    dh = q2_k_scale_codes(o, pos, scales, 0, 0)
    mh = q2_k_scale_codes(o, pos, mins, 0, 4)
    q2_k_finish(x, off, o, pos, L, dh, mh)


@njit(**_JIT)
def q2_k_scale_codes(o, pos, vals, voff, shift):  # type: ignore[no-untyped-def]
    """quantize_row_q2_K_ref's 4-bit codes of a super-block's 16 scales (shift 0) or mins (shift 4),
    vals[voff:voff+16], OR-ed into o[pos:pos+16] (zeroed by the caller), and their fp16 maximum / 15 at
    o[pos + 80 + shift // 2]; returns that maximum as the last pass decodes it."""
    mx = running_max(vals[voff:voff + 16], 16)
    if mx > _F0:
        iscale = _F15 / mx
        for j in range(16):
            o[pos + j] = (o[pos + j] | (nearest_int(iscale * vals[voff + j]) << shift)) & 0xFF
        h = fp32_to_fp16(mx / _F15)
    else:
        h = fp32_to_fp16(_F0)
    put16(o, pos + 80 + shift // 2, h)
    return fp16_to_fp32(h)


@njit(**_JIT)
def q2_k_finish(x, off, o, pos, L, dh, mh):  # type: ignore[no-untyped-def]
    """Q2_K's last pass (ref and impl alike): each sub-block's levels again from its stored 4-bit scale and min
    (``d = dh * (sc & 0xF)``, ``m = mh * (sc >> 4)``; a zero d keeps the search's levels), then the 2-bit packing."""
    for j in range(16):
        d = dh * np.float32(o[pos + j] & 0xF)
        if d == _F0:
            continue
        m = mh * np.float32(o[pos + j] >> 4)
        for ii in range(16):
            L[16 * j + ii] = max(0, min(3, nearest_int((x[off + 16 * j + ii] + m) / d)))
    pack_2bit(L, o, pos + 16)


@njit(**_JIT)
def q2_k_scalar(x, out):  # type: ignore[no-untyped-def]
    """quantize_row_q2_K_ref block by block: the mirror of `kquants.q2_k_kernel` (the lane kernel the codec
    runs), kept as the readable spec and checked against it in the tests."""
    L, Laux, weights, scales, mins, _, _, _ = k_scratch(16, 16)
    for b in range(x.shape[0]):
        q2_k_ref_block(x[b], 0, out[b], 0, L, Laux, weights, scales, mins)


@njit(**_JIT)
def q3_k_finish(x, off, o, pos, L):  # type: ignore[no-untyped-def]
    """The end of quantize_row_q3_K_ref / _impl once scales[12] and d are stored: levels from the decoded scales
    (where d is not 0), the high-bit mask and the 2-bit packing. Layout: hmask[32] qs[64] scales[12] d."""
    dh = fp16_to_fp32(np.int64(o[pos + 108]) | (np.int64(o[pos + 109]) << 8))
    for j in range(16):
        d = dh * np.float32(q3_k_get_scale(o, pos + 96, j))
        if d == _F0:
            continue
        for ii in range(16):
            L[16 * j + ii] = max(-4, min(3, nearest_int(x[off + 16 * j + ii] / d))) + 4
    for k in range(32):
        o[pos + k] = 0
    m = 0
    hm = 1
    for j in range(256):
        if L[j] > 3:
            o[pos + m] = (o[pos + m] | hm) & 0xFF
            L[j] -= 4
        m += 1
        if m == 32:
            m = 0
            hm <<= 1
    pack_2bit(L, o, pos + 32)


@njit(**_JIT)
def q3_k_get_scale(o, pos, j):  # type: ignore[no-untyped-def]
    """The signed 6-bit scale of sub-block j as the last pass decodes it from scales[12] at o[pos:pos+12]."""
    low = np.int64(o[pos + j] & 0xF) if j < 8 else np.int64(o[pos + j - 8] >> 4)
    high = (np.int64(o[pos + 8 + j % 4]) >> (2 * (j // 4))) & 3
    return as_int8((low | (high << 4)) - 32)


@njit(**_JIT)
def q3_k_put_scale(o, pos, j, l):  # type: ignore[no-untyped-def]
    """Store the 6-bit scale ``l`` (0..63) of sub-block j into scales[12] at o[pos:pos+12]."""
    if j < 8:
        o[pos + j] = l & 0xF
    else:
        o[pos + j - 8] = (o[pos + j - 8] | ((l & 0xF) << 4)) & 0xFF
    o[pos + j % 4 + 8] = (o[pos + j % 4 + 8] | ((l >> 4) << (2 * (j // 4)))) & 0xFF


@njit(**_JIT)
def q3_k_ref_block(x, off, o, pos, L, scales):  # type: ignore[no-untyped-def]
    """quantize_row_q3_K_ref on one super-block: make_q3_quants(16, 4, rmse) per sub-block, 6-bit signed scales."""
    for j in range(16):
        scales[j] = make_q3_quants(x, off + 16 * j, 16, 4, L, 16 * j, True)
    q3_k_put_scales(o, pos, scales, 0)
    q3_k_finish(x, off, o, pos, L)


@njit(**_JIT)
def q3_k_put_scales(o, pos, scales, soff):  # type: ignore[no-untyped-def]
    """quantize_row_q3_K_ref's scales[12] and d for the 16 sub-block scales scales[soff:soff+16], at o[pos+96:]
    and o[pos+108:]: 6-bit signed codes of -32 / (the first largest |scale|), d its inverse as fp16."""
    max_scale = max_abs(scales, soff, 16)[1]
    for k in range(12):
        o[pos + 96 + k] = 0
    if max_scale != _F0:
        iscale = np.float32(-32.0) / max_scale
        for j in range(16):
            l = as_int8(nearest_int(iscale * scales[soff + j]))  # int8_t l = nearest_int(...)
            q3_k_put_scale(o, pos + 96, j, max(-32, min(31, l)) + 32)
        put16(o, pos + 108, fp32_to_fp16(_F1 / iscale))
    else:
        put16(o, pos + 108, fp32_to_fp16(_F0))


@njit(**_JIT)
def q3_k_scalar(x, out):  # type: ignore[no-untyped-def]
    """quantize_row_q3_K_ref block by block: the mirror of `lowbit_lanes.q3_k_kernel` (the lane kernel the
    codec runs), kept as the readable spec and checked against it in the tests."""
    L = np.zeros(256, np.int64)
    scales = np.zeros(16, np.float32)
    for b in range(x.shape[0]):
        q3_k_ref_block(x[b], 0, out[b], 0, L, scales)


KVALUES_IQ4NL_F32 = KVALUES_IQ4NL.astype(np.float32)


@njit(**_JIT)
def iq4_trial_sums(x, xo, weight, trials):  # type: ignore[no-untyped-def]
    """The 16 scale trials of one 32-value block at once: for each inverse scale ``trials[0, t]``, Σ w·q·x into
    ``trials[1, t]`` and Σ w·q·q into ``trials[2, t]``, q = the level ``best_index_int8`` picks for id·x.

    Why not C's loop: ggml runs the trials one after another, each a binary search per value whose branches a
    random weight mispredicts. Here each trial is a lane: the sums of one trial still add the 32 values in C's
    order with C's products (bit for bit the same floats), but the 16 lanes advance together and the search is
    branch-free — the levels are sorted, so the last level not above id·x is found by 14 selects (a NaN passes
    every ``not <`` test and ends on the top pair, as C's search does), and C's ``x <= val[0]`` / ``x >= val[15]``
    early returns give what the final comparison gives there. LLVM vectorises the lanes: ~5× C's loop."""
    V = KVALUES_IQ4NL_F32
    for t in range(16):
        trials[1, t] = _F0
        trials[2, t] = _F0
    for j in range(32):
        xj = x[xo + j]
        w = weight[j]
        for t in range(16):
            al = trials[0, t] * xj
            vml = V[0]
            vmu = V[1]
            for k in range(1, 15):
                if not (al < V[k]):
                    vml = V[k]
                    vmu = V[k + 1]
            q = vml if al - vml < vmu - al else vmu
            wq = w * q
            trials[1, t] += wq * xj
            trials[2, t] += wq * q


@njit(**_JIT)
def iq4_superblock(x, off, sbs, o, pos, qw, qoff, has_w, L, weight, scales, trials):  # type: ignore[no-untyped-def]
    """quantize_row_iq4_nl_impl(sbs, 32, x + off, …, has_w ? qw + qoff : NULL, ntry = 7) into o[pos:]: IQ4_NL
    (sbs 32: d, qs[16]) or IQ4_XS (sbs 256: d, scales_h, scales_l[4], qs[128]). ``trials``: float32[3, 16] scratch
    (`iq4_trial_sums`): lane 0 is C's first pass (id = 1/d, d = -max/values[0]), lanes 1..15 its itry = -7..7."""
    values = KVALUES_IQ4NL
    v0 = np.float32(values[0])
    sigma2 = _F0
    for j in range(sbs):
        sigma2 += x[off + j] * x[off + j]
    sigma2 *= np.float32(2.0) / np.float32(sbs)
    q4 = pos + 2 if sbs == 32 else pos + 8
    for k in range(sbs // 2):
        o[q4 + k] = 0
    put16(o, pos, fp32_to_fp16(_F0))
    max_scale = _F0
    amax_scale = _F0
    nb = sbs // 32
    for ib in range(nb):
        xo = off + 32 * ib
        for j in range(32):
            xj = x[xo + j]
            weight[j] = qw[qoff + 32 * ib + j] * np.sqrt(sigma2 + xj * xj) if has_w else xj * xj
        amax, mx = max_abs(x, xo, 32)
        if amax < np.float32(1e-15):
            scales[ib] = _F0
            continue
        d = -mx / v0
        trials[0, 0] = _F1 / d
        for itry in range(-7, 8):
            trials[0, itry + 8] = np.float32(itry + values[0]) / mx
        # C's first pass also stores its levels in L: every branch below overwrites them before they are packed
        iq4_trial_sums(x, xo, weight, trials)
        sumqx = trials[1, 0]
        sumq2 = trials[2, 0]
        d = sumqx / sumq2 if sumq2 > _F0 else _F0
        best = d * sumqx
        for t in range(1, 16):  # C's order of comparisons: the sums do not depend on `best`
            sumqx = trials[1, t]
            sumq2 = trials[2, t]
            if sumq2 > _F0 and sumqx * sumqx > best * sumq2:
                d = sumqx / sumq2
                best = d * sumqx
        scales[ib] = d
        if abs(d) > amax_scale:
            amax_scale = abs(d)
            max_scale = d
    if nb > 1:
        o[pos + 2] = 0
        o[pos + 3] = 0
        scales_h = 0
        d = -max_scale / np.float32(32)
        put16(o, pos, fp32_to_fp16(d))
        idv = _F1 / d if d != _F0 else _F0
        for ib in range(nb):
            l = max(-32, min(31, nearest_int(idv * scales[ib])))
            dl = d * np.float32(l)
            idl = _F1 / dl if dl != _F0 else _F0
            for j in range(32):
                L[32 * ib + j] = best_index_int8(16, values, idl * x[off + 32 * ib + j])
            l += 32
            if ib % 2 == 0:
                o[pos + 4 + ib // 2] = l & 0xF
            else:
                o[pos + 4 + ib // 2] = (o[pos + 4 + ib // 2] | ((l & 0xF) << 4)) & 0xFF
            scales_h |= (l >> 4) << (2 * (ib % 8))
        put16(o, pos + 2, scales_h & 0xFFFF)
    else:
        put16(o, pos, fp32_to_fp16(scales[0]))
        idv = _F1 / scales[0] if scales[0] != _F0 else _F0
        for j in range(sbs):
            L[j] = best_index_int8(16, values, idv * x[off + j])
    for i in range(sbs // 32):
        for j in range(16):
            o[q4 + 16 * i + j] = (L[32 * i + j] | (L[32 * i + 16 + j] << 4)) & 0xFF


@njit(**_JIT)
def iq4_kernel(x, out):  # type: ignore[no-untyped-def]
    """quantize_iq4_nl / quantize_iq4_xs without weights: blocks of 32 (IQ4_NL) or 256 (IQ4_XS)."""
    sbs = x.shape[1]
    L = np.zeros(sbs, np.int64)
    weight = np.zeros(32, np.float32)
    scales = np.zeros(sbs // 32, np.float32)
    none = np.zeros(1, np.float32)
    trials = np.zeros((3, 16), np.float32)
    for b in range(x.shape[0]):
        iq4_superblock(x[b], 0, sbs, out[b], 0, none, 0, False, L, weight, scales, trials)
