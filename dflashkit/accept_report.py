"""The ``dflash-accept`` report: one `Report` (text, JSON, Markdown, HTML) from an `AcceptMeasurement`, and its PNG
plot."""

from __future__ import annotations

import json
import math
import os
from pathlib import Path
from typing import Any

from .accept_result import (CI_METHOD, EXIT_FAILED, EXIT_OK, SPEED_NOTE, TAU_RANDOM_NOTE, VERDICT_BELOW,
                            VERDICT_CRASHED, VERDICT_NONFINITE, VERDICT_REFUSED, VERDICT_ZERO, AcceptMeasurement,
                            ci_text)
from .errors import UsageError
from .files import atomic_output, check_output
from .reporting import Bar, BarChart, BarGroup, Column, Field, Notes, Report, Table, verdict
from .runtime import LoadInfo
from .runtime.load import VERIFY_MODE
from .serving import VERDICT_GAIN as SERVING_GAIN
from .serving import VERDICT_NO_GAIN as SERVING_NO_GAIN
from .serving import combo_label
from .serving import headline as serving_headline
from .serving import report_sections as serving_sections



def _form(info: LoadInfo) -> str:
    kind = "HF" if info.kind == "hf" else f"GGUF {info.dialect}" if info.dialect else "GGUF"
    types = ", ".join(f"{t}×{n}" for t, n in sorted(info.tensor_types.items(), key=lambda kv: -kv[1]))
    return f"{kind}: {types}"


def build_report(r: AcceptMeasurement, max_drop: float | None, min_tau: float | None = None,
                 max_gap: float | None = None, min_speedup: float | None = None) -> Report:
    comps = r.comparisons()
    failures = r.failures(max_drop, min_tau, max_gap, min_speedup)
    verdicts = r.verdicts()
    llama_comps, llama_verdicts = r.llama_cpp_comparisons(), r.llama_cpp_verdicts()
    first = r.drafters[0]
    parts = [f"{first.name} τ {first.tau:.2f}"]
    for d, c in zip(r.drafters[1:], comps[1:]):
        assert c is not None
        parts.append(f"{d.name} τ {d.tau:.2f} ({c.delta:+.2f}, {c.relative:+.1%}; {ci_text(c)})")
    if r.llama_cpp is not None:
        parts.append("llama.cpp: " + ", ".join(
            f"{d.name} {'refused' if l.refused else f'τ {l.tau:.2f}'} ({v})"
            for d, l, v in zip(r.drafters, r.llama_cpp, llama_verdicts)))
    if r.serving is not None:
        parts.append(serving_headline(r.serving))
    headline = "; ".join(parts)
    named = [f"{d.name}: {v}" for d, v in zip(r.drafters, verdicts)
             if v in (VERDICT_BELOW, VERDICT_ZERO, VERDICT_NONFINITE)]
    named += [f"{d.name} in llama.cpp: {v}" for d, v in zip(r.drafters, llama_verdicts)
              if v in (VERDICT_BELOW, VERDICT_ZERO, VERDICT_REFUSED, VERDICT_CRASHED)]
    if r.serving is not None:
        named += [f"{run.name} in llama-server ({combo_label(run)}): {v}" for run, v in
                  zip(r.serving.runs, r.serving.verdicts()) if v not in (SERVING_GAIN, SERVING_NO_GAIN)]
    status, level = verdict(failures, f"{headline} — {'; '.join(named)}" if named else None, headline)

    n_prompt_tokens = [len(ids) for ids in r.prompt_ids]
    summary = [
        Field("target", r.target, key="target"),
        Field("prompts", f"{len(r.prompts)} from {r.prompt_source} ({min(n_prompt_tokens)}–{max(n_prompt_tokens)} "
              "tokens each)", key="prompts_text"),
        Field("prompt count", len(r.prompts), key="prompt_count"),
        Field("max new tokens", r.max_new_tokens, key="max_new_tokens"),
        Field("temperature", r.temperature, key="temperature"),
        Field("seed", r.seed, key="seed"),
        Field("device / dtype", f"{r.device} / {r.dtype}", key="device_dtype"),
        Field("stop tokens", r.stop_token_ids or "none (--ignore-eos)", key="stop_token_ids"),
        Field("reasoning", r.reasoning if r.reasoning is not None else "not set (the template's default)",
              key="reasoning"),
        Field("chat template kwargs", json.dumps(r.chat_template_kwargs, sort_keys=True), key="chat_template_kwargs"),
        Field("verification", VERIFY_MODE, key="verification"),
        Field("confidence interval", CI_METHOD, key="ci_method"),
        Field("max drop", max_drop, "pct", key="max_drop"),
        Field("min tau", min_tau, key="min_tau"),
        Field("max gap (llama.cpp)", max_gap, "pct", key="max_gap"),
        Field("min speed-up (llama-server)", min_speedup, key="min_speedup"),
        Field("exit code", EXIT_FAILED if failures else EXIT_OK, key="exit_code"),
    ]

    rows, flagged = [], set()
    for i, (d, c) in enumerate(zip(r.drafters, comps)):
        row: dict[str, Any] = {
            "drafter": d.path, "family": d.info.family_name, "form": _form(d.info), "matmul": d.info.matmul, "block_size": d.block_size,
            "tau": d.tau, "tau_pooled": d.tau_pooled,
            "delta": None if c is None else c.delta, "relative": None if c is None else c.relative,
            "ci_low": None if c is None or c.ci is None else c.ci[0],
            "ci_high": None if c is None or c.ci is None else c.ci[1],
            "rounds": len(d.accepted), "tokens": d.tokens, "decode_tok_s": d.decode_tokens_per_s,
            "nonfinite_rounds": d.nonfinite_rounds, "verdict": verdicts[i],
        }
        if r.llama_cpp is not None:
            l, lc = r.llama_cpp[i], llama_comps[i]
            row.update({
                "tau_llama_cpp": None if l.refused else l.tau,
                "tau_llama_cpp_ci": None if lc is None or lc.ci is None else [lc.ci[0], lc.ci[1]],
                "llama_cpp_delta": None if lc is None else lc.delta,
                "llama_cpp_drafted": None if l.refused else l.drafted,
                "llama_cpp_accepted": None if l.refused else l.accepted,
                "llama_cpp_verdict": llama_verdicts[i],
                "llama_cpp_message": l.refused,
                "llama_cpp_gguf": l.gguf,
            })
        rows.append(row)
        if verdicts[i] in (VERDICT_BELOW, VERDICT_ZERO, VERDICT_NONFINITE) or (
                r.llama_cpp is not None and llama_verdicts[i] in (VERDICT_BELOW, VERDICT_ZERO, VERDICT_REFUSED)) \
                or any(f.startswith(f"{d.name}:") for f in failures):
            flagged.add(i)
    columns = [Column("drafter", "drafter"), Column("family", "family"), Column("form", "tensors"),
               Column("tau", "τ", ".3f"),
               Column("tau_pooled", "τ all rounds", ".3f"), Column("delta", "Δτ vs first", "+.3f"),
               Column("relative", "Δ%", "pct"), Column("ci_low", "CI low", "+.3f"), Column("ci_high", "CI high", "+.3f"),
               Column("rounds", "rounds"), Column("verdict", "verdict"),
               Column("decode_tok_s", "decode tok/s (this runtime)", ".1f")]
    if r.llama_cpp is not None:
        columns[-1:-1] = [Column("tau_llama_cpp", "τ llama.cpp", ".3f"), Column("llama_cpp_delta", "Δτ llama.cpp", "+.3f"),
                          Column("llama_cpp_verdict", "llama.cpp verdict")]
    sections: list[Any] = [Table(
        "Acceptance length τ per drafter", columns,
        rows, id="drafters", flagged=flagged, level="error" if failures else "warning" if named else "info",
        note="τ = mean over prompts of committed tokens per target forward; τ all rounds pools every round; "
             "Δτ and its CI are paired over prompts (see 'confidence interval')"
             + ("; τ llama.cpp: the same prompts through llama-speculative-simple, Δτ llama.cpp against this "
                "runtime's τ of the same drafter (paired CI in tau_llama_cpp_ci)" if r.llama_cpp is not None else ""),
    )]
    sections.append(BarChart(
        "τ per drafter",
        [BarGroup(d.name, [Bar(f"{d.path}: τ", d.tau, series=d.name)]) for d in r.drafters],
        value_label="τ (tokens per target forward)", reference=first.tau, reference_label=f"{first.name}",
        id="tau_chart", scale="linear",
    ))

    width = max(d.block_size for d in r.drafters)
    hist_cols = [Column("drafter", "drafter")] + [Column(f"a{k}", str(k), "pct") for k in range(width)]
    hist_rows = []
    for d in r.drafters:
        h = d.histogram()
        hist_rows.append({"drafter": d.name, **{f"a{k}": h[k] if k < len(h) else None for k in range(width)},
                          "histogram": h})
    sections.append(Table("Accepted draft tokens per round", hist_cols, hist_rows, id="histogram",
                          note="share of rounds that accepted k draft tokens (the bonus token not counted)"))
    pos_cols = [Column("drafter", "drafter")] + [Column(f"p{k}", str(k), "pct") for k in range(1, width)]
    pos_rows = []
    for d in r.drafters:
        p = d.position_rates()
        pos_rows.append({"drafter": d.name, **{f"p{k}": p[k - 1] if k - 1 < len(p) else None for k in range(1, width)},
                         "rates": p})
    sections.append(Table("Acceptance rate per block position", pos_cols, pos_rows, id="positions",
                          note="share of rounds whose draft token at block position k was accepted (k = 1 is the "
                               "first drafted token; a token is accepted only if all before it were)"))
    sections.append(BarChart(
        "Acceptance rate per block position (chart)",
        [BarGroup(str(k), [Bar(f"{d.name} @ {k}", d.position_rates()[k - 1], series=d.name)
                           for d in r.drafters if k < d.block_size]) for k in range(1, width)],
        value_label="acceptance rate", id="positions_chart", scale="linear",
    ))

    prompt_cols = [Column("prompt", "prompt"), Column("category", "category"), Column("prompt_tokens", "tokens")]
    prompt_cols += [Column(f"tau_{j}", f"τ {d.name}", ".2f") for j, d in enumerate(r.drafters)]
    if r.llama_cpp is not None:
        prompt_cols += [Column(f"tau_llama_cpp_{j}", f"τ llama.cpp {d.name}", ".2f") for j, d in enumerate(r.drafters)]
    prompt_rows = []
    for i, p in enumerate(r.prompts):
        prow: dict[str, Any] = {"prompt": p.id, "category": p.category, "prompt_tokens": len(r.prompt_ids[i])}
        for j, d in enumerate(r.drafters):
            run = d.runs[i]
            prow[f"tau_{j}"] = run.tau
            prow[f"generated_{j}"] = len(run.output_ids)
            if r.llama_cpp is not None:
                l = r.llama_cpp[j]
                prow[f"tau_llama_cpp_{j}"] = l.runs[i].tau if i < len(l.runs) else None
        prompt_rows.append(prow)
    sections.append(Table("τ per prompt", prompt_cols, prompt_rows, id="prompts"))

    warnings = r.divergences()
    for d in r.drafters:
        empty = [p.id for p, run in zip(r.prompts, d.runs) if not run.rounds]
        if empty:
            warnings.append(f"{d.name}: no round on prompt(s) {', '.join(empty)} (the first token ended it) — left "
                            "out of τ")
    sections.append(Notes("Warnings", warnings, level="warning" if warnings else "info", id="warnings"))
    notes = [SPEED_NOTE] + list(r.notes)
    if any(math.isfinite(d.tau) and d.tau < 1.3 for d in r.drafters):
        notes.insert(0, TAU_RANDOM_NOTE)
    if r.llama_cpp is not None:
        notes.append(f"llama.cpp: {r.target_gguf} as the target; greedy (--temp 0), --spec-draft-n-max = block size − 1; "
                     "τ per prompt = n_predict / (n_predict − n_accept)")
        for d, l in zip(r.drafters, r.llama_cpp):
            if l.refused:
                notes.append(f"llama.cpp refused {d.name}: {l.refused}")
    notes += [f"{d.name}: " + "; ".join([d.info.matmul, *d.info.notes]) for d in r.drafters]
    sections.append(Notes("Notes", notes, id="notes"))
    if r.serving is not None:
        sections += serving_sections(r.serving)
    names = ", ".join(d.name for d in r.drafters)
    return Report(f"dflash-accept: {names} on {Path(r.target).name}", status, level, summary, sections)


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

