"""What a `dflash-parity` run found, its verdict and the report it renders.

`RoundResult` records one draft round, `ParityResult` the whole run: the per-position statistics
(`dflashkit.parity.stats`), the weight diff, ``failures`` / ``exit_code`` (the gates) and ``report()`` — the
`dflashkit.reporting.Report` built here, next to the result it reads (the result's ``report()`` calls it, so the
two cannot sit in modules that import each other). The run itself is `dflashkit.parity.run`.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from .stats import HiddenStats, LogitStats
from .thresholds import NO_DEFAULT, Gate, resolve_gate
from ..reporting import Column, FieldSpec, NotesSpec, Report, ReportSpec, TableSpec, build, verdict
from ..runtime import LoadInfo
from ..runtime.load import VERIFY_MODE
from ..sweeps import level_label

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
    context_tokens: int = 0  # --context: the long context before the prompt (0: none)
    by_context: list["ParityResult"] | None = None  # --context: every level, this one first
    context_source: str | None = None
    #: what of the two drafters' rules (not weights) makes them draft differently: per-layer causality (`causality`)
    causes: list[str] = field(default_factory=list)

    @property
    def has_logits(self) -> bool:
        return self.overall is not None

    @property
    def accepted_mean(self) -> float | None:
        acc = [r.candidate_accepted for r in self.rounds if r.candidate_accepted is not None]
        return float(np.mean(acc)) if acc else None

    def gate(self, threshold_top1: float | None = None, threshold_kl: float | None = None, *,
             default_gate: bool = False) -> Gate:
        """The thresholds given, else (``default_gate``) the default for the files' precision (`thresholds`)."""
        return resolve_gate(self.reference.tensor_types, self.candidate.tensor_types, threshold_top1, threshold_kl,
                            self.overall is not None, default_gate)

    def failures(self, threshold_top1: float | None = None, threshold_kl: float | None = None, *,
                 default_gate: bool = False) -> list[str]:
        """One phrase per failed gate; empty when the candidate passes."""
        if (threshold_top1 is not None or threshold_kl is not None) and self.overall is None:
            return ["no logits to gate on (no target head) — pass --target"]
        gate = self.gate(threshold_top1, threshold_kl, default_gate=default_gate)
        threshold_top1, threshold_kl = gate.top1, gate.kl
        out = []
        figures = [self.hidden_overall.rel_rms, self.hidden_overall.cosine]
        if self.overall is not None:
            figures += [self.overall.kl_mean, self.overall.rms]
        if not all(math.isfinite(x) for x in figures):  # NaN / Inf outputs are an error finding, gate or not
            out.append("the drafters' outputs hold NaN/Inf values (check the weights with dflash-diff)")
        missed = []  # the gate's own failures
        if threshold_top1 is not None and self.overall is not None and not self.overall.top1 >= threshold_top1:
            missed.append(f"top-1 agreement {self.overall.top1:.2%} < --threshold-top1 {threshold_top1:.2%}"
                       if gate.given else f"top-1 agreement {self.overall.top1:.2%} < {threshold_top1:.2%}")
        if threshold_kl is not None and self.overall is not None and not self.overall.kl_mean <= threshold_kl:
            missed.append(f"mean KL {self.overall.kl_mean:.3g} > --threshold-kl {threshold_kl:.3g}" if gate.given
                       else f"mean KL {self.overall.kl_mean:.3g} > {threshold_kl:.3g}")
        if gate.cosine is not None and not self.hidden_overall.cosine >= gate.cosine:
            missed.append(f"output hidden-state cosine {self.hidden_overall.cosine:.6f} < {gate.cosine:g}")
        if missed and not gate.given and gate.source != "none":  # once: whose bound it is and how to change it
            option = "--threshold-top1 / --threshold-kl" if self.overall is not None else \
                "--target with --threshold-top1"
            missed[-1] += f" {gate.label(option)}"
        return out + missed

    def all_failures(self, threshold_top1: float | None = None, threshold_kl: float | None = None, *,
                     default_gate: bool = False) -> list[str]:
        """`failures` of every --context level (each named by its level past the first)."""
        out = self.failures(threshold_top1, threshold_kl, default_gate=default_gate)
        for r in (self.by_context or [])[1:]:
            out += [f"at --context {level_label(r.context_tokens)}: {f}"
                    for f in r.failures(threshold_top1, threshold_kl, default_gate=default_gate)]
        return out

    def exit_code(self, threshold_top1: float | None = None, threshold_kl: float | None = None, *,
                  default_gate: bool = False) -> int:
        return EXIT_FAILED if self.all_failures(threshold_top1, threshold_kl, default_gate=default_gate) else EXIT_OK

    def report(self, threshold_top1: float | None = None, threshold_kl: float | None = None, *,
               default_gate: bool = False) -> Report:
        return _build_report(self, self.gate(threshold_top1, threshold_kl, default_gate=default_gate),
                             self.all_failures(threshold_top1, threshold_kl, default_gate=default_gate))


# ---------------------------------------------------------------------------------------------
# Report: declared (PARITY_REPORT), built by reporting.build against a _Parity context
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
_WEIGHT_COLUMNS = [Column("item", "weights"), Column("value", "value", ".4g")]
_WORST_COLUMNS = [Column("tensor", "tensor"), Column("type_a", "ref type"), Column("type_b", "cand type"),
                  Column("rel_rms", "rel RMS", ".4g"), Column("cosine", "cosine", ".6f")]
_ROUND_COLUMNS = [Column("round", "round"), Column("start", "anchor pos"), Column("context", "new context"),
                  Column("candidate_accepted", "cand prefix = ref draft"),
                  Column("reference_accepted", "ref accepted by target"), Column("produced", "advanced by")]
WORST_TENSORS = 8


@dataclass(frozen=True)
class _Parity:
    """What the report reads: the result, the gates and their failures."""

    r: ParityResult
    gate: Gate
    failures: list[str]

    @property
    def o(self) -> LogitStats | None:
        return self.r.overall

    @property
    def w(self) -> Any:
        return self.r.weights


def _build_report(r: ParityResult, gate: Gate, failures: list[str]) -> Report:
    return build(PARITY_REPORT, _Parity(r, gate, failures))


def _gate_text(c: _Parity) -> str:
    g = c.gate
    parts = [f"top-1 ≥ {g.top1:.2%}" if g.top1 is not None else "", f"KL ≤ {g.kl:.3g}" if g.kl is not None else "",
             f"hidden cosine ≥ {g.cosine:g}" if g.cosine is not None else ""]
    text = ", ".join(p for p in parts if p)
    if g.source == NO_DEFAULT:
        return "none: no default below 8 bits — give --threshold-top1 / --threshold-kl"
    if not text:
        return "none"
    return text + ("" if g.given else f" (default for {g.source} files)")


def _form(info: LoadInfo) -> str:
    kind = "HF checkpoint" if info.kind == "hf" else f"GGUF ({info.dialect})"
    types = ", ".join(f"{n} {t}" for t, n in sorted(info.tensor_types.items()))
    return f"{info.path} — {kind}: {types}; {info.matmul}"


def _status(c: _Parity) -> tuple[str, str]:
    r, o = c.r, c.o
    if o is not None:
        headline = (f"top-1 {o.top1:.2%}, top-5 {o.top5:.2%}, KL mean {o.kl_mean:.3g}, accepted prefix "
                    f"{r.accepted_mean:.2f}/{r.block_size - 1} over {len(r.rounds)} round(s)")
    else:
        headline = (f"hidden-state rel RMS {r.hidden_overall.rel_rms:.3g}, cosine {r.hidden_overall.cosine:.6f} "
                    "(no target head: no logits)")
    if r.by_context:
        headline += f" at --context {level_label(r.context_tokens)} (every level in 'Parity by context length')"
    broken = breaks(r)
    cause = f"; likely cause: {r.causes[0]}" if r.causes else ""
    failures = [*c.failures[:-1], c.failures[-1] + cause] if c.failures else []
    return verdict(failures, broken[0] + cause if broken else None, headline, "ok" if o is not None else "info")


def _weights_rel_rms(c: _Parity) -> tuple[float | None, float | None] | None:
    if c.w is None:
        return None
    rel = c.w.rel_rms_summary()
    return rel.get("median"), rel.get("max")


def _has_logits(c: _Parity) -> bool:
    return c.o is not None


FIELDS = (
    FieldSpec("reference", lambda c: _form(c.r.reference), key="reference"),
    FieldSpec("candidate", lambda c: _form(c.r.candidate), key="candidate"),
    FieldSpec("family", lambda c: " / ".join(dict.fromkeys((c.r.reference.family_name, c.r.candidate.family_name))),
              key="family"),
    FieldSpec("verification", lambda c: VERIFY_MODE, key="verification"),
    FieldSpec("inputs", lambda c: MODES[c.r.mode], key="mode_text"),
    FieldSpec("mode", lambda c: c.r.mode, key="mode"),
    FieldSpec("target", lambda c: c.r.target, key="target"),
    FieldSpec("device / dtype", lambda c: f"{c.r.device} / {c.r.dtype}", key="device_dtype"),
    FieldSpec("rounds", lambda c: len(c.r.rounds), key="rounds"),
    FieldSpec("seed", lambda c: c.r.seed, key="seed"),
    FieldSpec("top-1 agreement", lambda c: c.o.top1, "pct", key="top1", when=_has_logits),
    FieldSpec("top-5 overlap", lambda c: c.o.top5, "pct", key="top5", when=_has_logits),
    FieldSpec("KL(ref‖cand) mean / p99 / max", lambda c: (c.o.kl_mean, c.o.kl_p99, c.o.kl_max), ".3g", key="kl",
              when=_has_logits),
    FieldSpec("max / RMS |Δlogit|", lambda c: (c.o.max_abs, c.o.rms), ".3g", key="dlogit", when=_has_logits),
    FieldSpec("accepted prefix (mean)", lambda c: c.r.accepted_mean, ".3g", key="accepted_prefix_mean",
              when=_has_logits),
    FieldSpec("hidden rel RMS / cosine", lambda c: (c.r.hidden_overall.rel_rms, c.r.hidden_overall.cosine), ".4g",
              key="hidden"),
    FieldSpec("weights rel RMS median / max", _weights_rel_rms, ".4g", key="weights_rel_rms"),
    FieldSpec("thresholds top-1 / KL", lambda c: (c.gate.top1, c.gate.kl), ".4g", key="thresholds"),
    FieldSpec("gate", _gate_text, key="gate"),
    FieldSpec("dump", lambda c: c.r.dump, key="dump"),
    FieldSpec("exit code", lambda c: EXIT_FAILED if c.failures else EXIT_OK, key="exit_code"),
)


def _weight_rows(c: _Parity) -> list[dict[str, Any]]:
    """The dflash-diff comparison, summarised (none when it was skipped)."""
    w = c.w
    if w is None:
        return []
    rel = w.rel_rms_summary()
    failures = w.failures()
    rows = [
        {"item": "tensors compared", "value": len(w.tensors)},
        {"item": "identical tensors", "value": sum(t.stats.identical for t in w.tensors)},
        {"item": "rel RMS median", "value": rel["median"]},
        {"item": "rel RMS mean", "value": rel["mean"]},
        {"item": "rel RMS max", "value": rel["max"]},
        {"item": "worst tensor", "value": w.tensors[0].canonical if w.tensors else None},
        {"item": "bits per weight ref / cand", "value": (w.bits_per_weight("A"), w.bits_per_weight("B"))},
        {"item": "diff verdict", "value": "; ".join(failures) if failures else "no missing tensors, same meaning"},
    ]
    rows += [{"item": f"meaning differs: {d.field}", "value": f"{d.a} vs {d.b}"} for d in w.meaning_differences]
    return rows


def _worst_rows(c: _Parity) -> list[dict[str, Any]]:
    return [{"tensor": t.canonical, "type_a": t.a.type_name, "type_b": t.b.type_name, "rel_rms": t.rel_rms,
             "cosine": t.stats.cosine} for t in c.w.tensors[:WORST_TENSORS]]


def _logit_rows(c: _Parity) -> list[dict[str, Any]]:
    return [{"position": p, **s.to_dict()} for p, s in c.r.per_position] + [{"position": "all", **c.o.to_dict()}]


def _logit_flagged(c: _Parity) -> set[int]:
    """Positions under --threshold-top1 or over --threshold-kl."""
    flagged = set()
    if c.gate.top1 is not None:
        flagged |= {i for i, (_, s) in enumerate(c.r.per_position) if s.top1 < c.gate.top1}
    if c.gate.kl is not None:
        flagged |= {i for i, (_, s) in enumerate(c.r.per_position) if s.kl_mean > c.gate.kl}
    return flagged


def _hidden_rows(c: _Parity) -> list[dict[str, Any]]:
    r = c.r
    return [{"position": p, **s.to_dict()} for p, s in r.hidden_per_position] + [
        {"position": "all", **r.hidden_overall.to_dict()}]


def _round_rows(c: _Parity) -> list[dict[str, Any]]:
    return [{"round": x.index, "start": x.start, "context": x.context, "candidate_accepted": x.candidate_accepted,
             "reference_accepted": x.reference_accepted, "produced": x.produced,
             "reference_tokens": x.reference_tokens, "candidate_tokens": x.candidate_tokens} for x in c.r.rounds]


#: a --context level breaks when its top-1 agreement is this much below the shortest level's …
BREAK_TOP1_DROP = 0.02
#: … or its mean accepted prefix this many tokens shorter
BREAK_PREFIX_DROP = 1.0


def breaks(result: ParityResult) -> list[str]:
    """The levels past the shortest where the candidate stops drafting like the reference, each as one line."""
    levels = result.by_context or []
    if len(levels) < 2 or levels[0].overall is None:
        return []
    first = levels[0]
    out = []
    for r in levels[1:]:
        if r.overall is None:
            continue
        top1_drop = first.overall.top1 - r.overall.top1  # type: ignore[union-attr]
        prefix_drop = (first.accepted_mean or 0.0) - (r.accepted_mean or 0.0)
        if top1_drop >= BREAK_TOP1_DROP or prefix_drop >= BREAK_PREFIX_DROP:
            out.append(f"from --context {level_label(r.context_tokens)} the candidate drafts unlike the reference: top-1 "
                       f"{first.overall.top1:.1%} → {r.overall.top1:.1%}, KL mean {first.overall.kl_mean:.3g} → "  # type: ignore[union-attr]
                       f"{r.overall.kl_mean:.3g}, accepted prefix {first.accepted_mean:.2f} → {r.accepted_mean:.2f} "
                       f"(at --context {level_label(first.context_tokens)}) — a window, rope or position difference "
                       "shows only past that length: compare the files' sliding_window, sliding_window_pattern, "
                       "rope_theta / rope scaling and context length (dflash-inspect, dflash-diff)")
            break
    return out


_CONTEXT_COLUMNS = [Column("context_label", "--context"), Column("positions", "context positions"),
                    Column("top1", "top-1", "pct"), Column("top5", "top-5 overlap", "pct"),
                    Column("kl_mean", "KL mean", ".3g"), Column("kl_max", "KL max", ".3g"),
                    Column("accepted", "accepted prefix", ".2f"), Column("rel_rms", "hidden rel RMS", ".3g")]


def _context_rows(c: _Parity) -> list[dict[str, Any]]:
    rows = []
    for r in c.r.by_context or []:
        o = r.overall
        rows.append({"context": r.context_tokens, "context_label": level_label(r.context_tokens),
                     "positions": r.rounds[0].start if r.rounds else None,
                     "top1": o.top1 if o else None, "top5": o.top5 if o else None,
                     "kl_mean": o.kl_mean if o else None, "kl_max": o.kl_max if o else None,
                     "accepted": r.accepted_mean, "rel_rms": r.hidden_overall.rel_rms})
    return rows


def _notes(c: _Parity) -> list[str]:
    r = c.r
    return ([MODES[r.mode]] + [f"likely cause of any difference: {cause}" for cause in r.causes]
            + [f"reference: {n}" for n in r.reference.notes] + [f"candidate: {n}" for n in r.candidate.notes])


PARITY_REPORT = ReportSpec(
    title=lambda c: f"dflash-parity: {Path(c.r.reference.path).name} vs {Path(c.r.candidate.path).name}",
    status=_status,
    fields=FIELDS,
    sections=(
        TableSpec("Weight parity", _WEIGHT_COLUMNS, _weight_rows, id="weights",
                  level=lambda c: "warning" if c.w is not None and c.w.failures() else "info",
                  note=lambda c: "" if c.w is None else
                  "the dflash-diff comparison, summarised (rel RMS = ‖ref−cand‖/‖ref‖ per tensor)",
                  empty=lambda c: "skipped" if c.w is None else "none"),
        TableSpec("Worst tensors", _WORST_COLUMNS, _worst_rows, id="worst_tensors", when=lambda c: c.w is not None),
        TableSpec("Logit parity per block position", _LOGIT_COLUMNS, _logit_rows, id="logits", flagged=_logit_flagged,
                  level=lambda c: "error" if c.failures else "info", when=_has_logits,
                  note="block position 1 is the first drafted token; KL in nats, reference as truth"),
        TableSpec("Output hidden-state parity per block position", _HIDDEN_COLUMNS, _hidden_rows, id="hidden",
                  note="the drafters' final-norm output; position 0 is the anchor"),
        TableSpec("Rounds", _ROUND_COLUMNS, _round_rows, id="rounds",
                  note="each round drafts from the cache of the previous ones, cropped to the context as "
                       "dflash_generate does"),
        TableSpec("Parity by context length", _CONTEXT_COLUMNS, _context_rows, id="by_context",
                  note=lambda c: f"the drafters after N tokens of context from {c.r.context_source}; the anchors of "
                  "every level lie past its N (anchor pos of round 1 = context positions)",
                  when=lambda c: bool(c.r.by_context)),
        NotesSpec("Where parity breaks with context", lambda c: breaks(c.r), id="breaks",
                  level=lambda c: "warning" if breaks(c.r) else "info",
                  empty="the candidate drafts like the reference at every level",
                  when=lambda c: bool(c.r.by_context)),
        NotesSpec("Notes", _notes, id="notes"),
    ),
)
