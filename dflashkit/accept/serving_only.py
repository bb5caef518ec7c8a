"""The llama-server half of ``dflash-accept`` on its own: drafter GGUFs through llama-server against the target
alone, with no reference runs — ``dflash-release``'s serving step, which measures its finished files one
combination at a time after every file job (`dflashkit.release.serving_record`).

The prompts are rendered, encoded and checked exactly as `run_acceptance` does it (`encode_prompts`), so the
figures are the ones ``dflash-accept --llama-server`` gives for the same files, prompts and seed.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any, Callable, Mapping, Sequence

from ..runtime import HFTarget
from .prompts import Prompt, load_prompts, template_kwargs_for
from .run import _block_size, _vocab_rows, encode_prompts
from .serving_measure import ServingResult, measure_serving
from .serving_plan import ServingPlan, plan_serving


@dataclass(frozen=True)
class PreparedPrompts:
    """A prompt set rendered, encoded and checked once for one target (`encode_prompts`): what every serving
    measurement of it sends, however many files and builds are measured."""

    prompts: list[Prompt]
    ids: list[list[int]]
    texts: list[str]
    vocab: int | None  # the target's vocabulary rows: no reply token id may pass it


def prepare_prompts(runner: HFTarget, prompts: str | os.PathLike | Sequence[Prompt] | None, *,
                    max_prompts: int | None = None, max_new_tokens: int = 128, reasoning: str | None = None,
                    chat_template_kwargs: Mapping[str, Any] | None = None) -> PreparedPrompts:
    """The prompts (a JSONL file, prompts, or None for the built-in set; the first ``max_prompts``) as the
    target's tokenizer renders them, exactly as `run_acceptance` does."""
    if isinstance(prompts, (str, os.PathLike)) or prompts is None:
        prompt_list = load_prompts(prompts, limit=max_prompts)
    else:
        prompt_list = list(prompts)
    prompt_list = prompt_list[:max_prompts] if max_prompts else prompt_list
    template_kwargs = template_kwargs_for(runner.tokenizer, reasoning, chat_template_kwargs)
    prompt_ids, texts, _ = encode_prompts(runner, prompt_list, max_new_tokens, template_kwargs)
    return PreparedPrompts(prompt_list, prompt_ids, texts, _vocab_rows(runner))


def serve_files(
    target: str | os.PathLike | HFTarget,
    drafters: Sequence[str | os.PathLike],
    prompts: str | os.PathLike | Sequence[Prompt] | PreparedPrompts | None = None,
    plan: ServingPlan | None = None,
    *,
    max_prompts: int | None = None,
    reasoning: str | None = None,
    chat_template_kwargs: Mapping[str, Any] | None = None,
    progress: Callable[[str], None] | None = None,
    **serving: Any,
) -> ServingResult:
    """Every drafter GGUF × target GGUF × draft cache type × n-max through llama-server (`measure_serving`), the
    target (an HF dir, or an `HFTarget` already loaded) giving the prompts' text and the vocabulary bound — unless
    ``prompts`` were prepared for it already (`prepare_prompts`; the other prompt settings are theirs).

    ``plan``: the serving options checked once by the caller (`plan_serving`: a release makes one per build when it
    reads its arguments); without one, ``serving`` holds `plan_serving`'s keywords (``llama_server``,
    ``target_ggufs``, ``draft_n_max`` …) and they are checked here."""
    say = progress or (lambda message: None)
    blocks = [_block_size(d) for d in drafters]
    if plan is None:
        plan = plan_serving([(str(d), b) for d, b in zip(drafters, blocks)], **serving)
    elif serving:
        raise TypeError(f"serve_files: pass the serving options in the plan, not as {', '.join(sorted(serving))}")
    if isinstance(prompts, PreparedPrompts):  # rendered once for the target by the caller (a release's builds)
        prepared = prompts
    else:
        runner = target if isinstance(target, HFTarget) else HFTarget(target)
        prepared = prepare_prompts(runner, prompts, max_prompts=max_prompts, max_new_tokens=plan.max_new_tokens,
                                   reasoning=reasoning, chat_template_kwargs=chat_template_kwargs)
    return measure_serving([(str(d), str(d), b) for d, b in zip(drafters, blocks)], prepared.texts,
                           [p.id for p in prepared.prompts], plan, prompt_tokens=[len(ids) for ids in prepared.ids],
                           progress=say, vocab=prepared.vocab)
