"""``dflash-parity --context``: parity once per context length, anchors past N tokens.

A file whose sliding-window or rope metadata is wrong drafts exactly like the right one while the context is shorter
than the window (and, for rope, while positions stay small): only parity *past* the window and past the drafter's
trained length shows it. Per level the drafters draft after N tokens of context:

* an HF target: the prompt with N tokens of long context before it — ``--context-file``'s text (its opening N
  tokens; `dflashkit.accept.context.read_context_file`), else the prompt's own tokens repeated (parity compares two
  files on the same input: any tokens reach the positions and the window);
* a GGUF target or none: N seeded random context positions (the random mode's hidden states, N long).

The result is the shortest level's `ParityResult` with every level in ``by_context``; its gates apply to every level,
and the report says from which level the candidate stops agreeing (`dflashkit.parity.result.breaks`).
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any, Sequence

from ..accept.context import read_context_file, target_context
from ..errors import UsageError
from ..runtime import HFTarget
from ..runtime.target import DEFAULT_PROMPT
from ..sweeps import level_label
from .result import ParityResult
from .run import CONTEXT_LEN, run_parity

#: the random context's hidden states (no HF target) are held whole: at most this many bytes
MAX_RANDOM_CONTEXT_BYTES = 2 << 30


def run_parity_by_context(reference: str | os.PathLike, candidate: str | os.PathLike, *, levels: Sequence[int],
                          context_file: str | os.PathLike | None = None, target: str | os.PathLike | None = None,
                          prompt: str | None = None, prompt_ids: Sequence[int] | None = None, device: str = "cpu",
                          weights: bool = True, **kwargs: Any) -> ParityResult:
    """`run_parity` at every level of ``levels`` (token counts, `dflashkit.accept.sweep.check_context_levels`)."""
    from ..accept.sweep import check_context_levels

    levels = check_context_levels(levels)
    hf = target is not None and Path(target).is_dir()
    if context_file is not None and not hf:
        raise UsageError("--context-file is text for an HF --target's tokenizer; with a GGUF target or none the "
                         "context is random hidden states (drop --context-file)")
    text = read_context_file(context_file) if context_file is not None else None
    runner = HFTarget(target, device=device) if hf else None  # type: ignore[arg-type]
    base: list[int] = []
    if runner is not None:
        base = list(prompt_ids) if prompt_ids is not None else runner.encode(prompt or DEFAULT_PROMPT)
        if not base:
            raise UsageError("the prompt is empty — give --prompt text or --prompt-ids")
        limit = target_context(runner)
        from ..runtime.load import runtime_spec

        rounds_tokens = int(kwargs.get("rounds", 1)) * runtime_spec(reference).block_size + 1
        if limit is not None and max(levels) + len(base) + rounds_tokens > limit:
            raise UsageError(f"--context {level_label(max(levels))}: {max(levels):,} + {len(base)} prompt tokens + "
                             f"{rounds_tokens} of the rounds exceed the target's context of {limit:,} "
                             "(max_position_embeddings)")
    elif max(levels) > 0:  # random context: the hidden states of every position are held at once
        from ..runtime.load import runtime_spec

        width = runtime_spec(reference).fc_input_width
        if max(levels) * width * 4 > MAX_RANDOM_CONTEXT_BYTES:
            raise UsageError(f"--context {level_label(max(levels))}: {max(levels):,} random context positions of "
                             f"{width:,} features are {max(levels) * width * 4 / 2**30:.1f} GiB — without an HF "
                             f"--target the context is held whole; give levels up to "
                             f"{MAX_RANDOM_CONTEXT_BYTES // (width * 4):,} (or --target HF_DIR)")
    source_ids = list(runner.tokenizer.encode(text, add_special_tokens=False)) if runner is not None and text else None
    if source_ids is not None and len(source_ids) < max(levels):
        raise UsageError(f"--context {level_label(max(levels))}: {Path(str(context_file)).name} holds "
                         f"{len(source_ids):,} tokens of the target's tokenizer — give a longer file")
    results = []
    for n, level in enumerate(levels):
        if runner is not None:
            context = (source_ids or (base * (level // len(base) + 1)))[:level]
            r = run_parity(reference, candidate, target=runner, prompt_ids=context + base, device=device,
                           weights=weights and n == 0, **kwargs)
        else:
            r = run_parity(reference, candidate, target=target, device=device, weights=weights and n == 0,
                           context_len=max(1, level) if level else CONTEXT_LEN, **kwargs)
        r.context_tokens = level
        results.append(r)
    first = results[0]
    first.by_context = results
    first.context_source = (f"context file {Path(str(context_file)).name}" if context_file is not None else
                            "the prompt's own tokens repeated" if runner is not None else
                            "seeded random hidden states (no HF target)")
    return first
