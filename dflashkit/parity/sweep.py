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

from ..accept.context import encode_window, read_context_file, target_context
from ..errors import UsageError
from ..reporting.values import human_size
from ..runtime import HFTarget
from ..runtime.target import DEFAULT_PROMPT
from ..sweeps import level_label
from .result import ParityResult
from .run import CONTEXT_LEN, run_parity

#: what one level may hold of the run's state per context position, all positions at once (the context's tapped
#: hidden states, and each drafter's fc projection and K/V of every layer): beside the models, within 1 GiB. An
#: HF target's own forward over the level is bounded by its context (max_position_embeddings) and its size.
MAX_CONTEXT_STATE_BYTES = 1 << 30


def context_state_bytes(spec: Any, positions: int) -> int:
    """float32 bytes the two drafters' run holds for ``positions`` context positions (measured: 8.1 KB a position
    for the trained pair's drafter, this gives 8.0 KB)."""
    per_side = spec.hidden_size + 2 * spec.n_layers * spec.n_kv_heads * spec.head_dim
    return 4 * positions * (spec.fc_input_width + 2 * per_side)


def _gguf_context(path: Path) -> int | None:
    """A GGUF target's ``{arch}.context_length``, where it has one (read from its header, not its tensors)."""
    from ..io.gguf_reader import open_gguf

    with open_gguf(path) as g:
        arch = g.get("general.architecture")
        value = g.get(f"{arch}.context_length") if isinstance(arch, str) else None
    return value if isinstance(value, int) and not isinstance(value, bool) and value > 0 else None


def check_parity_levels(levels: Sequence[int], spec: Any, prompt_tokens: int, rounds: int, context: int | None,
                        whose: str, key: str) -> None:
    """Every level, its prompt and its rounds inside ``context`` (``whose``: the target's or the drafter's own, read
    from ``key``), and its state within `MAX_CONTEXT_STATE_BYTES` — before anything of the level is built."""
    top, tail = max(levels), prompt_tokens + rounds * spec.block_size + 1
    if context is not None and top + tail > context:
        prompt = f"{prompt_tokens} prompt tokens + " if prompt_tokens else ""
        raise UsageError(f"--context {level_label(top)}: {top:,} + {prompt}"
                         f"{rounds * spec.block_size + 1} of the rounds exceed {whose} context of {context:,} ({key}) "
                         f"— give levels up to {max(0, context - tail):,}")
    need = context_state_bytes(spec, top + tail)
    if need > MAX_CONTEXT_STATE_BYTES:
        per = context_state_bytes(spec, 1)
        raise UsageError(f"--context {level_label(top)}: {top + tail:,} context positions hold about "
                         f"{human_size(need)} of the run's state ({per:,} bytes a position: the context's "
                         f"{spec.fc_input_width:,} features, each drafter's fc output and K/V of {spec.n_layers} "
                         f"layers), over the {human_size(MAX_CONTEXT_STATE_BYTES)} bound — give levels up to "
                         f"{max(0, MAX_CONTEXT_STATE_BYTES // per - tail):,}")


def run_parity_by_context(reference: str | os.PathLike, candidate: str | os.PathLike, *, levels: Sequence[int],
                          context_file: str | os.PathLike | None = None, target: str | os.PathLike | None = None,
                          prompt: str | None = None, prompt_ids: Sequence[int] | None = None, device: str = "cpu",
                          weights: bool = True, **kwargs: Any) -> ParityResult:
    """`run_parity` at every level of ``levels`` (token counts, `dflashkit.accept.sweep.check_context_levels`)."""
    from ..accept.sweep import check_context_levels
    from ..runtime.load import runtime_spec

    levels = check_context_levels(levels)
    hf = target is not None and Path(target).is_dir()
    if context_file is not None and not hf:
        raise UsageError("--context-file is text for an HF --target's tokenizer; with a GGUF target or none the "
                         "context is random hidden states (drop --context-file)")
    # the state is bounded by the drafter that holds more of it a position (the two may differ in layers and K/V)
    pair = (runtime_spec(reference), runtime_spec(candidate))
    spec = max(pair, key=lambda s: context_state_bytes(s, 1))
    own = min((s.context_length for s in pair if s.context_length), default=None)  # the shorter drafter's
    rounds = int(kwargs.get("rounds", 1))
    if not hf:  # every level is checked before any model loads: against a GGUF target's context, else the drafter's
        limit = _gguf_context(Path(target)) if target is not None else None
        if limit is not None:
            check_parity_levels(levels, spec, 0, rounds, limit, "the target's", f"{Path(target).name}: context_length")
        else:  # no target, or a GGUF target without a usable context_length
            where = "no --target" if target is None else f"{Path(target).name} has no usable context_length"
            check_parity_levels(levels, spec, 0, rounds, own, "the drafter's own",
                                f"its max_position_embeddings / context_length; {where}")
    text = read_context_file(context_file) if context_file is not None else None
    runner = HFTarget(target, device=device) if hf else None  # type: ignore[arg-type]
    base: list[int] = []
    if runner is not None:
        base = list(prompt_ids) if prompt_ids is not None else runner.encode(prompt or DEFAULT_PROMPT)
        if not base:
            raise UsageError("the prompt is empty — give --prompt text or --prompt-ids")
        check_parity_levels(levels, spec, len(base), rounds, target_context(runner), "the target's",
                            "max_position_embeddings")
    # only the opening the longest level reads is encoded (`encode_window`), never a long file whole
    source_ids = (encode_window(runner.tokenizer, text, max(levels), min_chars=0).tolist()
                  if runner is not None and text else None)
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
