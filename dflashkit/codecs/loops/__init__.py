"""Numba kernels that reproduce ggml's reference quantizers bit for bit.

Every kernel of the ``loops`` modules mirrors one C function of ggml (``ggml/src/ggml-quants.c``,
``ggml-impl.h``) in float32 and in the same per-element operation order, because that is what makes the bytes
equal:

- all arithmetic stays float32 (the float32 constants of ``c_ops``; int -> float conversions are explicit);
- sums run sequentially over element positions, as C's loops do (no pairwise / reassociated sums);
- no fast-math, so LLVM neither reassociates nor contracts a*b+c into an FMA (the golden files
  confirm ggml's reference build does not contract either);
- ``nearest_int`` is ggml's 12582912 bit trick (round-half-even, garbage beyond 2**22 exactly as C);
  ``roundf`` is round-half-away; C float -> int casts follow x86 ``cvttss2si`` (NaN / out of range -> INT_MIN).

The 32-value types and the scalar ``*_scalar`` K-quant kernels are statement-by-statement transcriptions.
The K-quant kernels used for real work run many sub-blocks side by side ("lanes", see ``kquants``)
so the sequential sums vectorise across blocks; each lane still performs C's exact sequence of operations.

The kernels live in one module per family of types, all taking C's scalar operations from one place:

- ``c_ops``: the numba options, float32 constants, bit casts, rounding, C casts and fp16 conversions;
- ``floats``: F32 -> F16 / BF16, BF16 -> F16 and the scans for values those cannot keep;
- ``legacy``: the 32-value types Q8_0, Q4_0, Q4_1, Q5_0, Q5_1 and their packings;
- ``legacy_f16``: the 32-value types straight from F16 bits, a block as LLVM vectors;
- ``kquants``: the lane kernels of Q4_K / Q5_K (`qk_kernel`), Q6_K and Q2_K without weights;
- ``kquants_mirror``: the scalar K-quant mirror (``*_scalar``, ``make_*_quants``);
- ``make``: the scale searches of the low-bit and weighted quantizers (``make_qx``, ``make_q3``,
  ``make_qkx2`` / ``make_qkx3``, ``make_qp``, ``best_index_int8``);
- ``lowbit``: Q2_K and Q3_K (their scalar mirrors), IQ4_NL and IQ4_XS without weights;
- ``lowbit_lanes``: the Q3_K lane kernel;
- ``weighted``: every type's importance-weighted row kernel (``quantize_row_*_impl``).

This module gathers their kernels under one name: the codecs reach them as ``base.K.<name>`` (imported on first
use) and the tests as ``loops.<name>``. numba's on-disk cache is keyed on the source file of the function
being compiled; a kernel inlines the ``c_ops`` helpers it calls, so each family module records that
file's sha256 and a change there changes them too (see ``c_ops``).

Kernels take C-contiguous ``x[n_blocks, block_size]`` float32 and write ``out[n_blocks, type_size]`` uint8;
they release the GIL so ``base.run_chunked`` can split blocks across threads.
"""

from __future__ import annotations

from .c_ops import (
    as_int8, c_f32_to_i32, c_roundf, f32_as_u32, fp16_to_fp32, fp32_to_fp16, nearest_int, nearest_int_f, put16,
    u32_as_f32,
)
from .floats import (
    bf16_f16_specials, bf16_to_f16_kernel, f16_to_f32_count, f16_to_f32_kernel, f32_to_bf16_kernel, f32_to_f16_kernel,
)
from .kquants import q2_k_kernel, q6_k_kernel, qk_kernel
from .kquants_mirror import make_qkx2_quants, make_qx_quants_rmse1, q4_k_scalar, q5_k_scalar, q6_k_scalar
from .legacy import legacy_kernel
from .lowbit import iq4_kernel, q2_k_scalar, q3_k_scalar
from .lowbit_lanes import q3_k_kernel
from .legacy_f16 import f16_to_f32_blocks, legacy_from_f16
from .weighted import (iq4_w_kernel, legacy_w_kernel, q23_k_w_kernel, q45_k_w_kernel,
                                q6_k_w_kernel)

__all__ = [
    # C's scalar operations
    "f32_as_u32", "u32_as_f32", "nearest_int", "nearest_int_f", "c_f32_to_i32", "c_roundf", "as_int8",
    "fp32_to_fp16", "fp16_to_fp32", "put16",
    # float types
    "f32_to_f16_kernel", "bf16_to_f16_kernel", "bf16_f16_specials", "f32_to_bf16_kernel", "f16_to_f32_kernel",
    "f16_to_f32_count", "f16_to_f32_blocks",
    # 32-value block types
    "legacy_kernel",
    "legacy_from_f16",
    # K-quants: the lane kernels the codecs run, and the scalar mirror
    "qk_kernel", "q6_k_kernel", "make_qkx2_quants", "q4_k_scalar", "q5_k_scalar", "make_qx_quants_rmse1", "q6_k_scalar",
    # the low-bit types, and every type's importance-weighted quantizer
    "q2_k_kernel", "q2_k_scalar", "q3_k_kernel", "q3_k_scalar", "iq4_kernel",
    "legacy_w_kernel", "q23_k_w_kernel", "q45_k_w_kernel", "q6_k_w_kernel", "iq4_w_kernel",
]
