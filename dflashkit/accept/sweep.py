"""``--context``: one measurement per context length, and where a drafter stops paying.

`sweep_context` runs the measurement of `dflashkit.accept.run` once per level on the prompts with that much long
context before them (`dflashkit.accept.context`), the target's prefill of each prompt made once per level and reused
by every drafter (`PrefillCache`). `context_rows` is the "by context length" table; `cliffs` locates, per drafter
and runtime, the first length whose τ (or speed-up) is significantly below the shortest length's — paired over
prompts, the same prompt at both lengths — and names the causes it can check (`likely_causes`).
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Sequence

from ..errors import UsageError
from ..llama_cpp.speculative_simple import mean_tau
from ..runtime import HFTarget
from ..runtime.speculative import PrefillCache
from ..stats import Comparison, paired_bootstrap_ci, paired_comparison
from ..sweeps import (MAX_CONTEXT_LEVELS, MAX_CONTEXT_TOKENS, MAX_PARALLEL, MAX_PARALLEL_LEVELS, level_label,
                      parse_context_levels, parse_parallel_levels)
from .context import MAX_PROMPT_TOKENS_TOTAL, LongContext, check_levels_fit, read_context_file
from .prompts import Prompt

#: a level's τ must be at least this much below the shortest's (besides its CI) to be called a cliff
MIN_CLIFF_DROP = 0.10
#: llama.cpp's options that size the draft context and the context (``-cd`` counts 0 as "the -c")
DRAFT_CONTEXT_ARGS = ("-cd", "--ctx-size-draft")
CONTEXT_ARGS = ("-c", "--ctx-size")


def check_context_levels(levels: Sequence[int] | str) -> tuple[int, ...]:
    """Levels as given by a Python caller (a string is parsed as the command line parses it), bounded."""
    if isinstance(levels, str):
        return parse_context_levels(levels)
    out: list[int] = []
    for v in levels:
        if isinstance(v, bool) or not isinstance(v, int) or not 0 <= v <= MAX_CONTEXT_TOKENS:
            raise UsageError(f"--context {v!r}: a token count 0..{MAX_CONTEXT_TOKENS:,}")
        if v in out:
            raise UsageError(f"--context {v}: given twice")
        out.append(v)
    if not out or len(out) > MAX_CONTEXT_LEVELS:
        raise UsageError(f"--context: give 1..{MAX_CONTEXT_LEVELS} levels")
    return tuple(sorted(out))


def check_levels_total(levels: Sequence[int], lengths: Sequence[int]) -> None:
    """The longest level's prompts together under `MAX_PROMPT_TOKENS_TOTAL`, before any level is built."""
    total = len(lengths) * max(levels) + sum(lengths)
    if total > MAX_PROMPT_TOKENS_TOTAL:
        raise UsageError(f"--context {level_label(max(levels))}: {len(lengths)} prompts after {max(levels):,} tokens "
                         f"each hold {total:,} tokens together, over {MAX_PROMPT_TOKENS_TOTAL:,} — give fewer prompts "
                         "(--max-prompts) or shorter levels")


def check_parallel_levels(levels: Sequence[int] | str) -> tuple[int, ...]:
    """``--parallel`` levels as a Python caller gives them (a string as the command line), bounded."""
    if isinstance(levels, str):
        return parse_parallel_levels(levels)
    out = sorted(set(levels)) if all(type(v) is int for v in levels) else None
    if out is None or len(out) != len(list(levels)) or not 1 <= len(out) <= MAX_PARALLEL_LEVELS \
            or not all(1 <= v <= MAX_PARALLEL for v in out):
        raise UsageError(f"--parallel {list(levels)!r}: 1..{MAX_PARALLEL_LEVELS} distinct counts of 1..{MAX_PARALLEL}")
    return tuple(out)


def check_context_plan(target: str | os.PathLike, prompts: Any, max_prompts: int | None, levels: Sequence[int],
                       context_file: str | os.PathLike | None, max_new_tokens: int, reasoning: str | None,
                       chat_template_kwargs: dict[str, Any] | None) -> None:
    """Before any work (a release measures the sweep last): every level's context exists and fits the target's
    context — read with the target's tokenizer and config only, not its weights."""
    import json
    from types import SimpleNamespace

    from transformers import AutoTokenizer

    from .prompts import load_prompts, template_kwargs_for

    tok = AutoTokenizer.from_pretrained(str(target))
    tok.model_max_length = 1 << 62  # the context is encoded in long chunks: no "longer than the maximum" log line
    kwargs = template_kwargs_for(tok, reasoning, chat_template_kwargs)
    prompt_list = load_prompts(prompts, limit=max_prompts)
    runner = SimpleNamespace(tokenizer=tok, path=Path(target))
    text = read_context_file(context_file) if context_file is not None else None
    long = LongContext(tok, prompt_list, text, Path(context_file).name if context_file else None, levels)
    lengths = [len(p.ids(runner, kwargs)[0]) for p in prompt_list]  # type: ignore[arg-type]
    longest = max(lengths)
    try:
        config = json.loads((Path(target) / "config.json").read_text(encoding="utf-8"))
        config = config.get("text_config", config)
        limit = config.get("max_position_embeddings")
    except (OSError, ValueError, AttributeError):
        limit = None
    check_levels_fit(levels, limit if isinstance(limit, int) and limit > 0 else None, longest, max_new_tokens,
                     f"target {target}")
    check_levels_total(levels, lengths)
    for level in levels:
        for i in range(len(prompt_list)):
            long.context_ids(i, level)


@dataclass
class DrafterLimits:
    """What of a drafter decides where its τ can fall with context: read from its config or metadata."""

    window: int | None
    sliding_layers: tuple[int, ...]
    context_length: int | None  # max_position_embeddings / context_length: the length it claims (trained)
    rope_scaling: str | None
    rope_theta: float | None = None

    def differences(self, other: "DrafterLimits") -> list[str]:
        """What of these limits differs from ``other``'s (the first drafter's), one phrase each."""
        out = []
        if (self.window, self.sliding_layers) != (other.window, other.sliding_layers):
            def show(x: DrafterLimits) -> str:
                return f"{x.window} on layers {', '.join(map(str, x.sliding_layers))}" if x.window else "none"
            out.append(f"its sliding window ({show(self)}) is not the first drafter's ({show(other)})")
        if self.rope_theta != other.rope_theta:
            out.append(f"its rope base ({self.rope_theta:g}) is not the first drafter's ({other.rope_theta:g})")
        if self.rope_scaling != other.rope_scaling:
            out.append(f"its rope scaling ({self.rope_scaling or 'none'}) is not the first drafter's "
                       f"({other.rope_scaling or 'none'})")
        if self.context_length != other.context_length:
            out.append(f"its context length ({self.context_length}) is not the first drafter's ({other.context_length})")
        return out


def drafter_limits(path: str | os.PathLike) -> DrafterLimits:
    from ..drafters import open_drafter

    with open_drafter(path) as d:
        s = d.spec
    pattern = s.sliding_window_pattern or ()
    sliding = tuple(i for i, on in enumerate(pattern) if on) if s.sliding_window else ()
    if s.sliding_window and not pattern:
        sliding = tuple(range(s.n_layers))
    scaling = ", ".join(f"{k}={v}" for k, v in s.rope_scaling) if s.rope_scaling else None
    return DrafterLimits(s.sliding_window, sliding, s.context_length or None, scaling, float(s.rope_theta))


@dataclass
class ContextSweep:
    """Every level's measurement (``levels[i]`` ↔ ``results[i]``), the source of the context, and per drafter its
    limits; the target's context; what was given to llama.cpp."""

    levels: list[int]
    results: list[Any]  # AcceptMeasurement per level
    source: str
    limits: list[DrafterLimits]
    target_context: int | None
    llama_cpp_args: list[str] = field(default_factory=list)
    prefills: list[int] = field(default_factory=list)  # the target's prefill passes per level


def sweep_context(runner: HFTarget, prompt_list: list[Prompt], levels: Sequence[int],
                  context_file: str | os.PathLike | None, notes: list[str],
                  measure: Callable[[list[Prompt], list[str], PrefillCache, bool], Any], *, max_new_tokens: int,
                  template_kwargs: dict[str, Any], say: Callable[[str], None], target_context: int | None,
                  drafters: Sequence[str | os.PathLike], llama_cpp_args: Sequence[str]) -> Any:
    """Measure at every level; the shortest level's result, carrying the sweep in ``by_context``."""
    text = read_context_file(context_file) if context_file is not None else None
    long = LongContext(runner.tokenizer, prompt_list, text, Path(context_file).name if context_file else None, levels)
    lengths = [len(p.ids(runner, template_kwargs)[0]) for p in prompt_list]
    check_levels_fit(levels, target_context, max(lengths), max_new_tokens, f"target {runner.path}")
    check_levels_total(levels, lengths)
    for level in levels:  # every level's context exists before the first round (a short file is said now)
        for i in range(len(prompt_list)):
            long.context_ids(i, level)
    limits = [drafter_limits(d) for d in drafters]
    results, prefill_counts = [], []
    prefills = PrefillCache()
    for n, level in enumerate(levels):
        say(f"context {level_label(level)} ({n + 1}/{len(levels)}): {len(prompt_list)} prompts after {level} tokens "
            f"of {long.source}")
        prefills.clear()
        prefills.prefills = prefills.reused = 0
        result = measure(long.prompts_at(level), notes if n == 0 else [], prefills, n == 0)  # --parallel: first level
        results.append(result)
        prefill_counts.append(prefills.prefills)
    prefills.clear()
    first = results[0]
    first.by_context = ContextSweep(list(levels), results, long.source, limits, target_context,
                                    list(llama_cpp_args), prefill_counts)
    return first


# ---------------------------------------------------------------------------------------------
# The table and the cliff
# ---------------------------------------------------------------------------------------------


def mean_prompt_tokens(result: Any) -> float:
    return sum(len(ids) for ids in result.prompt_ids) / max(1, len(result.prompt_ids))


def _ci(values: Sequence[float], seed: int) -> tuple[float, float] | None:
    return paired_bootstrap_ci([v for v in values if math.isfinite(v)], seed=seed)


def series_by_runtime(sweep: ContextSweep, j: int) -> dict[str, list[list[float]]]:
    """Per runtime, per level, the per-prompt figures of drafter ``j`` (τ, or log speed-up for llama-server)."""
    out: dict[str, list[list[float]]] = {"reference": [[r.tau for r in res.drafters[j].runs] for res in sweep.results]}
    if all(res.llama_cpp is not None and not res.llama_cpp[j].refused for res in sweep.results):
        out["llama.cpp"] = [res.llama_cpp[j].taus for res in sweep.results]
    if all(res.serving is not None for res in sweep.results):
        runs = [[s for s in res.serving.runs if s.drafter == res.drafters[j].path] for res in sweep.results]
        if all(runs):
            out["llama-server τ"] = [r[0].taus for r in runs]
            out["llama-server speed-up"] = [r[0].log_ratios_per_prompt() for r in runs]
    return out


def server_refusal(result: Any, drafter: str) -> str | None:
    """Why llama-server gave drafter ``drafter`` no figure at this level (its refusal, or its crash with the signal
    and last lines), None where it measured."""
    runs = [s for s in (result.serving.runs if result.serving is not None else []) if s.drafter == drafter]
    return runs[0].refused if runs else None


def context_rows(sweep: ContextSweep, seed: int) -> list[dict[str, Any]]:
    """One row per drafter × level: mean prompt tokens, τ with its CI, Δτ against the shortest level (paired CI),
    llama.cpp's τ and llama-server's τ and speed-up where measured."""
    rows = []
    for j, d in enumerate(sweep.results[0].drafters):
        series = series_by_runtime(sweep, j)
        for k, (level, res) in enumerate(zip(sweep.levels, sweep.results)):
            taus = series["reference"][k]
            cmp = paired_comparison(series["reference"][0], taus, seed=seed) if k else None
            ci = _ci(taus, seed)
            row: dict[str, Any] = {
                "drafter": d.name, "context": level, "prompt_tokens": mean_prompt_tokens(res),
                "tau": mean_tau(taus), "tau_ci": list(ci) if ci else None,
                "delta": None if cmp is None else cmp.delta, "relative": None if cmp is None else cmp.relative,
                "delta_ci": None if cmp is None or cmp.ci is None else list(cmp.ci),
                "prefills": sweep.prefills[k] if k < len(sweep.prefills) else None,
            }
            if "llama.cpp" in series:
                row["tau_llama_cpp"] = mean_tau(series["llama.cpp"][k])
            if "llama-server speed-up" in series:
                logs = [x for x in series["llama-server speed-up"][k] if math.isfinite(x)]
                lci = _ci(logs, seed)
                tau_server = mean_tau(series["llama-server τ"][k])
                # a level whose server refused or crashed has no figure: null beside its reason, never a NaN
                row["tau_server"] = tau_server if math.isfinite(tau_server) else None
                row["speedup"] = math.exp(sum(logs) / len(logs)) if logs else None
                row["speedup_ci"] = [math.exp(lci[0]), math.exp(lci[1])] if lci else None
                row["server_refused"] = server_refusal(res, d.path)
            rows.append(row)
    return rows


@dataclass
class Cliff:
    drafter: str
    runtime: str  # "reference", "llama.cpp", "llama-server τ", "llama-server speed-up"
    level: int
    prompt_tokens: float
    before: float
    after: float
    comparison: Comparison
    causes: list[str]

    def text(self) -> str:
        what = "speed-up" if self.runtime.endswith("speed-up") else "τ"
        fmt = (lambda v: f"{v:.2f}×") if what == "speed-up" else (lambda v: f"{v:.2f}")
        ci = self.comparison.ci
        shown = f"CI [{ci[0]:+.2f}, {ci[1]:+.2f}]" if ci else "no CI"
        return (f"{self.drafter} ({self.runtime}): {what} falls from {fmt(self.before)} to {fmt(self.after)} "
                f"({self.comparison.relative:+.0%}, paired {shown}) from --context {level_label(self.level)} "
                f"(≈ {self.prompt_tokens:.0f} prompt tokens) — likely cause: " + "; ".join(self.causes))


def cliffs(sweep: ContextSweep, seed: int) -> list[Cliff]:
    """Per drafter and runtime, the first level significantly below the shortest (paired CI entirely below 0 and
    at least `MIN_CLIFF_DROP` lower), with its likely causes."""
    out = []
    for j, d in enumerate(sweep.results[0].drafters):
        for runtime, per_level in series_by_runtime(sweep, j).items():
            base = per_level[0]
            for k in range(1, len(sweep.levels)):
                cmp = paired_comparison(base, per_level[k], seed=seed)
                if runtime.endswith("speed-up"):  # log ratios: the difference of logs is the relative change
                    cmp = Comparison(cmp.delta, math.expm1(cmp.delta) if math.isfinite(cmp.delta) else math.nan,
                                     cmp.ci, cmp.n_prompts)
                if cmp.ci is not None and cmp.ci[1] < 0 and cmp.relative <= -MIN_CLIFF_DROP:
                    tokens = mean_prompt_tokens(sweep.results[k])
                    before, after = _level_value(runtime, base), _level_value(runtime, per_level[k])
                    out.append(Cliff(d.name, runtime, sweep.levels[k], tokens, before, after, cmp,
                                     likely_causes(sweep, j, k, runtime)))
                    break
    return out


def below_first(sweep: ContextSweep, seed: int) -> list[str]:
    """Per drafter past the first and per runtime: the first level where it drafts significantly below the first
    drafter (paired over prompts, ≥ `MIN_CLIFF_DROP`) when it did not at the shortest level — a file that agrees
    with its reference at short context and not at long, named with what of its metadata differs."""
    out = []
    first = series_by_runtime(sweep, 0)
    for j, d in enumerate(sweep.results[0].drafters[1:], 1):
        for runtime, per_level in series_by_runtime(sweep, j).items():
            if runtime not in first or runtime.endswith("speed-up"):
                continue
            comps = [paired_comparison(first[runtime][k], per_level[k], seed=seed) for k in range(len(sweep.levels))]
            below = [c.ci is not None and c.ci[1] < 0 and c.relative <= -MIN_CLIFF_DROP for c in comps]
            if below[0] or not any(below):
                continue
            k = below.index(True)
            diffs = sweep.limits[j].differences(sweep.limits[0]) or ["none of its metadata differs from the first "
                                                                     "drafter's: its weights do"]
            c = comps[k]
            out.append(f"{d.name} ({runtime}) drafts like {sweep.results[0].drafters[0].name} at --context "
                       f"{level_label(sweep.levels[0])} and {c.relative:+.0%} below it from --context "
                       f"{level_label(sweep.levels[k])} (≈ {mean_prompt_tokens(sweep.results[k]):.0f} prompt tokens; "
                       f"paired CI [{c.ci[0]:+.2f}, {c.ci[1]:+.2f}]) — likely cause: " + "; ".join(diffs))
    return out


def _level_value(runtime: str, values: list[float]) -> float:
    if runtime.endswith("speed-up"):
        values = [x for x in values if math.isfinite(x)]
        return math.exp(sum(values) / len(values)) if values else math.nan
    return mean_tau(values)


def _arg_value(args: Sequence[str], names: Sequence[str]) -> int | None:
    value = None
    for i, a in enumerate(args):
        for n in names:
            text = a[len(n) + 1:] if a.startswith(n + "=") else args[i + 1] if a == n and i + 1 < len(args) else None
            if text is not None:
                try:
                    value = int(text)
                except ValueError:
                    pass
    return value


def likely_causes(sweep: ContextSweep, j: int, k: int, runtime: str) -> list[str]:
    """What this run can check that explains a fall at level ``k`` (the prompt + new tokens it reaches)."""
    limits = sweep.limits[j]
    res = sweep.results[k]
    reach = max(len(ids) for ids in res.prompt_ids) + res.max_new_tokens
    before = max(len(ids) for ids in sweep.results[k - 1].prompt_ids) + res.max_new_tokens
    causes = []
    if limits.window and before <= limits.window < reach:  # the fall comes as the context passes the window
        layers = ", ".join(str(i) for i in limits.sliding_layers)
        causes.append(f"the drafter's sliding window of {limits.window} tokens (layers {layers} slide): past it "
                      "only its full-attention layers see the early context — a file whose window metadata is "
                      "missing or changed drafts differently here (check it with dflash-parity --context)")
    if limits.context_length and reach > limits.context_length:
        causes.append(f"past the drafter's trained length: it claims {limits.context_length:,} positions "
                      f"(max_position_embeddings), this level reaches {reach:,}"
                      + (f" with rope scaling {limits.rope_scaling}" if limits.rope_scaling else " without rope scaling"))
    if sweep.target_context and reach > sweep.target_context:
        causes.append(f"past the target's context of {sweep.target_context:,}")
    if runtime != "reference":
        args = list(sweep.llama_cpp_args)
        draft_ctx, ctx = _arg_value(args, DRAFT_CONTEXT_ARGS), _arg_value(args, CONTEXT_ARGS)
        if draft_ctx and reach > draft_ctx:
            causes.append(f"the server's draft context -cd {draft_ctx} is smaller than the prompt + new tokens "
                          f"({reach:,}): the drafter's cache fills and it drafts from a cut context")
        if ctx and reach > ctx:
            causes.append(f"the server's context -c {ctx} is smaller than the prompt + new tokens ({reach:,})")
        cache_types = sorted({r.draft_cache_type for r in (res.serving.runs if res.serving else []) if r.draft_cache_type})
        lossy = [t for t in cache_types if t not in ("f16", "bf16", "f32")]
        if lossy:
            causes.append(f"a quantized draft KV cache ({', '.join(lossy)}): its error grows with the context it holds")
    if not causes:
        passed = (f"; its window of {limits.window} was passed already at ≈ {before:,} tokens, where τ held"
                  if limits.window and limits.window < before else "")
        causes.append(f"none this run can check (the fall comes between ≈ {before:,} and ≈ {reach:,} tokens, inside "
                      f"the drafter's trained length and every context given{passed}) — the drafter itself loses "
                      "accuracy with distance: the pair's training data was shorter than this, or the content changes")
    return causes
