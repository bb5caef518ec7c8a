"""What a drafter file is worth where it runs: τ, speed-up against the target alone and identical output, measured
through ``llama-server`` — the server users deploy.

For every combination (target GGUF × drafter × draft KV cache type × draft n-max) one server runs the target with
the drafter (``-md … --spec-type draft-dflash``) and one runs the target alone (the same target, started once per
target and shared by its combinations: neither llama.cpp build takes a per-request switch). Every prompt goes to
both as the same greedy request, one right after the other, the order alternating from prompt to prompt, after a
discarded warm-up on each; so a busy machine slows both arms of a pair alike. Per combination:

- τ: committed tokens per target forward, per prompt ``(predicted_n − 1) / (predicted_n − 1 − draft_n_accepted)``
  (the first token comes from the prompt's prefill), the mean over prompts (the definition ``--llama-cpp`` and the
  reference runtime use);
- decode tok/s without and with the drafter (``(predicted_n − 1) / predicted_ms``, prompt processing excluded);
- the speed-up: the geometric mean over prompts of (tok/s with) / (tok/s without), with a paired bootstrap CI of
  the mean log ratio (`stats.paired_bootstrap_ci`);
- identical output: the speculative tokens must equal the target's own greedy tokens — where not, the prompt, the
  first differing position and both tokens;
- a verdict: *net gain* / *net loss* (the CI lies above / below 1), *no gain* (it spans 1), *output differs*,
  *refused to load*, *crashed*, or *not measured* (``--server-url`` without ``--baseline-url``: no target alone);
- the acceptance rate (accepted / drafted tokens, the figure llama-server's log prints) and, for a server the user
  runs, the most it drafted a round: below the drafter's block − 1 in every reply, with no τ above it + 1, the
  server's n-max is capped (llama-server's default is 3) and the report says so (`ServingRun.capped_n_max`).

One pair of servers runs at a time, and nothing else of dflashkit's runs beside them: a timing never shares the
machine with another. The report's sections are `serving_report`'s.
"""

from __future__ import annotations

import contextlib
import math
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Sequence

import numpy as np

from ..errors import DFlashError
from ..llama_cpp.process import NO_REPACK_NOTE, LlamaCppCrashed
from ..llama_cpp.server import Completion, LlamaServer, RemoteServer
from ..llama_cpp.speculative_simple import CountedRuns, LlamaCppRefused, mean_tau
from ..reporting import distinct_labels
from ..stats import CONFIDENCE, Comparison, paired_bootstrap_ci, paired_comparison
from .serving_plan import ServingPlan, plan_serving
from .tau_gap import gap_message, gap_verdict

#: verdicts of a serving combination: stable strings, the JSON report's ``verdict``
VERDICT_GAIN = "net gain"
VERDICT_NO_GAIN = "no gain"
VERDICT_LOSS = "net loss"
#: the verdicts of a measured speed-up (the others say why there is none)
MEASURED_VERDICTS = (VERDICT_GAIN, VERDICT_NO_GAIN, VERDICT_LOSS)
VERDICT_DIFFERS = "output differs"
VERDICT_REFUSED = "refused to load"
VERDICT_CRASHED = "crashed"
VERDICT_UNMEASURED = "not measured"
VERDICTS = (VERDICT_GAIN, VERDICT_NO_GAIN, VERDICT_LOSS, VERDICT_DIFFERS, VERDICT_REFUSED, VERDICT_CRASHED,
            VERDICT_UNMEASURED)
CACHE_TYPES = ("f32", "f16", "bf16", "q8_0", "q4_0", "q4_1", "iq4_nl", "q5_0", "q5_1")
WARMUP_TOKENS = 8
SPEEDUP_CI_METHOD = (f"{CONFIDENCE:.0%} paired bootstrap interval over prompts of the mean log ratio "
                     "(tok/s with the drafter / tok/s of the target alone), shown as a ratio")


@dataclass
class Difference:
    """Where the speculative output first leaves the target's own greedy output."""

    prompt: str
    position: int  # generated token index
    target_token: int | None  # None: the target's output ended here
    speculative_token: int | None

    def text(self) -> str:
        def tok(t: int | None) -> str:
            return "end of output" if t is None else f"token {t}"
        return (f"prompt {self.prompt}: generated token {self.position} is {tok(self.speculative_token)} with the "
                f"drafter, {tok(self.target_token)} from the target alone")


def once(owner: Any, name: str, key: Any, compute: Callable[[], Any]) -> Any:
    """``compute()``, kept on ``owner`` under ``name`` and computed again only when ``key`` (the figures it is made
    of) changes: a bootstrap asked for by a record, a verdict and a report alike runs once."""
    cached = owner.__dict__.get(name)
    if cached is None or cached[0] != key:
        cached = (key, compute())
        owner.__dict__[name] = cached
    return cached[1]


class PairedSpeeds:
    """The speed-up of paired measurements: each of ``off`` (the target alone) beside the same of ``on`` (with the
    drafter), each with its ``tokens_per_s``; ``seed`` seeds the bootstrap of its CI."""

    off: Sequence[Any]
    on: Sequence[Any]
    seed: int

    def log_ratios_per_prompt(self) -> list[float]:
        """One log ratio per pair, NaN where it has none (a prompt's pairs across runs stay aligned)."""
        return [log_speed_ratio(a.tokens_per_s, b.tokens_per_s) for a, b in zip(self.off, self.on)]

    def log_ratios(self) -> list[float]:
        return [x for x in self.log_ratios_per_prompt() if math.isfinite(x)]

    @property
    def speedup(self) -> float:
        return speedup_of_logs(self.log_ratios())

    @property
    def speedup_ci(self) -> tuple[float, float] | None:
        """The bootstrap CI of the speed-up: computed once for the same ratios and seed (a record, its verdict and
        its report all ask for it; 10,000 resamples each time added up)."""
        logs = self.log_ratios()
        return once(self, "_speedup_ci", (tuple(logs), self.seed), lambda: speedup_ci_of_logs(logs, self.seed))


@dataclass
class ServingRun(PairedSpeeds, CountedRuns):
    """One combination: ``on[i]`` / ``off[i]`` ↔ prompt i (``off`` empty without a target alone to ask)."""

    target_gguf: str
    drafter: str  # as given
    drafter_gguf: str
    draft_n_max: int | None
    draft_cache_type: str | None  # None: the server's default
    on: list[Completion] = field(default_factory=list)
    off: list[Completion] = field(default_factory=list)
    refused: str | None = None
    crashed: bool = False
    note: str | None = None  # NO_REPACK_NOTE: measured again with --no-repack after a crash with repacking
    seed: int = 0
    label: str = ""  # the shortest path tail that tells the drafter from the others (`reporting.distinct_labels`)
    block_size: int | None = None  # the drafter's block: what it could draft a round is block − 1
    #: the reference runtime's τ of the same drafter on llama-server's schedule at this combination's n-max
    #: (`dflashkit.runtime.schedules`), ↔ prompts; None where it was not replayed (a server the user runs whose
    #: n-max is unknown)
    reference_taus: list[float] | None = None
    gap_causes: list[str] = field(default_factory=list)  # what could make the server's τ differ (`accept.gap`)

    @property
    def name(self) -> str:
        return self.label or Path(self.drafter).name or self.drafter

    def drafts_at_most(self) -> int | None:
        """The most tokens a round of this run drafted, as the replies tell it: per reply, its drafted tokens over
        its rounds (decoded − accepted: each round commits its accepted draft plus one), rounded up; the largest
        over replies. A reply gives no per-round counts, so this is a bound of what the server's n-max must be at
        least — and, over replies of many rounds, the n-max itself. None without a drafting reply."""
        per_reply = [math.ceil(c.draft_n / rounds - 1e-9) for c in self.on
                     if c.speculated and (rounds := c.decoded - c.draft_accepted) > 0]
        return max(per_reply) if per_reply else None

    def capped_n_max(self) -> int | None:
        """k when a server the user runs (no n-max of ours) drafted no more than k < block − 1 tokens a round in
        every reply and no prompt's τ passed k + 1: its n-max is likely k (llama-server's own default is 3)."""
        if self.draft_n_max is not None or self.block_size is None or not self.on:
            return None
        k = self.drafts_at_most()
        taus = [t for t in self.taus if math.isfinite(t)]
        if k is None or k >= self.block_size - 1 or not taus or max(taus) > k + 1 + 1e-9:
            return None
        return k

    @property
    def reference_tau(self) -> float:
        return mean_tau(self.reference_taus or [])

    def tau_comparison(self) -> Comparison | None:
        """The server's τ against the reference's on its schedule, paired over prompts (None: nothing to pair);
        bootstrapped once for the same figures (the row, its verdict, the notes and the gate all ask)."""
        if self.reference_taus is None or self.refused is not None or not self.on:
            return None
        reference, taus = self.reference_taus, self.taus
        c = once(self, "_tau_comparison", (tuple(reference), tuple(taus), self.seed),
                 lambda: paired_comparison(reference, taus, seed=self.seed))
        return c if c.n_prompts else None

    def tau_verdict(self) -> str | None:
        c = self.tau_comparison()
        return gap_verdict(c) if c is not None else None

    def gap_failure(self, max_gap: float) -> list[str]:
        c = self.tau_comparison()
        if c is None:
            return []
        return gap_message(f"{self.name} on {target_label(self)} ({combo_label(self)})", "llama-server", self.tau,
                           self.reference_tau, c, max_gap, self.gap_causes, "llama-server")

    @property
    def runs(self) -> list[Completion]:  # PerPromptTau's τ is over the runs with the drafter
        return self.on

    @staticmethod
    def _rate(runs: Sequence[Completion]) -> float:
        n, ms = sum(c.decoded for c in runs), sum(c.predicted_ms for c in runs)
        return n / ms * 1e3 if ms > 0 else math.nan

    @property
    def tokens_per_s_on(self) -> float:
        return self._rate(self.on)

    @property
    def tokens_per_s_off(self) -> float:
        return self._rate(self.off)

    def differences(self, prompt_names: Sequence[str]) -> list[Difference]:
        out = []
        for name, a, b in zip(prompt_names, self.off, self.on):
            if a.tokens != b.tokens:
                at = first_difference(a.tokens, b.tokens)
                out.append(Difference(name, at, a.tokens[at] if at < len(a.tokens) else None,
                                      b.tokens[at] if at < len(b.tokens) else None))
        return out

    def verdict(self, prompt_names: Sequence[str]) -> str:
        if self.refused is not None:
            return VERDICT_CRASHED if self.crashed else VERDICT_REFUSED
        if not self.off:
            return VERDICT_UNMEASURED
        if self.differences(prompt_names):
            return VERDICT_DIFFERS
        return measured_verdict(self.speedup, self.speedup_ci)


def log_speed_ratio(alone: float | None, with_drafter: float | None) -> float:
    """log(tok/s with the drafter / tok/s alone) of one prompt (or batch): NaN where either is missing, not positive
    or not finite — the one rule every speed-up here is made of."""
    if alone is None or with_drafter is None or not (alone > 0 and with_drafter > 0) \
            or not math.isfinite(alone * with_drafter):
        return math.nan
    return math.log(with_drafter / alone)


def first_difference(a: Sequence[int], b: Sequence[int]) -> int:
    """The index of the first token where two outputs differ (the shorter one's length when one is a prefix)."""
    return next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))


def speedup_of_logs(logs: Sequence[float]) -> float:
    """The speed-up from the per-prompt log ratios (tok/s with / alone): their geometric mean; NaN without any."""
    return math.exp(float(np.mean(logs))) if logs else math.nan


def speedup_ci_of_logs(logs: Sequence[float], seed: int) -> tuple[float, float] | None:
    """The speed-up's CI: the paired bootstrap CI of the mean log ratio, exponentiated (None when it has none)."""
    ci = paired_bootstrap_ci(logs, seed=seed)
    return None if ci is None else (math.exp(ci[0]), math.exp(ci[1]))


def measured_verdict(speedup: float, ci: Sequence[float] | None) -> str:
    """The verdict of a measured speed-up: a gain when its CI lies above 1, a loss when below, else no gain (one
    prompt: its own ratio stands for the CI)."""
    low, high = (ci[0], ci[1]) if ci is not None else (speedup, speedup)
    if low > 1:
        return VERDICT_GAIN
    if high < 1:
        return VERDICT_LOSS
    return VERDICT_NO_GAIN


@dataclass
class ServingResult:
    runs: list[ServingRun]
    prompt_names: list[str]
    max_new_tokens: int
    source: str  # "llama-server BIN_DIR (started by dflashkit)" or the URL
    threads: int
    extra_args: list[str]
    notes: list[str] = field(default_factory=list)
    parallel: list[Any] = field(default_factory=list)  # --parallel: `dflashkit.accept.parallel.ParallelLevel`s

    def verdicts(self) -> list[str]:
        return [r.verdict(self.prompt_names) for r in self.runs]

    def failures(self, min_speedup: float | None, *, below: bool = True, max_gap: float | None = None) -> list[str]:
        """``--min-speedup X``: a combination below X (``below``: the first context level only), refused, crashed
        or not reproducing the target fails; so does a ``--parallel`` level that has no figure (its server refused
        or crashed). ``--max-gap``: a combination whose τ is significantly off the reference's on llama-server's
        schedule fails, as llama-speculative-simple's rows do (`tau_gap`)."""
        out = []
        if max_gap is not None:
            for r in self.runs:
                out += r.gap_failure(max_gap)
        if min_speedup is None:
            return out
        for r, v in zip(self.runs, self.verdicts()):
            where = f"{r.name} on {target_label(r)} ({combo_label(r)})"
            if v in (VERDICT_REFUSED, VERDICT_CRASHED):
                out.append(f"{where}: llama-server {v}: {r.refused}")
            elif v == VERDICT_UNMEASURED:
                out.append(f"{where}: no speed-up measured (no target alone: pass --baseline-url)")
            elif v == VERDICT_DIFFERS:
                out.append(f"{where}: output differs from the target alone — {r.differences(self.prompt_names)[0].text()}")
            elif below and not r.speedup >= min_speedup:
                out.append(f"{where}: speed-up ×{r.speedup:.2f} below --min-speedup {min_speedup:g}")
        for lv in self.parallel:  # a --parallel level without a figure (its server refused or died) fails too
            if lv.refused is not None:
                out.append(f"{Path(lv.drafter).name} at -np {lv.n}: no speed-up measured "
                           f"({lv.verdict(self.prompt_names)}): {lv.refused}")
        return out


def target_label(r: ServingRun) -> str:
    """The target GGUF's file name, or the URL of a server the user runs."""
    return r.target_gguf if r.target_gguf.startswith(("http://", "https://")) else Path(r.target_gguf).name


def combo_label(r: ServingRun) -> str:
    return (f"draft cache {r.draft_cache_type or 'default'}, n-max "
            f"{r.draft_n_max if r.draft_n_max is not None else 'default'}")


def draft_n_max_value(v: str) -> int:
    n = int(v)
    if not 1 <= n <= 256:
        raise ValueError("is not a draft length from 1 to 256")
    return n


def cache_type_value(v: str) -> str:
    if v.lower() not in CACHE_TYPES:
        raise ValueError(f"is not a KV cache type llama.cpp takes ({', '.join(CACHE_TYPES)})")
    return v.lower()


class _TargetAloneFailed(DFlashError):
    """The target alone refused or died: every combination of its target GGUF is left without a figure, for this
    reason (the drafters' rows say so, crashed or refused, and the rest of the run is kept)."""

    def __init__(self, message: str, crashed: bool) -> None:
        super().__init__(message)
        self.crashed = crashed


def measure_serving(
    drafters: Sequence[tuple[str, str | os.PathLike, int]],
    texts: Sequence[str],
    prompt_names: Sequence[str],
    plan: ServingPlan | None = None,
    *,
    prompt_tokens: Sequence[int] | None = None,
    ignore_eos: bool = False,
    progress: Callable[[str], None] | None = None,
    vocab: int | None = None,
    **options: Any,
) -> ServingResult:
    """Every combination through llama-server (module doc). ``drafters``: (path as given, GGUF path, block size).

    ``plan`` (`serving_plan.plan_serving`: the options checked once by the caller) says where and how: with
    ``plan.llama_server`` (a build's bin/ folder) dflashkit starts and stops the servers, one per combination and
    one target alone per target GGUF; with ``plan.server_url`` it asks a running server (its drafter, cache and n-max
    are the server's own) and ``plan.baseline_url`` for the target alone. Without a plan, ``options`` are
    `plan_serving`'s keywords and are checked here. Every reply is checked against what its request allows (the
    plan's ``max_new_tokens``, the n-max set — or, for a running server, the drafter's block − 1, where llama.cpp
    clamps it —, token ids below ``vocab``, its own wall time): an impossible one is refused."""
    say = progress or (lambda message: None)
    if plan is None:
        if "parallel" in options or "target_ggufs_later" in options:
            raise TypeError("measure_serving: --parallel levels are measure_parallel's, and the target GGUFs are "
                            "needed now: pass neither parallel nor target_ggufs_later")
        plan = plan_serving([(path, block) for path, _, block in drafters], **options)
    elif options:
        raise TypeError(f"measure_serving: pass the options in the plan, not as {', '.join(sorted(options))}")
    llama_server, server_url, baseline_url = plan.llama_server, plan.server_url, plan.baseline_url
    max_new_tokens, seed, threads, timeout = plan.max_new_tokens, plan.seed, plan.threads, plan.timeout
    extra_args = plan.extra_args
    longest = max(prompt_tokens) if prompt_tokens else 512
    pairs = list(zip(texts, prompt_names))
    runs: list[ServingRun] = []

    def ask(server: Any, base: Any | None, text: str, n: int, request_seed: int) -> Completion:
        try:
            return server.complete(text, n, seed=request_seed, ignore_eos=ignore_eos)
        except (LlamaCppRefused, LlamaCppCrashed) as exc:
            if server is base:  # the shared target alone failed: no drafter's fault, and no later pair can run
                raise _TargetAloneFailed(f"the target alone ({server.label}) failed: {exc}",
                                         isinstance(exc, LlamaCppCrashed)) from None
            raise

    def measure(run: ServingRun, spec: Any, base: Any | None) -> None:
        say(f"llama-server: {run.name} on {Path(run.target_gguf).name} ({combo_label(run)}): warm-up")
        warm = min(WARMUP_TOKENS, max_new_tokens)
        for server in (spec, base) if base is not None else (spec,):
            ask(server, base, texts[0], warm, seed)
        for i, (text, name) in enumerate(pairs):
            arms = [(spec, run.on), (base, run.off)] if base is not None else [(spec, run.on)]
            for server, out in arms if i % 2 else arms[::-1]:  # the order alternates
                out.append(ask(server, base, text, max_new_tokens, seed + i))
            speed = (f", ×{run.on[-1].tokens_per_s / run.off[-1].tokens_per_s:.2f}"
                     if base is not None and run.off[-1].tokens_per_s > 0 else "")
            say(f"llama-server {run.name}: prompt {i + 1}/{len(pairs)} ({name}): τ {run.on[-1].tau:.2f}{speed}")

    if server_url is not None:
        spec = RemoteServer(server_url, request_timeout=timeout, expects_drafts=True,
                            draft_max=max(b for _, _, b in drafters) - 1, vocab=vocab)
        base = (RemoteServer(baseline_url, label=f"target alone {baseline_url}", request_timeout=timeout,
                             vocab=vocab) if baseline_url else None)
        run = ServingRun(server_url, server_url, server_url, None, None, seed=seed,
                         block_size=max(b for _, _, b in drafters))
        try:
            measure(run, spec, base)
        except _TargetAloneFailed as exc:
            raise DFlashError(str(exc)) from None  # a server the user runs: nothing of ours to report on
        runs.append(run)
        source = f"llama-server at {server_url}" + (f", target alone at {baseline_url}" if baseline_url else "")
    else:
        assert llama_server is not None
        source = f"llama-server from {llama_server} (started by dflashkit on 127.0.0.1)"
        for target in plan.target_ggufs:
            blocks = [b for _, _, b in drafters]
            ctx = longest + 2 * (max_new_tokens + max(blocks)) + 64

            def server(gguf: Any = None, n: int | None = None, cache: str | None = None,
                       args: Sequence[str] = extra_args, target: Any = target, ctx: int = ctx) -> LlamaServer:
                return LlamaServer(llama_server, target, gguf, draft_max=n, draft_cache_type=cache, ctx_size=ctx,
                                   threads=threads, extra_args=args, startup_timeout=timeout,
                                   request_timeout=timeout, vocab=vocab)

            say(f"llama-server: starting the target alone ({Path(target).name})")
            args, note = list(extra_args), None
            with contextlib.ExitStack() as stack:
                try:
                    base_server = stack.enter_context(server())
                except LlamaCppCrashed as exc:
                    if not exc.repack:
                        raise
                    say("llama-server crashed loading the target with weight repacking: every pair with --no-repack")
                    args, note = [*args, "--no-repack"], NO_REPACK_NOTE
                    base_server = stack.enter_context(server(args=args))
                alone_failed: _TargetAloneFailed | None = None
                for path, gguf, block in drafters:
                    for cache in plan.draft_cache_types:
                        for n_max in plan.draft_n_max:
                            n = n_max if n_max is not None else block - 1
                            run = ServingRun(str(target), path, str(gguf), n, cache, seed=seed, block_size=block,
                                             note=note)
                            runs.append(run)
                            if alone_failed is not None:  # no pair of this target can be measured any more
                                run.refused, run.crashed = str(alone_failed), alone_failed.crashed
                                continue
                            try:
                                try:
                                    with server(gguf, n, cache, args) as spec:
                                        measure(run, spec, base_server)
                                except LlamaCppCrashed as exc:
                                    if not exc.repack:
                                        raise
                                    # both arms again without repacking: a speed-up compares like with like
                                    say(f"llama-server crashed loading {path} with weight repacking: the pair once "
                                        "more with --no-repack")
                                    run.on, run.off, run.note = [], [], NO_REPACK_NOTE
                                    no_repack = [*args, "--no-repack"]
                                    with server(args=no_repack) as base2, server(gguf, n, cache, no_repack) as spec:
                                        measure(run, spec, base2)
                            except _TargetAloneFailed as exc:  # every pair of this target: no figure, this reason
                                run.on, run.off, alone_failed = [], [], exc
                                run.refused, run.crashed = str(exc), exc.crashed
                                say(f"llama-server: {exc}")
                            except (LlamaCppRefused, LlamaCppCrashed) as exc:
                                run.on, run.off = [], []
                                run.refused, run.crashed = str(exc), isinstance(exc, LlamaCppCrashed)
                                say(f"llama-server {'crashed on' if run.crashed else 'refused'} {path}: {exc}")
    labels = dict(zip([p for p, _, _ in drafters], distinct_labels([str(p) for p, _, _ in drafters])))
    for run in runs:
        run.label = labels.get(run.drafter, "")
    notes = [f"llama-server: greedy requests (temperature 0, top-k 1, no prompt cache), {max_new_tokens} new tokens, "
             f"-np 1, -t {threads}; speed-up: {SPEEDUP_CI_METHOD}",
             "τ per prompt = (predicted_n − 1) / (predicted_n − 1 − draft_n_accepted) (the first token comes from "
             "the prompt's prefill) and tok/s = (predicted_n − 1) / predicted_ms, both from the server's JSON timings"]
    return ServingResult(runs, list(prompt_names), max_new_tokens, source, threads, list(extra_args), notes)
