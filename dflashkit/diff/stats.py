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
    acc = StatsAccumulator(chunk)
    acc.add(a, b)
    return acc.result()


class StatsAccumulator:
    """`tensor_stats` over a tensor pair fed in pieces (row blocks), so no whole float32 pair is needed.

    Pieces whose sizes are multiples of ``chunk`` (all but the last) give exactly the sums — and so the
    figures — of one call on the whole pair: the float64 sums run over the same element blocks in order.
    """

    def __init__(self, chunk: int = CHUNK_ELEMENTS) -> None:
        self.chunk = chunk
        self.n = 0
        self.sum_a2 = self.sum_b2 = self.sum_ab = self.sum_d2 = 0.0
        self.max_diff = 0.0
        self.bad_a = self.bad_b = 0
        self.lo_hi_a: tuple[float, float] | None = None
        self.lo_hi_b: tuple[float, float] | None = None
        self._bufs: tuple[np.ndarray, np.ndarray, np.ndarray] | None = None

    def add(self, a: np.ndarray, b: np.ndarray) -> None:
        fa, fb = a.reshape(-1), b.reshape(-1)
        if fa.size != fb.size:
            raise ValueError(f"piece sizes differ: {fa.size} vs {fb.size}")
        n, chunk = fa.size, self.chunk
        if self._bufs is None or self._bufs[0].size < min(chunk, max(n, 1)):
            # Preallocated float64 buffers + einsum dot products: no per-chunk allocations, float64 sums.
            self._bufs = tuple(np.empty(min(chunk, max(n, 1)), dtype=np.float64) for _ in range(3))  # type: ignore[assignment]
        buf_a, buf_b, buf_d = self._bufs  # type: ignore[misc]
        sum_a2 = sum_b2 = 0.0
        for start in range(0, n, chunk):
            m = min(chunk, n - start)
            ca, cb, d = buf_a[:m], buf_b[:m], buf_d[:m]
            ca[...] = fa[start : start + m]
            cb[...] = fb[start : start + m]
            with np.errstate(invalid="ignore"):  # inf - inf: counted as non-finite below
                np.subtract(ca, cb, out=d)
            x_a2, x_b2 = float(np.einsum("i,i->", ca, ca)), float(np.einsum("i,i->", cb, cb))
            self.sum_a2 += x_a2
            self.sum_b2 += x_b2
            sum_a2 += x_a2
            sum_b2 += x_b2
            self.sum_ab += float(np.einsum("i,i->", ca, cb))
            self.sum_d2 += float(np.einsum("i,i->", d, d))
            np.abs(d, out=d)
            self.max_diff = max(self.max_diff, float(d.max()))  # a NaN chunk is skipped here; see result()
        # finite sums ⇔ finite inputs (float32 squares cannot overflow float64): count only when needed
        if not all(math.isfinite(x) for x in (sum_a2, sum_b2)):
            self.bad_a += int(n - np.count_nonzero(np.isfinite(fa)))
            self.bad_b += int(n - np.count_nonzero(np.isfinite(fb)))
        if n:
            self.lo_hi_a = _merge(self.lo_hi_a, (float(np.min(fa)), float(np.max(fa))))
            self.lo_hi_b = _merge(self.lo_hi_b, (float(np.min(fb)), float(np.max(fb))))
        self.n += n

    def result(self) -> TensorStats:
        sum_a2, sum_b2, sum_ab, sum_d2 = self.sum_a2, self.sum_b2, self.sum_ab, self.sum_d2
        bad_a, bad_b, max_diff = self.bad_a, self.bad_b, self.max_diff
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
        min_a, max_a = self.lo_hi_a or (0.0, 0.0)
        min_b, max_b = self.lo_hi_b or (0.0, 0.0)
        return TensorStats(self.n, rel, max_diff, cosine, snr, min_a, max_a, min_b, max_b, bad_a, bad_b)


def _merge(old: tuple[float, float] | None, new: tuple[float, float]) -> tuple[float, float]:
    if old is None:
        return new
    # np.min/np.max propagate NaN: so does this merge
    lo = old[0] if math.isnan(old[0]) else new[0] if math.isnan(new[0]) else min(old[0], new[0])
    hi = old[1] if math.isnan(old[1]) else new[1] if math.isnan(new[1]) else max(old[1], new[1])
    return lo, hi
