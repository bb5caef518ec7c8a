"""The ``dflash-accept`` report: one `Report` (text, JSON, Markdown, HTML) from an `AcceptMeasurement`, and its PNG
plot.

The report is a declaration (`ACCEPT_REPORT`: its summary fields and sections in order, each naming where its values
come from) that `reporting.build` evaluates against an `_Accept` context: the measurement, the gates, and what the
report computes once (comparisons, verdicts, failures). The llama-server sections are `serving`'s own declaration.
"""

from __future__ import annotations

import json
import math
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .result import (CI_METHOD, EXIT_FAILED, EXIT_OK, SPEED_NOTE, TAU_RANDOM_NOTE, VERDICT_BELOW,
                            VERDICT_CRASHED, VERDICT_NONFINITE, VERDICT_REFUSED, VERDICT_ZERO, AcceptMeasurement,
                            ci_text)
from ..errors import UsageError
from ..files import atomic_output, check_output
from ..reporting import (Bar, BarGroup, ChartSpec, Column, EachSpec, FieldSpec, NotesSpec, Report, ReportSpec,
                        TableSpec, build, verdict)
from ..runtime import LoadInfo
from ..runtime.load import VERIFY_MODE
from .serving_measure import VERDICT_GAIN as SERVING_GAIN
from .serving_measure import VERDICT_NO_GAIN as SERVING_NO_GAIN
from .serving_measure import combo_label
from .serving_report import SECTIONS as SERVING_SECTIONS
from .serving_report import headline as serving_headline
from .serving_report import section_context as serving_context
from .parallel_report import SECTIONS as PARALLEL_SECTIONS
from .parallel_report import findings as parallel_findings
from .sweep_report import SECTIONS as SWEEP_SECTIONS
from .sweep_report import cliff_lines, headline_tokens
from ..stats import Comparison


@dataclass(frozen=True)
class _Accept:
    """What the report reads: the measurement, its gates, and what is computed once for every part."""

    r: AcceptMeasurement
    max_drop: float | None
    min_tau: float | None
    max_gap: float | None
    min_speedup: float | None
    comps: list[Comparison | None]
    failures: list[str]
    verdicts: list[str]
    llama_comps: list[Comparison | None]
    llama_verdicts: list[str]
    named: list[str]  # what deserves a look: the status's warning and the drafter table's level
    cliffs: list[str]  # where τ or the speed-up falls with context (`sweep_report.cliff_lines`), computed once


def _context(r: AcceptMeasurement, max_drop: float | None, min_tau: float | None, max_gap: float | None,
             min_speedup: float | None) -> _Accept:
    verdicts, llama_verdicts = r.verdicts(), r.llama_cpp_verdicts()
    named = [f"{d.name}: {v}" for d, v in zip(r.drafters, verdicts)
             if v in (VERDICT_BELOW, VERDICT_ZERO, VERDICT_NONFINITE)]
    named += [f"{d.name} in llama.cpp: {v}" for d, v in zip(r.drafters, llama_verdicts)
              if v in (VERDICT_BELOW, VERDICT_ZERO, VERDICT_REFUSED, VERDICT_CRASHED)]
    if r.serving is not None:
        named += [f"{run.name} in llama-server ({combo_label(run)}): {v}" for run, v in
                  zip(r.serving.runs, r.serving.verdicts()) if v not in (SERVING_GAIN, SERVING_NO_GAIN)]
    falls = cliff_lines(r)
    named += falls  # where τ or the speed-up falls with context: a warning, with its cause
    named += parallel_findings(r)  # a slot that drafts nothing, an output that differs under concurrency
    return _Accept(r, max_drop, min_tau, max_gap, min_speedup, r.comparisons(),
                   r.failures(max_drop, min_tau, max_gap, min_speedup), verdicts, r.llama_cpp_comparisons(),
                   llama_verdicts, named, falls)


def build_report(r: AcceptMeasurement, max_drop: float | None, min_tau: float | None = None,
                 max_gap: float | None = None, min_speedup: float | None = None) -> Report:
    return build(ACCEPT_REPORT, _context(r, max_drop, min_tau, max_gap, min_speedup))


# ---- status and summary ---------------------------------------------------------------------------------------


def _status(c: _Accept) -> tuple[str, str]:
    r = c.r
    first = r.drafters[0]
    parts = [f"{headline_tokens(r)}: {first.name} τ {first.tau:.2f}"]
    for d, cmp in zip(r.drafters[1:], c.comps[1:]):
        assert cmp is not None
        parts.append(f"{d.name} τ {d.tau:.2f} ({cmp.delta:+.2f}, {cmp.relative:+.1%}; {ci_text(cmp)})")
    if r.llama_cpp is not None:
        parts.append("llama.cpp: " + ", ".join(
            f"{d.name} {'refused' if l.refused else f'τ {l.tau:.2f}'} ({v})"
            for d, l, v in zip(r.drafters, r.llama_cpp, c.llama_verdicts)))
    if r.serving is not None:
        parts.append(serving_headline(r.serving))
    headline = "; ".join(parts)
    return verdict(c.failures, f"{headline} — {'; '.join(c.named)}" if c.named else None, headline)


def _prompts_text(c: _Accept) -> str:
    n = [len(ids) for ids in c.r.prompt_ids]
    return f"{len(c.r.prompts)} from {c.r.prompt_source} ({min(n)}–{max(n)} tokens each)"


FIELDS = (
    FieldSpec("target", lambda c: c.r.target, key="target"),
    FieldSpec("prompts", _prompts_text, key="prompts_text"),
    FieldSpec("prompt count", lambda c: len(c.r.prompts), key="prompt_count"),
    FieldSpec("max new tokens", lambda c: c.r.max_new_tokens, key="max_new_tokens"),
    FieldSpec("temperature", lambda c: c.r.temperature, key="temperature"),
    FieldSpec("seed", lambda c: c.r.seed, key="seed"),
    FieldSpec("device / dtype", lambda c: f"{c.r.device} / {c.r.dtype}", key="device_dtype"),
    FieldSpec("stop tokens", lambda c: c.r.stop_token_ids or "none (--ignore-eos)", key="stop_token_ids"),
    FieldSpec("reasoning", lambda c: c.r.reasoning if c.r.reasoning is not None else
              "not set (the template's default)", key="reasoning"),
    FieldSpec("chat template kwargs", lambda c: json.dumps(c.r.chat_template_kwargs, sort_keys=True),
              key="chat_template_kwargs"),
    FieldSpec("verification", lambda c: VERIFY_MODE, key="verification"),
    FieldSpec("confidence interval", lambda c: CI_METHOD, key="ci_method"),
    FieldSpec("max drop", lambda c: c.max_drop, "pct", key="max_drop"),
    FieldSpec("min tau", lambda c: c.min_tau, key="min_tau"),
    FieldSpec("max gap (llama.cpp)", lambda c: c.max_gap, "pct", key="max_gap"),
    FieldSpec("min speed-up (llama-server)", lambda c: c.min_speedup, key="min_speedup"),
    FieldSpec("exit code", lambda c: EXIT_FAILED if c.failures else EXIT_OK, key="exit_code"),
)


# ---- the drafter table and its chart --------------------------------------------------------------------------


def _form(info: LoadInfo) -> str:
    kind = "HF" if info.kind == "hf" else f"GGUF {info.dialect}" if info.dialect else "GGUF"
    types = ", ".join(f"{t}×{n}" for t, n in sorted(info.tensor_types.items(), key=lambda kv: -kv[1]))
    return f"{kind}: {types}"


def _drafter_columns(c: _Accept) -> list[Column]:
    columns = [Column("drafter", "drafter"), Column("family", "family"), Column("form", "tensors"),
               Column("tau", "τ", ".3f"),
               Column("tau_pooled", "τ all rounds", ".3f"), Column("delta", "Δτ vs first", "+.3f"),
               Column("relative", "Δ%", "pct"), Column("ci_low", "CI low", "+.3f"), Column("ci_high", "CI high", "+.3f"),
               Column("rounds", "rounds"), Column("verdict", "verdict"),
               Column("decode_tok_s", "decode tok/s (this runtime)", ".1f")]
    if c.r.llama_cpp is not None:
        columns[-1:-1] = [Column("tau_llama_cpp_schedule", "τ on llama.cpp's schedule", ".3f"),
                          Column("tau_llama_cpp", "τ llama.cpp", ".3f"),
                          Column("llama_cpp_delta", "Δτ llama.cpp", "+.3f"),
                          Column("llama_cpp_verdict", "llama.cpp verdict")]
    return columns


def _drafter_rows(c: _Accept) -> list[dict[str, Any]]:
    rows = []
    for i, (d, cmp) in enumerate(zip(c.r.drafters, c.comps)):
        row: dict[str, Any] = {
            "drafter": d.path, "family": d.info.family_name, "form": _form(d.info), "matmul": d.info.matmul,
            "block_size": d.block_size, "tau": d.tau, "tau_pooled": d.tau_pooled,
            "delta": None if cmp is None else cmp.delta, "relative": None if cmp is None else cmp.relative,
            "ci_low": None if cmp is None or cmp.ci is None else cmp.ci[0],
            "ci_high": None if cmp is None or cmp.ci is None else cmp.ci[1],
            "rounds": len(d.accepted), "tokens": d.tokens, "decode_tok_s": d.decode_tokens_per_s,
            "nonfinite_rounds": d.nonfinite_rounds, "verdict": c.verdicts[i],
        }
        if c.r.llama_cpp is not None:
            l, lc = c.r.llama_cpp[i], c.llama_comps[i]
            row.update({
                "tau_llama_cpp": None if l.refused else l.tau,
                "tau_llama_cpp_schedule": d.schedule_tau, "llama_cpp_schedule": d.schedule,
                "llama_cpp_gap_causes": list(d.gap_causes),
                "tau_llama_cpp_ci": None if lc is None or lc.ci is None else [lc.ci[0], lc.ci[1]],
                "llama_cpp_delta": None if lc is None else lc.delta,
                "llama_cpp_drafted": None if l.refused else l.drafted,
                "llama_cpp_accepted": None if l.refused else l.accepted,
                "llama_cpp_verdict": c.llama_verdicts[i],
                "llama_cpp_message": l.refused,
                "llama_cpp_note": l.note,
                "llama_cpp_gguf": l.gguf,
            })
        rows.append(row)
    return rows


def _drafter_flagged(c: _Accept) -> set[int]:
    """A drafter below the first, accepting nothing, with non-finite logits, refused by llama.cpp, or failing."""
    return {i for i, d in enumerate(c.r.drafters)
            if c.verdicts[i] in (VERDICT_BELOW, VERDICT_ZERO, VERDICT_NONFINITE)
            or (c.r.llama_cpp is not None and c.llama_verdicts[i] in (VERDICT_BELOW, VERDICT_ZERO, VERDICT_REFUSED))
            or any(f.startswith(f"{d.name}:") for f in c.failures)}


def _drafter_note(c: _Accept) -> str:
    return ("τ = mean over prompts of committed tokens per target forward; τ all rounds pools every round; "
            "Δτ and its CI are paired over prompts (see 'confidence interval')"
            + ("; τ llama.cpp: the same prompts through llama.cpp; τ on llama.cpp's schedule: this runtime's rounds "
               "scheduled as that llama.cpp program schedules them (dflashkit.runtime.schedules); Δτ llama.cpp against "
               "it, paired per prompt (CI in tau_llama_cpp_ci)" if c.r.llama_cpp is not None else ""))


def _tau_bars(c: _Accept) -> list[BarGroup]:
    return [BarGroup(d.name, [Bar(f"{d.path}: τ", d.tau, series=d.name)]) for d in c.r.drafters]


# ---- per round, per block position, per prompt ----------------------------------------------------------------


def _width(c: _Accept) -> int:
    return max(d.block_size for d in c.r.drafters)


def _histogram_columns(c: _Accept) -> list[Column]:
    return [Column("drafter", "drafter")] + [Column(f"a{k}", str(k), "pct") for k in range(_width(c))]


def _histogram_rows(c: _Accept) -> list[dict[str, Any]]:
    rows = []
    for d in c.r.drafters:
        h = d.histogram()
        rows.append({"drafter": d.name, **{f"a{k}": h[k] if k < len(h) else None for k in range(_width(c))},
                     "histogram": h})
    return rows


def _position_columns(c: _Accept) -> list[Column]:
    return [Column("drafter", "drafter")] + [Column(f"p{k}", str(k), "pct") for k in range(1, _width(c))]


def _position_rows(c: _Accept) -> list[dict[str, Any]]:
    rows = []
    for d in c.r.drafters:
        p = d.position_rates()
        rows.append({"drafter": d.name, **{f"p{k}": p[k - 1] if k - 1 < len(p) else None
                                           for k in range(1, _width(c))}, "rates": p})
    return rows


def _position_bars(c: _Accept) -> list[BarGroup]:
    return [BarGroup(str(k), [Bar(f"{d.name} @ {k}", d.position_rates()[k - 1], series=d.name)
                              for d in c.r.drafters if k < d.block_size]) for k in range(1, _width(c))]


def _prompt_columns(c: _Accept) -> list[Column]:
    r = c.r
    columns = [Column("prompt", "prompt"), Column("category", "category"), Column("prompt_tokens", "tokens")]
    columns += [Column(f"tau_{j}", f"τ {d.name}", ".2f") for j, d in enumerate(r.drafters)]
    if r.llama_cpp is not None:
        for j, d in enumerate(r.drafters):
            columns += [Column(f"tau_llama_cpp_schedule_{j}", f"τ {d.name} on llama.cpp's schedule", ".2f"),
                        Column(f"tau_llama_cpp_{j}", f"τ llama.cpp {d.name}", ".2f")]
    return columns


def _prompt_rows(c: _Accept) -> list[dict[str, Any]]:
    r = c.r
    rows = []
    for i, p in enumerate(r.prompts):
        row: dict[str, Any] = {"prompt": p.id, "category": p.category, "prompt_tokens": len(r.prompt_ids[i])}
        for j, d in enumerate(r.drafters):
            run = d.runs[i]
            row[f"tau_{j}"] = run.tau
            row[f"generated_{j}"] = len(run.output_ids)
            if r.llama_cpp is not None:
                l = r.llama_cpp[j]
                row[f"tau_llama_cpp_{j}"] = l.runs[i].tau if i < len(l.runs) else None
                row[f"tau_llama_cpp_schedule_{j}"] = d.schedule_taus[i]
        rows.append(row)
    return rows


# ---- warnings and notes ---------------------------------------------------------------------------------------


def _warnings(c: _Accept) -> list[str]:
    r = c.r
    warnings = r.divergences()
    for d in r.drafters:
        empty = [p.id for p, run in zip(r.prompts, d.runs) if not run.rounds]
        if empty:
            warnings.append(f"{d.name}: no round on prompt(s) {', '.join(empty)} (the first token ended it) — left "
                            "out of τ")
    return warnings


def _notes(c: _Accept) -> list[str]:
    r = c.r
    notes = [SPEED_NOTE] + list(r.notes)
    if any(math.isfinite(d.tau) and d.tau < 1.3 for d in r.drafters):
        notes.insert(0, TAU_RANDOM_NOTE)
    if r.llama_cpp is not None:
        notes.append(f"llama.cpp: {r.target_gguf} as the target; greedy (--temp 0), --spec-draft-n-max = block size − 1; "
                     "τ per prompt = n_predict / (n_predict − n_accept)")
        for d, l in zip(r.drafters, r.llama_cpp):
            if l.refused:
                notes.append(f"llama.cpp refused {d.name}: {l.refused}")
            if l.note:
                notes.append(f"llama.cpp, {d.name}: {l.note}")
    notes += [f"{d.name}: " + "; ".join([d.info.matmul, *d.info.notes]) for d in r.drafters]
    return notes


# ---- the report -----------------------------------------------------------------------------------------------


ACCEPT_REPORT = ReportSpec(
    title=lambda c: f"dflash-accept: {', '.join(d.name for d in c.r.drafters)} on {Path(c.r.target).name}",
    status=_status,
    fields=FIELDS,
    sections=(
        TableSpec("Acceptance length τ per drafter", _drafter_columns, _drafter_rows, id="drafters",
                  flagged=_drafter_flagged, note=_drafter_note,
                  level=lambda c: "error" if c.failures else "warning" if c.named else "info"),
        *SWEEP_SECTIONS,
        ChartSpec("τ per drafter", _tau_bars, value_label="τ (tokens per target forward)",
                  reference=lambda c: c.r.drafters[0].tau, reference_label=lambda c: f"{c.r.drafters[0].name}",
                  id="tau_chart", scale="linear"),
        TableSpec("Accepted draft tokens per round", _histogram_columns, _histogram_rows, id="histogram",
                  note="share of rounds that accepted k draft tokens (the bonus token not counted)"),
        TableSpec("Acceptance rate per block position", _position_columns, _position_rows, id="positions",
                  note="share of rounds whose draft token at block position k was accepted (k = 1 is the first "
                       "drafted token; a token is accepted only if all before it were)"),
        ChartSpec("Acceptance rate per block position (chart)", _position_bars, value_label="acceptance rate",
                  id="positions_chart", scale="linear"),
        TableSpec("τ per prompt", _prompt_columns, _prompt_rows, id="prompts"),
        NotesSpec("Warnings", _warnings, id="warnings", level=lambda c: "warning" if _warnings(c) else "info"),
        NotesSpec("Notes", _notes, id="notes"),
        EachSpec(lambda c: [serving_context(c.r.serving)] if c.r.serving is not None else [], SERVING_SECTIONS),
        *PARALLEL_SECTIONS,
    ),
)


# ---------------------------------------------------------------------------------------------
# PNG plot
# ---------------------------------------------------------------------------------------------


def require_matplotlib() -> None:
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        raise UsageError("a .png plot needs matplotlib (pip install matplotlib) — or give --plot FILE.html") from None


def write_png(result: AcceptMeasurement, path: str | os.PathLike, *, force: bool = False) -> Path:
    """τ per drafter with the CI of its difference to the first, as a PNG (matplotlib)."""
    require_matplotlib()
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    out = Path(path)
    check_output(out, force=force)
    names = [d.name for d in result.drafters]
    taus = [d.tau for d in result.drafters]
    base = result.drafters[0].tau
    lower, upper = [0.0], [0.0]  # error bars: the CI of Δτ, drawn around each drafter's τ
    for c in result.comparisons()[1:]:
        ci = c.ci if c is not None else None
        lower.append(0.0 if ci is None else max(0.0, c.delta - ci[0]))  # type: ignore[union-attr]
        upper.append(0.0 if ci is None else max(0.0, ci[1] - c.delta))  # type: ignore[union-attr]
    fig, ax = plt.subplots(figsize=(max(4.0, 1.2 * len(names) + 2), 4))
    ax.bar(names, taus, yerr=[lower, upper], capsize=4, color="#4e79a7")
    ax.axhline(base, color="#c00000", linestyle="--", linewidth=1)
    ax.set_ylabel("τ (tokens per target forward)")
    ax.set_title(f"dflash-accept on {Path(result.target).name} (T={result.temperature:g})")
    plt.setp(ax.get_xticklabels(), rotation=20, ha="right")
    fig.tight_layout()
    try:
        with atomic_output(out, force=force) as f:
            fig.savefig(f, format="png", dpi=120)
    finally:
        plt.close(fig)
    return out

