"""Triton source of the fused dequant + matmul (imported only by ``triton_kernels``, which guards the import).

One kernel for every type: a program owns ``BLOCK_N`` weight rows (output features) and ``BLOCK_M`` activation
rows, walks the row 256 values at a time (one K-quant super-block, or eight Q8_0 blocks), expands that weight
tile to float32 in registers from the raw ggml bytes and accumulates in float32:

- ``BLOCK_M == 1`` (matrix-vector): broadcast multiply + row sum, plain fp32 FMAs;
- ``BLOCK_M >= 16`` (the drafter's 16-64 rows): ``tl.dot``; with ``SPLIT`` the fp32 weight tile is split into
  hi + lo parts in the activations' 16-bit type (two MMAs), else one fp32 dot with ``DOT_PRECISION``.

The per-type ``_tile_*`` helpers mirror ggml's ``dequantize_row_*`` (and ``reference.py``) on a
``[BLOCK_N, 256]`` tile; ``QTYPE`` is the ggml type number, a compile-time constant.
"""

from __future__ import annotations

import triton
import triton.language as tl

QK = 256  # values per loop iteration
Q8_0, Q4_K, Q6_K = 8, 12, 14  # GGMLQuantizationType values
TYPE_BYTES = {Q8_0: 34, Q4_K: 144, Q6_K: 210}  # bytes per 32 (Q8_0) / 256 (K-quants) values


@triton.jit
def _f16_at(ptr, mask):
    """The little-endian fp16 at byte pointer(s) ``ptr`` as float32 (two byte loads: ggml blocks are 2-aligned)."""
    lo = tl.load(ptr, mask=mask, other=0).to(tl.uint16)
    hi = tl.load(ptr + 1, mask=mask, other=0).to(tl.uint16)
    return (lo | (hi << 8)).to(tl.float16, bitcast=True).to(tl.float32)


@triton.jit
def _tile_q8_0(rows, rmask, it, K, BLOCK_N: tl.constexpr):
    # block_q8_0 (34 bytes): d fp16 | qs int8[32]; x = qs * d. Eight blocks per 256-value step; the row may
    # end inside the step (K is only a multiple of 32), so blocks past K load as zero.
    b = it * 8 + tl.arange(0, 8)
    blk = rows[:, None] + b[None, :] * 34  # [BN, 8] byte pointers
    m = rmask[:, None] & (b[None, :] < K // 32)
    d = _f16_at(blk, m)
    j = tl.arange(0, 32)
    q = tl.load(blk[:, :, None] + 2 + j[None, None, :], mask=m[:, :, None], other=0)
    w = q.to(tl.int8, bitcast=True).to(tl.float32) * d[:, :, None]
    return tl.reshape(w, (BLOCK_N, 256))


@triton.jit
def _tile_q4_k(rows, rmask, it, BLOCK_N: tl.constexpr):
    # block_q4_K (144 bytes): d, dmin fp16 | scales[12] (get_scale_min_k4) | qs[128]. Sub-block s (32 values)
    # reads the low (s even) or high (s odd) nibbles of qs[32*(s//2) : 32*(s//2)+32];
    # x = (d * sc[s]) * q - (dmin * m[s]).
    sb = rows + it * 144
    d = _f16_at(sb, rmask)[:, None]
    dmin = _f16_at(sb + 2, rmask)[:, None]
    s = tl.arange(0, 8)
    sc_ptr = sb[:, None] + 4
    a = tl.load(sc_ptr + s[None, :], mask=rmask[:, None], other=0).to(tl.int32)  # scales[s]
    b = tl.load(sc_ptr + s[None, :] + 4, mask=rmask[:, None], other=0).to(tl.int32)  # scales[s + 4]
    c = tl.load(sc_ptr + s[None, :] % 4, mask=rmask[:, None], other=0).to(tl.int32)  # scales[s - 4] for s >= 4
    first = s[None, :] < 4
    sc = tl.where(first, a & 63, (b & 15) | ((c >> 6) << 4))
    mn = tl.where(first, b & 63, (b >> 4) | ((a >> 6) << 4))
    ds = (d * sc.to(tl.float32))[:, :, None]
    dm = (dmin * mn.to(tl.float32))[:, :, None]
    j = tl.arange(0, 32)
    s3 = s[None, :, None]
    qb = tl.load(sb[:, None, None] + 16 + (s3 // 2) * 32 + j[None, None, :], mask=rmask[:, None, None], other=0)
    q = (qb.to(tl.int32) >> ((s3 % 2) * 4)) & 15
    return tl.reshape(ds * q.to(tl.float32) - dm, (BLOCK_N, 256))


@triton.jit
def _tile_q6_k(rows, rmask, it, BLOCK_N: tl.constexpr):
    # block_q6_K (210 bytes): ql[128] | qh[64] | int8 scales[16] | d fp16; x = (d * sc[v // 16]) * (q - 32).
    # Value v = 128 h + 32 t + l: low 4 bits from ql[64 h + l + 32 (t % 2)] (nibble t // 2), high 2 bits
    # from qh[32 h + l] (bits 2t, 2t+1).
    sb = rows + it * 210
    d = _f16_at(sb + 208, rmask)[:, None, None]
    g = tl.arange(0, 16)  # scale group: values 16g .. 16g+15
    sc = tl.load(sb[:, None] + 192 + g[None, :], mask=rmask[:, None], other=0)
    ds = d * sc.to(tl.int8, bitcast=True).to(tl.float32)[:, :, None]
    v = g[:, None] * 16 + tl.arange(0, 16)[None, :]
    h = v // 128
    t = (v % 128) // 32
    l = v % 32
    base = sb[:, None, None]
    lm = rmask[:, None, None]
    ql = tl.load(base + (h * 64 + l + 32 * (t % 2))[None, :, :], mask=lm, other=0).to(tl.int32)
    qh = tl.load(base + (128 + h * 32 + l)[None, :, :], mask=lm, other=0).to(tl.int32)
    q = ((ql >> (4 * (t // 2))[None, :, :]) & 15) | (((qh >> (2 * t)[None, :, :]) & 3) << 4)
    return tl.reshape(ds * (q - 32).to(tl.float32), (BLOCK_N, 256))


@triton.jit
def qmm_kernel(x_ptr, w_ptr, out_ptr, M, N, K, row_bytes, stride_xm, stride_om,
               QTYPE: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
               SPLIT: tl.constexpr, DOT_PRECISION: tl.constexpr):
    """out[M, N] = x[M, K] @ dequant(w)[N, K].T with float32 accumulation; w is raw ggml rows of row_bytes."""
    pid_n = tl.program_id(0)
    pid_m = tl.program_id(1)
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    rmask = offs_n < N
    mmask = offs_m < M
    rows = w_ptr + offs_n.to(tl.int64) * row_bytes
    x_rows = x_ptr + offs_m.to(tl.int64)[:, None] * stride_xm
    k = tl.arange(0, 256)
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for it in range(0, tl.cdiv(K, 256)):
        kk = it * 256 + k
        xt = tl.load(x_rows + kk[None, :], mask=mmask[:, None] & (kk[None, :] < K), other=0)
        if QTYPE == 8:
            w = _tile_q8_0(rows, rmask, it, K, BLOCK_N)
        elif QTYPE == 12:
            w = _tile_q4_k(rows, rmask, it, BLOCK_N)
        else:
            w = _tile_q6_k(rows, rmask, it, BLOCK_N)
        if BLOCK_M == 1:
            acc += tl.sum(xt.to(tl.float32) * w, axis=1)[None, :]
        elif SPLIT:
            # w = hi + lo, both in the activations' 16-bit type: two native MMAs with exact 16-bit x carry
            # ~22 (fp16) / ~16 (bf16) bits of each weight, for fewer registers than an fp32 "tf32x3" dot.
            w_hi = w.to(xt.dtype)
            w_lo = (w - w_hi.to(tl.float32)).to(xt.dtype)
            acc = tl.dot(xt, tl.trans(w_hi), acc)
            acc = tl.dot(xt, tl.trans(w_lo), acc)
        else:
            acc = tl.dot(xt.to(tl.float32), tl.trans(w), acc, input_precision=DOT_PRECISION)
    out = out_ptr + offs_m.to(tl.int64)[:, None] * stride_om + offs_n[None, :]
    tl.store(out, acc.to(out_ptr.dtype.element_ty), mask=mmask[:, None] & rmask[None, :])
