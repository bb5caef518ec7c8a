"""Q8_0 straight from F16 bits: a 32-value block decoded, scaled and rounded as whole LLVM vectors.

Why LLVM vector intrinsics and not a plain numba loop: LLVM unrolls a numba loop of 32 values into a scalar chain
before its vectoriser sees it, so the decode, the absmax and the rounding of a block ran one value at a time
(~1.3 ns a value; llama-quantize's own Q8_0 is no faster). Written as ``<32 x i16>`` / ``<32 x float>`` operations
they are a handful of AVX2 instructions each.

The operations are those of `legacy.q8_0_numpy` (which is byte-identical to ``quantize_row_q8_0_ref``): the
absmax of a block of finite F16 values is the largest magnitude's bits decoded (magnitude order is bit order);
``d = amax / 127`` and ``id = 1 / d`` (0 for 0) in float32, d stored as fp16 (`fp32_to_fp16`); each level is
``trunc(x * id + copysign(0.49999997, x))`` — C's ``roundf`` for every |v| < 2**23 — cast to int8. A block holding
NaN / ±inf goes through the exact F16 decode and the C mirror (`q8_0_kernel`), as in numpy's path.
"""

from __future__ import annotations

import numpy as np
from numba.core import cgutils

from ._kernels_c_ops import _JIT, intrinsic, ir, njit, require_recorded_sha256, types
from ._kernels_float import f16_to_f32_count
from ._kernels_legacy import q8_0_kernel

#: sha256 of ``_kernels_c_ops.py``, whose helpers these kernels inline (see ``_kernels_c_ops``)
C_OPS_SHA256 = "7b23dae62d456d5e0b8c1772218738daa90cff1db2a739219283c3ae8a2c3ea2"
require_recorded_sha256(C_OPS_SHA256, __name__)

_LANES = 32


def _vec_i32(value: int) -> ir.Constant:
    return ir.Constant(ir.VectorType(ir.IntType(32), _LANES), [value] * _LANES)


def _reduce(builder, name: str, vec, scalar):  # type: ignore[no-untyped-def]
    suffix = f"v{_LANES}{'i16' if isinstance(scalar, ir.IntType) else 'f32'}"
    fn = cgutils.get_or_insert_function(builder.module, ir.FunctionType(scalar, [vec.type]),
                                        f"llvm.vector.reduce.{name}.{suffix}")
    return builder.call(fn, [vec])


@intrinsic
def q8_0_block_from_f16(typingctx, bits, offset, out, out_offset):  # type: ignore[no-untyped-def]
    """Q8_0 of the 32 F16 values at ``bits[offset:]`` into the 34 bytes at ``out[out_offset:]``; returns their
    largest magnitude as F16 bits — at least 0x7C00 when the block holds NaN or ±inf, and then what was stored
    is meaningless (the caller writes that block again the C way)."""
    if not (isinstance(bits, types.Array) and bits.dtype == types.uint16 and isinstance(out, types.Array)
            and out.dtype == types.uint8):
        return None

    def codegen(context, builder, sig, args):  # type: ignore[no-untyped-def]
        f32, i16, i32 = ir.FloatType(), ir.IntType(16), ir.IntType(32)
        f32v, i32v, i16v = (ir.VectorType(t, _LANES) for t in (f32, i32, i16))
        src = context.make_array(sig.args[0])(context, builder, args[0]).data
        halves = builder.load(builder.bitcast(builder.gep(src, [args[1]]), ir.VectorType(ir.HalfType(), _LANES)
                                              .as_pointer()), align=2)
        magnitude = builder.and_(builder.bitcast(halves, i16v), ir.Constant(i16v, [0x7FFF] * _LANES))
        top = _reduce(builder, "umax", magnitude, i16)
        x = builder.fpext(halves, f32v)  # exact for every finite half (F16C's vcvtph2ps)
        # amax: the largest magnitude decoded (magnitude order is bit order); d = amax / 127, id = 1 / d or 0
        amax = builder.fpext(builder.bitcast(top, ir.HalfType()), f32)
        d = builder.fdiv(amax, ir.Constant(f32, 127.0))
        inv = builder.select(builder.fcmp_ordered("!=", d, ir.Constant(f32, 0.0)),
                             builder.fdiv(ir.Constant(f32, 1.0), d), ir.Constant(f32, 0.0))
        dst = context.make_array(sig.args[2])(context, builder, args[2]).data
        d_half = builder.bitcast(builder.fptrunc(d, ir.HalfType()), i16)  # round to nearest even, as ggml's
        builder.store(d_half, builder.bitcast(builder.gep(dst, [args[3]]), i16.as_pointer()), align=1)
        inv_v = builder.shuffle_vector(builder.insert_element(ir.Constant(f32v, ir.Undefined), inv,
                                                              ir.Constant(i32, 0)),
                                       ir.Constant(f32v, ir.Undefined), ir.Constant(i32v, [0] * _LANES))
        v = builder.fmul(x, inv_v)
        sign = builder.and_(builder.bitcast(x, i32v), _vec_i32(-0x80000000))
        half = builder.bitcast(builder.or_(sign, _vec_i32(0x3EFFFFFF)), f32v)  # ±0.49999997, the sign of x
        q = builder.fptosi(builder.fadd(v, half), i32v)
        q8 = builder.trunc(builder.trunc(q, i16v), ir.VectorType(ir.IntType(8), _LANES))
        level_at = builder.add(args[3], ir.Constant(args[3].type, 2))
        builder.store(q8, builder.bitcast(builder.gep(dst, [level_at]), q8.type.as_pointer()), align=1)
        return builder.zext(top, i32)

    return types.uint32(bits, offset, out, out_offset), codegen


@njit(**_JIT)
def q8_0_from_f16(bits, out):  # type: ignore[no-untyped-def]
    """F16 bits (flat uint16, whole 32-value blocks) → Q8_0 blocks (flat uint8, 34 bytes each), the bytes of
    ``quantize_row_q8_0_ref`` of their float32 values; returns how many values are NaN / ±inf."""
    nonfinite = 0
    scratch = np.empty((1, 32), np.float32)
    for b in range(bits.shape[0] // 32):
        if q8_0_block_from_f16(bits, b * 32, out, b * 34) >= 0x7C00:  # NaN / ±inf: C's behaviour, value by value
            nonfinite += f16_to_f32_count(bits[b * 32:(b + 1) * 32], scratch[0])
            q8_0_kernel(scratch, out[b * 34:(b + 1) * 34].reshape(1, 34))
    return nonfinite
