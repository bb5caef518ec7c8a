"""`dflash-accept`: what a drafter file is worth in speculative decoding — its acceptance length τ.

Each drafter (HF dir or GGUF of any dialect/type) runs the draft–verify loop of
`dflashkit.runtime.speculative` against the same HF target on the same prompts. Per drafter the
report gives the mean τ (committed tokens per target forward), the histogram of accepted tokens per
round, the acceptance rate per block position, the loop's decode speed in this PyTorch runtime, and
the difference to the *first* drafter with a paired bootstrap confidence interval over prompts.

τ of one prompt = mean over its rounds of (accepted + 1) (docs/formats.md); a drafter's τ is
the mean over prompts of that, as z-lab's benchmark reports it.
"""

from __future__ import annotations

import json
import math
import os
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path
from typing import Any, Callable, Mapping, Sequence

import numpy as np

from .bounds import dumps
from .errors import DFlashError, UsageError
from .files import atomic_output, check_output, write_text_atomic
from .converters.convert import convert
from .llama_cpp import (LlamaCppDrafterRun, PerPromptTau, check_prompt_text, find_binary, run_drafter,
                        target_gguf_from_hf, temp_dir)
from .llama_cpp import llama_cpp_src as find_src
from .reporting import Bar, BarChart, BarGroup, Column, Field, Notes, Report, Table, verdict
from .runtime import HFTarget, LoadInfo, load_drafter
from .runtime.load import VERIFY_MODE
from .runtime.speculative import SpeculativeResult, check_pair, default_stop_ids, speculative_generate

EXIT_OK, EXIT_FAILED = 0, 1
CONFIDENCE = 0.95
BOOTSTRAP_RESAMPLES = 10_000
WARMUP_TOKENS = 4
CI_METHOD = (f"{CONFIDENCE:.0%} paired bootstrap percentile interval over prompts ({BOOTSTRAP_RESAMPLES} "
             "resamples of the per-prompt τ differences to the first drafter)")
#: verdicts of a drafter row: against the first drafter (reference runtime) and against its own reference τ
#: (llama.cpp column). Stable strings: the JSON report's ``verdict`` / ``llama_cpp_verdict``.
VERDICT_REFERENCE = "reference"
VERDICT_AGREES = "agrees"
VERDICT_ABOVE = "above reference"
VERDICT_BELOW = "below reference"
VERDICT_ZERO = "zero accepted"
VERDICT_NONFINITE = "non-finite logits"
VERDICT_REFUSED = "refused to load"
TAU_RANDOM_NOTE = ("τ ≈ 1 means the drafter's first token is almost never the target's: expected of random weights "
                   "(fixtures/example), a sign of a broken file otherwise. A trained pair shows a real τ: "
                   "dflash-accept fixtures/trained/drafter --target fixtures/trained/target "
                   "--prompts fixtures/trained/prompts.jsonl")
SPEED_NOTE = ("decode tok/s is this PyTorch reference runtime's speed (eager, dequantized or reference kernels) — "
              "not what a serving engine (llama.cpp, vLLM, SGLang) would reach; compare drafters by τ")

# ---------------------------------------------------------------------------------------------
# Prompts
# ---------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Prompt:
    """One prompt: chat ``messages`` (rendered with the target's chat template) or raw ``text``."""

    id: str
    category: str = ""
    messages: tuple[tuple[str, str], ...] | None = None  # (role, content)
    text: str | None = None

    def ids(self, target: HFTarget, template_kwargs: Mapping[str, Any] | None = None) -> tuple[list[int], bool]:
        """Token ids for ``target``, and whether a chat prompt had to go in as plain text (no template).

        ``template_kwargs`` go to ``apply_chat_template`` (``enable_thinking``, ``reasoning_effort``, ...).
        """
        tok = target.tokenizer
        text, templated, fallback = self.rendered(target, template_kwargs)
        if templated:
            return list(tok.encode(text, add_special_tokens=False)), False
        return list(tok.encode(text)), fallback  # the tokenizer's own specials (a BOS where used)

    def rendered(self, target: HFTarget, template_kwargs: Mapping[str, Any] | None = None) -> tuple[str, bool, bool]:
        """(the prompt as the text the target reads, whether the chat template made it, whether a chat prompt
        fell back to plain text). llama.cpp gets this text (its special tokens are parsed there too)."""
        tok = target.tokenizer
        if self.messages is None:
            return self.text or "", False, False
        if getattr(tok, "chat_template", None):
            chat = [{"role": r, "content": c} for r, c in self.messages]
            text = tok.apply_chat_template(chat, tokenize=False, add_generation_prompt=True, **(template_kwargs or {}))
            return text, True, False
        # A base model: the contents as plain text, as HFTarget.encode does for one user turn.
        return "\n\n".join(c for _, c in self.messages), False, True


#: ``--reasoning`` levels that switch thinking on or off; anything else is a reasoning level.
REASONING_SWITCH = ("on", "off")
_LEVEL_KEYS = ("reasoning_strength", "reasoning_effort")  # z-lab's order


def reasoning_template_kwargs(reasoning: str | None, template: str | None) -> dict[str, Any]:
    """``--reasoning`` → chat-template kwargs, exactly as z-lab's ``dflash benchmark`` maps it
    (``dflash/benchmark.py`` ``_reasoning_kwargs``): ``on``/``off`` → ``enable_thinking``, which the template
    must mention; a level → ``reasoning_strength`` or ``reasoning_effort``, the first the template mentions."""
    if reasoning is None:
        return {}
    text = template or ""
    if reasoning in REASONING_SWITCH:
        if "enable_thinking" not in text:
            raise UsageError(f"--reasoning {reasoning}: the target's chat template has no enable_thinking switch "
                             "(pass the template's own variable with --chat-template-kwargs)")
        return {"enable_thinking": reasoning == "on"}
    for key in _LEVEL_KEYS:
        if key in text:
            return {key: reasoning}
    raise UsageError(f"--reasoning {reasoning}: the target's chat template takes no reasoning level "
                     f"({' / '.join(_LEVEL_KEYS)}); use --reasoning on or off")


def parse_template_kwargs(text: str | None) -> dict[str, Any]:
    """``--chat-template-kwargs JSON``: a JSON object, or a one-line usage error."""
    if text is None:
        return {}
    try:
        value = json.loads(text)
    except json.JSONDecodeError as exc:
        raise UsageError(f"--chat-template-kwargs: not valid JSON ({exc.msg}) — give an object such as "
                         "'{\"enable_thinking\": false}'") from None
    except RecursionError:  # a few bytes of brackets: bounded here, not a crash
        raise UsageError("--chat-template-kwargs: JSON nested too deeply — give an object such as "
                         "'{\"enable_thinking\": false}'") from None
    if not isinstance(value, dict):
        raise UsageError(f"--chat-template-kwargs: expected a JSON object, got a JSON {type(value).__name__}")
    return value


def builtin_prompts_path() -> Path:
    return Path(str(resources.files("dflashkit.runtime").joinpath("prompts.jsonl")))


def load_prompts(path: str | os.PathLike | None = None) -> list[Prompt]:
    """Prompts from a JSONL file (the built-in chat/code/math set when ``path`` is None).

    Each line: ``{"messages": [{"role": "user", "content": "..."}, ...]}`` (chat template),
    ``{"prompt": "..."}`` or a bare JSON string (one user turn, chat template), or ``{"text": "..."}``
    (raw text, tokenized as is); optional ``"id"`` and ``"category"``.
    """
    src = Path(path) if path is not None else builtin_prompts_path()
    try:
        lines = src.read_text(encoding="utf-8").splitlines()
    except FileNotFoundError:
        raise DFlashError(f"{src}: no such prompts file") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise DFlashError(f"{src}: cannot read the prompts file ({exc})") from None
    prompts = [_parse_prompt(line, src, n) for n, line in enumerate(lines, 1) if line.strip()]
    if not prompts:
        raise DFlashError(f"{src}: no prompts (expected one JSON object per line)")
    return prompts


_PROMPT_FORMS = '{"messages": [{"role": "user", "content": "..."}]}, {"prompt": "..."} or {"text": "..."}'


def _parse_prompt(line: str, src: Path, n: int) -> Prompt:
    where = f"{src}:{n}"
    try:
        obj = json.loads(line)
    except json.JSONDecodeError as exc:
        raise DFlashError(f"{where}: not valid JSON ({exc.msg}) — each line must be {_PROMPT_FORMS}") from None
    except RecursionError:
        raise DFlashError(f"{where}: JSON nested too deeply — each line must be {_PROMPT_FORMS}") from None
    if isinstance(obj, str):
        obj = {"prompt": obj}
    if not isinstance(obj, dict):
        raise DFlashError(f"{where}: expected {_PROMPT_FORMS}, got a JSON {type(obj).__name__}")
    pid, category = str(obj.get("id", f"{src.stem}:{n}")), str(obj.get("category", ""))
    given = [k for k in ("messages", "prompt", "text") if k in obj]
    if len(given) != 1:
        raise DFlashError(f"{where}: give exactly one of messages / prompt / text (found {given or 'none'})")
    if "text" in obj or "prompt" in obj:
        value = obj[given[0]]
        if not isinstance(value, str) or not value:
            raise DFlashError(f"{where}: '{given[0]}' must be a non-empty string")
        if "text" in obj:
            return Prompt(pid, category, text=value)
        return Prompt(pid, category, messages=(("user", value),))
    messages = obj["messages"]
    if not isinstance(messages, list) or not messages:
        raise DFlashError(f"{where}: 'messages' must be a non-empty list of {{\"role\", \"content\"}} objects")
    out = []
    for i, m in enumerate(messages):
        if not (isinstance(m, dict) and isinstance(m.get("role"), str) and isinstance(m.get("content"), str)):
            raise DFlashError(f"{where}: messages[{i}] needs string 'role' and 'content'")
        out.append((m["role"], m["content"]))
    return Prompt(pid, category, messages=tuple(out))


# ---------------------------------------------------------------------------------------------
# Statistics
# ---------------------------------------------------------------------------------------------


def paired_bootstrap_ci(diffs: Sequence[float], *, seed: int = 0, resamples: int = BOOTSTRAP_RESAMPLES,
                        confidence: float = CONFIDENCE) -> tuple[float, float] | None:
    """Percentile interval of the mean of ``diffs`` (per-prompt paired differences); None below 2 prompts."""
    d = np.asarray(diffs, dtype=np.float64)
    if d.size < 2:
        return None
    rng = np.random.default_rng(seed)
    means = d[rng.integers(0, d.size, size=(resamples, d.size))].mean(axis=1)
    alpha = (1 - confidence) / 2
    lo, hi = np.quantile(means, [alpha, 1 - alpha])
    return float(lo), float(hi)


@dataclass
class DrafterRun(PerPromptTau):
    """One drafter over every prompt (``runs[i]`` ↔ prompt i)."""

    path: str  # as given
    info: LoadInfo
    block_size: int
    runs: list[SpeculativeResult]

    @property
    def name(self) -> str:
        return Path(self.path).name or self.path


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


@dataclass
class Comparison:
    """A drafter against the first one, over the prompts where both ran at least one round."""

    delta: float  # τ − τ(first), mean of the per-prompt differences
    relative: float  # delta / τ(first) over the same prompts
    ci: tuple[float, float] | None
    n_prompts: int

    @property
    def significant(self) -> bool:
        return self.ci is not None and (self.ci[1] < 0 or self.ci[0] > 0)


def paired_comparison(base: Sequence[float], other: Sequence[float], *, seed: int = 0) -> Comparison:
    """``other`` against ``base``, paired over the prompts where both have a finite τ."""
    pairs = [(a, b) for a, b in zip(base, other) if math.isfinite(a) and math.isfinite(b)]
    if not pairs:
        return Comparison(math.nan, math.nan, None, 0)
    diffs = [b - a for a, b in pairs]
    mean_base = float(np.mean([a for a, _ in pairs]))
    delta = float(np.mean(diffs))
    return Comparison(delta, delta / mean_base if mean_base else math.nan, paired_bootstrap_ci(diffs, seed=seed),
                      len(pairs))


@dataclass
class AcceptResult:
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

    def comparisons(self) -> list[Comparison | None]:
        """Per drafter, the comparison with the first (None for the first itself)."""
        first = self.drafters[0].taus
        return [None] + [paired_comparison(first, d.taus, seed=self.seed) for d in self.drafters[1:]]

    def llama_cpp_comparisons(self) -> list[Comparison | None]:
        """Per drafter, llama.cpp's τ against the reference runtime's τ of the same drafter (None: refused)."""
        if self.llama_cpp is None:
            return []
        return [None if l.refused is not None else paired_comparison(d.taus, l.taus, seed=self.seed)
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
                out.append(VERDICT_REFUSED)
            elif l.accepted == 0 and (d.accepted_total > 0 or first_accepts):
                out.append(VERDICT_ZERO)
            elif c is not None and c.significant:
                out.append(VERDICT_BELOW if c.delta < 0 else VERDICT_ABOVE)
            elif c is not None and c.ci is None and c.n_prompts == 1 and c.delta != 0:
                out.append(VERDICT_BELOW if c.delta < 0 else VERDICT_ABOVE)  # one prompt: no CI, its difference
            else:
                out.append(VERDICT_AGREES)
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
                    at = next((i for i, (x, y) in enumerate(zip(a.output_ids, b.output_ids)) if x != y),
                              min(len(a.output_ids), len(b.output_ids)))
                    out.append(f"{d.name} on prompt {prompt.id}: greedy output differs from {ref.name}'s at generated "
                               f"token {at} — float rounding of the batched verify pass (expected now and then in "
                               "bf16/fp16); τ is measured on each drafter's own output")
        return out

    def failures(self, max_drop: float | None = None, min_tau: float | None = None,
                 max_gap: float | None = None) -> list[str]:
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
                    out.append(f"{d.name}: llama.cpp refused to load it: {l.refused}")
                elif c is not None and math.isfinite(d.tau) and d.tau > 0 and c.n_prompts \
                        and -(c.ci[1] if c.ci is not None else c.delta) / d.tau > max_gap:  # 1 prompt: no CI
                    out.append(f"{d.name}: llama.cpp τ {l.tau:.2f} is significantly more than {max_gap:.1%} below the "
                               f"reference runtime's {d.tau:.2f} (--max-gap; {_ci_text(c)})")
        return out

    def exit_code(self, max_drop: float | None = None, min_tau: float | None = None,
                  max_gap: float | None = None) -> int:
        return EXIT_FAILED if self.failures(max_drop, min_tau, max_gap) else EXIT_OK

    def trace_lines(self) -> list[dict[str, Any]]:
        """The acceptance trace (docs/formats.md): one object per (drafter, prompt)."""
        extra = {"reasoning": self.reasoning, "chat_template_kwargs": dict(self.chat_template_kwargs)}
        return [{**r.to_trace(d.path), **extra} for d in self.drafters for r in d.runs]

    def write_trace(self, path: str | os.PathLike, *, force: bool = False) -> Path:
        text = "".join(dumps(line, ensure_ascii=False) + "\n" for line in self.trace_lines())
        return write_text_atomic(path, text, force=force)

    def report(self, max_drop: float | None = None, min_tau: float | None = None,
               max_gap: float | None = None) -> Report:
        return _build_report(self, max_drop, min_tau, max_gap)


# ---------------------------------------------------------------------------------------------
# Running
# ---------------------------------------------------------------------------------------------


def run_acceptance(
    target: str | os.PathLike | HFTarget,
    drafters: Sequence[str | os.PathLike],
    prompts: str | os.PathLike | Sequence[Prompt] | None = None,
    *,
    max_new_tokens: int = 128,
    temperature: float = 0.0,
    seed: int = 0,
    device: str = "cpu",
    dtype: str = "float32",
    keep_quantized: bool = False,
    max_prompts: int | None = None,
    ignore_eos: bool = False,
    warmup: bool = True,
    progress: Callable[[str], None] | None = None,
    reasoning: str | None = None,
    chat_template_kwargs: Mapping[str, Any] | str | None = None,
    llama_cpp: str | os.PathLike | None = None,
    target_gguf: str | os.PathLike | None = None,
    llama_cpp_src: str | os.PathLike | None = None,
    threads: int = 1,
) -> AcceptResult:
    """Run every drafter on every prompt against ``target`` (an HF dir, or an `HFTarget` already loaded).

    Drafters are loaded one at a time (only one sits in memory next to the target). Each
    (drafter, prompt) run is seeded with ``seed + prompt index``, so a prompt gets the same random
    stream with every drafter. ``warmup`` runs a few tokens first so one-time costs stay out of tok/s.

    ``reasoning`` (``"on"``, ``"off"`` or a level such as ``"high"``) sets the chat template's thinking
    switch as z-lab's ``dflash benchmark --reasoning`` does (`reasoning_template_kwargs`);
    ``chat_template_kwargs`` (a mapping, or its JSON text) is merged over that into every
    ``apply_chat_template`` call. Both are recorded in the report and in every trace line.

    ``llama_cpp`` (a llama.cpp build's bin/ folder) also runs every drafter through llama.cpp's
    ``llama-speculative-simple`` on the same prompt texts, greedy (`dflashkit.llama_cpp`), with ``target_gguf`` as
    the target — or the HF target converted by llama.cpp's own converter from ``llama_cpp_src`` (default
    $DFLASHKIT_LLAMA_CPP_SRC). An HF drafter directory is converted to a bf16 GGUF on the fly.
    """
    if not drafters:
        raise UsageError("give at least one drafter")
    if max_new_tokens < 2:
        raise UsageError(f"--max-new-tokens must be at least 2 (the prefill makes the first token; rounds come "
                         f"after it), got {max_new_tokens}")
    if temperature < 0 or not math.isfinite(temperature):
        raise UsageError(f"--temperature must be ≥ 0, got {temperature}")
    if max_prompts is not None and max_prompts < 1:
        raise UsageError(f"--max-prompts must be at least 1, got {max_prompts}")
    say = progress or (lambda message: None)
    if reasoning is not None and (not isinstance(reasoning, str) or not reasoning.strip()):
        raise UsageError("--reasoning: give off, on or a reasoning level (e.g. high)")
    if isinstance(chat_template_kwargs, str) or chat_template_kwargs is None:
        user_kwargs = parse_template_kwargs(chat_template_kwargs)
    elif isinstance(chat_template_kwargs, Mapping):
        user_kwargs = dict(chat_template_kwargs)
    else:
        raise UsageError(f"chat_template_kwargs: expected a mapping or JSON text, got {type(chat_template_kwargs).__name__}")

    if isinstance(prompts, (str, os.PathLike)) or prompts is None:
        source = str(prompts) if prompts is not None else "built-in (chat, code, math)"
        prompt_list = load_prompts(prompts)
    else:
        source, prompt_list = "given", list(prompts)
    prompt_list = prompt_list[:max_prompts] if max_prompts else prompt_list
    # fail on a missing drafter before spending minutes loading the target
    for d in drafters:
        if not Path(d).exists():
            raise DFlashError(f"{d}: no such file or directory (drafters are HF dirs or GGUF files)")
    llama_binary = converter_src = None
    if llama_cpp is not None:

        if temperature > 0:
            raise UsageError("--llama-cpp measures greedy τ: use it with --temperature 0")
        llama_binary = find_binary(llama_cpp)
        if target_gguf is not None:
            if not Path(target_gguf).is_file():
                raise UsageError(f"--target-gguf {target_gguf}: no such file")
        else:
            converter_src = find_src(llama_cpp_src)
            if converter_src is None:
                raise UsageError("--llama-cpp needs the target as a GGUF: pass --target-gguf FILE (or --llama-cpp-src "
                                 "DIR, llama.cpp's source tree, to convert --target with llama.cpp's own converter)")
    elif target_gguf is not None or llama_cpp_src is not None:
        raise UsageError("--target-gguf / --llama-cpp-src only matter with --llama-cpp BIN_DIR")

    if isinstance(target, HFTarget):
        runner = target
    else:
        if not Path(target).is_dir():
            kind = "a file" if Path(target).is_file() else "not found"
            raise UsageError(f"--target {target}: {kind} — dflash-accept runs the target with transformers, so it "
                             "needs the target's HF model directory (config.json + safetensors), not a GGUF")
        say(f"loading target {target}")
        runner = HFTarget(target, device=device, dtype=dtype)

    template = getattr(runner.tokenizer, "chat_template", None)
    template_kwargs = {**reasoning_template_kwargs(reasoning, template if isinstance(template, str) else None),
                       **user_kwargs}
    notes: list[str] = []
    if template_kwargs and not template:
        notes.append(f"target {runner.path} has no chat template: chat template kwargs {json.dumps(template_kwargs)} "
                     "were not used")
    prompt_ids, plain, texts = [], [], []
    for p in prompt_list:
        ids, fallback = p.ids(runner, template_kwargs)
        if not ids:
            raise DFlashError(f"prompt {p.id}: encodes to no tokens — give it some text")
        prompt_ids.append(ids)
        texts.append(p.rendered(runner, template_kwargs)[0])
        if fallback:
            plain.append(p.id)
    if llama_binary is not None:  # before minutes of reference runs, not after

        for p, text in zip(prompt_list, texts):
            try:
                check_prompt_text(text)
            except DFlashError as exc:
                raise DFlashError(f"prompt {p.id}: {exc}") from None
    if plain:
        notes.append(f"target {runner.path} has no chat template: chat prompt(s) {', '.join(plain)} were fed as "
                     "plain text")
    stops = [] if ignore_eos else default_stop_ids(runner)

    runs: list[DrafterRun] = []
    head = None
    for n, path in enumerate(drafters, 1):
        say(f"drafter {n}/{len(drafters)}: loading {path}")
        model = load_drafter(path, device=str(runner.device), dtype=dtype, keep_quantized=keep_quantized)
        if head is None:  # one head for all drafters: same device and dtype
            head = runner.head(dtype=dtype)
        check_pair(model, runner, head, where=f"drafter {path}")
        if warmup:
            speculative_generate(model, runner, prompt_ids[0], max_new_tokens=WARMUP_TOKENS, temperature=temperature,
                                 head=head, stop_token_ids=(), seed=seed)
        results = []
        for i, ids in enumerate(prompt_ids):
            r = speculative_generate(model, runner, ids, max_new_tokens=max_new_tokens, temperature=temperature,
                                     head=head, stop_token_ids=stops, seed=seed + i)
            results.append(r)
            say(f"drafter {n}/{len(drafters)}: prompt {i + 1}/{len(prompt_ids)} ({prompt_list[i].id}): "
                f"τ {r.tau:.2f} over {r.rounds} round(s)")
        runs.append(DrafterRun(str(path), model.load_info, model.draft_tokens + 1, results))  # verify width  # type: ignore[arg-type]
        del model  # free it before the next one loads
    llama_runs, gguf_used = None, None
    if llama_binary is not None:
        llama_runs, gguf_used = _run_llama_cpp(llama_binary, runs, texts, prompt_ids, runner, target_gguf,
                                               converter_src, max_new_tokens, threads, notes, say, ignore_eos)
    return AcceptResult(
        target=str(runner.path), prompts=prompt_list, prompt_source=source, prompt_ids=prompt_ids, drafters=runs,
        max_new_tokens=max_new_tokens, temperature=float(temperature), seed=seed, device=str(runner.device),
        dtype=dtype, stop_token_ids=stops, notes=notes, reasoning=reasoning, chat_template_kwargs=template_kwargs,
        llama_cpp=llama_runs, target_gguf=gguf_used,
    )


def _run_llama_cpp(binary: Path, runs: list[DrafterRun], texts: list[str], prompt_ids: list[list[int]],
                   runner: HFTarget, target_gguf: str | os.PathLike | None, converter_src: Path | None,
                   max_new_tokens: int, threads: int, notes: list[str],
                   say: Callable[[str], None], ignore_eos: bool = False) -> tuple[list[LlamaCppDrafterRun], str]:
    """Every drafter through llama-speculative-simple (HF dirs converted to bf16 GGUFs in a temp folder)."""

    with temp_dir() as tmp:
        if target_gguf is None:
            assert converter_src is not None
            say(f"llama.cpp: converting target {runner.path} with llama.cpp's convert_hf_to_gguf.py (bf16)")
            target_gguf = target_gguf_from_hf(runner.path, Path(tmp) / "target-bf16.gguf", converter_src)
            notes.append(f"llama.cpp target: {runner.path} converted to bf16 by llama.cpp's own convert_hf_to_gguf.py")
        out = []
        for n, d in enumerate(runs, 1):
            gguf_path = Path(d.path)
            if gguf_path.is_dir():
                gguf_path = Path(tmp) / f"drafter-{n}-bf16.gguf"
                say(f"llama.cpp: converting {d.path} to bf16 GGUF (tokenizer from {target_gguf})")
                convert(d.path, gguf_path, outtype="bf16", target=target_gguf, progress=False, warn=lambda m: None)
                notes.append(f"llama.cpp ran {d.name} as a bf16 GGUF converted on the fly by dflash-convert")
            out.append(run_drafter(binary, target_gguf, d.path, gguf_path, texts, n_predict=max_new_tokens,
                                   draft_max=d.block_size - 1, threads=threads, progress=say,
                                   prompt_tokens=[len(ids) for ids in prompt_ids], ignore_eos=ignore_eos))
        if ignore_eos:
            notes.append("--ignore-eos: llama.cpp's --ignore-eos bans the end-of-sequence token (logit bias −inf), "
                         "the reference runtime generates through it; τ compares the two only while neither emits it")
        mismatched = sorted({i for l in out for i, r in enumerate(l.runs)
                             if r.n_prompt_tokens is not None and r.n_prompt_tokens != len(prompt_ids[i])})
        if mismatched:
            notes.append(f"llama.cpp tokenized {len(mismatched)} prompt(s) to another length than the HF tokenizer "
                         f"(prompt indices {mismatched[:10]}): those τ pairs compare different token streams")
        kept = str(target_gguf)
    return out, kept


# ---------------------------------------------------------------------------------------------
# Report
# ---------------------------------------------------------------------------------------------


def _form(info: LoadInfo) -> str:
    kind = "HF" if info.kind == "hf" else f"GGUF {info.dialect}" if info.dialect else "GGUF"
    types = ", ".join(f"{t}×{n}" for t, n in sorted(info.tensor_types.items(), key=lambda kv: -kv[1]))
    return f"{kind}: {types}"


def _ci_text(c: Comparison) -> str:
    if c.ci is None:
        return "no CI (< 2 prompts)"
    return f"{CONFIDENCE:.0%} CI [{c.ci[0]:+.2f}, {c.ci[1]:+.2f}]"


def _build_report(r: AcceptResult, max_drop: float | None, min_tau: float | None = None,
                  max_gap: float | None = None) -> Report:
    comps = r.comparisons()
    failures = r.failures(max_drop, min_tau, max_gap)
    verdicts = r.verdicts()
    llama_comps, llama_verdicts = r.llama_cpp_comparisons(), r.llama_cpp_verdicts()
    first = r.drafters[0]
    parts = [f"{first.name} τ {first.tau:.2f}"]
    for d, c in zip(r.drafters[1:], comps[1:]):
        assert c is not None
        parts.append(f"{d.name} τ {d.tau:.2f} ({c.delta:+.2f}, {c.relative:+.1%}; {_ci_text(c)})")
    if r.llama_cpp is not None:
        parts.append("llama.cpp: " + ", ".join(
            f"{d.name} {'refused' if l.refused else f'τ {l.tau:.2f}'} ({v})"
            for d, l, v in zip(r.drafters, r.llama_cpp, llama_verdicts)))
    headline = "; ".join(parts)
    named = [f"{d.name}: {v}" for d, v in zip(r.drafters, verdicts)
             if v in (VERDICT_BELOW, VERDICT_ZERO, VERDICT_NONFINITE)]
    named += [f"{d.name} in llama.cpp: {v}" for d, v in zip(r.drafters, llama_verdicts)
              if v in (VERDICT_BELOW, VERDICT_ZERO, VERDICT_REFUSED)]
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


def write_png(result: AcceptResult, path: str | os.PathLike, *, force: bool = False) -> Path:
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
