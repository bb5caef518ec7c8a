"""Drafter ↔ target checks (``dflash-inspect DRAFTER --target TARGET``).

Hidden size, tap range (llama.cpp aborts with "layer input tensor is null" on a tap past the last
layer), mask id inside the target vocabulary, identical tokenizer, and instruct/base agreement.
The target is read through `dflashkit.converters.target.load_target` (header / config only).
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

from dflashkit.converters.target import TargetInfo, load_target
from dflashkit.converters.tokenizer import tokenizer_from_gguf
from dflashkit.errors import DFlashError
from dflashkit.inspect.checks import InspectContext, register_check
from dflashkit.inspect.drafter import drafter_of
from dflashkit.inspect.findings import Finding, error, info
from dflashkit.inspect.provenance import Verdict, verdict_for_path


def _target(ctx: InspectContext) -> TargetInfo | DFlashError:
    if "target" not in ctx.cache:
        try:
            ctx.cache["target"] = load_target(ctx.target)  # type: ignore[arg-type]
        except DFlashError as exc:
            ctx.cache["target"] = exc
    return ctx.cache["target"]


def _target_verdict(target: TargetInfo) -> Verdict:
    path = Path(target.path)
    if target.kind == "gguf":
        return verdict_for_path(path, target.metadata)
    return verdict_for_path(path if path.is_dir() else path.parent)


@register_check("target.fit", order=400)
def check_target_fit(ctx: InspectContext) -> Iterator[Finding]:
    if ctx.target is None:
        return
    drafter = drafter_of(ctx)
    if drafter is None or drafter.spec is None:
        return
    target = _target(ctx)
    if isinstance(target, DFlashError):
        yield error("target.unreadable", f"--target: {target}")
        return
    spec = drafter.spec
    ctx.summary["target"] = target.path
    if spec.hidden_size != target.hidden_size:
        yield error(
            "target.hidden_size",
            f"{ctx.path}: drafter hidden size {spec.hidden_size} ≠ target embedding length {target.hidden_size} "
            f"({target.path}) — this drafter belongs to another target",
            drafter=spec.hidden_size, target=target.hidden_size,
        )
    # Every runtime reads the hidden state entering layer id + 1; that layer must exist.
    bad = [i for i in spec.target_layer_ids if i + 1 >= target.n_layers]
    if bad:
        stored = drafter.dialect.taps_to_file(bad) if drafter.dialect else bad
        yield error(
            "target.tap_range",
            f"{ctx.path}: target layer id(s) {bad} (stored as {stored}, {drafter.tap_convention}) tap past the last "
            f"layer of the {target.n_layers}-layer target — llama.cpp aborts ('layer input tensor is null' / GGML_ASSERT); "
            "wrong target, or ids converted with the wrong tap convention",
            ids=bad, target_layers=target.n_layers,
        )
    if spec.num_target_layers is not None and spec.num_target_layers != target.n_layers:
        yield error(
            "target.layer_count",
            f"{ctx.path}: drafter was trained for a {spec.num_target_layers}-layer target, {target.path} has {target.n_layers}",
            drafter=spec.num_target_layers, target=target.n_layers,
        )
    if spec.mask_token_id is not None and spec.mask_token_id >= target.vocab_size:
        yield error(
            "target.mask_token",
            f"{ctx.path}: mask token id {spec.mask_token_id} is outside the target vocabulary ({target.vocab_size} tokens)",
            mask_token_id=spec.mask_token_id, vocab=target.vocab_size,
        )
    yield from _tokenizer_match(ctx, target)
    yield from _instruct_match(ctx, target)


def _tokenizer_match(ctx: InspectContext, target: TargetInfo) -> Iterator[Finding]:
    if ctx.gguf is None or target.tokenizer is None:
        return
    try:
        mine = tokenizer_from_gguf(ctx.gguf)
    except DFlashError as exc:
        yield error("target.tokenizer", f"{ctx.path}: unreadable tokenizer metadata ({exc})")
        return
    if mine is None:
        return  # drafter.tokenizer_missing already says so
    if mine.tokens_hash() != target.tokenizer.tokens_hash():
        yield error(
            "target.tokenizer",
            f"{ctx.path}: tokenizer token list differs from the target's ({len(mine.tokens)} vs "
            f"{len(target.tokenizer.tokens)} tokens) — re-convert with --target {target.path}",
            drafter_tokens=len(mine.tokens), target_tokens=len(target.tokenizer.tokens),
        )
    elif mine.merges_hash() != target.tokenizer.merges_hash():
        yield error(
            "target.tokenizer",
            f"{ctx.path}: tokenizer merges differ from the target's — re-convert with --target {target.path}",
        )
    else:
        yield info("target.tokenizer", f"{ctx.path}: tokenizer identical to the target's (tokens and merges)")


def _instruct_match(ctx: InspectContext, target: TargetInfo) -> Iterator[Finding]:
    mine: Verdict | None = ctx.cache.get("verdict")
    theirs = _target_verdict(target)
    ctx.summary["target_instruct_verdict"] = theirs.verdict
    if mine is None or "unknown" in (mine.verdict, theirs.verdict):
        if theirs.verdict == "unknown":
            yield info("target.instruct", f"{target.path}: instruct/base cannot be told ({theirs.describe()})")
        return
    if mine.verdict != theirs.verdict:
        yield error(
            "target.instruct",
            f"{ctx.path}: drafter looks {mine.verdict} but target {target.path} looks {theirs.verdict} "
            f"(drafter: {mine.describe()}; target: {theirs.describe()}) — acceptance collapses with the wrong variant",
            drafter=mine.to_dict(), target=theirs.to_dict(),
        )
