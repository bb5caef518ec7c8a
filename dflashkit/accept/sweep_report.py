"""The report's "by context length", "where τ falls" and "by category" sections (declared; `accept.report` lists
them). Every τ and speed-up here stands beside the mean prompt tokens it was measured at."""

from __future__ import annotations

import math
from typing import Any

from ..llama_cpp.speculative_simple import mean_tau
from ..reporting import Column, NotesSpec, TableSpec
from ..stats import paired_bootstrap_ci
from ..sweeps import level_label
from .serving_measure import speedup_ci_of_logs, speedup_of_logs
from .sweep import below_first, cliffs, context_rows, mean_prompt_tokens, series_by_runtime, server_refusal


def _sweep(c: Any) -> Any:
    return c.r.by_context


def _context_columns(c: Any) -> list[Column]:
    columns = [Column("drafter", "drafter"), Column("context_label", "--context"),
               Column("prompt_tokens", "mean prompt tokens", ".0f"), Column("tau", "τ", ".2f"),
               Column("tau_ci_text", "τ 95% CI"), Column("delta", "Δτ vs shortest", "+.2f"),
               Column("relative", "Δ%", "pct"), Column("delta_ci_text", "Δ 95% CI")]
    sweep = _sweep(c)  # the runtimes measured (no figure computed for it: the rows compute theirs once)
    runtimes = {k for j in range(len(sweep.results[0].drafters)) for k in series_by_runtime(sweep, j)}
    if "llama.cpp" in runtimes:
        columns.append(Column("tau_llama_cpp", "τ llama.cpp", ".2f"))
    if "llama-server speed-up" in runtimes:
        columns += [Column("tau_server", "τ llama-server", ".2f"), Column("speedup", "speed-up", ".2f"),
                    Column("speedup_ci_text", "speed-up 95% CI")]
    return columns


def _interval(ci: Any, fmt: str) -> str:
    return f"[{ci[0]:{fmt}}, {ci[1]:{fmt}}]" if ci else "—"


def _context_rows(c: Any) -> list[dict[str, Any]]:
    rows = context_rows(_sweep(c), c.r.seed)
    for r in rows:
        r["context_label"] = level_label(r["context"])
        r["tau_ci_text"] = _interval(r["tau_ci"], ".2f")
        r["delta_ci_text"] = _interval(r["delta_ci"], "+.2f")
        if "speedup_ci" in r:
            r["speedup_ci_text"] = _interval(r["speedup_ci"], ".2f")
    return rows


def cliff_lines(r: Any) -> list[str]:
    """Where τ or the speed-up falls with context in measurement ``r`` (none without ``--context``): the report's
    warning and section, the release's record."""
    sweep = r.by_context
    if sweep is None:
        return []
    return [cl.text() for cl in cliffs(sweep, r.seed)] + below_first(sweep, r.seed)


def server_failures(r: Any) -> list[str]:
    """Per drafter, each context level whose llama-server refused or crashed: its message (the signal and last
    lines) — that level's speed-up and τ through the server are null."""
    sweep = r.by_context
    if sweep is None:
        return []
    return [f"{d.name} at --context {level_label(level)}: {why}" for d in sweep.results[0].drafters
            for level, res in zip(sweep.levels, sweep.results) if (why := server_refusal(res, d.path))]


def _context_note(c: Any) -> str:
    s = _sweep(c)
    return (f"each prompt measured after N tokens of long context from {s.source} (docs/serving.md, 'τ falls at long "
            "context?'); Δτ and its CI are paired over prompts against the shortest level; the target prefilled each "
            f"prompt once per level for every drafter (prefills per level: {', '.join(map(str, s.prefills))})")


# ---- by category ----------------------------------------------------------------------------------------------


def category_rows(r: Any) -> list[dict[str, Any]]:
    """Per drafter × prompt category: prompts, mean prompt tokens, τ with its CI (and llama.cpp's τ, llama-server's
    speed-up with its CI where measured)."""
    categories = sorted({p.category or "(none)" for p in r.prompts})
    rows = []
    for j, d in enumerate(r.drafters):
        for cat in categories:
            idx = [i for i, p in enumerate(r.prompts) if (p.category or "(none)") == cat]
            taus = [d.runs[i].tau for i in idx]
            ci = paired_bootstrap_ci([t for t in taus if math.isfinite(t)], seed=r.seed)
            row: dict[str, Any] = {"drafter": d.name, "category": cat, "prompts": len(idx),
                                   "prompt_tokens": sum(len(r.prompt_ids[i]) for i in idx) / len(idx),
                                   "tau": mean_tau(taus), "tau_ci": list(ci) if ci else None,
                                   "tau_ci_text": _interval(ci, ".2f")}
            if r.llama_cpp is not None and not r.llama_cpp[j].refused:
                row["tau_llama_cpp"] = mean_tau([r.llama_cpp[j].runs[i].tau for i in idx if i < len(r.llama_cpp[j].runs)])
            if r.serving is not None:
                runs = [s for s in r.serving.runs if s.drafter == d.path and s.off]
                if runs:  # the first combination's (as the headline's); per prompt tok/s with / alone
                    per_prompt = runs[0].log_ratios_per_prompt()
                    logs = [per_prompt[i] for i in idx if i < len(per_prompt) and math.isfinite(per_prompt[i])]
                    row["speedup"] = speedup_of_logs(logs)
                    row["speedup_ci_text"] = _interval(speedup_ci_of_logs(logs, r.seed), ".2f")
            rows.append(row)
    return rows


def _category_columns(c: Any) -> list[Column]:
    columns = [Column("drafter", "drafter"), Column("category", "category"), Column("prompts", "prompts"),
               Column("prompt_tokens", "mean prompt tokens", ".0f"), Column("tau", "τ", ".2f"),
               Column("tau_ci_text", "τ 95% CI")]
    r = c.r  # what was measured decides the columns (the rows compute their figures once)
    if r.llama_cpp is not None and any(not l.refused for l in r.llama_cpp):
        columns.append(Column("tau_llama_cpp", "τ llama.cpp", ".2f"))
    if r.serving is not None and any(s.off for s in r.serving.runs if s.drafter in {d.path for d in r.drafters}):
        columns += [Column("speedup", "speed-up", ".2f"), Column("speedup_ci_text", "speed-up 95% CI")]
    return columns


def headline_tokens(r: Any) -> str:
    """"at ≈ 31 prompt tokens" (or the range of levels): what every τ of the status line was measured at."""
    if r.by_context is not None:
        s = r.by_context
        return (f"at ≈ {mean_prompt_tokens(s.results[0]):.0f} prompt tokens (--context {level_label(s.levels[0])}; "
                f"every level in 'τ by context length')")
    return f"at ≈ {mean_prompt_tokens(r):.0f} prompt tokens"


SECTIONS = (
    TableSpec("τ by context length", _context_columns, _context_rows, id="by_context", note=_context_note,
              when=lambda c: c.r.by_context is not None),
    NotesSpec("Where τ falls with context", lambda c: c.cliffs, id="cliffs",
              level=lambda c: "warning" if c.cliffs else "info",
              empty="no level significantly below the shortest (paired 95% CI, ≥ 10% lower)",
              when=lambda c: c.r.by_context is not None),
    NotesSpec("llama-server by context length: no figure", lambda c: server_failures(c.r), id="context_server",
              level="warning", when=lambda c: bool(server_failures(c.r))),
    TableSpec("τ by prompt category", _category_columns, lambda c: category_rows(c.r), id="by_category",
              note="τ per prompt category (the prompts file's 'category'), CI over the category's prompts",
              when=lambda c: len({p.category for p in c.r.prompts}) > 1),
)
