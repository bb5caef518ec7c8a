"""What a `dflash-parity` run found, its verdict and the report it renders.

`RoundResult` records one draft round, `ParityResult` the whole run: the per-position statistics
(`dflashkit.parity_stats`), the weight diff, ``failures`` / ``exit_code`` (the gates) and ``report()`` — the
`dflashkit.reporting.Report` built here, next to the result it reads (the result's ``report()`` calls it, so the
two cannot sit in modules that import each other). The run itself is `dflashkit.parity`.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from .parity_stats import HiddenStats, LogitStats
from .reporting import Column, Field, Notes, Report, Table, verdict
from .runtime import LoadInfo
from .runtime.load import VERIFY_MODE

EXIT_OK = 0
EXIT_FAILED = 1

MODES = {
    "hf-target": "target run with transformers: real tap hidden states, embeddings and lm_head",
    "gguf-target": "target GGUF: its token_embd / output give embeddings and lm_head; context hidden states are "
    "seeded random; each round accepts the reference's whole draft",
    "no-target": "no target: hidden states and embeddings are seeded random, so parity is measured on the drafters' "
    "output hidden states — logits need a target head (pass --target)",
}


# ---------------------------------------------------------------------------------------------
# Result
# ---------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class RoundResult:
    index: int
    start: int  # position of the anchor
    context: int  # context positions fed this round
    reference_tokens: list[int] | None
    candidate_tokens: list[int] | None
    candidate_accepted: int | None  # prefix of the candidate's draft equal to the reference's
    reference_accepted: int | None  # prefix of the reference's draft the target accepts (hf-target)
    produced: int  # tokens the round advanced by


@dataclass
class ParityResult:
    reference: LoadInfo
    candidate: LoadInfo
    mode: str  # "hf-target" | "gguf-target" | "no-target"
    target: str | None
    device: str
    dtype: str
    seed: int
    block_size: int
    rounds: list[RoundResult]
    per_position: list[tuple[int, LogitStats]]  # block position (1..B-1) → stats over rounds
    overall: LogitStats | None
    hidden_per_position: list[tuple[int, HiddenStats]]  # block position (0..B-1)
    hidden_overall: HiddenStats
    weights: Any = None  # dflashkit.diff.DiffResult, or None when skipped
    prompt_ids: list[int] | None = None
    dump: str | None = None

    @property
    def has_logits(self) -> bool:
        return self.overall is not None

    @property
    def accepted_mean(self) -> float | None:
        acc = [r.candidate_accepted for r in self.rounds if r.candidate_accepted is not None]
        return float(np.mean(acc)) if acc else None

    def failures(self, threshold_top1: float | None = None, threshold_kl: float | None = None) -> list[str]:
        """One phrase per failed gate; empty when the candidate passes."""
        if (threshold_top1 is not None or threshold_kl is not None) and self.overall is None:
            return ["no logits to gate on (no target head) — pass --target"]
        out = []
        figures = [self.hidden_overall.rel_rms, self.hidden_overall.cosine]
        if self.overall is not None:
            figures += [self.overall.kl_mean, self.overall.rms]
        if not all(math.isfinite(x) for x in figures):  # NaN / Inf outputs are an error finding, gate or not
            out.append("the drafters' outputs hold NaN/Inf values (check the weights with dflash-diff)")
        if threshold_top1 is not None and self.overall is not None and not self.overall.top1 >= threshold_top1:
            out.append(f"top-1 agreement {self.overall.top1:.2%} < --threshold-top1 {threshold_top1:.2%}")
        if threshold_kl is not None and self.overall is not None and not self.overall.kl_mean <= threshold_kl:
            out.append(f"mean KL {self.overall.kl_mean:.3g} > --threshold-kl {threshold_kl:.3g}")
        return out

    def exit_code(self, threshold_top1: float | None = None, threshold_kl: float | None = None) -> int:
        return EXIT_FAILED if self.failures(threshold_top1, threshold_kl) else EXIT_OK

    def report(self, threshold_top1: float | None = None, threshold_kl: float | None = None) -> Report:
        return _build_report(self, threshold_top1, threshold_kl)


# ---------------------------------------------------------------------------------------------
# Report
# ---------------------------------------------------------------------------------------------

_LOGIT_COLUMNS = [
    Column("position", "pos"), Column("n", "n"), Column("top1", "top-1", "pct"), Column("top5", "top-5 overlap", "pct"),
    Column("kl_mean", "KL mean", ".3g"), Column("kl_p99", "KL p99", ".3g"), Column("kl_max", "KL max", ".3g"),
    Column("max_abs", "max |Δlogit|", ".3g"), Column("rms", "RMS |Δlogit|", ".3g"),
]
_HIDDEN_COLUMNS = [
    Column("position", "pos"), Column("n", "n"), Column("rel_rms", "rel RMS", ".3g"), Column("max_abs", "max |Δ|", ".3g"),
    Column("cosine", "cosine", ".6f"),
]


def _form(info: LoadInfo) -> str:
    kind = "HF checkpoint" if info.kind == "hf" else f"GGUF ({info.dialect})"
    types = ", ".join(f"{n} {t}" for t, n in sorted(info.tensor_types.items()))
    return f"{info.path} — {kind}: {types}; {info.matmul}"


def _build_report(r: ParityResult, threshold_top1: float | None, threshold_kl: float | None) -> Report:
    failures = r.failures(threshold_top1, threshold_kl)
    o = r.overall
    if o is not None:
        headline = (f"top-1 {o.top1:.2%}, top-5 {o.top5:.2%}, KL mean {o.kl_mean:.3g}, accepted prefix "
                    f"{r.accepted_mean:.2f}/{r.block_size - 1} over {len(r.rounds)} round(s)")
    else:
        headline = (f"hidden-state rel RMS {r.hidden_overall.rel_rms:.3g}, cosine {r.hidden_overall.cosine:.6f} "
                    "(no target head: no logits)")
    status, level = verdict(failures, None, headline, "ok" if o is not None else "info")

    w = r.weights
    rel = w.rel_rms_summary() if w is not None else {}
    summary = [
        Field("reference", _form(r.reference), key="reference"),
        Field("candidate", _form(r.candidate), key="candidate"),
        Field("family", " / ".join(dict.fromkeys((r.reference.family_name, r.candidate.family_name))), key="family"),
        Field("verification", VERIFY_MODE, key="verification"),
        Field("inputs", MODES[r.mode], key="mode_text"),
        Field("mode", r.mode, key="mode"),
        Field("target", r.target, key="target"),
        Field("device / dtype", f"{r.device} / {r.dtype}", key="device_dtype"),
        Field("rounds", len(r.rounds), key="rounds"),
        Field("seed", r.seed, key="seed"),
    ]
    if o is not None:
        summary += [
            Field("top-1 agreement", o.top1, "pct", key="top1"),
            Field("top-5 overlap", o.top5, "pct", key="top5"),
            Field("KL(ref‖cand) mean / p99 / max", (o.kl_mean, o.kl_p99, o.kl_max), ".3g", key="kl"),
            Field("max / RMS |Δlogit|", (o.max_abs, o.rms), ".3g", key="dlogit"),
            Field("accepted prefix (mean)", r.accepted_mean, ".3g", key="accepted_prefix_mean"),
        ]
    summary += [
        Field("hidden rel RMS / cosine", (r.hidden_overall.rel_rms, r.hidden_overall.cosine), ".4g", key="hidden"),
        Field("weights rel RMS median / max", (rel.get("median"), rel.get("max")) if w is not None else None,
              ".4g", key="weights_rel_rms"),
        Field("thresholds top-1 / KL", (threshold_top1, threshold_kl), ".4g", key="thresholds"),
        Field("dump", r.dump, key="dump"),
        Field("exit code", EXIT_FAILED if failures else EXIT_OK, key="exit_code"),
    ]

    sections: list[Any] = [_weights_section(r)]
    if w is not None:
        sections.append(_worst_tensors(w))
    if o is not None:
        rows = [{"position": p, **s.to_dict()} for p, s in r.per_position]
        rows.append({"position": "all", **o.to_dict()})
        flagged = set()
        if threshold_top1 is not None:
            flagged |= {i for i, (_, s) in enumerate(r.per_position) if s.top1 < threshold_top1}
        if threshold_kl is not None:
            flagged |= {i for i, (_, s) in enumerate(r.per_position) if s.kl_mean > threshold_kl}
        sections.append(Table("Logit parity per block position", _LOGIT_COLUMNS, rows, id="logits", flagged=flagged,
                              level="error" if failures else "info",
                              note="block position 1 is the first drafted token; KL in nats, reference as truth"))
    hrows = [{"position": p, **s.to_dict()} for p, s in r.hidden_per_position]
    hrows.append({"position": "all", **r.hidden_overall.to_dict()})
    sections.append(Table("Output hidden-state parity per block position", _HIDDEN_COLUMNS, hrows, id="hidden",
                          note="the drafters' final-norm output; position 0 is the anchor"))
    sections.append(Table(
        "Rounds",
        [Column("round", "round"), Column("start", "anchor pos"), Column("context", "new context"),
         Column("candidate_accepted", "cand prefix = ref draft"), Column("reference_accepted", "ref accepted by target"),
         Column("produced", "advanced by")],
        [{"round": x.index, "start": x.start, "context": x.context, "candidate_accepted": x.candidate_accepted,
          "reference_accepted": x.reference_accepted, "produced": x.produced,
          "reference_tokens": x.reference_tokens, "candidate_tokens": x.candidate_tokens} for x in r.rounds],
        id="rounds",
        note="each round drafts from the cache of the previous ones, cropped to the context as dflash_generate does",
    ))
    notes = [MODES[r.mode]] + [f"reference: {n}" for n in r.reference.notes] + [f"candidate: {n}" for n in r.candidate.notes]
    sections.append(Notes("Notes", notes, id="notes"))
    title = f"dflash-parity: {Path(r.reference.path).name} vs {Path(r.candidate.path).name}"
    return Report(title, status, level, summary, sections)


def _weights_section(r: ParityResult) -> Table:
    w = r.weights
    columns = [Column("item", "weights"), Column("value", "value", ".4g")]
    if w is None:
        return Table("Weight parity", columns, [], empty="skipped", id="weights")
    rel = w.rel_rms_summary()
    worst = w.tensors[0].canonical if w.tensors else None
    failures = w.failures()
    rows = [
        {"item": "tensors compared", "value": len(w.tensors)},
        {"item": "identical tensors", "value": sum(t.stats.identical for t in w.tensors)},
        {"item": "rel RMS median", "value": rel["median"]},
        {"item": "rel RMS mean", "value": rel["mean"]},
        {"item": "rel RMS max", "value": rel["max"]},
        {"item": "worst tensor", "value": worst},
        {"item": "bits per weight ref / cand", "value": (w.bits_per_weight("A"), w.bits_per_weight("B"))},
        {"item": "diff verdict", "value": "; ".join(failures) if failures else "no missing tensors, same meaning"},
    ]
    for d in w.meaning_differences:
        rows.append({"item": f"meaning differs: {d.field}", "value": f"{d.a} vs {d.b}"})
    return Table("Weight parity", columns, rows, id="weights", level="warning" if failures else "info",
                 note="the dflash-diff comparison, summarised (rel RMS = ‖ref−cand‖/‖ref‖ per tensor)")


def _worst_tensors(w: Any, n: int = 8) -> Table:
    rows = [{"tensor": t.canonical, "type_a": t.a.type_name, "type_b": t.b.type_name, "rel_rms": t.rel_rms,
             "cosine": t.stats.cosine} for t in w.tensors[:n]]
    return Table("Worst tensors", [Column("tensor", "tensor"), Column("type_a", "ref type"),
                                   Column("type_b", "cand type"), Column("rel_rms", "rel RMS", ".4g"),
                                   Column("cosine", "cosine", ".6f")], rows, id="worst_tensors")
