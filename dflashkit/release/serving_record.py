"""The release's serving step: every finished file through llama-server, alone on the machine.

Speed-ups are timings, and a timing that shares the machine with another is not a figure: the file jobs (quantize,
inspect, diff, parity, τ) may run side by side in a pool or on Ray, but the serving step runs after every one of
them has finished, in this process, one combination at a time (one llama-server pair: the target with the drafter
and the target alone) — for each ``--llama-server`` build, each type, each ``--draft-cache-type`` and each
``--draft-n-max``. Each step's start and end go to ``timings.json`` (a test reads them back: no serving interval
overlaps a job or another serving interval), and the record names the host and the build that measured.

A job's serving entries keep the per-prompt decode speeds with and without the drafter, so ``--check`` derives the
speed-up, its CI and its verdict again from the record (`speedup_of`); `best_entry` picks the n-max (and cache
type) that served a type fastest — the figure the card shows and the n-max its ``llama-server`` line uses.
"""

from __future__ import annotations

import math
import os
import platform
import time
from pathlib import Path
from typing import Any, Callable, Sequence

# MEASURED: the verdicts whose speed-up was measured (the others: output differs, refused to load, crashed, not
# measured); speed-ups, CIs and verdicts with ServingRun's own arithmetic and rule
from ..accept.serving_measure import (MEASURED_VERDICTS as MEASURED, log_speed_ratio, measured_verdict,
                                      speedup_ci_of_logs, speedup_of_logs)


def host_description() -> str:
    """The machine the speed-ups were measured on, as a card names hardware: architecture, cores, CPU model — no
    host name, user or path."""
    model = ""
    try:
        with open("/proc/cpuinfo", encoding="utf-8", errors="replace") as f:
            for line in f.read(1 << 20).splitlines():
                if line.startswith("model name"):
                    model = line.split(":", 1)[1].strip()
                    break
    except OSError:
        pass
    model = model or platform.processor() or ""
    text = f"{platform.machine() or 'unknown'}, {os.cpu_count() or '?'} cores" + (f" ({model})" if model else "")
    return "".join(c for c in text if c.isprintable())[:200]


def build_name(bin_dir: str | os.PathLike | None) -> str | None:
    """A llama.cpp build as the card names it: its folder's name (``…/llama-build-b11549/bin`` → llama-build-b11549;
    ``…/ik_llama.cpp/build/bin`` → ik_llama.cpp/build), never its path on this machine."""
    if bin_dir is None:
        return None
    p = Path(os.path.abspath(bin_dir))
    if p.name == "bin" and p.parent.name:
        p = p.parent
    if p.name in ("build", "bin", "Release", "release") and p.parent.name:
        return f"{p.parent.name}/{p.name}"
    return p.name or "llama.cpp"


def _finite(x: float | None) -> float | None:
    return None if x is None or not math.isfinite(x) else float(x)


def entry_of(run: Any, prompt_names: Sequence[str], build: str) -> dict[str, Any]:
    """One combination as the record keeps it (`dflashkit.accept.serving_measure.ServingRun`)."""
    ci = run.speedup_ci
    return {
        "build": build, "target_gguf": Path(run.target_gguf).name, "draft_n_max": run.draft_n_max,
        "draft_cache_type": run.draft_cache_type, "tau": _finite(run.tau) if run.on else None,
        "tau_per_prompt": [_finite(t) for t in run.taus],
        "acceptance_rate": _finite(run.acceptance_rate), "drafted": run.drafted, "accepted": run.accepted,
        "tokens_per_s_on": _finite(run.tokens_per_s_on) if run.on else None,
        "tokens_per_s_off": _finite(run.tokens_per_s_off) if run.off else None,
        "per_prompt_tokens_per_s": [[_finite(a.tokens_per_s), _finite(b.tokens_per_s)]
                                    for a, b in zip(run.on, run.off)],
        "speedup": _finite(run.speedup), "speedup_ci": [float(ci[0]), float(ci[1])] if ci else None,
        "verdict": run.verdict(prompt_names), "refused": run.refused, "note": run.note,
    }


def speedup_of(per_prompt: Sequence[Sequence[float | None]], seed: int) -> tuple[float | None, list[float] | None]:
    """(speed-up, its CI) from per-prompt (tok/s with, tok/s alone): the geometric mean of the ratios and the paired
    bootstrap CI of their mean log — `ServingRun.speedup` / ``speedup_ci`` over the recorded values."""
    logs = [x for x in (log_speed_ratio(off, on) for on, off in per_prompt) if math.isfinite(x)]
    if not logs:
        return None, None
    ci = speedup_ci_of_logs(logs, seed)  # ServingRun's own arithmetic: the same floats
    return speedup_of_logs(logs), None if ci is None else list(ci)


def verdict_of(speedup: float | None, ci: Sequence[float] | None) -> str | None:
    """A measured verdict from the speed-up and its CI (`ServingRun.verdict`'s rule; one prompt: its own ratio)."""
    return None if speedup is None else measured_verdict(speedup, ci or None)


def best_entry(entries: Sequence[dict[str, Any]], build: str | None = None) -> dict[str, Any] | None:
    """The combination that served a type fastest (of ``build``, default the first build measured): the highest
    measured speed-up, the first listed on a tie; None when none was measured — then the first entry, if any."""
    of_build = [e for e in entries if build is None or e.get("build") == build]
    if build is None and of_build:
        first = of_build[0].get("build")
        of_build = [e for e in of_build if e.get("build") == first]
    measured = [e for e in of_build if e.get("verdict") in MEASURED and e.get("speedup") is not None]
    if measured:
        return max(measured, key=lambda e: (e["speedup"], -of_build.index(e)))
    return of_build[0] if of_build else None


def builds_of(record: dict[str, Any]) -> list[str]:
    """The builds a record's serving entries come from, in the order measured."""
    out: list[str] = []
    for t in record["types"]:
        for e in record["jobs"].get(t, {}).get("serving", []):
            if e.get("build") not in out:
                out.append(e.get("build"))
    return out


def run_serving(jobs: dict[str, dict[str, Any]], types: Sequence[str], files: dict[str, Path], target: Any,
                builds: Sequence[str | os.PathLike], measure: Callable[..., Any], timings: list[dict[str, Any]],
                done: Callable[[str], None], say: Callable[[str], None]) -> None:
    """Serve every type's finished file with every build, one combination at a time (module doc). ``measure`` is
    `dflashkit.accept.serving_only.serve_files` with the release's settings bound; ``done(t)`` saves a type whose
    entries changed. A type whose record already holds a build's entries (a resumed release) is not measured
    again with that build."""
    from ..runtime import HFTarget

    runner = None
    for build in builds:
        name = build_name(build) or "llama.cpp"
        for t in types:
            job = jobs.get(t)
            if job is None or any(e.get("build") == name for e in job.get("serving", [])):
                continue
            if runner is None:  # the target's tokenizer renders the prompts as the τ step did
                runner = target if isinstance(target, HFTarget) else HFTarget(target)
            say(f"{t}: serving through llama-server ({name}), one combination at a time")
            started = time.time()
            result = measure(runner, [files[t]], llama_server=build, progress=say)
            finished = time.time()
            timings.append({"type": t, "build": name, "started": round(started, 3), "finished": round(finished, 3)})
            job["serving"] = [*job.get("serving", []),
                              *(entry_of(r, result.prompt_names, name) for r in result.runs)]
            best = best_entry(job["serving"], name)
            if best is not None and best.get("speedup") is not None:
                say(f"{t}: ×{best['speedup']:.2f} at n-max {best['draft_n_max']} ({best['verdict']}, {name})")
            done(t)
