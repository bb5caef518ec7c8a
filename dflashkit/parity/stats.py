"""The figures `dflash-parity` compares two drafters by: logit and hidden-state agreement, the accepted prefix.

Per row (one block position of one round) `logit_rows` / `hidden_rows` compute float64 figures — top-1 agreement,
top-5 overlap, KL(ref‖cand), |Δlogit|; hidden-state error and cosine —, `select_rows` picks rows (a block position)
and `logit_stats` / `hidden_stats` aggregate them into `LogitStats` / `HiddenStats`. `accepted_prefix` is greedy
verification's count. Pure functions of tensors: the run (`dflashkit.parity.run`) feeds them, the result
(`dflashkit.parity.result`) reports them.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Sequence

import numpy as np
import torch

TOP_K = 5


@dataclass(frozen=True)
class LogitStats:
    """Logit agreement over ``n`` draft positions (rows)."""

    n: int
    top1: float  # fraction of rows whose argmax agrees
    top5: float  # mean |top5(ref) ∩ top5(cand)| / 5
    kl_mean: float  # KL(ref ‖ cand) in nats
    kl_p99: float
    kl_max: float
    max_abs: float  # max |Δlogit|
    rms: float  # RMS |Δlogit| over every logit

    def to_dict(self) -> dict[str, Any]:
        return dict(self.__dict__)


@dataclass(frozen=True)
class HiddenStats:
    """Output hidden-state agreement over ``n`` rows."""

    n: int
    rel_rms: float  # ‖Δ‖ / ‖ref‖
    max_abs: float
    cosine: float  # mean per-row cosine similarity

    def to_dict(self) -> dict[str, Any]:
        return dict(self.__dict__)


#: rows of logits whose float64 figures are computed at once: each is a row of its own, and a few rows keep the
#: float64 temporaries of a 152 k vocabulary at a few MB (all 15 rows at once took ~120 MB of the run's peak)
_LOGIT_ROWS_AT_ONCE = 4


def logit_rows(ref: torch.Tensor, cand: torch.Tensor) -> dict[str, np.ndarray]:
    """Per-row figures for [n, vocab] logits (float64), a few rows at a time."""
    parts = [_logit_rows_block(ref[i : i + _LOGIT_ROWS_AT_ONCE], cand[i : i + _LOGIT_ROWS_AT_ONCE])
             for i in range(0, ref.shape[0], _LOGIT_ROWS_AT_ONCE)]
    return {k: np.concatenate([p[k] for p in parts]) for k in parts[0]}


def _logit_rows_block(ref: torch.Tensor, cand: torch.Tensor) -> dict[str, np.ndarray]:
    r, c = ref.double(), cand.double()
    lr, lc = torch.log_softmax(r, -1), torch.log_softmax(c, -1)
    kl = (lr.exp() * (lr - lc)).sum(-1).clamp_min(0.0)  # tiny negative values are rounding
    k = min(TOP_K, r.shape[-1])
    tr, tc = r.topk(k, -1).indices, c.topk(k, -1).indices
    overlap = (tr[:, :, None] == tc[:, None, :]).any(-1).sum(-1).double() / k
    d = (r - c).abs()
    return {
        "top1": (r.argmax(-1) == c.argmax(-1)).double().numpy(),
        "top5": overlap.numpy(),
        "kl": kl.numpy(),
        "max_abs": d.max(-1).values.numpy(),
        "sq": (d * d).mean(-1).numpy(),
    }


def logit_stats(rows: dict[str, np.ndarray]) -> LogitStats:
    kl = rows["kl"]
    return LogitStats(
        n=int(kl.size),
        top1=float(rows["top1"].mean()),
        top5=float(rows["top5"].mean()),
        kl_mean=float(kl.mean()),
        kl_p99=float(np.percentile(kl, 99)),
        kl_max=float(kl.max()),
        max_abs=float(rows["max_abs"].max()),
        rms=float(math.sqrt(rows["sq"].mean())),
    )


def hidden_rows(ref: torch.Tensor, cand: torch.Tensor) -> dict[str, np.ndarray]:
    r, c = ref.double(), cand.double()
    d = r - c
    cos = (r * c).sum(-1) / (r.norm(dim=-1) * c.norm(dim=-1)).clamp_min(1e-300)
    return {
        "d2": (d * d).sum(-1).numpy(),
        "r2": (r * r).sum(-1).numpy(),
        "max_abs": d.abs().max(-1).values.numpy(),
        "cos": cos.numpy(),
    }


def hidden_stats(rows: dict[str, np.ndarray]) -> HiddenStats:
    r2 = rows["r2"].sum()
    return HiddenStats(
        n=int(rows["d2"].size),
        # NaN stays NaN (a NaN reference must never read as "rel RMS 0")
        rel_rms=float(math.sqrt(rows["d2"].sum() / r2)) if r2 > 0 else (0.0 if rows["d2"].sum() == 0 else math.nan),
        max_abs=float(rows["max_abs"].max()),
        cosine=float(rows["cos"].mean()),
    )


def select_rows(rows: dict[str, np.ndarray], mask: np.ndarray) -> dict[str, np.ndarray]:
    return {k: v[mask] for k, v in rows.items()}


def accepted_prefix(draft: Sequence[int], truth: Sequence[int]) -> int:
    """How many leading tokens of ``draft`` match ``truth`` (greedy verification)."""
    n = 0
    for a, b in zip(draft, truth):
        if a != b:
            break
        n += 1
    return n
