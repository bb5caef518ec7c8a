"""Paired statistics over prompts: the bootstrap interval every comparison in dflashkit reports.

Each prompt gives one number per arm (τ of drafter A and of drafter B; decode speed with and without a drafter);
the arms are compared through the per-prompt differences (or log ratios), resampled with replacement.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Sequence

import numpy as np

CONFIDENCE = 0.95
BOOTSTRAP_RESAMPLES = 10_000
BOOTSTRAP_CHUNK = 1 << 21  # indices drawn at once (16 MiB of int64, as much again of values)


def paired_bootstrap_ci(diffs: Sequence[float], *, seed: int = 0, resamples: int = BOOTSTRAP_RESAMPLES,
                        confidence: float = CONFIDENCE) -> tuple[float, float] | None:
    """Percentile interval of the mean of ``diffs`` (per-prompt paired differences); None below 2 prompts."""
    d = np.asarray(diffs, dtype=np.float64)
    if d.size < 2:
        return None
    rng = np.random.default_rng(seed)
    # resamples drawn in chunks of at most BOOTSTRAP_CHUNK indices: the same stream of draws (a Generator fills
    # an array element by element, so consecutive row blocks are the rows of one draw), bounded memory at any n
    rows = max(1, BOOTSTRAP_CHUNK // d.size)
    means = np.concatenate([d[rng.integers(0, d.size, size=(min(rows, resamples - start), d.size))].mean(axis=1)
                            for start in range(0, resamples, rows)])
    alpha = (1 - confidence) / 2
    lo, hi = np.quantile(means, [alpha, 1 - alpha])
    return float(lo), float(hi)


@dataclass
class Comparison:
    """A drafter against the first one, over the prompts where both ran at least one round."""

    delta: float  # τ − τ(first), mean of the per-prompt differences
    relative: float  # delta / τ(first) over the same prompts
    ci: tuple[float, float] | None
    n_prompts: int
    #: prompts where the other arm is higher / lower (equal ones are neither); None: not counted
    n_higher: int | None = None
    n_lower: int | None = None

    @property
    def significant(self) -> bool:
        return self.ci is not None and (self.ci[1] < 0 or self.ci[0] > 0)

    @property
    def sign_test_p(self) -> float | None:
        """Two-sided exact sign test over the prompts that differ (None: not counted). The bootstrap interval of
        a mean is too narrow when only a few prompts differ and all one way — four prompts of 48 one float tie
        lower give a CI that excludes 0 — while four signs alike are what chance gives one time in eight."""
        if self.n_higher is None or self.n_lower is None:
            return None
        n, k = self.n_higher + self.n_lower, min(self.n_higher, self.n_lower)
        if n == 0:
            return 1.0
        return min(1.0, 2 * sum(math.comb(n, i) for i in range(k + 1)) / 2 ** n)


def paired_comparison(base: Sequence[float], other: Sequence[float], *, seed: int = 0) -> Comparison:
    """``other`` against ``base``, paired over the prompts where both have a finite τ."""
    pairs = [(a, b) for a, b in zip(base, other) if math.isfinite(a) and math.isfinite(b)]
    if not pairs:
        return Comparison(math.nan, math.nan, None, 0)
    diffs = [b - a for a, b in pairs]
    mean_base = float(np.mean([a for a, _ in pairs]))
    delta = float(np.mean(diffs))
    return Comparison(delta, delta / mean_base if mean_base else math.nan, paired_bootstrap_ci(diffs, seed=seed),
                      len(pairs), sum(d > 0 for d in diffs), sum(d < 0 for d in diffs))
