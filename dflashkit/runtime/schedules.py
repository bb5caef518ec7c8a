"""llama.cpp's own schedules of draft–verify rounds, replayed in the reference runtime (greedy).

The reference loop (`dflashkit.runtime.speculative`, z-lab's ``dflash_generate``) commits the first token from the
prefill, always drafts ``block_size`` positions and shrinks the last block to what ``max_new_tokens`` leaves. llama.cpp
schedules its rounds otherwise, so the same drafter counts another τ there even when every draft is the same. To
compare the two runtimes prompt by prompt, `replay_llama_cpp` runs the drafter and the target of this runtime on
llama.cpp's schedule; its per-prompt τ is the quantity llama.cpp reports. Line numbers: ``examples/speculative-simple/
speculative-simple.cpp``, ``common/speculative.cpp`` and ``tools/server/server-context.cpp`` of the 0.3.36 build
(llama_cpp_python 0.3.36's vendor/llama.cpp); b11549 (xllamacpp 2026.10.11549) has the simple.cpp lines unchanged and
the speculative.cpp ones 59–88 lines further on.

``"simple"`` — ``llama-speculative-simple``, what ``dflash-accept --llama-cpp`` runs where the build has no server:

- the target decodes the prompt without its last token (``simple.cpp:126-139``); the last prompt token is the first
  round's anchor at position N−1 (``id_last = inp.back()``, ``n_past = inp.size() - 1``: ``142-148``). No token is
  committed without a round.
- each round: ``n_draft_max = max(min(n_ctx − n_past − 2, n_predict − n_predict_done − 1), 0)`` (``179-185``). The
  drafter decodes its whole block, ``[id_last, mask × n_max]`` (``speculative.cpp:1203-1210``; one slot less for an
  anchor-sampling DSpark), ``n_max`` being ``--spec-draft-n-max`` clamped to what the block drafts
  (``speculative.cpp:1016-1023``); the draft is truncated to ``n_draft_max`` only when that is > 0
  (``speculative.cpp:2832-2837``) — at the end of the budget a full draft is verified.
- the target verifies ``[id_last, draft…]`` (``221-233``); ``ids`` = the accepted prefix + the target's token
  (``257``); ``n_accept += ids.size() − 1``, ``n_predict += ids.size()`` (``294-297``).
- the loop ends when ``n_predict > -n`` — strictly, so it runs past ``-n`` to finish its block — or at an end token
  (``338``), whose round still counts whole.

``"server"`` — ``llama-server`` (``server-context.cpp``), what ``--llama-cpp`` runs where the build has one:

- the whole prompt is prefilled and the first token sampled from it without a round (``3834-3868``);
- each round drafts only when ``get_n_draft_max() = min(n_ctx − n_tokens − 2, n_remaining − 1)`` is > 0
  (``453-471``, ``2985``), the full block truncated to it; else the target decodes one token alone — a round without
  a draft. ``n_remaining = -n − generated`` (``428-430``): the run never goes past ``-n``.

Both read the drafter's greedy token at every drafted slot (a top-k sampler's first candidate,
``speculative.cpp:1032-1038``) and accept greedily (``common_sampler_sample_and_accept_n``), as `accept_prefix` does.
"""

from __future__ import annotations

from typing import Literal, Sequence

import torch

from ..errors import UsageError
from .dflash import DFlashDraftModel, TargetHead
from .speculative import (PrefillCache, SpeculativeResult, context_ids_kwargs, _crop_target, _prefill, _sync, _token_ids,
                          accept_prefix, check_pair, drafter_dtype)
from .target import HFTarget, cache_argument, extract_context_feature

Schedule = Literal["simple", "server"]
SCHEDULES: tuple[Schedule, ...] = ("simple", "server")


def _draft_budget(schedule: Schedule, n_ctx: int | None, n_past: int, n_predict: int, done: int) -> int:
    """``n_draft_max`` of the next round (module doc): the context bound, then the generation bound."""
    budget = n_predict - done - 1
    if n_ctx is not None:
        budget = min(budget, n_ctx - n_past - 2)
    return max(budget, 0) if schedule == "simple" else budget


@torch.inference_mode()
def replay_llama_cpp(
    model: DFlashDraftModel, target: HFTarget, prompt_ids: Sequence[int], *, schedule: Schedule, n_predict: int,
    n_max: int, n_ctx: int | None = None, stop_token_ids: Sequence[int] = (), banned_ids: Sequence[int] = (),
    head: TargetHead | None = None, prefills: PrefillCache | None = None,
) -> SpeculativeResult:
    """Greedy rounds of ``model`` and ``target`` on ``prompt_ids`` as llama.cpp's ``schedule`` runs them (module doc).

    ``n_predict``: llama.cpp's ``-n``; ``n_max``: its ``--spec-draft-n-max`` (clamped to the drafter's block as
    llama.cpp clamps it); ``n_ctx``: its context (None: unbounded). ``stop_token_ids``: the end tokens that stop it;
    ``banned_ids``: tokens the target may never pick (``--ignore-eos`` biases the end tokens to −inf). The result's
    ``accepted`` holds every round's count as llama.cpp counts it, so its ``tau`` is llama.cpp's
    ``n_predict / (n_predict − n_accept)`` (the server's: after the prefill's token); ``output_ids`` is every token
    the rounds committed (the first token of the prefill first, for ``"server"``)."""
    if schedule not in SCHEDULES:
        raise UsageError(f"schedule {schedule!r}: expected one of {', '.join(SCHEDULES)}")
    if n_predict < 1 or n_max < 1:
        raise UsageError(f"n_predict and n_max must be at least 1, got {n_predict} and {n_max}")
    prompt = _token_ids(prompt_ids, "prompt_ids")
    if len(prompt) < (2 if schedule == "simple" else 1):
        raise UsageError("llama-speculative-simple's schedule holds the last prompt token back: give a prompt of at "
                         "least 2 tokens")
    head = head if head is not None else target.head(dtype=drafter_dtype(model))
    check_pair(model, target, head)
    lm, device, layers, dtype = target.model, target.device, list(model.target_layer_ids), drafter_dtype(model)
    stops, banned = set(_token_ids(stop_token_ids, "stop_token_ids")), _token_ids(banned_ids, "banned_ids")
    first_slot = model.first_draft_slot
    if model.clamps_n_max:
        n_max = min(n_max, model.draft_tokens)
    mask = int(model.mask_token_id or 0)  # check_pair made sure there is one, where the drafter reads it

    def greedy(logits: torch.Tensor) -> list[int]:
        if banned:
            logits = logits.clone()
            logits[..., banned] = -torch.inf
        return torch.argmax(logits, dim=-1).tolist()

    held = prompt[:-1] if schedule == "simple" else prompt
    target_cache, logits, context, prefill_s = _prefill(lm, held, layers, device, dtype, prefills)
    output: list[int] = [] if schedule == "simple" else greedy(logits)[-1:]
    anchor = prompt[-1] if schedule == "simple" else output[0]
    n_past = len(held)  # positions in the target's cache; the anchor goes at n_past
    by_position = [*held, anchor]  # every token by its position, the anchor last
    draft_cache = model.new_cache()
    accepted: list[int] = []
    drafted: list[int] = []
    t1 = _sync(device)
    ended = stopped = bool(output) and output[0] in stops  # ended: on an end token
    while not stopped and (schedule == "simple" or len(output) < n_predict):
        budget = _draft_budget(schedule, n_ctx, n_past, n_predict, len(output))
        draft: list[int] = []
        if schedule == "simple" or budget > 0:
            noise = torch.full((1, n_max + first_slot), mask, dtype=torch.long, device=device)
            noise[0, 0] = anchor
            positions = torch.arange(n_past - context.shape[1], n_past + noise.shape[1], device=device)[None]
            following = context_ids_kwargs(model, by_position[n_past - context.shape[1] + 1 : n_past + 1], device)
            draft = model.draft(context, noise, positions, draft_cache, head, **following).tokens[0].tolist()
            draft = draft[:budget] if budget > 0 else draft
        block = torch.tensor([[anchor, *draft]], dtype=torch.long, device=device)
        out = lm(block, position_ids=torch.arange(n_past, n_past + block.shape[1], device=device)[None],
                 **cache_argument(lm, target_cache), use_cache=True, output_hidden_states=True)
        ids = accept_prefix(draft, greedy(out.logits[0])).tokens
        accepted.append(len(ids) - 1)
        drafted.append(len(draft))
        stop_at = next((i for i, t in enumerate(ids) if t in stops), None)
        ended = stop_at is not None
        stopped = ended or (schedule == "simple" and len(output) + len(ids) > n_predict)
        output += ids if stop_at is None else ids[: stop_at + 1]
        # the committed tokens' features (the anchor and the accepted drafts) are the drafter's next context
        context = extract_context_feature(out.hidden_states, layers)[:, : len(ids)].to(dtype)
        n_past += len(ids)
        anchor = ids[-1]
        by_position += ids
        _crop_target(target_cache, n_past)
    return SpeculativeResult(prompt_ids=prompt, output_ids=output, accepted=accepted, drafted=drafted,
                             temperature=0.0, prefill_s=prefill_s, decode_s=_sync(device) - t1, stopped=ended,
                             block_size=n_max + first_slot)
