"""`diff_drafters`: per-tensor differences between any two forms of a drafter, and their report.

Both sides go through `open_drafter`, so every name scheme (HF, llama.cpp, luce, dflash-draft)
meets on canonical tensor ids, GGUF dims come back in numpy order and every type is read as
float32. Tensor pairs are streamed one at a time (peak memory ≈ the largest pair as float32).
Nothing is skipped silently: tensors on one side only, unmapped names, shape mismatches,
unreadable tensors and differences in meaning each get their own list and fail the diff.
"""

from __future__ import annotations

import math
import os
import re
import statistics
import sys
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Iterator

import numpy as np
from tqdm import tqdm

from ..dialects import LLAMA_CPP
from ..families import family_for_architecture
from ..errors import DFlashError
from ..drafters import DrafterFile, TensorRef, open_drafter
from ..reporting import Bar, BarChart, BarGroup, Column, Field, Report, Table, verdict
from .specs import SpecDifference, carried_fields, compare_specs
from .stats import StatsAccumulator, TensorStats, tensor_stats

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
# Comparing
# --------------------------------------------------------------------------------------------


def _side(label: str, f: DrafterFile) -> Side:
    return Side(label, str(f.path), f.kind, f.dialect.name if f.dialect else None, f.architecture, f.tap_convention)


def _open(path: str | os.PathLike[str] | DrafterFile) -> tuple[DrafterFile, bool]:
    if isinstance(path, DrafterFile):
        return path, False
    f = open_drafter(path)
    if f.kind == "gguf" and f.dialect is None:
        f.close()
        raise DFlashError(
            f"{path}: general.architecture '{f.architecture}' is not a DFlash drafter — dflash-diff compares "
            "drafters (HF checkpoint directories or drafter GGUFs)"
        )
    return f, True


def diff_drafters(
    a: str | os.PathLike[str] | DrafterFile,
    b: str | os.PathLike[str] | DrafterFile,
    *,
    progress: bool = False,
) -> DiffResult:
    """Compare drafter ``a`` (the reference) with ``b``: tensors, shapes and meaning."""
    fa, close_a = _open(a)
    try:
        fb, close_b = _open(b)
        try:
            return _diff(fa, fb, progress)
        finally:
            if close_b:
                fb.close()
    finally:
        if close_a:
            fa.close()


#: integer tensor types: ids, compared exactly (never as an RMS)
_INTEGER_TYPES = frozenset({"I64", "I32", "I16", "I8", "U8", "BOOL"})


def _dropped_by_conversion(f: DrafterFile, other: DrafterFile) -> frozenset[str]:
    """Tensors of an HF checkpoint that conversion does not write (DSpark's t2d, a full-vocabulary lm_head),
    when the other side is a GGUF: their absence there is what the converter does, not a loss."""
    if f.kind != "hf" or other.kind != "gguf" or f.family is None or f.spec is None:
        return frozenset()
    return f.family.dropped_on_convert(f.spec)


def _read_ids(f: DrafterFile, canonical: str) -> np.ndarray:
    """An integer tensor as the GGUF holds it: an HF checkpoint's data through its family's conversion
    step (speculators' d2t offsets → absolute ids, with llama.cpp's checks)."""
    raw = f.read_raw(canonical)
    if f.kind == "hf" and f.family is not None and f.spec is not None and canonical in f.family.final_tensors:
        raw = f.family.finalize_tensor(f.spec, canonical, raw, str(f.path))[0]
    return np.asarray(raw).astype(np.int64).reshape(-1)


def _exact_diff(fa: DrafterFile, fb: DrafterFile, canonical: str) -> ExactDiff:
    a, b = _read_ids(fa, canonical), _read_ids(fb, canonical)
    different = np.flatnonzero(a != b)
    first = (int(different[0]), int(a[different[0]]), int(b[different[0]])) if different.size else None
    return ExactDiff(canonical, fa.tensors[canonical], fb.tensors[canonical], int(different.size), first)


def _generated_by_conversion(f: DrafterFile, other: DrafterFile) -> dict[str, np.ndarray]:
    """Tensors conversion derives from an HF checkpoint's config (Gemma-4 DSpark's rope_freqs), when the
    other side is a GGUF: compared with what the config implies."""
    if f.kind != "hf" or other.kind != "gguf" or f.family is None or f.spec is None:
        return {}
    return f.family.generated_tensors(f.spec)


def _diff(fa: DrafterFile, fb: DrafterFile, progress: bool) -> DiffResult:
    dropped_a, dropped_b = _dropped_by_conversion(fa, fb), _dropped_by_conversion(fb, fa)
    generated_a, generated_b = _generated_by_conversion(fa, fb), _generated_by_conversion(fb, fa)
    only = [OneSided(c, "A", r) for c, r in fa.tensors.items()
            if c not in fb.tensors and c not in dropped_a and c not in generated_b]
    only += [OneSided(c, "B", r) for c, r in fb.tensors.items()
             if c not in fa.tensors and c not in dropped_b and c not in generated_a]
    common = [c for c in fa.tensors if c in fb.tensors]
    mismatches = [ShapeMismatch(c, fa.tensors[c], fb.tensors[c]) for c in common
                  if fa.tensors[c].shape != fb.tensors[c].shape]
    same_shape = [c for c in common if fa.tensors[c].shape == fb.tensors[c].shape]
    integer = [c for c in same_shape if {fa.tensors[c].type_name, fb.tensors[c].type_name} & _INTEGER_TYPES]
    same_shape = [c for c in same_shape if c not in integer]
    exact: list[ExactDiff] = []
    unreadable: list[Unreadable] = []
    for canonical in integer:
        try:
            exact.append(_exact_diff(fa, fb, canonical))
        except DFlashError as exc:
            unreadable.append(Unreadable(canonical, str(exc)))

    diffs: list[TensorDiff] = []
    for canonical, stats in _stream_pairs(fa, fb, same_shape, progress):
        if isinstance(stats, str):
            unreadable.append(Unreadable(canonical, stats))
            continue
        diffs.append(TensorDiff(canonical, fa.tensors[canonical], fb.tensors[canonical], stats))
    # tensors conversion derives from the config (small: Gemma-4 DSpark's rope_freqs), against the GGUF's
    for generated, f, label in ((generated_a, fb, "A"), (generated_b, fa, "B")):
        for canonical, array in generated.items():
            if canonical not in f.tensors:
                continue
            ref = TensorRef(canonical, "(from config.json)", tuple(array.shape), "F32", array.nbytes)
            a_ref, b_ref = (ref, f.tensors[canonical]) if label == "A" else (f.tensors[canonical], ref)
            if f.tensors[canonical].shape != tuple(array.shape):  # never skipped silently
                mismatches.append(ShapeMismatch(canonical, a_ref, b_ref))
                continue
            other = f.read_f32(canonical)
            pair = (array, other) if label == "A" else (other, array)
            diffs.append(TensorDiff(canonical, a_ref, b_ref, tensor_stats(*pair)))

    return DiffResult(
        a=_side("A", fa),
        b=_side("B", fb),
        tensors=sorted(diffs, key=_worst_first),
        only_one_side=only,
        unmapped=[("A", n) for n in fa.unmapped] + [("B", n) for n in fb.unmapped],
        shape_mismatches=mismatches,
        unreadable=unreadable,
        spec_differences=_spec_differences(fa, fb),
        info=_info(fa, fb) + _dropped_info(fa, dropped_a, "A") + _dropped_info(fb, dropped_b, "B"),
        file_order=[d.canonical for d in diffs],
        exact=exact,
    )


def _dropped_info(f: DrafterFile, dropped: frozenset[str], side: str) -> list[InfoItem]:
    present = [c for c in f.tensors if c in dropped]
    if not present:
        return []
    names = ", ".join(f.tensors[c].name for c in present)
    value = (names, None) if side == "A" else (None, names)
    return [InfoItem("dropped by conversion", *value, f"{side}'s tensors llama.cpp's converter does not write (as dflash-convert)")]


def _stream_pairs(
    fa: DrafterFile, fb: DrafterFile, names: list[str], progress: bool
) -> Iterator[tuple[str, Any]]:
    """(canonical, TensorStats) one pair at a time, or (canonical, error) when unreadable. Each pair is
    read in row blocks of both sides (peak: two float32 blocks, not two whole float32 tensors)."""
    bar = tqdm(total=len(names), desc="diff", unit="tensor", file=sys.stderr, leave=False,
               disable=not progress or not sys.stderr.isatty())
    try:
        for canonical in names:
            bar.set_postfix_str(canonical, refresh=False)
            acc = StatsAccumulator()
            try:
                for a, b in zip(fa.read_f32_pieces(canonical), fb.read_f32_pieces(canonical), strict=True):
                    acc.add(a, b)
            except DFlashError as exc:
                yield canonical, str(exc)
            else:
                yield canonical, acc.result()
            bar.update(1)
    finally:
        bar.close()


def _worst_first(t: TensorDiff) -> tuple[bool, float]:
    r = t.rel_rms
    return (not math.isnan(r), -r if not math.isnan(r) else 0.0)


def _spec_differences(fa: DrafterFile, fb: DrafterFile) -> list[SpecDifference]:
    if fa.spec is None or fb.spec is None:
        return [
            SpecDifference(
                "metadata", fa.spec_error or "decoded", fb.spec_error or "decoded", True,
                "drafter metadata cannot be decoded, so its meaning cannot be compared",
            )
        ]
    diffs = compare_specs(fa.spec, fb.spec, carried_a=carried_fields(fa), carried_b=carried_fields(fb))
    out = []
    for d in diffs:
        family = family_for_architecture(d.a) if d.field == "architecture" and isinstance(d.a, str) else None
        if family is not None and family.gguf_architecture_note and d.b in family.architectures \
                and "gguf" in (fa.kind, fb.kind):
            d = replace(d, meaningful=False, note=family.gguf_architecture_note)
        if d.field == "target_layer_ids":
            d = replace(d, note=f"compared in the HF convention; A stores {_stored_taps(fa)}: {fa.tap_convention}; "
                                f"B stores {_stored_taps(fb)}: {fb.tap_convention}")
        out.append(d)
    return out


def _stored_taps(f: DrafterFile) -> list[int] | None:
    if f.spec is None:
        return None
    ids = f.spec.target_layer_ids
    return f.dialect.taps_to_file(ids) if f.dialect else list(ids)


def _file_type(f: DrafterFile) -> str:
    if f.kind == "hf":
        dtypes = sorted({r.type_name for r in f.tensors.values()})
        return "safetensors " + "/".join(dtypes)
    value = f.metadata.get("general.file_type")
    if value is None:
        return "-"
    import gguf

    try:
        return f"{gguf.LlamaFileType(int(value)).name} ({value})"
    except (ValueError, TypeError, OverflowError):  # a string, array, NaN or infinity in the file
        return str(value)


def _tokenizer(f: DrafterFile) -> str:
    if f.kind == "hf":
        names = [n for n in ("tokenizer.json", "tokenizer.model", "tokenizer_config.json") if (f.path / n).is_file()]
        return "yes (" + ", ".join(names) + ")" if names else "no"
    model = f.metadata.get("tokenizer.ggml.model")
    if model is None:
        return "no"
    tokens = f.metadata.get("tokenizer.ggml.tokens")
    return f"yes ({model}, {len(tokens)} tokens)" if isinstance(tokens, list) else f"yes ({model})"


def _info(fa: DrafterFile, fb: DrafterFile) -> list[InfoItem]:
    """Keys that differ between forms by nature: shown, never failing."""
    return [
        InfoItem("format", _side("A", fa).form, _side("B", fb).form),
        InfoItem("file type", _file_type(fa), _file_type(fb)),
        InfoItem("quantization version", fa.metadata.get("general.quantization_version") if fa.kind == "gguf" else None,
                 fb.metadata.get("general.quantization_version") if fb.kind == "gguf" else None),
        InfoItem("tokenizer", _tokenizer(fa), _tokenizer(fb)),
        InfoItem("target layer ids as stored", _stored_taps(fa), _stored_taps(fb),
                 f"A: {fa.tap_convention}; B: {fb.tap_convention}"),
    ]


# --------------------------------------------------------------------------------------------
# Report
# --------------------------------------------------------------------------------------------

_LAYER = re.compile(r"^layers\.(\d+)\.")

_TENSOR_COLUMNS = [
    Column("tensor", "tensor"), Column("name_a", "A name"), Column("name_b", "B name"), Column("shape", "shape", "shape"),
    Column("type_a", "A type"), Column("type_b", "B type"), Column("bpw_a", "A bpw", ".3g"), Column("bpw_b", "B bpw", ".3g"),
    Column("rel_rms", "rel RMS", ".4g"), Column("max_abs_diff", "max |a-b|", ".4g"), Column("cosine", "cosine", ".6f"),
    Column("snr_db", "SNR dB", ".1f"), Column("range_a", "A range", ".3g"), Column("range_b", "B range", ".3g"),
]


def _tensor_columns(r: DiffResult) -> list[Column]:
    """All tensor columns, less a name column that only repeats the canonical id (an HF side)."""
    redundant = {key for key, side in (("name_a", "a"), ("name_b", "b"))
                 if all(getattr(t, side).name == t.canonical for t in r.tensors)}
    return [c for c in _TENSOR_COLUMNS if c.key not in redundant]


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


def _type_rows(r: DiffResult) -> list[dict[str, Any]]:
    groups: dict[tuple[str, str], list[TensorDiff]] = {}
    for t in r.tensors:  # worst first, so the first of each group is its worst
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


def _chart(r: DiffResult, threshold: float | None) -> BarChart:
    by_name = {t.canonical: t for t in r.tensors}
    groups: dict[str, list[Bar]] = {}
    for canonical in sorted(r.file_order, key=lambda c: _layer_key(c)):
        t = by_name[canonical]
        m = _LAYER.match(canonical)
        group = f"layer {m.group(1)}" if m else "global"
        label = f"{canonical} ({t.a.type_name} → {t.b.type_name})"
        groups.setdefault(group, []).append(Bar(label, t.rel_rms, _short_kind(canonical), t.over(threshold),
                                                tag=t.b.type_name))
    return BarChart(
        "Relative RMS error per tensor, by layer",
        [BarGroup(g, bars) for g, bars in groups.items()],
        value_label="‖a−b‖ / ‖a‖",
        reference=threshold,
        reference_label=f"threshold {threshold:g}" if threshold is not None else "",
        id="chart",
    )


def _layer_key(canonical: str) -> tuple[int, int]:
    m = _LAYER.match(canonical)
    return (1, int(m.group(1))) if m else (0, 0)  # stable sort keeps file order within a layer


def _build_report(r: DiffResult, threshold: float | None, allow_missing: bool) -> Report:
    failures = r.failures(threshold, allow_missing)
    relaxed = r._missing_phrases() if allow_missing else []
    rel = r.rel_rms_summary()
    worst = r.tensors[0] if r.tensors else None
    headline = (f"{len(r.tensors)} tensors, all identical" if worst is None or worst.stats.identical else
                f"{len(r.tensors)} tensors, max relative RMS error {rel['max']:.4g} ({worst.canonical})")
    status, level = verdict(failures, f"passes with --allow-missing ({'; '.join(relaxed)})" if relaxed else None,
                            headline)

    missing_level = "warning" if allow_missing else "error"
    summary = [
        Field("A (reference)", f"{r.a.path} — {r.a.form}", key="a"),
        Field("B", f"{r.b.path} — {r.b.form}", key="b"),
        Field("tensors compared", len(r.tensors), key="tensors_compared"),
        Field("rel RMS median", rel["median"], ".4g", key="rel_rms_median"),
        Field("rel RMS mean", rel["mean"], ".4g", key="rel_rms_mean"),
        Field("rel RMS max", rel["max"], ".4g", key="rel_rms_max"),
        Field("worst tensor", worst.canonical if worst else None, key="worst_tensor"),
        Field("bits per weight A / B", (r.bits_per_weight("A"), r.bits_per_weight("B")), ".4g", key="bits_per_weight"),
        Field("threshold", threshold, ".4g", key="threshold"),
        Field("exit code", EXIT_DIFFERENT if failures else EXIT_OK, key="exit_code"),
    ]
    sections = [
        _chart(r, threshold),  # first: the HTML page shows it without scrolling
        Table(
            "Differences in meaning",
            [Column("field", "field"), Column("a", "A"), Column("b", "B"), Column("note", "note")],
            [{"field": d.field, "a": d.a, "b": d.b, "note": d.note} for d in r.meaning_differences],
            level="error", id="meaning",
            note="metadata that changes what the drafter does (dimensions, taps, mask id, block size, SWA, scales)",
        ),
        Table(
            "Tensors only on one side",
            [Column("tensor", "tensor"), Column("side", "only in"), Column("name", "stored name"),
             Column("shape", "shape", "shape"), Column("type", "type")],
            [{"tensor": o.canonical, "side": o.side, "name": o.ref.name, "shape": list(o.ref.shape),
              "type": o.ref.type_name} for o in r.only_one_side],
            level=missing_level, id="missing",
        ),
        Table(
            "Unmapped tensor names",
            [Column("side", "side"), Column("name", "stored name")],
            [{"side": side, "name": name} for side, name in r.unmapped],
            level=missing_level, id="unmapped",
            note="names that no supported scheme (HF, llama.cpp, luce, dflash-draft) maps to a drafter tensor",
        ),
        Table(
            "Shape mismatches",
            [Column("tensor", "tensor"), Column("name_a", "A name"), Column("name_b", "B name"),
             Column("shape_a", "A shape", "shape"), Column("shape_b", "B shape", "shape"),
             Column("type_a", "A type"), Column("type_b", "B type")],
            [{"tensor": m.canonical, "name_a": m.a.name, "name_b": m.b.name, "shape_a": list(m.a.shape),
              "shape_b": list(m.b.shape), "type_a": m.a.type_name, "type_b": m.b.type_name}
             for m in r.shape_mismatches],
            level="error", id="shape_mismatches", note="shapes in numpy/HF order (GGUF dims reversed)",
        ),
        *([Table(
            "Integer tensors (compared exactly)",
            [Column("tensor", "tensor"), Column("name_a", "A name"), Column("name_b", "B name"),
             Column("n", "elements"), Column("different", "different"), Column("first", "first difference")],
            [{"tensor": e.canonical, "name_a": e.a.name, "name_b": e.b.name, "n": e.a.n_elements,
              "different": e.n_different,
              "first": f"[{e.first[0]}]: {e.first[1]} vs {e.first[2]}" if e.first else "-"} for e in r.exact],
            level="error" if r.exact_differences else "info", id="exact",
            note="token ids: any difference is an error (A's d2t offsets are made absolute first, as conversion does)",
            empty="none",
        )] if r.exact else []),  # only drafters with a d2t have integer tensors
        Table(
            "Unreadable tensors",
            [Column("tensor", "tensor"), Column("error", "error")],
            [{"tensor": u.canonical, "error": u.error} for u in r.unreadable],
            level="error", id="unreadable",
        ),
        Table(
            "Tensors, worst first",
            _tensor_columns(r),
            [_tensor_row(t, threshold) for t in r.tensors],
            id="tensors",
            flagged={i for i, t in enumerate(r.tensors) if t.over(threshold)},
            note="rel RMS = ‖a−b‖/‖a‖ with A as the reference; SNR = 10·log10(‖a‖²/‖a−b‖²)",
            empty="no tensor in common",
        ),
        Table(
            "Totals per type",
            [Column("type_a", "A type"), Column("type_b", "B type"), Column("tensors", "tensors"),
             Column("n_elements", "weights"), Column("bpw_b", "B bpw", ".3g"),
             Column("rel_rms_mean", "mean rel RMS", ".4g"), Column("rel_rms_max", "max rel RMS", ".4g"),
             Column("worst", "worst tensor")],
            _type_rows(r),
            id="types",
        ),
        Table(
            "Information (not compared)",
            [Column("key", "key"), Column("a", "A"), Column("b", "B"), Column("note", "note")],
            [{"key": i.key, "a": i.a, "b": i.b, "note": i.note} for i in r.info]
            + [{"key": d.field, "a": d.a, "b": d.b, "note": d.note}
               for d in r.spec_differences if not d.meaningful],
            id="info",
        ),
    ]
    title = f"dflash-diff: {Path(r.a.path).name} vs {Path(r.b.path).name}"
    return Report(title, status, level, summary, sections)
