"""Speculative decoding with a DFlash drafter and an HF target: the draft–verify loop.

Specification: ``dflash_generate`` in z-lab's ``dflash/model.py``. One *round*:

1. the drafter reads the tap hidden states of the tokens committed since its last round (its KV
   cache holds the older ones) and drafts a block ``[anchor, d1, ..., d(B-1)]``;
2. the target runs the whole block in one forward (its KV cache holds everything before the anchor);
3. greedy (temperature 0): the longest prefix of the draft equal to the target's argmax is accepted,
   plus the target's own token after it (the *bonus*) — `accept_prefix`; sampled (temperature > 0):
   the standard rejection-sampling rule (`rejection_sample`), which keeps the target's distribution;
4. both caches are cropped back to the committed tokens and the verify pass's tap hidden states of
   the committed tokens become the drafter's next context.

At temperature 0 the output is *exactly* the target's own greedy output, whatever the drafter
proposes: a bad drafter only costs rounds. The per-round ``accepted`` counts are what
``dflash-accept`` reports: the acceptance length τ = mean(accepted + 1), tokens per target forward.
"""

from __future__ import annotations

import copy
import math
import operator
import time
from dataclasses import dataclass, field
from typing import Any, NamedTuple, Sequence

import torch

from ..errors import DFlashError, UsageError
from ..target_rules import Target, check_runtime_fit
from .dflash import DFlashDraftModel, TargetHead, sample_probs, sampling_probs
from .target import HFTarget, cache_argument, extract_context_feature

# ---------------------------------------------------------------------------------------------
# Acceptance rules
# ---------------------------------------------------------------------------------------------


class Acceptance(NamedTuple):
    """What one verify pass commits: ``accepted`` draft tokens, then the target's bonus token."""

    accepted: int
    tokens: list[int]  # draft[:accepted] + [bonus]

    @property
    def bonus(self) -> int:
        return self.tokens[-1]


def _token_ids(values: Sequence[int], name: str) -> list[int]:
    if isinstance(values, (str, bytes)) or not hasattr(values, "__len__"):
        raise TypeError(f"{name} must be a sequence of token ids, got {type(values).__name__}")
    out = []
    for i, v in enumerate(values):
        if isinstance(v, bool):  # bool is an int subclass, but never a token id
            raise TypeError(f"{name}[{i}] is a bool, not a token id")
        try:
            out.append(operator.index(v))  # ints, numpy / 0-d torch integers; rejects floats
        except TypeError:
            raise TypeError(f"{name}[{i}] = {v!r} is not an integer token id") from None
    return out


def accept_prefix(draft: Sequence[int], verify_argmax: Sequence[int]) -> Acceptance:
    """Greedy acceptance: the longest prefix of ``draft`` equal to the target's argmax, plus the bonus.

    ``verify_argmax[i]`` is the target's argmax after the anchor and ``draft[:i]``, so it has one more
    entry than ``draft``: at the first mismatch ``i`` the bonus is ``verify_argmax[i]`` (the target's
    correction); when the whole draft matches it is the last entry.
    """
    d, v = _token_ids(draft, "draft"), _token_ids(verify_argmax, "verify_argmax")
    if len(v) != len(d) + 1:
        raise ValueError(f"verify_argmax has {len(v)} entries, expected len(draft) + 1 = {len(d) + 1}")
    n = 0
    while n < len(d) and d[n] == v[n]:
        n += 1
    return Acceptance(n, d[:n] + [v[n]])


def rejection_sample(
    draft_tokens: torch.Tensor,
    target_probs: torch.Tensor,
    draft_probs: torch.Tensor,
    draft_indices: torch.Tensor | None = None,
) -> tuple[int, int]:
    """Speculative sampling (Leviathan et al. / Chen et al.), exactly as ``dflash_generate`` applies it.

    ``draft_tokens`` [n]; ``target_probs`` [n + 1, vocab]; ``draft_probs`` [n, vocab], or [n, k] over
    ``draft_indices`` [n, k] (DFlash 2 samples among its top-k candidates). Draft token i is kept with
    probability min(1, p/q); at the first rejection the bonus comes from the residual
    max(0, p − q) (renormalised), after a full acceptance from the target's last distribution.
    Returns (accepted, bonus). Uses torch's global RNG.
    """
    n = int(draft_tokens.shape[0])
    if target_probs.shape[0] != n + 1 or draft_probs.shape[0] != n:
        raise ValueError(f"rejection_sample: {n} draft tokens need {n + 1} target and {n} draft rows, got "
                         f"{target_probs.shape[0]} and {draft_probs.shape[0]}")
    p = target_probs[:n].gather(-1, draft_tokens[:, None])[:, 0]
    if draft_indices is None:
        q = draft_probs.gather(-1, draft_tokens[:, None])[:, 0]
    else:
        q = (draft_probs * (draft_indices == draft_tokens[:, None])).sum(-1)
    # u·q < p ⇔ u < p/q: accept with probability min(1, p/q); the run stops at the first rejection.
    accepted = int((torch.rand_like(q) * q < p).to(torch.int32).cumprod(0).sum())
    if accepted == n:
        return accepted, int(sample_probs(target_probs[n]))
    residual = target_probs[accepted].clone()
    if draft_indices is None:
        residual.sub_(draft_probs[accepted])
    else:
        residual.scatter_add_(0, draft_indices[accepted], -draft_probs[accepted])
    residual.clamp_min_(0)
    total = residual.sum()
    # p ≤ q everywhere cannot reject, but rounding can leave an all-zero residual: fall back to p.
    residual = residual / total if total > 0 else target_probs[accepted]
    return accepted, int(sample_probs(residual))


# ---------------------------------------------------------------------------------------------
# The loop
# ---------------------------------------------------------------------------------------------


@dataclass
class SpeculativeResult:
    """One prompt's run. ``accepted[r]``: draft tokens round r committed (the bonus not counted);
    ``drafted[r]``: draft positions it judged — all it proposed, except in a last round cut short by
    ``max_new_tokens`` or a stop token, which judged only what it kept. ``len(output_ids) == 1 +
    Σ (accepted + 1)``: the first token comes from the prefill, each round commits accepted + 1."""

    prompt_ids: list[int]
    output_ids: list[int]  # generated tokens only
    accepted: list[int]
    drafted: list[int]
    temperature: float
    prefill_s: float
    decode_s: float
    stopped: bool = False  # ended on a stop token (else on max_new_tokens)
    block_size: int = 0
    nonfinite_rounds: int = 0  # rounds whose draft logits (or hidden states) held a NaN or +inf (−inf masks tokens)

    @property
    def rounds(self) -> int:
        return len(self.accepted)

    @property
    def tau(self) -> float:
        """Mean acceptance length: committed tokens per target verify forward (nan without rounds)."""
        return sum(a + 1 for a in self.accepted) / len(self.accepted) if self.accepted else math.nan

    @property
    def decode_tokens_per_s(self) -> float:
        n = len(self.output_ids) - 1  # the first token belongs to the prefill
        return n / self.decode_s if self.decode_s > 0 else math.nan

    def to_trace(self, drafter: str) -> dict[str, Any]:
        """One line of the acceptance trace (docs/formats.md)."""
        return {
            "drafter": drafter,
            "prompt_ids": list(self.prompt_ids),
            "output_ids": list(self.output_ids),
            "accepted": list(self.accepted),
            "temperature": float(self.temperature),
        }


def _new_target_cache(model: Any) -> Any:
    from transformers import DynamicCache

    cache = DynamicCache(config=model.config)
    if hasattr(cache, "activate_past_recording"):  # hybrid targets (linear attention) can then crop
        cache.activate_past_recording()
    return cache


def _crop_target(cache: Any, length: int) -> None:
    """Keep the first ``length`` positions. transformers ≥ 5 takes ``crop(-n)`` (remove n); a negative
    argument meant the same in 4.x, but 4.x read ``crop(0)`` as "keep nothing", so 0 is skipped there."""
    remove = cache.get_seq_length() - length
    if remove > 0 or (remove == 0 and hasattr(cache, "activate_past_recording")):
        cache.crop(-remove)


def _sync(device: torch.device) -> float:
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    return time.perf_counter()


def drafter_dtype(model: DFlashDraftModel) -> torch.dtype:
    """The float dtype the drafter computes in (its norms are always dense)."""
    return model.norm.weight.dtype


def default_stop_ids(target: HFTarget) -> list[int]:
    """The target's end-of-sequence ids, as z-lab's benchmark takes them (generation config, then tokenizer); an id
    that is no token of the target (a string, a float, a bool, a negative or past-the-vocabulary number) is a
    one-line error naming the files and the key, never a stop token that can never match."""
    ids = getattr(target.model.generation_config, "eos_token_id", None) or target.tokenizer.eos_token_id
    if ids is None:
        return []
    vocab = int(target.model.config.get_text_config().vocab_size)
    values = ids if isinstance(ids, (list, tuple)) else [ids]
    bad = [i for i in values if isinstance(i, bool) or not isinstance(i, int) or not 0 <= i < vocab]
    if bad or len(values) > 4096:
        shown = repr(bad[0])[:60] if bad else f"{len(values)} ids"
        raise DFlashError(f"target {target.path}: eos_token_id {shown} (generation_config.json / config.json) is "
                          f"not a token id of its vocabulary of {vocab} — fix the key")
    return [int(i) for i in values]


def check_pair(model: DFlashDraftModel, target: HFTarget, head: TargetHead, where: str = "drafter") -> None:
    """The drafter can run on this target (the drafter ↔ target rule table, `target_rules.check_runtime_fit`),
    and has a mask token and a block."""
    spec = model.spec
    check_runtime_fit(spec, Target(str(target.path), head.hidden_size, target.n_layers, head.vocab_size), where,
                      UsageError)
    if model.reads_context_ids:  # a chain drafter: no mask token (its block is its draft length)
        return
    if spec.mask_token_id is None or not 0 <= spec.mask_token_id < head.vocab_size:
        raise UsageError(f"{where}: mask_token_id {spec.mask_token_id} is not a token of target {target.path} "
                         f"(vocab {head.vocab_size}) — set it in the drafter's config (dflash_config.mask_token_id)")
    if spec.block_size < 2:  # a property of the file, not of the command line: exit 1
        raise DFlashError(f"{where}: block_size {spec.block_size} drafts nothing (needs at least 2)")


@dataclass
class _Prefilled:
    cache: Any  # the target's cache after the prompt (copied for each run: a run extends and crops it)
    logits: torch.Tensor  # the last position's logits: the first new token
    features: torch.Tensor  # the drafter's first context (its taps of every prompt position)
    seconds: float


@dataclass
class PrefillCache:
    """The target's prefill of each prompt, kept for the next drafter on the same prompts (``--context``: one
    prefill per prompt and level, whatever the number of drafters). Keyed by the prompt's ids and the taps; a
    prefill past ``max_bytes`` together is not kept (nor copied) (it is computed again where asked). ``prefills`` counts the
    target's prefill passes, ``reused`` the runs that started from a kept one."""

    max_bytes: int = 2 << 30
    prefills: int = 0
    reused: int = 0
    _kept: dict[tuple[tuple[int, ...], tuple[int, ...], str], _Prefilled] = field(default_factory=dict)
    _bytes: int = 0

    def get(self, prompt: list[int], layers: list[int], dtype: torch.dtype) -> _Prefilled | None:
        hit = self._kept.get((tuple(prompt), tuple(layers), str(dtype)))
        if hit is not None:
            self.reused += 1
        return hit

    def fits(self, cache: Any, features: torch.Tensor, logits: torch.Tensor) -> int | None:
        """The bytes a prefill would take when they fit what is left, else None (checked before it is copied)."""
        size = features.nbytes + logits.nbytes + _cache_bytes(cache)
        return size if self._bytes + size <= self.max_bytes else None

    def put(self, prompt: list[int], layers: list[int], dtype: torch.dtype, entry: _Prefilled, size: int) -> None:
        self._kept[(tuple(prompt), tuple(layers), str(dtype))] = entry
        self._bytes += size

    def clear(self) -> None:
        self._kept.clear()
        self._bytes = 0


def _cache_bytes(cache: Any) -> int:
    """The tensors a target cache holds (its layers' keys and values; unknown layouts count as too large)."""
    total = 0
    for layer in getattr(cache, "layers", None) or []:
        for name in ("keys", "values"):
            t = getattr(layer, name, None)
            total += t.nbytes if isinstance(t, torch.Tensor) else 0
    return total if total else 1 << 62


@torch.inference_mode()
def speculative_generate(
    model: DFlashDraftModel,
    target: HFTarget,
    prompt_ids: Sequence[int],
    *,
    max_new_tokens: int,
    temperature: float = 0.0,
    head: TargetHead | None = None,
    stop_token_ids: Sequence[int] | None = None,
    block_size: int | None = None,
    seed: int | None = None,
    prefills: PrefillCache | None = None,
) -> SpeculativeResult:
    """Generate up to ``max_new_tokens`` tokens after ``prompt_ids`` by draft–verify rounds.

    ``head``: the target's embeddings and lm_head in the drafter's dtype (built from ``target`` when
    omitted — pass it to avoid a copy per call when the dtypes differ). ``stop_token_ids``: None = the
    target's EOS ids; ``()`` = never stop early. ``seed``: seeds torch's RNG for this run (sampling,
    and DFlash 2's sampled selector) without disturbing the caller's RNG state. ``prefills``: the target's
    prefill of this prompt is taken from there when kept, and kept there when made (same tokens, same output).
    """
    if temperature < 0 or not math.isfinite(temperature):
        raise UsageError(f"temperature must be a finite number ≥ 0, got {temperature}")
    if max_new_tokens < 1:
        raise UsageError(f"max_new_tokens must be at least 1, got {max_new_tokens}")
    prompt = _token_ids(prompt_ids, "prompt_ids")
    if not prompt:
        raise UsageError("the prompt has no tokens")
    head = head if head is not None else target.head(dtype=drafter_dtype(model))
    check_pair(model, target, head)
    stops = set(default_stop_ids(target) if stop_token_ids is None else _token_ids(stop_token_ids, "stop_token_ids"))
    devices = [target.device] if target.device.type == "cuda" else []
    with torch.random.fork_rng(devices=devices, enabled=seed is not None):
        if seed is not None:
            torch.manual_seed(seed)
        return _generate(model, target, head, prompt, max_new_tokens, float(temperature), stops,
                         block_size or model.block_size, prefills)


def _prefill(lm: Any, prompt: list[int], layers: list[int], device: torch.device, dtype: torch.dtype,
             prefills: PrefillCache | None) -> tuple[Any, torch.Tensor, torch.Tensor, float]:
    """(the target's cache after ``prompt``, the last logits, the drafter's first context, seconds)."""
    kept = prefills.get(prompt, layers, dtype) if prefills is not None else None
    if kept is not None:
        return copy.deepcopy(kept.cache), kept.logits, kept.features, kept.seconds
    cache = _new_target_cache(lm)
    t0 = _sync(device)
    out = lm(torch.tensor([prompt], device=device), **cache_argument(lm, cache), use_cache=True,
             logits_to_keep=1, output_hidden_states=True)
    logits = out.logits[0, -1:]
    features = extract_context_feature(out.hidden_states, layers).to(dtype)
    seconds = _sync(device) - t0
    if prefills is not None:
        prefills.prefills += 1
        size = prefills.fits(cache, features, logits)
        if size is not None:  # copied only when it is kept
            prefills.put(prompt, layers, dtype, _Prefilled(copy.deepcopy(cache), logits, features, seconds), size)
    return cache, logits, features, seconds


def _generate(model: DFlashDraftModel, target: HFTarget, head: TargetHead, prompt: list[int], max_new_tokens: int,
              temperature: float, stops: set[int], block: int, prefills: PrefillCache | None) -> SpeculativeResult:
    lm, device, layers = target.model, target.device, list(model.target_layer_ids)
    dtype = drafter_dtype(model)
    n_prompt = len(prompt)
    max_length = n_prompt + max_new_tokens
    tokens = list(prompt)
    draft_cache = model.new_cache()
    mask = int(model.mask_token_id or 0)  # check_pair made sure there is one, where the drafter reads it

    target_cache, first_logits, context, prefill_s = _prefill(lm, prompt, layers, device, dtype, prefills)
    tokens.append(_pick(first_logits, temperature)[0])
    t1 = _sync(device)

    accepted_counts: list[int] = []
    drafted_counts: list[int] = []
    nonfinite = 0
    # Slot 0 of the drafter's block is the anchor (z-lab: block - 1 draft tokens) or predicts too
    # (sample_from_anchor: block draft tokens); the target verifies [anchor, drafts...].
    first_slot = model.first_draft_slot
    n_draft = block - first_slot
    start = n_prompt  # index of the anchor: the last committed token, not yet in the target's cache
    stopped = tokens[start] in stops
    while start + 1 < max_length and not stopped:
        # As dflash_generate: the block may reach one past max_length; the surplus is cut below.
        verify = min(n_draft + 1, max_length - start)
        block_ids = torch.full((1, verify), mask, dtype=torch.long, device=device)
        block_ids[0, 0] = tokens[start]
        draft_probs = draft_indices = None
        if verify > 1:
            noise_len = verify - 1 + first_slot
            noise_ids = block_ids if noise_len == verify else block_ids[:, :noise_len].clone()
            positions = torch.arange(start - context.shape[1], start + noise_len, device=device)[None]
            extra = context_ids_kwargs(model, tokens[start - context.shape[1] + 1 : start + 1], device)
            if temperature > 0 and model.proposes_with_selector:
                # DraftStep carries no selector probabilities: draft hidden states, then `propose`.
                step = model.draft(context, noise_ids, positions, draft_cache,
                                   noise_embedding=model.noise_embedding(noise_ids, head), **extra)
                draft, draft_indices, draft_probs = model.propose(step.hidden[:, 1:], noise_ids[:, 0], head,
                                                                  temperature)
            else:
                step = model.draft(context, noise_ids, positions, draft_cache, head, temperature=temperature, **extra)
                draft = step.tokens
                if temperature > 0:  # the distribution the runtime sampled from
                    draft_probs = sampling_probs(step.logits, temperature)  # type: ignore[arg-type]
            # argmax of a NaN row is a token like any other: a broken drafter would only look unlucky. −inf is
            # legitimate (tokens outside a draft vocabulary are masked with it); NaN and +inf never are.
            checked = step.logits if step.logits is not None else step.hidden
            nonfinite += int(bool(torch.isnan(checked).any() or torch.isposinf(checked).any()))
            block_ids[:, 1:] = draft
        out = lm(block_ids, position_ids=torch.arange(start, start + verify, device=device)[None],
                 **cache_argument(lm, target_cache), use_cache=True, output_hidden_states=True)
        if temperature > 0:
            target_probs = sampling_probs(out.logits[0], temperature)
            if verify > 1:
                n_acc, bonus = rejection_sample(block_ids[0, 1:], target_probs, draft_probs[0],  # type: ignore[index]
                                                None if draft_indices is None else draft_indices[0])
            else:
                n_acc, bonus = 0, int(sample_probs(target_probs[-1]))
            committed = block_ids[0, 1 : 1 + n_acc].tolist() + [bonus]
        else:
            acc = accept_prefix(block_ids[0, 1:].tolist(), torch.argmax(out.logits[0], dim=-1).tolist())
            committed = acc.tokens
        verdict = len(committed)
        committed = committed[: max_length - start - 1]  # never past max_new_tokens
        for i, tok in enumerate(committed):  # stop at (and keep) the first stop token
            if tok in stops:
                committed, stopped = committed[: i + 1], True
                break
        tokens.extend(committed)
        produced = len(committed)
        accepted_counts.append(produced - 1)
        # A round cut short judged only what it kept: its dropped positions are not rejections.
        drafted_counts.append(verify - 1 if produced == verdict else produced - 1)
        # The committed tokens' tap features (anchor first) are the drafter's next context.
        context = extract_context_feature(out.hidden_states, layers)[:, :produced].to(dtype)
        start += produced
        _crop_target(target_cache, start)
    t2 = _sync(device)
    return SpeculativeResult(
        prompt_ids=prompt,
        output_ids=tokens[n_prompt:max_length],
        accepted=accepted_counts,
        drafted=drafted_counts,
        temperature=temperature,
        prefill_s=prefill_s,
        decode_s=t2 - t1,
        stopped=stopped,
        block_size=block,
        nonfinite_rounds=nonfinite,
    )


def context_ids_kwargs(model: Any, following: list[int], device: torch.device) -> dict[str, torch.Tensor]:
    """``context_ids`` for a drafter that reads, beside each context position's features, the token that follows it
    (EAGLE-3's pairs (token p + 1, features p); the last one is the anchor) — nothing for the others."""
    if not model.reads_context_ids:
        return {}
    return {"context_ids": torch.tensor([following], dtype=torch.long, device=device)}


def _pick(logits: torch.Tensor, temperature: float) -> list[int]:
    """Greedy or sampled token per row of ``logits`` [n, vocab]."""
    if temperature <= 0:
        return torch.argmax(logits, dim=-1).tolist()
    return sample_probs(sampling_probs(logits, temperature)).tolist()
