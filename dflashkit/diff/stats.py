"""Error statistics of one tensor pair, accumulated in float64 over chunks (no full float64 copies)."""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

CHUNK_ELEMENTS = 1 << 16  # float64 work buffers of 512 KB each: cache-resident, whatever the tensor size


@dataclass(frozen=True)
class TensorStats:
    """A is the reference: errors are relative to ‖a‖."""

    n_elements: int
    rel_rms: float  # ‖a−b‖ / ‖a‖ (0 when equal; inf when a is all zero and b is not)
    max_abs_diff: float
    cosine: float  # a·b / (‖a‖‖b‖); exactly 1.0 when a == b
    snr_db: float  # 10·log10(‖a‖² / ‖a−b‖²); inf when a == b
    min_a: float
    max_a: float
    min_b: float
    max_b: float
    nonfinite_a: int = 0
    nonfinite_b: int = 0

    @property
    def identical(self) -> bool:
        return self.max_abs_diff == 0.0 and self.nonfinite_a == self.nonfinite_b == 0


def tensor_stats(a: np.ndarray, b: np.ndarray, *, chunk: int = CHUNK_ELEMENTS) -> TensorStats:
    """Compare two float32 arrays of one shape."""
    if a.shape != b.shape:
        raise ValueError(f"shapes differ: {a.shape} vs {b.shape}")
    fa, fb = a.reshape(-1), b.reshape(-1)
    n = fa.size
    # Preallocated float64 buffers + einsum dot products: no per-chunk allocations, float64 sums.
    buf_a, buf_b, buf_d = (np.empty(min(chunk, max(n, 1)), dtype=np.float64) for _ in range(3))
    sum_a2 = sum_b2 = sum_ab = sum_d2 = 0.0
    max_diff = 0.0
    for start in range(0, n, chunk):
        m = min(chunk, n - start)
        ca, cb, d = buf_a[:m], buf_b[:m], buf_d[:m]
        ca[...] = fa[start : start + m]
        cb[...] = fb[start : start + m]
        with np.errstate(invalid="ignore"):  # inf - inf: counted as non-finite below
            np.subtract(ca, cb, out=d)
        sum_a2 += float(np.einsum("i,i->", ca, ca))
        sum_b2 += float(np.einsum("i,i->", cb, cb))
        sum_ab += float(np.einsum("i,i->", ca, cb))
        sum_d2 += float(np.einsum("i,i->", d, d))
        np.abs(d, out=d)
        max_diff = max(max_diff, float(d.max()))  # a NaN chunk is skipped here; see below

    # finite sums ⇔ finite inputs (float32 squares cannot overflow float64): count only when needed
    bad_a = bad_b = 0
    if not all(math.isfinite(x) for x in (sum_a2, sum_b2)):
        bad_a = int(n - np.count_nonzero(np.isfinite(fa)))
        bad_b = int(n - np.count_nonzero(np.isfinite(fb)))

    if bad_a or bad_b:  # a NaN/inf somewhere: no meaningful error figures
        rel = cosine = snr = max_diff = math.nan
    elif sum_d2 == 0.0:
        rel, cosine, snr = 0.0, 1.0, math.inf
    elif sum_a2 == 0.0:  # reference all zeros, b not
        rel, cosine, snr = math.inf, 0.0, -math.inf
    else:
        rel = math.sqrt(sum_d2 / sum_a2)
        denom = math.sqrt(sum_a2) * math.sqrt(sum_b2)
        cosine = max(-1.0, min(1.0, sum_ab / denom)) if denom > 0 else 0.0
        snr = 10 * math.log10(sum_a2 / sum_d2)

    def lo_hi(x: np.ndarray) -> tuple[float, float]:
        return (float(np.min(x)), float(np.max(x))) if x.size else (0.0, 0.0)

    min_a, max_a = lo_hi(fa)
    min_b, max_b = lo_hi(fb)
    return TensorStats(n, rel, max_diff, cosine, snr, min_a, max_a, min_b, max_b, bad_a, bad_b)
