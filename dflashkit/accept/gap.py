"""llama.cpp's τ against the reference runtime's on one accounting, and the causes of a gap dflashkit can check.

The reference runtime replays the schedule of the llama.cpp program that measured (`dflashkit.runtime.schedules`:
llama-server's, or llama-speculative-simple's), so a GGUF that computes what its reference computes shows the same
τ prompt by prompt. Where the two still differ, `gap_causes` names what it can check: the per-layer causality of the
drafter as given against the file llama.cpp ran (`dflashkit.causality`), a quantized file, another tokenization.
"""

from __future__ import annotations

import os
from typing import TYPE_CHECKING, Mapping, Sequence

from ..causality import causality_differs
from ..divergences import divergence_causes, hf_config
from ..errors import DFlashError
from ..runtime import DFlashDraftModel, HFTarget, TargetHead
from ..runtime.load import _FLOAT_TYPES, runtime_spec
from ..runtime.schedules import Schedule, replay_llama_cpp
from ..runtime.speculative import PrefillCache, SpeculativeResult

if TYPE_CHECKING:  # the results are the callers' (`accept.result`, `accept.serving_measure`): no import back up
    from .result import DrafterRun
    from .serving_measure import ServingRun


def replay_schedule(model: DFlashDraftModel, target: HFTarget, head: TargetHead, prompt_ids: Sequence[list[int]],
                    schedule: Schedule, *, n_predict: int, n_ctx: Sequence[int | None], stops: Sequence[int],
                    banned: Sequence[int], prefills: PrefillCache | None,
                    n_max: int | None = None) -> list[SpeculativeResult]:
    """Every prompt on llama.cpp's ``schedule`` with the block it drafts (``--spec-draft-n-max`` = ``n_max``, the
    drafter's draft tokens when None); ``n_ctx[i]``: the context llama.cpp got for prompt i (None: never binding)."""
    n_max = model.draft_tokens if n_max is None else n_max
    return [replay_llama_cpp(model, target, ids, schedule=schedule, n_predict=n_predict, n_max=n_max,
                             n_ctx=ctx, stop_token_ids=stops, banned_ids=banned, head=head, prefills=prefills)
            for ids, ctx in zip(prompt_ids, n_ctx)]


def gap_causes(given: str | os.PathLike, ran: str | os.PathLike, tensor_types: Mapping[str, int],
               prompt_tokens: Sequence[int], llama_prompt_tokens: Sequence[int | None]) -> list[str]:
    """What differs between the drafter as given (``given``, run by the reference runtime with ``tensor_types``) and
    the GGUF llama.cpp ran (``ran``), and between the two tokenizations: one phrase per cause found."""
    causes = []
    try:
        given_spec, ran_spec = runtime_spec(given), runtime_spec(ran)
        causes += causality_differs(given_spec, ran_spec) + divergence_causes(given_spec, ran_spec, hf_config(given))
    except DFlashError as exc:  # a cause unknown is said, never a crash of the report
        causes.append(f"per-layer causality not compared ({str(exc).splitlines()[0][:120]})")
    quantized = sorted(t for t in tensor_types if t.upper() not in _FLOAT_TYPES)
    if quantized:
        causes.append(f"a quantized file ({', '.join(quantized)}): the runtime rounds the activations as ggml does, "
                      "but llama.cpp sums in its kernels' order (its flash attention's online softmax too), so a near-tie "
                      "between the drafter's two best tokens can fall the other way")
    other = [i for i, (a, b) in enumerate(zip(prompt_tokens, llama_prompt_tokens)) if b is not None and a != b]
    if other:
        causes.append(f"another tokenization: llama.cpp read {len(other)} prompt(s) as another number of tokens "
                      f"(prompt indices {other[:10]})")
    return causes


def serving_gap_causes(d: "DrafterRun", r: "ServingRun", prompt_tokens: Sequence[int],
                       target_ggufs: Sequence[str | os.PathLike]) -> list[str]:
    """`gap_causes` of one llama-server combination, and what the combination itself changes: a quantized draft KV
    cache, a target GGUF other than the first (a quantized target verifies other tokens)."""
    ran = r.drafter_gguf if os.path.isfile(r.drafter_gguf) else d.path  # a server the user runs: its file unknown
    causes = gap_causes(d.path, ran, d.info.tensor_types, prompt_tokens, [c.prompt_n for c in r.on])
    if r.draft_cache_type not in (None, "f32", "f16", "bf16"):
        causes.append(f"a quantized draft KV cache ({r.draft_cache_type}): the reference keeps it in float")
    if target_ggufs and r.target_gguf != str(target_ggufs[0]):
        causes.append(f"another target GGUF ({os.path.basename(r.target_gguf)}): the reference runs the HF target")
    return causes
