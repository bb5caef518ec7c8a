"""Drafter ↔ target checks (``dflash-inspect DRAFTER --target TARGET``).

The drafter ↔ target rules shared with the converter (`dflashkit.target_rules`: hidden size, tap
range — llama.cpp aborts with "layer input tensor is null" on a tap past the last layer —, layer
count, mask id inside the target vocabulary), then identical tokenizer and instruct/base agreement.
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
from dflashkit.converters.plan import target_uses_mrope
from dflashkit.inspect.findings import Finding, error, info, warning
from dflashkit.inspect.provenance import Verdict, verdict_for_path
from dflashkit.spec import DrafterSpec
from dflashkit.target_rules import target_violations


def cached_target(ctx: InspectContext) -> TargetInfo | DFlashError:
    """--target opened once per file (its error kept, reported by target.fit)."""
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
    target = cached_target(ctx)
    if isinstance(target, DFlashError):
        yield error("target.unreadable", f"--target: {target}")
        return
    spec = drafter.spec
    ctx.summary["target"] = target.path
    # the rule list the converter refuses pairs by (dflashkit.target_rules)
    for rule_id, message, data in target_violations(str(ctx.path), spec, target, drafter.dialect, drafter.tap_convention):
        yield error(rule_id, message, **data)
    yield from _mrope_sections(ctx, spec, target)
    yield from _tokenizer_match(ctx, target)
    yield from _instruct_match(ctx, target)


def _mrope_sections(ctx: InspectContext, spec: DrafterSpec, target: TargetInfo) -> Iterator[Finding]:
    """An M-RoPE target's drafter needs ``rope.dimension_sections`` ([n_rot/2, 0, 0, 0], as llama.cpp's
    converter writes it); DFlash 2 files made before 2026-08-27 lack it and lose acceptance on image input."""
    if ctx.gguf is None or spec.rope_dimension_sections is not None or not target_uses_mrope(target):
        return
    yield warning(
        "target.mrope_sections",
        f"{ctx.path}: target {target.path} uses M-RoPE but the drafter has no rope.dimension_sections (llama.cpp "
        f"writes [{spec.head_dim // 2}, 0, 0, 0]) — acceptance drops on image input; fix: dflash-convert {ctx.path} "
        f"{ctx.path.with_suffix('.fixed.gguf')} --target {target.path}",
        expected=[spec.head_dim // 2, 0, 0, 0],
    )


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
