"""The tile moves the lane kernels share: a tile of 16-value sub-blocks laid out as lanes, each lane's first
largest |x|, the clamp of a float level, and the 2-bit packing of Q2_K / Q3_K levels read back from the lanes.

A lane kernel (``kquants``, ``lowbit_lanes``) works on ``xT[i, 16 * g + j]`` = value i of
sub-block j of super-block g of the tile, so that the loop over lanes is the inner, vectorised one. Kernels that
inline these helpers record this file's sha256 (``INLINED_SHA256``), as they do for ``c_ops``.
"""

from __future__ import annotations

import numpy as np

from .c_ops import _JIT, f32_as_u32, njit, u32_as_f32


@njit(**_JIT)
def gather_sub16(x, b0, n_sb, xT):  # type: ignore[no-untyped-def]
    """xT[i, 16 g + j] = x[b0 + g, 16 j + i] for the n_sb super-blocks of the tile at b0 (x: [n_blocks, 256]);
    returns how many are real (ng): a short last tile repeats its last super-block, whose lanes the caller
    discards."""
    ng = min(n_sb, x.shape[0] - b0)
    for g in range(n_sb):
        bb = b0 + min(g, ng - 1)
        for j in range(16):
            for i in range(16):
                xT[i, 16 * g + j] = x[bb, 16 * j + i]
    return ng


@njit(**_JIT)
def pick(ok, new, old):  # type: ignore[no-untyped-def]
    """``new if ok else old`` for float32, as a blend of the bits: numba lowers a conditional expression to branches,
    which LLVM's vectoriser turns into masked loads and stores — microcoded on AMD's cores, 3–4× a lane loop's time."""
    keep = np.uint32(0) - np.uint32(not ok)  # all ones where the old value stays
    return u32_as_f32(f32_as_u32(new) ^ ((f32_as_u32(new) ^ f32_as_u32(old)) & keep))


@njit(**_JIT)
def max_abs_lanes(xT, amax, mx):  # type: ignore[no-untyped-def]
    """Per lane, C's ``if (ax > amax) { amax = ax; max = x[i]; }`` from 0: the first largest |x| and its value
    (a NaN never wins)."""
    nl = xT.shape[1]
    # rows 2·(i % 2) (amax), 2·(i % 2) + 1 (max) are read at position i and the other two written, every lane:
    # "the new value or the old one" stored back where the old one was becomes a masked store, slow on AMD
    state = np.zeros((4, nl), np.float32)
    for i in range(xT.shape[0]):
        a = 2 * (i & 1)
        amax_in, mx_in, amax_out, mx_out = state[a], state[a + 1], state[2 - a], state[3 - a]
        for j in range(nl):
            v = xT[i, j]
            ax = abs(v)
            ok = ax > amax_in[j]
            amax_out[j] = pick(ok, ax, amax_in[j])
            mx_out[j] = pick(ok, v, mx_in[j])
    last = 2 * (xT.shape[0] & 1)
    for j in range(nl):
        amax[j] = state[last, j]
        mx[j] = state[last + 1, j]


@njit(**_JIT)
def pack_2bit_lanes(L, g, out, b, pos):  # type: ignore[no-untyped-def]
    """The low two bits of super-block g's levels (lanes 16 g .. 16 g + 15 of L [16, lanes]) packed as ggml packs
    Q2_K / Q3_K qs at out[b, pos:pos+64]: byte 32 h + l holds values 128 h + l + 32 s at bits 2 s (value
    k = 16 j + i is L[i, 16 g + j])."""
    for h in range(2):
        for l in range(32):
            q = 0
            for s in range(4):
                k = 128 * h + 32 * s + l
                q |= (np.int64(L[k % 16, 16 * g + k // 16]) & 3) << (2 * s)
            out[b, pos + 32 * h + l] = q


@njit(**_JIT)
def clampf(v, lo, hi):  # type: ignore[no-untyped-def]
    """MAX(lo, MIN(hi, v)) on float-valued levels (v is never NaN: it comes from nearest_int_f)."""
    if v < lo:
        v = lo
    if v > hi:
        v = hi
    return v
