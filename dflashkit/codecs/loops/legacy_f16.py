"""The 32-value block types straight from F16 bits: a block decoded, scaled, rounded and packed as LLVM vectors.

Why LLVM vector intrinsics and not a plain numba loop: LLVM unrolls a numba loop of 32 values into a scalar chain
before its vectoriser sees it, so the decode, the absmax and the rounding of a block ran one value at a time
(Q8_0 ~1.3 ns a value, Q4_0 ~2.8 ns; llama-quantize's are no faster). Written as ``<32 x half>`` / ``<32 x float>``
operations they are a handful of AVX2 instructions each.

Each is the float32 sequence of ggml's ``quantize_row_*_ref`` (the scalar mirrors in ``legacy``), for
blocks of finite values:

- the F16 values widen exactly (``fpext``, F16C's ``vcvtph2ps``);
- Q8_0 / Q4_0 / Q5_0: the largest magnitude is the largest of the values' bits with the sign cleared; Q4_0 / Q5_0
  take the signed value of the *first* element of that magnitude (C replaces it only on a strictly larger one),
  +0 when every magnitude is 0 (C's initial value); Q4_1 / Q5_1: min and max are the first element equal to the
  vector minimum / maximum (C's strict ``<`` / ``>`` from ±FLT_MAX keep the first of equal values, which decides
  the sign of a zero);
- ``d`` and ``id = d ? 1/d : 0`` in float32, stored as fp16 with round-to-nearest-even (ggml's conversion of a
  finite value); each level ``x·id + 8.5`` (…) truncated and clamped as C's ``MIN(15, (int8_t)…)``; Q8_0's
  ``roundf(x·id)`` as ``trunc(x·id + copysign(0.49999997, x))`` (`legacy.q8_0_numpy`'s identity, every |v| < 2²³);
- nibbles packed ``qs[j] = q[j] | q[j + 16] << 4`` and Q5's fifth bits as the 32-bit mask of the levels' bit 4.

A block holding NaN or ±inf is written again by the exact F16 decode and the scalar mirror, as C behaves there.
"""

from __future__ import annotations

import numpy as np
from numba.core import cgutils

from .c_ops import _JIT, intrinsic, ir, njit, require_inlined, types
from .floats import f16_to_f32_count
from .legacy import BLOCK_BYTES, legacy_kernel

#: sha256 of the files whose helpers these kernels inline: numba's cache is keyed on this file's text only, so a
#: change there has to change this line (`require_inlined`; python tools/rehash_kernels.py sets them)
INLINED_SHA256 = {"c_ops": "d0fe70f014628680", "floats": "faa0a59eac10e009", "legacy": "7f2ab094f00e47eb"}
require_inlined(__name__, INLINED_SHA256)

_LANES = 32
_F32, _I8, _I16, _I32 = ir.FloatType(), ir.IntType(8), ir.IntType(16), ir.IntType(32)
_F32V, _I8V, _I16V, _I32V = (ir.VectorType(t, _LANES) for t in (_F32, _I8, _I16, _I32))

#: type → (divisor of d, level offset, clamp, byte offsets of d, m, qh, qs; None where the type has none)
_LAYOUT = {
    "q8_0": (127.0, None, None, (0, None, None, 2)),
    "q4_0": (-8.0, 8.5, 15, (0, None, None, 2)),
    "q4_1": (15.0, 0.5, 15, (0, 2, None, 4)),
    "q5_0": (-16.0, 16.5, 31, (0, None, 2, 6)),
    "q5_1": (31.0, 0.5, None, (0, 2, 4, 8)),
}


def _splat(builder, scalar, vec_type):  # type: ignore[no-untyped-def]
    one = builder.insert_element(ir.Constant(vec_type, ir.Undefined), scalar, ir.Constant(_I32, 0))
    return builder.shuffle_vector(one, ir.Constant(vec_type, ir.Undefined), ir.Constant(_I32V, [0] * _LANES))


def _call(builder, name: str, ret, args):  # type: ignore[no-untyped-def]
    fn = cgutils.get_or_insert_function(builder.module, ir.FunctionType(ret, [a.type for a in args]), name)
    return builder.call(fn, args)


def _first_where(builder, mask, x):  # type: ignore[no-untyped-def]
    """The element of ``x`` at the first true lane of ``mask`` (lane 0 when none: the block is written again)."""
    bits = builder.bitcast(mask, _I32)
    lane = _call(builder, "llvm.cttz.i32", _I32, [bits, ir.Constant(ir.IntType(1), 0)])
    return builder.extract_element(x, builder.and_(lane, ir.Constant(_I32, _LANES - 1)))


def _min_max(builder, x):  # type: ignore[no-untyped-def]
    """The least and the greatest value of finite ``x`` (either zero of a tie of ±0): integer reductions over the
    bits made order-preserving (a negative value's magnitude bits flipped), which vectorise where float ones
    with NaN semantics do not."""
    bits = builder.bitcast(x, _I32V)
    flip = builder.and_(builder.ashr(bits, ir.Constant(_I32V, [31] * _LANES)), ir.Constant(_I32V, [0x7FFFFFFF] * _LANES))
    key = builder.xor(bits, flip)
    out = []
    for name in ("smin", "smax"):
        k = _call(builder, f"llvm.vector.reduce.{name}.v{_LANES}i32", _I32, [key])
        k = builder.xor(k, builder.and_(builder.ashr(k, ir.Constant(_I32, 31)), ir.Constant(_I32, 0x7FFFFFFF)))
        out.append(builder.bitcast(k, _F32))
    return out[0], out[1]


def _store(builder, base, offset, value, at: int) -> None:  # type: ignore[no-untyped-def]
    where = builder.gep(base, [builder.add(offset, ir.Constant(offset.type, at))])
    builder.store(value, builder.bitcast(where, value.type.as_pointer()), align=1)


def _fp16(builder, value):  # type: ignore[no-untyped-def]
    return builder.bitcast(builder.fptrunc(value, ir.HalfType()), _I16)  # round to nearest even, as ggml's


def _load_block(context, builder, sig, args):  # type: ignore[no-untyped-def]
    """The 32 halves at ``bits[offset:]`` (``args``: bits, offset, out, …): the output array's data pointer, their
    magnitudes (their bits, sign cleared), the largest as F16 bits (0x7C00 and up: NaN or ±inf among them) and the
    halves widened to float32 (exact for every finite half)."""
    src = context.make_array(sig.args[0])(context, builder, args[0]).data
    dst = context.make_array(sig.args[2])(context, builder, args[2]).data
    halves = builder.load(builder.bitcast(builder.gep(src, [args[1]]), ir.VectorType(ir.HalfType(), _LANES)
                                          .as_pointer()), align=2)
    magnitude = builder.and_(builder.bitcast(halves, _I16V), ir.Constant(_I16V, [0x7FFF] * _LANES))
    top = _call(builder, f"llvm.vector.reduce.umax.v{_LANES}i16", _I16, [magnitude])
    return dst, magnitude, top, builder.fpext(halves, _F32V)


def _block_codegen(kind: str):  # type: ignore[no-untyped-def]
    divisor, offset, clamp, (at_d, at_m, at_qh, at_qs) = _LAYOUT[kind]

    def codegen(context, builder, sig, args):  # type: ignore[no-untyped-def]
        dst, magnitude, top, x = _load_block(context, builder, sig, args)
        zero = ir.Constant(_F32, 0.0)
        if at_m is not None:  # min and max: the first element equal to each
            lo, hi = _min_max(builder, x)
            lo = _first_where(builder, builder.fcmp_ordered("==", x, _splat(builder, lo, _F32V)), x)
            hi = _first_where(builder, builder.fcmp_ordered("==", x, _splat(builder, hi, _F32V)), x)
            d = builder.fdiv(builder.fsub(hi, lo), ir.Constant(_F32, divisor))
            _store(builder, dst, args[3], _fp16(builder, lo), at_m)
            x = builder.fsub(x, _splat(builder, lo, _F32V))
        elif kind == "q8_0":
            d = builder.fdiv(builder.fpext(builder.bitcast(top, ir.HalfType()), _F32), ir.Constant(_F32, divisor))
        else:  # the signed value of the first element of the largest magnitude, +0 when all are 0
            first = _first_where(builder, builder.icmp_unsigned("==", magnitude, _splat(builder, top, _I16V)), x)
            signed = builder.select(builder.icmp_unsigned("==", top, ir.Constant(_I16, 0)), zero, first)
            d = builder.fdiv(signed, ir.Constant(_F32, divisor))
        inv = builder.select(builder.fcmp_ordered("!=", d, zero), builder.fdiv(ir.Constant(_F32, 1.0), d), zero)
        _store(builder, dst, args[3], _fp16(builder, d), at_d)
        v = builder.fmul(x, _splat(builder, inv, _F32V))
        if kind == "q8_0":
            sign = builder.and_(builder.bitcast(x, _I32V), ir.Constant(_I32V, [-0x80000000] * _LANES))
            v = builder.fadd(v, builder.bitcast(builder.or_(sign, ir.Constant(_I32V, [0x3EFFFFFF] * _LANES)), _F32V))
            q = builder.fptosi(v, _I32V)
            _store(builder, dst, args[3], builder.trunc(builder.trunc(q, _I16V), _I8V), at_qs)
            return builder.zext(top, _I32)
        q = builder.fptosi(builder.fadd(v, ir.Constant(_F32V, [offset] * _LANES)), _I32V)
        if clamp is not None:  # MIN(clamp, (int8_t)…): the value is 0 … clamp + 1 here
            limit = ir.Constant(_I32V, [clamp] * _LANES)
            q = builder.select(builder.icmp_signed("<", q, limit), q, limit)
        q8 = builder.trunc(builder.trunc(q, _I16V), _I8V)
        first16 = ir.Constant(ir.VectorType(_I32, 16), list(range(16)))
        last16 = ir.Constant(ir.VectorType(_I32, 16), list(range(16, 32)))
        low = builder.and_(builder.shuffle_vector(q8, q8, first16), ir.Constant(ir.VectorType(_I8, 16), [0x0F] * 16))
        high = builder.shl(builder.shuffle_vector(q8, q8, last16), ir.Constant(ir.VectorType(_I8, 16), [4] * 16))
        _store(builder, dst, args[3], builder.or_(low, high), at_qs)
        if at_qh is not None:  # the fifth bits: bit j of qh is level j's bit 4
            fifth = builder.icmp_unsigned("!=", builder.and_(q8, ir.Constant(_I8V, [0x10] * _LANES)),
                                          ir.Constant(_I8V, [0] * _LANES))
            _store(builder, dst, args[3], builder.bitcast(fifth, _I32), at_qh)
        return builder.zext(top, _I32)

    return codegen


def _block_intrinsic(kind: str):  # type: ignore[no-untyped-def]
    def typer(typingctx, bits, offset, out, out_offset):  # type: ignore[no-untyped-def]
        if not (isinstance(bits, types.Array) and bits.dtype == types.uint16 and isinstance(out, types.Array)
                and out.dtype == types.uint8):
            return None
        return types.uint32(bits, offset, out, out_offset), _block_codegen(kind)

    typer.__name__ = f"{kind}_block_from_f16"
    return intrinsic(typer)


@intrinsic
def _widen_block(typingctx, bits, offset, out):  # type: ignore[no-untyped-def]
    """The 32 F16 values at ``bits[offset:]`` widened into ``out[offset:]`` (float32); returns their largest
    magnitude as F16 bits (at least 0x7C00: NaN or ±inf among them, and what was stored is to be redone)."""
    if not (isinstance(bits, types.Array) and bits.dtype == types.uint16 and isinstance(out, types.Array)
            and out.dtype == types.float32):
        return None

    def codegen(context, builder, sig, args):  # type: ignore[no-untyped-def]
        dst, _, top, x = _load_block(context, builder, sig, args)
        builder.store(x, builder.bitcast(builder.gep(dst, [args[1]]), _F32V.as_pointer()), align=4)
        return builder.zext(top, _I32)

    return types.uint32(bits, offset, out), codegen


@njit(**_JIT)
def f16_to_f32_blocks(bits, out):  # type: ignore[no-untyped-def]
    """`f16_to_f32_count` (F16 bits → float32, exactly numpy's conversion; returns the NaN / ±inf count) 32 values
    at a time as one vector conversion; a run of 32 holding NaN or ±inf, and the tail, through the exact scalar
    decode (a vector conversion quiets a signalling NaN, numpy's keeps its bits)."""
    n = bits.shape[0]
    nonfinite = 0
    whole = n - n % 32
    for a in range(0, whole, 32):
        if _widen_block(bits, a, out) >= 0x7C00:
            nonfinite += f16_to_f32_count(bits[a:a + 32], out[a:a + 32])
    if whole < n:
        nonfinite += f16_to_f32_count(bits[whole:], out[whole:])
    return nonfinite


# One block of 32 F16 values at bits[offset:] into its bytes at out[out_offset:]; returns their largest magnitude
# as F16 bits — at least 0x7C00 when the block holds NaN or ±inf, and then what was stored is meaningless.
q8_0_block = _block_intrinsic("q8_0")
q4_0_block = _block_intrinsic("q4_0")
q4_1_block = _block_intrinsic("q4_1")
q5_0_block = _block_intrinsic("q5_0")
q5_1_block = _block_intrinsic("q5_1")


@njit(**_JIT)
def legacy_from_f16(bits, out, kind):  # type: ignore[no-untyped-def]
    """F16 bits (flat uint16, whole blocks) → blocks of the 32-value type ``kind`` (0 Q8_0, 1 Q4_0, 2 Q4_1, 3 Q5_0,
    4 Q5_1; flat uint8): quantize_row_*_ref's bytes of their values; returns how many values are NaN / ±inf. A block
    holding NaN / ±inf is written again: its exact decode (`f16_to_f32_count`, which counts them) into a one-block
    scratch, then C's scalar mirror over it. (The kind's branches cost nothing measurable: each type's own entry
    point with the kind a constant ran as fast, 2026-11-28.)"""
    size = BLOCK_BYTES[kind]
    nonfinite, scratch = 0, np.empty((1, 32), np.float32)
    for b in range(bits.shape[0] // 32):
        at = b * size
        if kind == 0:
            top = q8_0_block(bits, b * 32, out, at)
        elif kind == 1:
            top = q4_0_block(bits, b * 32, out, at)
        elif kind == 2:
            top = q4_1_block(bits, b * 32, out, at)
        elif kind == 3:
            top = q5_0_block(bits, b * 32, out, at)
        else:
            top = q5_1_block(bits, b * 32, out, at)
        if top >= 0x7C00:
            nonfinite += f16_to_f32_count(bits[b * 32:(b + 1) * 32], scratch[0])
            legacy_kernel(scratch, out[at:at + size].reshape(1, size), kind)
    return nonfinite
