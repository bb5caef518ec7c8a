"""What `diff_drafters` found, its verdict and the report it renders.

The findings, one dataclass each: tensor pairs with their statistics (`TensorDiff`, statistics from
`dflashkit.diff.stats`), integer tensors compared exactly (`ExactDiff`), shape mismatches, tensors on one side
only, unreadable tensors, keys shown but never compared (`InfoItem`), how each input is described (`Side`).
`DiffResult` gathers them with the spec differences (`dflashkit.diff.specs`) and gives the verdict
(``failures``, ``exit_code``), the summary figures and ``report()`` — the `dflashkit.reporting.Report` built
here, next to the result it reads (the result's ``report()`` calls it, so the two cannot sit in modules that
import each other). How two drafters' tensors are paired and measured is `dflashkit.diff.align`.
"""

from __future__ import annotations

import math
import re
import statistics
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..dialects import LLAMA_CPP
from ..errors import DFlashError
from ..drafters import TensorRef
from ..reporting import (Bar, BarGroup, ChartSpec, Column, FieldSpec, Report, ReportSpec, TableSpec, build,
                         verdict)
from .specs import SpecDifference
from .stats import TensorStats

EXIT_OK = 0
EXIT_DIFFERENT = 1


@dataclass(frozen=True)
class Side:
    """How one input is described in the report."""

    label: str  # "A" | "B"
    path: str
    kind: str  # "hf" | "gguf"
    dialect: str | None
    architecture: str
    tap_convention: str

    @property
    def form(self) -> str:
        if self.kind == "hf":
            return "HF checkpoint"
        return f"GGUF, {self.dialect} dialect (arch {self.architecture})"


@dataclass(frozen=True)
class TensorDiff:
    canonical: str
    a: TensorRef
    b: TensorRef
    stats: TensorStats

    @property
    def rel_rms(self) -> float:
        return self.stats.rel_rms

    def over(self, threshold: float | None) -> bool:
        # NaN (non-finite values) never passes a threshold
        return threshold is not None and not (self.rel_rms <= threshold)


@dataclass(frozen=True)
class ShapeMismatch:
    canonical: str
    a: TensorRef
    b: TensorRef


@dataclass(frozen=True)
class OneSided:
    canonical: str
    side: str  # the side that has it: "A" | "B"
    ref: TensorRef


@dataclass(frozen=True)
class Unreadable:
    canonical: str
    error: str


@dataclass(frozen=True)
class ExactDiff:
    """An integer tensor (DSpark ``d2t``: target token ids) compared exactly: any difference is an error."""

    canonical: str
    a: TensorRef
    b: TensorRef
    n_different: int
    first: tuple[int, int, int] | None  # (index, a value, b value) of the first difference

    @property
    def identical(self) -> bool:
        return self.n_different == 0


@dataclass(frozen=True)
class InfoItem:
    key: str
    a: Any
    b: Any
    note: str = ""


@dataclass
class DiffResult:
    a: Side
    b: Side
    tensors: list[TensorDiff]  # worst first
    only_one_side: list[OneSided]
    unmapped: list[tuple[str, str]]  # (side, stored name)
    shape_mismatches: list[ShapeMismatch]
    unreadable: list[Unreadable]
    spec_differences: list[SpecDifference]
    info: list[InfoItem] = field(default_factory=list)
    file_order: list[str] = field(default_factory=list)  # canonical ids of `tensors` in A's file order
    exact: list[ExactDiff] = field(default_factory=list)  # integer tensors (d2t), compared exactly

    @property
    def exact_differences(self) -> list[ExactDiff]:
        return [e for e in self.exact if not e.identical]

    # ---- verdict ----------------------------------------------------------------------------
    @property
    def meaning_differences(self) -> list[SpecDifference]:
        return [d for d in self.spec_differences if d.meaningful]

    def over_threshold(self, threshold: float | None) -> list[TensorDiff]:
        return [t for t in self.tensors if t.over(threshold)]

    def failures(self, threshold: float | None = None, allow_missing: bool = False) -> list[str]:
        """One phrase per reason the diff fails; empty when it passes."""
        reasons = []
        if not allow_missing:
            reasons += self._missing_phrases()
        for items, what in (
            (self.shape_mismatches, "shape mismatch(es)"),
            (self.unreadable, "unreadable tensor(s)"),
        ):
            if items:
                reasons.append(f"{len(items)} {what}")
        nonfinite = self.nonfinite()
        if nonfinite:  # NaN / Inf weights: no error figure means anything, and a runtime would produce NaN
            shown = ", ".join(f"{t.canonical} (A {t.stats.nonfinite_a}, B {t.stats.nonfinite_b})" for t in nonfinite[:3])
            reasons.append(f"{len(nonfinite)} tensor(s) hold NaN/Inf values: {shown}")
        exact = self.exact_differences
        if exact:
            reasons.append(f"{len(exact)} integer tensor(s) differ ({', '.join(e.canonical for e in exact)})")
        meaning = self.meaning_differences
        if meaning:
            reasons.append(f"{len(meaning)} difference(s) in meaning ({', '.join(d.field for d in meaning)})")
        over = self.over_threshold(threshold)
        if over:
            reasons.append(f"{len(over)} tensor(s) over --threshold {threshold:g} (worst {over[0].canonical})")
        return reasons

    def nonfinite(self) -> list[TensorDiff]:
        """Tensors with a NaN or infinity on either side (counts in ``stats.nonfinite_a/_b``)."""
        return [t for t in self.tensors if t.stats.nonfinite_a or t.stats.nonfinite_b]

    def _missing_phrases(self) -> list[str]:
        out = []
        for side in ("A", "B"):
            n = sum(o.side == side for o in self.only_one_side)
            if n:
                out.append(f"{n} tensor(s) only in {side}")
        if self.unmapped:
            out.append(f"{len(self.unmapped)} unmapped tensor name(s)")
        return out

    def exit_code(self, threshold: float | None = None, allow_missing: bool = False) -> int:
        return EXIT_DIFFERENT if self.failures(threshold, allow_missing) else EXIT_OK

    # ---- summary numbers ----------------------------------------------------------------------
    def rel_rms_summary(self) -> dict[str, float | None]:
        values = [t.rel_rms for t in self.tensors if not math.isnan(t.rel_rms)]
        if not values:
            return {"median": None, "mean": None, "max": None}
        return {"median": statistics.median(values), "mean": math.fsum(values) / len(values), "max": max(values)}

    def bits_per_weight(self, side: str) -> float | None:
        refs = [t.a if side == "A" else t.b for t in self.tensors]
        n = sum(r.n_elements for r in refs)
        return 8.0 * sum(r.nbytes for r in refs) / n if n else None

    def report(self, threshold: float | None = None, allow_missing: bool = False) -> Report:
        return _build_report(self, threshold, allow_missing)


# --------------------------------------------------------------------------------------------
# Report: declared (DIFF_REPORT), built by reporting.build against a _Diff context
# --------------------------------------------------------------------------------------------

_LAYER = re.compile(r"^layers\.(\d+)\.")

_TENSOR_COLUMNS = [
    Column("tensor", "tensor"), Column("name_a", "A name"), Column("name_b", "B name"), Column("shape", "shape", "shape"),
    Column("type_a", "A type"), Column("type_b", "B type"), Column("bpw_a", "A bpw", ".3g"), Column("bpw_b", "B bpw", ".3g"),
    Column("rel_rms", "rel RMS", ".4g"), Column("max_abs_diff", "max |a-b|", ".4g"), Column("cosine", "cosine", ".6f"),
    Column("snr_db", "SNR dB", ".1f"), Column("range_a", "A range", ".3g"), Column("range_b", "B range", ".3g"),
]
_MEANING_COLUMNS = [Column("field", "field"), Column("a", "A"), Column("b", "B"), Column("note", "note")]
_MISSING_COLUMNS = [Column("tensor", "tensor"), Column("side", "only in"), Column("name", "stored name"),
                    Column("shape", "shape", "shape"), Column("type", "type")]
_UNMAPPED_COLUMNS = [Column("side", "side"), Column("name", "stored name")]
_SHAPE_COLUMNS = [Column("tensor", "tensor"), Column("name_a", "A name"), Column("name_b", "B name"),
                  Column("shape_a", "A shape", "shape"), Column("shape_b", "B shape", "shape"),
                  Column("type_a", "A type"), Column("type_b", "B type")]
_EXACT_COLUMNS = [Column("tensor", "tensor"), Column("name_a", "A name"), Column("name_b", "B name"),
                  Column("n", "elements"), Column("different", "different"), Column("first", "first difference")]
_UNREADABLE_COLUMNS = [Column("tensor", "tensor"), Column("error", "error")]
_TYPE_COLUMNS = [Column("type_a", "A type"), Column("type_b", "B type"), Column("tensors", "tensors"),
                 Column("n_elements", "weights"), Column("bpw_b", "B bpw", ".3g"),
                 Column("rel_rms_mean", "mean rel RMS", ".4g"), Column("rel_rms_max", "max rel RMS", ".4g"),
                 Column("worst", "worst tensor")]
_INFO_COLUMNS = [Column("key", "key"), Column("a", "A"), Column("b", "B"), Column("note", "note")]


@dataclass(frozen=True)
class _Diff:
    """What the report reads: the result, the gate's options and its failures."""

    r: DiffResult
    threshold: float | None
    allow_missing: bool
    failures: list[str]

    @property
    def missing_level(self) -> str:
        return "warning" if self.allow_missing else "error"


def _build_report(r: DiffResult, threshold: float | None, allow_missing: bool) -> Report:
    return build(DIFF_REPORT, _Diff(r, threshold, allow_missing, r.failures(threshold, allow_missing)))


def _status(c: _Diff) -> tuple[str, str]:
    r = c.r
    relaxed = r._missing_phrases() if c.allow_missing else []
    worst = r.tensors[0] if r.tensors else None
    headline = (f"{len(r.tensors)} tensors, all identical" if worst is None or worst.stats.identical else
                f"{len(r.tensors)} tensors, max relative RMS error {r.rel_rms_summary()['max']:.4g} "
                f"({worst.canonical})")
    return verdict(c.failures, f"passes with --allow-missing ({'; '.join(relaxed)})" if relaxed else None, headline)


FIELDS = (
    FieldSpec("A (reference)", lambda c: f"{c.r.a.path} — {c.r.a.form}", key="a"),
    FieldSpec("B", lambda c: f"{c.r.b.path} — {c.r.b.form}", key="b"),
    FieldSpec("tensors compared", lambda c: len(c.r.tensors), key="tensors_compared"),
    FieldSpec("rel RMS median", lambda c: c.r.rel_rms_summary()["median"], ".4g", key="rel_rms_median"),
    FieldSpec("rel RMS mean", lambda c: c.r.rel_rms_summary()["mean"], ".4g", key="rel_rms_mean"),
    FieldSpec("rel RMS max", lambda c: c.r.rel_rms_summary()["max"], ".4g", key="rel_rms_max"),
    FieldSpec("worst tensor", lambda c: c.r.tensors[0].canonical if c.r.tensors else None, key="worst_tensor"),
    FieldSpec("bits per weight A / B", lambda c: (c.r.bits_per_weight("A"), c.r.bits_per_weight("B")), ".4g",
              key="bits_per_weight"),
    FieldSpec("threshold", lambda c: c.threshold, ".4g", key="threshold"),
    FieldSpec("exit code", lambda c: EXIT_DIFFERENT if c.failures else EXIT_OK, key="exit_code"),
)


def _tensor_columns(c: _Diff) -> list[Column]:
    """All tensor columns, less a name column that only repeats the canonical id (an HF side)."""
    redundant = {key for key, side in (("name_a", "a"), ("name_b", "b"))
                 if all(getattr(t, side).name == t.canonical for t in c.r.tensors)}
    return [col for col in _TENSOR_COLUMNS if col.key not in redundant]


def _tensor_row(t: TensorDiff, threshold: float | None) -> dict[str, Any]:
    s = t.stats
    return {
        "tensor": t.canonical,
        "name_a": t.a.name,
        "name_b": t.b.name,
        "shape": list(t.a.shape),
        "type_a": t.a.type_name,
        "type_b": t.b.type_name,
        "bpw_a": t.a.bits_per_weight,
        "bpw_b": t.b.bits_per_weight,
        "n_elements": s.n_elements,
        "rel_rms": s.rel_rms,
        "max_abs_diff": s.max_abs_diff,
        "cosine": s.cosine,
        "snr_db": s.snr_db,
        "range_a": [s.min_a, s.max_a],
        "range_b": [s.min_b, s.max_b],
        "nonfinite_a": s.nonfinite_a,
        "nonfinite_b": s.nonfinite_b,
        "over_threshold": t.over(threshold),
    }


def _type_rows(c: _Diff) -> list[dict[str, Any]]:
    groups: dict[tuple[str, str], list[TensorDiff]] = {}
    for t in c.r.tensors:  # worst first, so the first of each group is its worst
        groups.setdefault((t.a.type_name, t.b.type_name), []).append(t)
    rows = []
    for (ta, tb), ts in sorted(groups.items()):
        n = sum(t.a.n_elements for t in ts)
        bytes_a, bytes_b = sum(t.a.nbytes for t in ts), sum(t.b.nbytes for t in ts)
        rels = [t.rel_rms for t in ts]
        rows.append({
            "type_a": ta, "type_b": tb, "tensors": len(ts), "n_elements": n,
            "bytes_a": bytes_a, "bytes_b": bytes_b, "bpw_a": 8.0 * bytes_a / n, "bpw_b": 8.0 * bytes_b / n,
            "rel_rms_mean": math.fsum(rels) / len(rels), "rel_rms_max": ts[0].rel_rms, "worst": ts[0].canonical,
        })
    return rows


def _short_kind(canonical: str) -> str:
    """Series label for the chart: llama.cpp's short tensor name (``ffn_down``), as users know it."""
    try:
        name = LLAMA_CPP.gguf_name(canonical)
    except DFlashError:
        name = canonical
    name = re.sub(r"^blk\.\d+\.", "", name)
    return name[: -len(".weight")] if name.endswith(".weight") else name


def _chart_groups(c: _Diff) -> list[BarGroup]:
    by_name = {t.canonical: t for t in c.r.tensors}
    groups: dict[str, list[Bar]] = {}
    for canonical in sorted(c.r.file_order, key=lambda name: _layer_key(name)):
        t = by_name[canonical]
        m = _LAYER.match(canonical)
        group = f"layer {m.group(1)}" if m else "global"
        label = f"{canonical} ({t.a.type_name} → {t.b.type_name})"
        groups.setdefault(group, []).append(Bar(label, t.rel_rms, _short_kind(canonical), t.over(c.threshold),
                                                tag=t.b.type_name))
    return [BarGroup(g, bars) for g, bars in groups.items()]


def _layer_key(canonical: str) -> tuple[int, int]:
    m = _LAYER.match(canonical)
    return (1, int(m.group(1))) if m else (0, 0)  # stable sort keeps file order within a layer


def _exact_first(e: ExactDiff) -> str:
    return f"[{e.first[0]}]: {e.first[1]} vs {e.first[2]}" if e.first else "-"


def _info_rows(c: _Diff) -> list[dict[str, Any]]:
    return ([{"key": i.key, "a": i.a, "b": i.b, "note": i.note} for i in c.r.info]
            + [{"key": d.field, "a": d.a, "b": d.b, "note": d.note} for d in c.r.spec_differences if not d.meaningful])


DIFF_REPORT = ReportSpec(
    title=lambda c: f"dflash-diff: {Path(c.r.a.path).name} vs {Path(c.r.b.path).name}",
    status=_status,
    fields=FIELDS,
    sections=(
        ChartSpec(  # first: the HTML page shows it without scrolling
            "Relative RMS error per tensor, by layer", _chart_groups, value_label="‖a−b‖ / ‖a‖",
            reference=lambda c: c.threshold,
            reference_label=lambda c: f"threshold {c.threshold:g}" if c.threshold is not None else "", id="chart"),
        TableSpec(
            "Differences in meaning", _MEANING_COLUMNS,
            lambda c: [{"field": d.field, "a": d.a, "b": d.b, "note": d.note} for d in c.r.meaning_differences],
            level="error", id="meaning",
            note="metadata that changes what the drafter does (dimensions, taps, mask id, block size, SWA, scales)"),
        TableSpec(
            "Tensors only on one side", _MISSING_COLUMNS,
            lambda c: [{"tensor": o.canonical, "side": o.side, "name": o.ref.name, "shape": list(o.ref.shape),
                        "type": o.ref.type_name} for o in c.r.only_one_side],
            level=lambda c: c.missing_level, id="missing"),
        TableSpec(
            "Unmapped tensor names", _UNMAPPED_COLUMNS,
            lambda c: [{"side": side, "name": name} for side, name in c.r.unmapped],
            level=lambda c: c.missing_level, id="unmapped",
            note="names that no supported scheme (HF, llama.cpp, luce, dflash-draft) maps to a drafter tensor"),
        TableSpec(
            "Shape mismatches", _SHAPE_COLUMNS,
            lambda c: [{"tensor": m.canonical, "name_a": m.a.name, "name_b": m.b.name, "shape_a": list(m.a.shape),
                        "shape_b": list(m.b.shape), "type_a": m.a.type_name, "type_b": m.b.type_name}
                       for m in c.r.shape_mismatches],
            level="error", id="shape_mismatches", note="shapes in numpy/HF order (GGUF dims reversed)"),
        TableSpec(  # only drafters with a d2t have integer tensors
            "Integer tensors (compared exactly)", _EXACT_COLUMNS,
            lambda c: [{"tensor": e.canonical, "name_a": e.a.name, "name_b": e.b.name, "n": e.a.n_elements,
                        "different": e.n_different, "first": _exact_first(e)} for e in c.r.exact],
            level=lambda c: "error" if c.r.exact_differences else "info", id="exact",
            note="token ids: any difference is an error (A's d2t offsets are made absolute first, as conversion does)",
            when=lambda c: bool(c.r.exact)),
        TableSpec(
            "Unreadable tensors", _UNREADABLE_COLUMNS,
            lambda c: [{"tensor": u.canonical, "error": u.error} for u in c.r.unreadable], level="error",
            id="unreadable"),
        TableSpec(
            "Tensors, worst first", _tensor_columns, lambda c: [_tensor_row(t, c.threshold) for t in c.r.tensors],
            id="tensors", flagged=lambda c: {i for i, t in enumerate(c.r.tensors) if t.over(c.threshold)},
            note="rel RMS = ‖a−b‖/‖a‖ with A as the reference; SNR = 10·log10(‖a‖²/‖a−b‖²)",
            empty="no tensor in common"),
        TableSpec("Totals per type", _TYPE_COLUMNS, _type_rows, id="types"),
        TableSpec("Information (not compared)", _INFO_COLUMNS, _info_rows, id="info"),
    ),
)
