"""Q8_0: 32 values in 34 bytes — d (fp16) = absmax / 127 | qs int8[32] = roundf(x / d); x = qs * d.

Quantized from float32 by numpy (`q8_0_numpy`, see there why), from F16 bits and as the fallback of odd blocks by
the shared 32-value loops (kind 0); ggml quantizes it without importance weights.
"""

from __future__ import annotations

from typing import Any

import numpy as np
from gguf import GGMLQuantizationType as Q
from gguf import LlamaFileType as F

from dflashkit.quant_types import FileType

from ..base import K, fp16_col
from ..blocks import Block32

#: blocks per pass of `q8_0_numpy`: its five float32 scratch arrays (2.5 MB) stay in the L2 cache
_Q8_0_STEP = 4096
_HALF_BELOW = np.nextafter(np.float32(0.5), np.float32(0.0))  # 0.49999997: trunc(v + this, signed) == roundf(v)
_HALF_BELOW_BITS = _HALF_BELOW.view(np.int32)
_SIGN_BIT = np.int32(-0x80000000)
_F1, _F127 = np.float32(1.0), np.float32(127.0)
_FLT_MIN = np.finfo(np.float32).tiny  # smallest normal float32


def q8_0_numpy(x: np.ndarray, out: np.ndarray) -> None:
    """quantize_row_q8_0_ref in numpy, for x float32 [n, 32] (C-contiguous) into out uint8 [n, 34].

    Why numpy and not a numba kernel like the other types: Q8_0 is simple enough for whole-array numpy
    operations (about 1.3 ns per value on two threads, as fast as the numba mirror), and `import numba` plus
    loading a cached kernel costs ~0.4 s of start-up, more than quantizing a 67 M-value tensor takes.

    Same float32 operations as C, so the same bytes: amax = max |x| (order-free for finite values),
    d = amax / 127, id = 1 / d (0 when d is 0), d stored as fp16 (numpy's round-to-nearest-even conversion,
    ggml's too), q = roundf(x * id) computed as trunc(x * id + copysign(0.49999997, x)), which equals
    round-half-away for every |v| < 2**23, then C's float -> int8 truncation. Blocks where C relies on
    platform behaviour — NaN / inf inputs, or a subnormal d whose reciprocal overflows or whose levels
    can leave int8 — go to the numba mirror of the C code (`loops.legacy_kernel`), a pass of blocks at a time.
    """
    n = x.shape[0]
    step = min(n, _Q8_0_STEP)
    absx = np.empty(step * 32, np.float32)
    pairs = np.empty(step * 16, np.float32)
    inv = np.empty(step, np.float32)
    v = np.empty((step, 32), np.float32)
    half = np.empty((step, 32), np.int32)
    out_d = out.view(np.uint16)[:, 0]  # the fp16 scale: first 2 bytes of each 34-byte block (rows stay 2-aligned)
    with np.errstate(all="ignore"):
        for lo in range(0, n, step):
            hi = min(n, lo + step)
            nb = hi - lo
            xs = x[lo:hi]
            a = absx[: nb * 32]
            np.abs(xs.reshape(-1), out=a)
            # per-block max by halving (pairs of neighbours stay inside a block): flat ops, no per-row loop
            m = pairs[: nb * 16]
            np.maximum(a[0::2], a[1::2], out=m)
            k = nb * 16
            while k > nb:
                k //= 2
                np.maximum(m[0 : 2 * k : 2], m[1 : 2 * k : 2], out=m[:k])
            amax = m[:nb]
            d = amax / _F127
            if not (np.isfinite(amax).all() and ((d == 0) | (d >= _FLT_MIN)).all()):
                K.legacy_kernel(xs, out[lo:hi], 0)  # K imports numba on this first use only
                continue
            iv = inv[:nb]
            np.divide(_F1, d, out=iv)
            iv[d == 0] = 0
            out_d[lo:hi] = d.astype(np.float16).view(np.uint16)
            vs, hs = v[:nb], half[:nb]
            np.multiply(xs, iv[:, None], out=vs)
            np.bitwise_and(xs.view(np.int32), _SIGN_BIT, out=hs)  # sign of x, which is the sign of x * id
            np.bitwise_or(hs, _HALF_BELOW_BITS, out=hs)
            np.add(vs, hs.view(np.float32), out=vs)
            np.copyto(out[lo:hi, 2:].view(np.int8), vs, casting="unsafe")  # |vs| < 128: truncation toward 0


class Q8_0(Block32, ggml_type=Q.Q8_0, kind=0, fp16_fields=(0,)):
    """d (fp16) = absmax / 127; qs = roundf(x / d) as int8."""

    _kernel = q8_0_numpy
    needs_numba = False
    file_types = (FileType("Q8_0", F.MOSTLY_Q8_0, Q.Q8_0, rank=80, converter_writes=True),)

    def dequantize_blocks(self, q: np.ndarray) -> np.ndarray:
        out = np.empty((q.shape[0], self.block_size), dtype=np.float32)
        self.dequantize_blocks_into(q, out)
        return out

    def dequantize_blocks_into(self, q: np.ndarray, out: np.ndarray) -> None:
        # float(qs) * d in float32; the ufunc casts the int8 levels in small buffers: one pass, no temporary array
        np.multiply(q[:, 2:].view(np.int8), fp16_col(q, 0), out=out, dtype=np.float32)

    def dequantize_torch(self, ops: Any, blocks: Any, out: Any) -> None:
        ops.scaled(out, blocks[:, 2:].view(ops.torch.int8), ops.fp16_field(blocks, 0))
