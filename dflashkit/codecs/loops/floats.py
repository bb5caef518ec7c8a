"""Numba kernels of the float types: float32 -> F16 / BF16, BF16 -> F16, F16 -> float32, and the scans that count the values
such a conversion cannot keep (NaN / inf, finite values past F16's 65504).

F32 -> F16 / BF16 mirror ggml's ``ggml_fp32_to_fp16_row`` / ``ggml_fp32_to_bf16_row_ref`` value by value;
BF16 -> F16 is numpy's ``astype(float16)`` of the exact float32 value, as gguf-py and llama.cpp's converter
write it. Kernels take flat arrays of values (or their bits) and release the GIL.
"""

from __future__ import annotations

import numpy as np

from .c_ops import _F_2M24, _JIT, f32_as_u32, fp32_to_fp16, njit, require_inlined, u32_as_f32

#: sha256 of the files whose helpers these kernels inline: numba's cache is keyed on this file's text only, so a
#: change there has to change this line (`require_inlined`; python tools/rehash_kernels.py sets them)
INLINED_SHA256 = {"c_ops": "d0fe70f014628680"}
require_inlined(__name__, INLINED_SHA256)


@njit(**_JIT)
def f32_to_f16_kernel(x, out):  # type: ignore[no-untyped-def]
    """ggml_fp32_to_fp16_row over a flat float32 array into uint16."""
    for i in range(x.shape[0]):
        out[i] = fp32_to_fp16(x[i])


@njit(**_JIT)
def bf16_to_f16_kernel(bits, out):  # type: ignore[no-untyped-def]
    """bfloat16 bits → IEEE half bits in one pass, as numpy's ``astype(float16)`` of the exact float32 value
    (gguf-py's and llama.cpp's converter's F16 output): round-to-nearest-even (`fp32_to_fp16`), and a NaN
    keeps its sign and top payload bits (numpy's rule; ggml's own conversion would write 0x7E00)."""
    for i in range(bits.shape[0]):
        b = np.int64(bits[i])
        if (b & 0x7F80) == 0x7F80 and (b & 0x007F) != 0:
            payload = ((b & 0x007F) << 16) >> 13  # float32 mantissa bits 22..13
            out[i] = ((b & 0x8000) | 0x7C00 | payload) if payload != 0 else ((b & 0x8000) | 0x7C01)
        else:
            out[i] = fp32_to_fp16(u32_as_f32(b << 16))


@njit(**_JIT)
def bf16_f16_specials(bits):  # type: ignore[no-untyped-def]
    """(NaN / inf values, finite values that round past F16's 65504) among bfloat16 ``bits``: a magnitude at or
    above 0x7F80 is not finite; a finite one at or above 0x4780 (65536; the bfloat16 below it is 65280) overflows."""
    nonfinite = 0
    beyond = 0
    for i in range(bits.shape[0]):
        m = bits[i] & 0x7FFF
        if m >= 0x4780:
            beyond += 1
            if m >= 0x7F80:
                nonfinite += 1
    return nonfinite, beyond - nonfinite


@njit(**_JIT)
def f32_to_bf16_kernel(x, out):  # type: ignore[no-untyped-def]
    """ggml_fp32_to_bf16_row_ref / ggml_compute_fp32_to_bf16 over flat uint32 bits into uint16."""
    for i in range(x.shape[0]):
        u = np.int64(x[i])
        if (u & 0x7FFFFFFF) > 0x7F800000:
            out[i] = (u >> 16) | 64  # NaN: keep sign and payload top, force quiet
        else:
            out[i] = ((u + (0x7FFF + ((u >> 16) & 1))) >> 16) & 0xFFFF


@njit(**_JIT)
def f16_to_f32_count(bits, out):  # type: ignore[no-untyped-def]
    """IEEE half bits → float32 (exact: ggml_compute_fp16_to_fp32, numpy's ``astype(float32)``) into ``out``;
    returns how many are NaN / ±inf: three candidate bit patterns and a choice among them per value (~2× the scalar
    `fp16_to_fp32` loop). The exact path of `legacy_f16.f16_to_f32_blocks` for runs holding NaN / ±inf."""
    nonfinite = 0
    for i in range(bits.shape[0]):
        h = np.uint32(bits[i])
        a = h & np.uint32(0x7FFF)
        normal = (a << np.uint32(13)) + np.uint32(0x38000000)  # exponent rebiased 15 → 127
        special = normal + np.uint32(0x38000000)  # exponent 31 → 255: ±inf / NaN, payload kept
        sub = f32_as_u32(np.float32(np.int32(a)) * _F_2M24)  # subnormal or zero: m · 2⁻²⁴, exact
        r = sub if a < np.uint32(0x400) else (special if a >= np.uint32(0x7C00) else normal)
        out[i] = u32_as_f32(r | ((h & np.uint32(0x8000)) << np.uint32(16)))
        nonfinite += a >= np.uint32(0x7C00)
    return nonfinite


@njit(**_JIT)
def f16_to_f32_kernel(bits, out):  # type: ignore[no-untyped-def]
    """`f16_to_f32_count` without the count (the `run_chunked` kernel shape)."""
    f16_to_f32_count(bits, out)
