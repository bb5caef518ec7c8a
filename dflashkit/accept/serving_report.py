"""The serving sections of the ``dflash-accept`` report: every llama-server combination side by side, its speed-up
chart, why a server the user runs drafts less than the drafter can, the output differences and the notes —
declared, built by `reporting.build` against a `SectionContext` (`dflashkit.accept.serving_measure` measures them)."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from ..reporting import Bar, BarGroup, ChartSpec, Column, NotesSpec, TableSpec, build_sections
from ..stats import CONFIDENCE
from .serving_measure import (VERDICT_CRASHED, VERDICT_DIFFERS, VERDICT_GAIN, VERDICT_LOSS, VERDICT_NO_GAIN,
                              VERDICT_REFUSED, Difference, ServingResult, ServingRun, combo_label, target_label)
from .tau_gap import NO_CAUSE, VERDICT_AGREES, ci_text


# ---------------------------------------------------------------------------------------------
# Report sections (the accept report carries them): declared, built by reporting.build
# ---------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class SectionContext:
    """What the serving sections read: the result, its verdicts, its rows (the table's, the chart's) and the output
    differences, each computed once (a verdict bootstraps the speed-up's CI)."""

    s: ServingResult
    verdicts: list[str]
    rows: list[dict[str, Any]]
    differ: list[str]
    capped: list[str]
    gap_notes: list[str]  # combinations whose τ is off the reference's (`_gap_notes`)


def capped_text(r: ServingRun, k: int) -> str:
    """Why a server the user runs drafts less than the drafter could, and how to set it."""
    assert r.block_size is not None
    most = r.block_size - 1
    return (f"llama-server at {target_label(r)}: every reply drafted at most {k} token(s) a round and no prompt's τ "
            f"passed {k + 1}, where the drafter drafts up to {most} (block size {r.block_size}) — the server's "
            f"n-max is likely {k}. llama-server drafts at most 3 tokens a round unless told (its default n_max = 3, "
            f"which its log prints): start it with --spec-draft-n-max {most}, or measure the choice with "
            "dflash-accept --llama-server BIN_DIR --draft-n-max 4,8,15 (docs/serving.md, \"τ lower in my server?\")")


def section_context(s: ServingResult) -> SectionContext:
    verdicts = s.verdicts()
    rows, differ, capped = [], [], []
    for r, v in zip(s.runs, verdicts):
        diffs = r.differences(s.prompt_names)
        differ += [f"{r.name} on {target_label(r)} ({combo_label(r)}): {d.text()}" for d in diffs[:3]]
        rows.append(_row(r, v, diffs))
        if (k := r.capped_n_max()) is not None:
            capped.append(capped_text(r, k))
    return SectionContext(s, verdicts, rows, differ, capped, _gap_notes(s))


def _row(r: ServingRun, v: str, diffs: list[Difference]) -> dict[str, Any]:
    ci = r.speedup_ci
    measured = bool(r.on) and bool(r.off)
    return {
        "target": target_label(r), "target_gguf": r.target_gguf, "drafter": r.drafter,
        "drafter_name": r.name, "drafter_gguf": r.drafter_gguf,
        "draft_cache_type": r.draft_cache_type or "default", "draft_n_max": r.draft_n_max,
        "tau": r.tau if r.on else None, "tau_per_prompt": r.taus,
        "reference_tau": r.reference_tau if r.reference_taus is not None and math.isfinite(r.reference_tau) else None,
        "reference_tau_per_prompt": r.reference_taus, "tau_verdict": r.tau_verdict(),
        "tau_gap_ci": list(c.ci) if (c := r.tau_comparison()) is not None and c.ci is not None else None,
        "gap_causes": list(r.gap_causes),
        "tokens_per_s_off": r.tokens_per_s_off if r.off else None,
        "tokens_per_s_on": r.tokens_per_s_on if r.on else None,
        "speedup": r.speedup if measured else None, "speedup_ci": list(ci) if ci else None,
        "speedup_ci_text": f"[{ci[0]:.2f}, {ci[1]:.2f}]" if ci else ("no CI (< 2 prompts)" if measured else "—"),
        "identical_output": ("yes" if not diffs else "no") if measured else "—",
        "first_difference": None if not diffs else {"prompt": diffs[0].prompt, "position": diffs[0].position,
                                                    "target_token": diffs[0].target_token,
                                                    "speculative_token": diffs[0].speculative_token},
        "drafted": r.drafted, "accepted": r.accepted,
        "acceptance_rate": r.acceptance_rate if r.drafted else None, "drafts_at_most": r.drafts_at_most(),
        "refused": r.refused, "verdict": v, "note": r.note,
    }


def _flagged(c: SectionContext) -> set[int]:
    return {i for i, (v, row) in enumerate(zip(c.verdicts, c.rows))
            if v in (VERDICT_LOSS, VERDICT_DIFFERS, VERDICT_REFUSED, VERDICT_CRASHED)
            or row["tau_verdict"] not in (None, VERDICT_AGREES)}


def _speedup_bars(c: SectionContext) -> list[BarGroup]:
    groups: dict[str, list[Bar]] = {}
    for r, row in zip(c.s.runs, c.rows):
        if row["speedup"] is not None:
            groups.setdefault(target_label(r), []).append(
                Bar(f"{r.name} ({combo_label(r)})", row["speedup"], series=r.name, tag=str(r.draft_n_max or ""),
                    flagged=row["verdict"] != VERDICT_GAIN))
    return [BarGroup(k, v) for k, v in groups.items()]


def _gap_notes(s: ServingResult) -> list[str]:
    out = []
    for r in s.runs:
        v, comparison = r.tau_verdict(), r.tau_comparison()
        if v is not None and v != VERDICT_AGREES and comparison is not None:
            causes = "; ".join(r.gap_causes) or NO_CAUSE
            out.append(f"{r.name} on {target_label(r)} ({combo_label(r)}): τ {r.tau:.2f} {v} "
                       f"{r.reference_tau:.2f} ({ci_text(comparison)}); likely cause: {causes}")
    return out


def _notes(c: SectionContext) -> list[str]:
    unreplayed = [r for r in c.s.runs if r.reference_taus is None and r.refused is None]
    return list(c.s.notes) + [f"{r.name} ({combo_label(r)}): {r.note}" for r in c.s.runs if r.note] + [
        f"verdicts: {VERDICT_GAIN} / {VERDICT_LOSS} — the speed-up's CI lies above / below 1; {VERDICT_NO_GAIN} "
        f"— it spans 1; {VERDICT_DIFFERS} — the speculative tokens are not the target's own greedy tokens",
        "τ reference: the reference runtime's τ of the same drafter on llama-server's schedule (first token from the "
        "prefill, no round past -n) at the combination's n-max; τ verdict: agrees, or above / below reference when "
        "the paired CI of the per-prompt differences excludes 0 — as --llama-cpp's rows, and --max-gap gates both"] + (
        ["no τ reference for " + ", ".join(sorted({r.name for r in unreplayed})) + ": a server the user runs, whose "
         "n-max is not known (start it with --spec-draft-n-max block − 1)"] if unreplayed else [])


_COLUMNS = [
    Column("target", "target"), Column("drafter_name", "drafter"), Column("draft_cache_type", "draft cache"),
    Column("draft_n_max", "n-max"), Column("tau", "τ", ".2f"),
    Column("reference_tau", "τ reference (server schedule)", ".2f"), Column("tau_verdict", "τ verdict"),
    Column("tokens_per_s_off", "tok/s alone", ".1f"),
    Column("tokens_per_s_on", "tok/s with drafter", ".1f"), Column("speedup", "speed-up", ".2f"),
    Column("speedup_ci_text", f"{CONFIDENCE:.0%} CI"), Column("identical_output", "identical output"),
    Column("verdict", "verdict"),
]

#: the serving table (every combination side by side), its speed-up chart, the output differences and notes;
#: evaluated against a `section_context`
SECTIONS = (
    TableSpec("llama-server: speed-up against the target alone", _COLUMNS, lambda c: c.rows, id="serving",
              flagged=_flagged, level=lambda c: "warning" if _flagged(c) else "info",
              note=lambda c: f"measured through {c.s.source}: the same prompts, order and seeds for every combination"),
    ChartSpec("llama-server speed-up (chart)", _speedup_bars, value_label="speed-up (×)", reference=1.0,
              reference_label="target alone", id="serving_chart", scale="linear"),
    NotesSpec("llama-server: why it drafts less than the drafter can", lambda c: c.capped, id="serving_n_max",
              level="warning", when=lambda c: bool(c.capped)),
    NotesSpec("llama-server: τ against the reference", lambda c: c.gap_notes, id="serving_tau_gap", level="warning",
              when=lambda c: bool(c.gap_notes)),
    NotesSpec("llama-server: output differences", lambda c: c.differ, id="serving_differences",
              level=lambda c: "warning" if c.differ else "info",
              empty="none: every speculative output equals the target's own"),
    NotesSpec("llama-server notes", _notes, id="serving_notes"),
)


def report_sections(s: ServingResult) -> list[Any]:
    """The serving sections of ``s`` (`SECTIONS`, built)."""
    return build_sections(SECTIONS, section_context(s))


def headline(s: ServingResult) -> str:
    parts = []
    for r, v in zip(s.runs, s.verdicts()):
        speed = f" ×{r.speedup:.2f}" if r.on and r.off else ""
        parts.append(f"{r.name} [{combo_label(r)}]{speed} ({v})")
    return "llama-server: " + ", ".join(parts)
