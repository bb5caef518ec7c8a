"""What ``dflash-accept`` measured: per drafter its runs over the prompts, the paired comparisons with the first
drafter, the verdicts, the gates' failures and the trace. The report is built from it in `dflashkit.accept.report`."""

from __future__ import annotations

import math
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from ..bounds import dumps
from ..files import write_text_atomic
from ..llama_cpp import LlamaCppDrafterRun, PerPromptTau, mean_tau
from .prompts import Prompt
from ..runtime import LoadInfo
from ..runtime.speculative import SpeculativeResult
from ..reporting import distinct_labels  # noqa: F401 (re-exported)
from .serving_measure import VERDICT_CRASHED, VERDICT_REFUSED, ServingResult, first_difference
from ..stats import BOOTSTRAP_RESAMPLES, CONFIDENCE, Comparison, paired_comparison
from .tau_gap import VERDICT_ABOVE, VERDICT_AGREES, VERDICT_BELOW, ci_text, gap_message, gap_verdict

EXIT_OK, EXIT_FAILED = 0, 1
WARMUP_TOKENS = 4
CI_METHOD = (f"{CONFIDENCE:.0%} paired bootstrap percentile interval over prompts ({BOOTSTRAP_RESAMPLES} "
             "resamples of the per-prompt τ differences to the first drafter)")
#: verdicts of a drafter row: against the first drafter (reference runtime) and against its own reference τ
#: (llama.cpp column). Stable strings: the JSON report's ``verdict`` / ``llama_cpp_verdict``.
VERDICT_REFERENCE = "reference"
VERDICT_ZERO = "zero accepted"
VERDICT_NONFINITE = "non-finite logits"
TAU_RANDOM_NOTE = ("τ ≈ 1 means the drafter's first token is almost never the target's: expected of random weights "
                   "(fixtures/example), a sign of a broken file otherwise. A trained pair shows a real τ: "
                   "dflash-accept fixtures/trained/drafter --target fixtures/trained/target "
                   "--prompts fixtures/trained/prompts.jsonl")
SPEED_NOTE = ("decode tok/s is this PyTorch reference runtime's speed (eager, dequantized or reference kernels) — "
              "not what a serving engine (llama.cpp, vLLM, SGLang) would reach; compare drafters by τ")


@dataclass
class DrafterRun(PerPromptTau):
    """One drafter over every prompt (``runs[i]`` ↔ prompt i)."""

    path: str  # as given
    info: LoadInfo
    block_size: int
    runs: list[SpeculativeResult]

    label: str = ""  # the shortest path tail that tells it from the other drafters (`distinct_labels`)
    #: with --llama-cpp: the same drafter on llama.cpp's schedule (`dflashkit.runtime.schedules`), ↔ prompts
    replayed: list[SpeculativeResult] | None = None
    schedule: str | None = None  # "simple" / "server": the program whose schedule ``replayed`` follows
    gap_causes: list[str] = field(default_factory=list)  # what could make llama.cpp's τ differ (`accept.gap`)
    #: with --llama-server: per n-max served, the same drafter on llama-server's schedule, ↔ prompts
    server_replays: dict[int, list[SpeculativeResult]] = field(default_factory=dict)

    @property
    def schedule_taus(self) -> list[float]:
        """Per prompt, τ on llama.cpp's schedule (its own τ where none was replayed)."""
        return [r.tau for r in self.replayed] if self.replayed is not None else self.taus

    @property
    def schedule_tau(self) -> float:
        return mean_tau(self.schedule_taus)

    @property
    def name(self) -> str:
        return self.label or Path(self.path).name or self.path


    @property
    def accepted(self) -> list[int]:
        return [a for r in self.runs for a in r.accepted]

    @property
    def tau_pooled(self) -> float:
        acc = self.accepted
        return sum(a + 1 for a in acc) / len(acc) if acc else math.nan

    def histogram(self) -> list[float]:
        """Fraction of rounds that accepted k draft tokens, k = 0 .. block_size − 1."""
        acc = np.asarray(self.accepted, dtype=np.int64)
        counts = np.bincount(acc, minlength=self.block_size)[: self.block_size]
        return (counts / max(1, acc.size)).tolist()

    def position_rates(self) -> list[float]:
        """P(draft token at block position k is accepted), k = 1 .. block_size − 1, over the rounds
        that judged position k (a prompt's last round may judge fewer: see `SpeculativeResult`)."""
        acc = np.asarray(self.accepted, dtype=np.int64)
        drafted = np.asarray([d for r in self.runs for d in r.drafted], dtype=np.int64)
        out = []
        for k in range(1, self.block_size):
            n = int((drafted >= k).sum())
            out.append(float((acc[drafted >= k] >= k).sum() / n) if n else math.nan)
        return out

    @property
    def tokens(self) -> int:
        return sum(len(r.output_ids) for r in self.runs)

    @property
    def nonfinite_rounds(self) -> int:
        return sum(r.nonfinite_rounds for r in self.runs)

    @property
    def accepted_total(self) -> int:
        return sum(self.accepted)

    @property
    def decode_tokens_per_s(self) -> float:
        n = sum(len(r.output_ids) - 1 for r in self.runs)
        t = sum(r.decode_s for r in self.runs)
        return n / t if t > 0 else math.nan


def gap_failure(d: DrafterRun, l: LlamaCppDrafterRun, c: Comparison, max_gap: float) -> list[str]:
    """``--max-gap``, two-sided: llama.cpp's τ significantly off the reference's on llama.cpp's schedule and by more
    than ``max_gap`` of it, below *or* above (one prompt: no CI, its difference) — a drafter that drafts better in
    llama.cpp than in its reference is another model too. The message names the causes found (`DrafterRun.gap_causes`)."""
    return gap_message(d.name, "llama.cpp", l.tau, d.schedule_tau, c, max_gap, d.gap_causes,
                       SCHEDULE_NAMES.get(d.schedule or ""))


#: the llama.cpp program each replayed schedule is (`dflashkit.runtime.schedules`)
SCHEDULE_NAMES = {"simple": "llama-speculative-simple", "server": "llama-server"}


@dataclass
class AcceptMeasurement:
    target: str
    prompts: list[Prompt]
    prompt_source: str
    prompt_ids: list[list[int]]
    drafters: list[DrafterRun]
    max_new_tokens: int
    temperature: float
    seed: int
    device: str
    dtype: str
    stop_token_ids: list[int]
    notes: list[str] = field(default_factory=list)
    reasoning: str | None = None  # --reasoning as given
    chat_template_kwargs: dict[str, Any] = field(default_factory=dict)  # what apply_chat_template received
    llama_cpp: list[LlamaCppDrafterRun] | None = None  # ↔ drafters, with --llama-cpp
    target_gguf: str | None = None
    serving: ServingResult | None = None  # with --llama-server / --server-url
    by_context: Any = None  # with --context: the `dflashkit.accept.sweep.ContextSweep` (this is its first level)

    def comparisons(self) -> list[Comparison | None]:
        """Per drafter, the comparison with the first (None for the first itself)."""
        first = self.drafters[0].taus
        return [None] + [paired_comparison(first, d.taus, seed=self.seed) for d in self.drafters[1:]]

    def llama_cpp_comparisons(self) -> list[Comparison | None]:
        """Per drafter, llama.cpp's τ against the reference runtime's τ of the same drafter on llama.cpp's schedule
        (`DrafterRun.schedule_taus`; None: refused)."""
        if self.llama_cpp is None:
            return []
        return [None if l.refused is not None else paired_comparison(d.schedule_taus, l.taus, seed=self.seed)
                for d, l in zip(self.drafters, self.llama_cpp)]

    def verdicts(self) -> list[str]:
        """Per drafter in the reference runtime: non-finite logits, zero accepted (where the first accepts), below /
        above the first (significant: the paired CI excludes 0), agrees; the first is the reference."""
        first = self.drafters[0]
        out = []
        for i, (d, c) in enumerate(zip(self.drafters, self.comparisons())):
            if d.nonfinite_rounds:
                out.append(VERDICT_NONFINITE)
            elif i and d.accepted_total == 0 and first.accepted_total > 0:
                out.append(VERDICT_ZERO)
            elif c is None:
                out.append(VERDICT_REFERENCE)
            elif c.significant:
                out.append(VERDICT_BELOW if c.delta < 0 else VERDICT_ABOVE)
            else:
                out.append(VERDICT_AGREES)
        return out

    def llama_cpp_verdicts(self) -> list[str]:
        out = []
        first = (self.llama_cpp or [None])[0]
        first_accepts = first is not None and first.refused is None and first.accepted > 0
        for d, l, c in zip(self.drafters, self.llama_cpp or [], self.llama_cpp_comparisons()):
            if l.refused is not None:
                out.append(VERDICT_CRASHED if l.crashed else VERDICT_REFUSED)
            elif l.accepted == 0 and (d.accepted_total > 0 or first_accepts):
                out.append(VERDICT_ZERO)
            else:
                out.append(gap_verdict(c) if c is not None else VERDICT_AGREES)
        return out

    def divergences(self) -> list[str]:
        """At temperature 0 every drafter must reproduce the target's greedy output: where not, say where."""
        if self.temperature > 0:
            return []
        out = []
        ref = self.drafters[0]
        for d in self.drafters[1:]:
            for prompt, a, b in zip(self.prompts, ref.runs, d.runs):
                if a.output_ids != b.output_ids:
                    at = first_difference(a.output_ids, b.output_ids)
                    out.append(f"{d.name} on prompt {prompt.id}: greedy output differs from {ref.name}'s at generated "
                               f"token {at} — float rounding of the batched verify pass (expected now and then in "
                               "bf16/fp16); τ is measured on each drafter's own output")
        return out

    def failures(self, max_drop: float | None = None, min_tau: float | None = None,
                 max_gap: float | None = None, min_speedup: float | None = None) -> list[str]:
        """What makes the exit code 1: non-finite logits always; the gates when given."""
        out = []
        verdicts = self.verdicts()
        for d, v in zip(self.drafters, verdicts):
            if v == VERDICT_NONFINITE:
                out.append(f"{d.name}: non-finite draft logits in {d.nonfinite_rounds} round(s) — a NaN or +inf from a NaN or an "
                           "infinity in its weights or its arithmetic (dflash-diff against its source names the tensors)")
        gated = max_drop is not None or min_tau is not None
        if gated:
            for d, v in zip(self.drafters[1:], verdicts[1:]):
                if v == VERDICT_ZERO:
                    out.append(f"{d.name}: accepted no draft token where {self.drafters[0].name} accepts "
                               f"{self.drafters[0].accepted_total} ({VERDICT_ZERO})")
        if max_drop is not None:
            for d, c, v in zip(self.drafters[1:], self.comparisons()[1:], verdicts[1:]):
                assert c is not None
                if v == VERDICT_NONFINITE:
                    continue
                if not math.isfinite(c.relative):
                    out.append(f"{d.name}: no prompt with rounds on both sides to compare")
                elif -c.relative > max_drop:
                    out.append(f"{d.name}: τ {-c.relative:.1%} below {self.drafters[0].name} "
                               f"(> --max-drop {max_drop:.1%})")
        if min_tau is not None:
            for d, v in zip(self.drafters, verdicts):
                if v not in (VERDICT_NONFINITE, VERDICT_ZERO) and not d.tau >= min_tau:
                    out.append(f"{d.name}: τ {d.tau:.2f} below --min-tau {min_tau:g}")
        if max_gap is not None and self.llama_cpp is not None:
            for d, l, c in zip(self.drafters, self.llama_cpp, self.llama_cpp_comparisons()):
                if l.refused is not None:
                    out.append(f"{d.name}: llama.cpp {'crashed' if l.crashed else 'refused to load it'}: {l.refused}")
                elif c is not None:
                    out += gap_failure(d, l, c, max_gap)
        if self.serving is not None:
            out += self.serving.failures(min_speedup, max_gap=max_gap)
        if self.by_context is not None:  # a longer context level whose server refused or crashed has no figure
            from ..sweeps import level_label

            for level, res in zip(self.by_context.levels[1:], self.by_context.results[1:]):
                if res.serving is not None:
                    out += [f"at --context {level_label(level)}: {f}"
                            for f in res.serving.failures(min_speedup, below=False)]
        return out

    def exit_code(self, max_drop: float | None = None, min_tau: float | None = None,
                  max_gap: float | None = None, min_speedup: float | None = None) -> int:
        return EXIT_FAILED if self.failures(max_drop, min_tau, max_gap, min_speedup) else EXIT_OK

    def trace_lines(self) -> list[dict[str, Any]]:
        """The acceptance trace (docs/formats.md): one object per (drafter, prompt)."""
        extra = {"reasoning": self.reasoning, "chat_template_kwargs": dict(self.chat_template_kwargs)}
        return [{**r.to_trace(d.path), **extra} for d in self.drafters for r in d.runs]

    def write_trace(self, path: str | os.PathLike, *, force: bool = False) -> Path:
        text = "".join(dumps(line, ensure_ascii=False) + "\n" for line in self.trace_lines())
        return write_text_atomic(path, text, force=force)


