"""The release's "by context length" and "by concurrent requests" step (``--context``, ``--parallel``).

After every job and the serving step have finished — alone on the machine, as every timing — every type's file is
measured by `dflashkit.accept.run_acceptance` itself: per ``--context`` level τ in the reference runtime and, with
``--llama-server``, τ and the speed-up through the first build; per ``--parallel`` level the aggregate speed-up
under N concurrent requests. The record keeps the per-prompt (per-batch) values only; every figure the card shows —
τ, its CI, the change against the shortest level, the speed-ups and their CIs — is derived from them here, by the
card and by ``--check`` alike, and the picture (`PICTURE`, τ and speed-up against context, one line per type) is
drawn from them too: deterministic bytes, so ``--check`` draws it again and compares.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any, Callable

from ..accept.options import ContextOptions, LlamaCppOptions, PromptOptions
from ..accept.serving_measure import log_speed_ratio, speedup_ci_of_logs, speedup_of_logs
from ..llama_cpp.speculative_simple import mean_tau
from ..reporting.markdown import markdown_text
from ..reporting.png_chart import Panel, Series, line_chart_png
from ..stats import paired_bootstrap_ci, paired_comparison
from ..sweeps import level_label

PICTURE = "tau-by-context.png"


def _finite(x: float) -> float | None:
    return float(x) if x is not None and math.isfinite(x) else None


def measure_sweeps(files: dict[str, Path], target: Any, *, prompt: PromptOptions, context: ContextOptions,
                   llama: LlamaCppOptions, build: str | None, say: Callable[[str], None],
                   scrub: Callable[[str], str]) -> dict[str, Any]:
    """Every type's file by context and by concurrency: the record's ``by_context`` / ``by_parallel`` parts (every
    message through ``scrub``: nothing of the machine is published). ``prompt``, ``context`` and ``llama`` (its
    one build and target GGUF, its ``parallel`` levels) are dflash-accept's values, passed to `run_acceptance`."""
    from ..accept.run import run_acceptance

    types = list(files)
    levels, parallel, llama_server = context.levels, llama.parallel, next(iter(llama.llama_servers), None)
    say(f"release: {', '.join(types)} by context length {', '.join(map(level_label, levels or [0]))}"
        + (f" and under {', '.join(map(str, parallel))} concurrent requests" if parallel else ""))
    result = run_acceptance(target, [files[t] for t in types], prompt_options=prompt, llama=llama,
                            context=tuple(levels) if levels else None, context_file=context.file,
                            progress=lambda m: say(f"release sweep: {m}"))
    out: dict[str, Any] = {}
    if levels:
        from ..accept.sweep import server_refusal
        from ..accept.sweep_report import cliff_lines

        sweep = result.by_context
        rows: dict[str, list[dict[str, Any]]] = {t: [] for t in types}
        for level, res in zip(sweep.levels, sweep.results):
            for t, d in zip(types, res.drafters):
                served = [s for s in (res.serving.runs if res.serving else []) if s.drafter == d.path and s.off]
                why = server_refusal(res, d.path)
                rows[t].append({
                    "context": level, "prompt_tokens": sum(map(len, res.prompt_ids)) / len(res.prompt_ids),
                    "tau_per_prompt": [_finite(r.tau) for r in d.runs],
                    "server_tau": _finite(served[0].tau) if served else None,
                    "server_tau_per_prompt": [_finite(x) for x in served[0].taus] if served else None,
                    "log_speedups": [float(x) for x in served[0].log_ratios()] if served else None,
                    "server_refused": scrub(_name_types(why, files)) if why else None})
        out["by_context"] = {"levels": list(sweep.levels), "source": _public_source(sweep.source),
                             "build": build if llama_server else None, "rows": rows,
                             "cliffs": [scrub(_name_types(c, files)) for c in cliff_lines(result)][:64]}
    if parallel and result.serving is not None:
        prow: dict[str, list[dict[str, Any]]] = {t: [] for t in types}
        names = result.serving.prompt_names
        for lv in result.serving.parallel:
            t = next(t for t in types if str(files[t]) == lv.drafter)
            prow[t].append({"np": lv.n, "on": [_finite(b.tokens_per_s) for b in lv.on],
                            "off": [_finite(b.tokens_per_s) for b in lv.off],
                            "slot_tau": {str(s): _finite(v) for s, v in lv.slot_taus().items()},
                            "differences": len(lv.differences(names)),
                            "refused": scrub(_name_types(lv.refused, files)) if lv.refused else None,
                            "crashed": lv.crashed,
                            "findings": [scrub(_name_types(f, files)) for f in lv.slot_findings()]})
        out["by_parallel"] = {"build": build, "rows": prow}
    return out


def _public_source(source: str) -> str:
    """The context's source as the card may say it: a file by its base name only."""
    if source.startswith("context file "):
        return "context file " + Path(source[len("context file "):]).name
    return source


def _name_types(line: str, files: dict[str, Path]) -> str:
    for t, f in files.items():
        line = line.replace(str(f), t).replace(Path(f).name, t)
    return line[:600]


# ---- derived figures, the card's sections, the picture --------------------------------------------------------


def context_table(part: dict[str, Any], seed: int) -> list[dict[str, Any]]:
    """Per type × level: mean prompt tokens, τ with its CI, Δ% against the shortest level, the speed-up and CI."""
    out = []
    for t, rows in part["rows"].items():
        base = [x if x is not None else math.nan for x in rows[0]["tau_per_prompt"]] if rows else []
        for k, r in enumerate(rows):
            taus = [x if x is not None else math.nan for x in r["tau_per_prompt"]]
            ci = paired_bootstrap_ci([x for x in taus if math.isfinite(x)], seed=seed)
            cmp = paired_comparison(base, taus, seed=seed) if k else None
            logs = r["log_speedups"]
            out.append({"type": t, "context": r["context"], "prompt_tokens": r["prompt_tokens"], "tau": mean_tau(taus),
                        "tau_ci": ci, "relative": cmp.relative if cmp else None,
                        "speedup": speedup_of_logs(logs) if logs else None,
                        "speedup_ci": speedup_ci_of_logs(logs, seed) if logs else None, "server_tau": r["server_tau"]})
    return out


def parallel_table(part: dict[str, Any], seed: int) -> list[dict[str, Any]]:
    out = []
    for t, rows in part["rows"].items():
        for r in rows:
            logs = [x for x in (log_speed_ratio(a, b) for a, b in zip(r["off"], r["on"])) if math.isfinite(x)]
            on = [x for x in r["on"] if x]
            off = [x for x in r["off"] if x]
            out.append({"type": t, "np": r["np"], "slot_tau": r["slot_tau"], "speedup": speedup_of_logs(logs),
                        "speedup_ci": speedup_ci_of_logs(logs, seed), "tok_s_on": sum(on) / len(on) if on else None,
                        "tok_s_off": sum(off) / len(off) if off else None, "differences": r["differences"],
                        "refused": r["refused"], "crashed": r.get("crashed", False), "findings": r["findings"]})
    return out


def _f(x: float | None, spec: str) -> str:
    return "—" if x is None or not math.isfinite(x) else format(x, spec)


def _ci(ci: Any, spec: str) -> str:
    return "—" if not ci else f"[{format(ci[0], spec)}, {format(ci[1], spec)}]"


def card_lines(record: dict[str, Any]) -> list[str]:
    """The card's "By context length" and "By concurrent requests" sections (Markdown lines; none when absent)."""
    seed = record["settings"]["seed"]
    lines: list[str] = []
    part = record.get("by_context")
    if part:
        lines += ["", "## By context length", "",
                  f"Each prompt measured after N tokens of long context ({markdown_text(part['source'])}); τ in "
                  "dflashkit's reference runtime with its 95% CI over prompts, Δ against the shortest level paired "
                  "over prompts"
                  + (f"; speed-up through llama-server ({markdown_text(part['build'])}) with its 95% CI"
                     if part["build"] else "")
                  + ".", "", "| type | context | mean prompt tokens | τ | τ 95% CI | Δ vs shortest | speed-up | "
                  "speed-up 95% CI |", "|---|---|---|---|---|---|---|---|"]
        for r in context_table(part, seed):
            rel = "—" if r["relative"] is None else f"{r['relative']:+.0%}"
            lines.append(f"| {markdown_text(r['type'])} | {level_label(r['context'])} | {r['prompt_tokens']:.0f} | {_f(r['tau'], '.2f')} "
                         f"| {_ci(r['tau_ci'], '.2f')} | {rel} | {_f(r['speedup'], '.2f')} | "
                         f"{_ci(r['speedup_ci'], '.2f')} |")
        lines += ["", f"![τ and speed-up by context length]({PICTURE})", ""]
        lines += [f"- {markdown_text(c)}" for c in part["cliffs"]] or ["- No level's τ is significantly below the "
                                                                         "shortest's."]
        lines += [f"- {markdown_text(t)} at --context {level_label(r['context'])}: no speed-up — "
                  f"{markdown_text(r['server_refused'])}" for t, rows in part["rows"].items() for r in rows
                  if r.get("server_refused")]
    part = record.get("by_parallel")
    if part:
        lines += ["", "## By concurrent requests", "",
                  f"llama-server ({markdown_text(str(part['build']))}) with -np N asked N prompts at once; aggregate tok/s with and without "
                  "the drafter, speed-up over batches with its 95% CI.", "",
                  "| type | -np | τ per slot | tok/s alone | tok/s with drafter | speed-up | 95% CI | outputs |",
                  "|---|---|---|---|---|---|---|---|"]
        for r in parallel_table(part, seed):
            slots = ", ".join(f"{s}: {_f(v, '.2f')}" for s, v in r["slot_tau"].items()) or "—"
            outputs = (("crashed" if r["crashed"] else "refused") if r["refused"] else
                       "identical" if not r["differences"] else f"{r['differences']} differ")
            lines.append(f"| {markdown_text(r['type'])} | {r['np']} | {markdown_text(slots)} | {_f(r['tok_s_off'], '.1f')} | {_f(r['tok_s_on'], '.1f')} "
                         f"| {_f(r['speedup'], '.2f')} | {_ci(r['speedup_ci'], '.2f')} | {outputs} |")
            lines += [f"- {markdown_text(r['type'])} at -np {r['np']}: {markdown_text(f)}"
                      for f in ([r["refused"]] if r["refused"] else []) + r["findings"]]
    return lines


def category_lines(record: dict[str, Any]) -> list[str]:
    """The card's "τ by prompt category" (where the prompts hold more than one): per type × category, τ with its CI
    over the category's prompts and the speed-up of the type's best llama-server combination with its CI — derived
    from the per-prompt values the record keeps."""
    from .serving_record import best_entry

    seed = record["settings"]["seed"]
    jobs = [(t, record["jobs"][t]) for t in record["types"] if t in record["jobs"]]
    cats = [j["tau"].get("categories") for _, j in jobs]
    if not jobs or cats[0] is None or len(set(cats[0])) < 2:
        return []
    lines = ["", "## τ by prompt category", "", "| type | category | prompts | τ | τ 95% CI | speed-up | speed-up 95% CI |",
             "|---|---|---|---|---|---|---|"]
    for t, j in jobs:
        categories = j["tau"].get("categories") or []
        entry = best_entry(j.get("serving", []))
        speeds = entry["per_prompt_tokens_per_s"] if entry else []
        for cat in sorted(set(categories)):
            idx = [i for i, c in enumerate(categories) if c == cat]
            taus = [j["tau"]["per_prompt"][i] for i in idx if i < len(j["tau"]["per_prompt"])]
            taus = [x for x in taus if x is not None and math.isfinite(x)]
            ci = paired_bootstrap_ci(taus, seed=seed)
            logs = [x for x in (log_speed_ratio(speeds[i][1], speeds[i][0]) for i in idx if i < len(speeds))
                    if math.isfinite(x)]
            sp = speedup_of_logs(logs) if logs else None
            lines.append(f"| {markdown_text(t)} | {markdown_text(cat or '(none)')} | {len(idx)} | "
                         f"{_f(mean_tau(taus), '.2f')} | {_ci(ci, '.2f')} | {_f(sp, '.2f')} | "
                         f"{_ci(speedup_ci_of_logs(logs, seed) if logs else None, '.2f')} |")
    return lines


def picture(record: dict[str, Any]) -> bytes | None:
    """τ (and the speed-up, where measured) against context, one line per type; None without ``by_context``."""
    part = record.get("by_context")
    if not part:
        return None
    table = context_table(part, record["settings"]["seed"])
    types = list(part["rows"])
    tau = Panel("TAU BY CONTEXT LENGTH (REFERENCE RUNTIME)",
                [Series(t, [r["tau"] for r in table if r["type"] == t]) for t in types])
    panels = [tau]
    if any(r["speedup"] is not None for r in table):
        panels.append(Panel(f"SPEED-UP THROUGH LLAMA-SERVER ({part['build']})",
                            [Series(t, [r["speedup"] for r in table if r["type"] == t]) for t in types], reference=1.0))
    return line_chart_png([level_label(x) for x in part["levels"]], panels, "CONTEXT TOKENS BEFORE EACH PROMPT")
