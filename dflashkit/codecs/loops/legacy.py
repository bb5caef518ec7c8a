"""Numba kernels of the 32-value block types Q8_0, Q4_0, Q4_1, Q5_0 and Q5_1, and their packings.

Each is a statement-by-statement transcription of ggml's ``quantize_row_q8_0_ref`` / ``q4_0_ref`` / ``q4_1_ref``
/ ``q5_0_ref`` / ``q5_1_ref``: a block's scale from its signed absmax (or its min and max), stored as fp16, then one C
rounding per value and the type's packing. Kernels take ``x[n_blocks, 32]`` float32 and write
``out[n_blocks, type_size]`` uint8. Q8_0's codec runs numpy and calls `legacy_kernel` only for the passes
holding blocks whose C behaviour numpy cannot reproduce (see ``codecs/types/q8_0.py``: ``q8_0_numpy``).
"""

from __future__ import annotations

import numpy as np

from .c_ops import (
    _F0, _F1, _F_HALF, _JIT, as_int8, c_f32_to_i32, c_roundf, fp32_to_fp16, njit, put16, require_inlined,
)

#: sha256 of the files whose helpers these kernels inline: numba's cache is keyed on this file's text only, so a
#: change there has to change this line (`require_inlined`; python tools/rehash_kernels.py sets them)
INLINED_SHA256 = {"c_ops": "d0fe70f014628680"}
require_inlined(__name__, INLINED_SHA256)

#: bytes of a block by the kind every 32-value kernel takes (`legacy_kernel`, `legacy_f16.legacy_from_f16`,
#: `weighted.legacy_w_kernel`): 0 Q8_0, 1 Q4_0, 2 Q4_1, 3 Q5_0, 4 Q5_1
BLOCK_BYTES = (34, 18, 20, 22, 24)


@njit(**_JIT)
def _q8_0_block(x, b, o):  # type: ignore[no-untyped-def]
    """quantize_row_q8_0_ref on block b: d = amax/127 (fp16), q = roundf(x/d)."""
    amax = _F0
    for j in range(32):
        av = abs(x[b, j])
        amax = amax if amax > av else av  # MAX(amax, fabsf(v))
    d = amax / np.float32(127)
    idv = _F1 / d if d != _F0 else _F0
    put16(o, 0, fp32_to_fp16(d))
    for j in range(32):
        o[2 + j] = c_roundf(x[b, j] * idv) & 0xFF


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
def _signed_scale(x, b, o, divisor):  # type: ignore[no-untyped-def]
    """q4_0 / q5_0: d = the signed absmax / divisor, stored as fp16 at the block's start; returns 1/d (0 for 0)."""
    d = _signed_absmax(x, b, 32) / divisor
    put16(o, 0, fp32_to_fp16(d))
    return _F1 / d if d != _F0 else _F0


@njit(**_JIT)
def _min_scale(x, b, o, levels):  # type: ignore[no-untyped-def]
    """q4_1 / q5_1: d = (max - min) / levels and m = min, stored as fp16 at the block's start; returns (1/d, min)."""
    mn, mx = _min_max(x, b, 32)
    d = (mx - mn) / levels
    put16(o, 0, fp32_to_fp16(d))
    put16(o, 2, fp32_to_fp16(mn))
    return (_F1 / d if d != _F0 else _F0), mn


@njit(**_JIT)
def pack_q4(o, pos, L):  # type: ignore[no-untyped-def]
    """q4_0 / q4_1: the 32 codes L[0:32] (their low bytes) as nibbles at o[pos:pos+16], value j and j + 16 a byte."""
    for j in range(16):
        o[pos + j] = ((L[j] & 0xFF) | ((L[j + 16] & 0xFF) << 4)) & 0xFF


@njit(**_JIT)
def pack_q5(o, pos_qh, pos_qs, L):  # type: ignore[no-untyped-def]
    """q5_0 / q5_1: the 32 codes' low nibbles into qs at o[pos_qs:pos_qs+16], their 5th bits into the
    little-endian uint32 qh at o[pos_qh:pos_qh+4]."""
    qh = 0
    for j in range(16):
        xi0 = L[j] & 0xFF
        xi1 = L[j + 16] & 0xFF
        o[pos_qs + j] = (xi0 & 0x0F) | ((xi1 & 0x0F) << 4)
        qh |= ((xi0 & 0x10) >> 4) << j
        qh |= ((xi1 & 0x10) >> 4) << (j + 16)
    for k in range(4):
        o[pos_qh + k] = (qh >> (8 * k)) & 0xFF


@njit(**_JIT)
def legacy_kernel(x, out, kind):  # type: ignore[no-untyped-def]
    """quantize_row_{q8_0,q4_0,q4_1,q5_0,q5_1}_ref (``kind`` 0–4, `legacy_from_f16`'s numbering) of the blocks
    ``x[n_blocks, 32]`` into ``out[n_blocks, type_size]``. Q8_0: d = amax/127, q = roundf(x/d). Q4_0 / Q5_0: d =
    the signed absmax / -8 (-16), q = MIN(15 (31), (int8_t)(x/d + 8.5 (16.5))). Q4_1 / Q5_1: d = (max-min)/15
    (31), m = min, q = (int8_t)((x-min)/d + 0.5), MIN(15, …) for Q4_1."""
    L = np.empty(32, np.int64)
    for b in range(x.shape[0]):
        o = out[b]
        if kind == 0:
            _q8_0_block(x, b, o)
            continue
        if kind == 1 or kind == 3:
            idv = _signed_scale(x, b, o, np.float32(-8) if kind == 1 else np.float32(-16))
            nmax = 15 if kind == 1 else 31
            bias = np.float32(8.5) if kind == 1 else np.float32(16.5)
            for j in range(32):
                L[j] = min(nmax, as_int8(c_f32_to_i32(x[b, j] * idv + bias)))
        else:
            idv, mn = _min_scale(x, b, o, np.float32(15) if kind == 2 else np.float32(31))
            for j in range(32):
                v = c_f32_to_i32((x[b, j] - mn) * idv + _F_HALF)
                L[j] = min(15, as_int8(v)) if kind == 2 else v
        if kind <= 2:
            pack_q4(o, 2 if kind == 1 else 4, L)
        else:
            pack_q5(o, 2 if kind == 3 else 4, 6 if kind == 3 else 8, L)
