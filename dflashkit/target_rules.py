"""The drafter ↔ target rules, once: which pairs llama.cpp would mis-run or abort on.

One table (`TARGET_RULES`), iterated by the converter and translation (`converters.plan`: the first
broken rule is a DFlashError naming the target), by ``dflash-inspect --target`` (every broken
rule is a finding) and by the runtime before a drafter runs on a target (`check_runtime_fit`:
``dflash-accept``, ``dflash-parity``, `speculative_generate`). Each rule carries its id, the fix, and the
one-line message of each caller; the messages are the ones those commands have always printed.

The target is anything with ``path``, ``hidden_size``, ``n_layers`` and ``vocab_size``
(`dflashkit.converters.target.TargetInfo`, `Target` below), so this module stays below the commands. A
field the caller does not know (None) skips the rules that need it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Protocol, Sequence, Union

from .dialects import Dialect
from .errors import DFlashError
from .families import has_conv_selector
from .spec import DrafterSpec


class TargetShape(Protocol):
    path: str
    hidden_size: int
    n_layers: int
    vocab_size: int


@dataclass(frozen=True)
class Target:
    """A target as far as a caller knows it (None: unknown, its rules are skipped)."""

    path: str
    hidden_size: int | None = None
    n_layers: int | None = None
    vocab_size: int | None = None


#: A message: a ``str.format`` template over ``s`` (the spec), ``t`` (the target), ``v`` (the broken value),
#: ``p`` (the drafter's path, inspect) and ``w`` (where, the runtime) — or a callable of those names.
Message = Union[str, Callable[..., str]]


@dataclass(frozen=True)
class TargetRule:
    id: str  # inspect finding id
    #: the broken value(s), or None when the pair is fine
    check: Callable[[DrafterSpec, TargetShape], Any]
    #: the target fields the rule reads (a caller that does not know one skips the rule)
    needs: tuple[str, ...]
    #: converter/translation message (the first broken rule is the error)
    convert: Message | None
    #: inspect message (every broken rule is a finding) and the finding's data
    inspect: Message | None = None
    inspect_data: Callable[[DrafterSpec, TargetShape, Any], dict[str, Any]] | None = None
    #: runtime message (accept, parity, speculative_generate)
    runtime: Message | None = None
    #: where inspect lists the finding (its report keeps its historical order)
    inspect_rank: int = 0


def _say(message: Message, **names: Any) -> str:
    return message(**names) if callable(message) else message.format(**names)


_WRONG = "wrong target for this drafter"


def _hidden(spec: DrafterSpec, t: TargetShape) -> Any:
    return True if spec.target_width != t.hidden_size else None


def _mask(spec: DrafterSpec, t: TargetShape) -> Any:
    return True if spec.mask_token_id is not None and spec.mask_token_id >= t.vocab_size else None


def _selector_vocab(spec: DrafterSpec, t: TargetShape) -> Any:
    return True if spec.vocab_size is not None and spec.vocab_size != t.vocab_size and has_conv_selector(spec) else None


def taps_out_of_range(layer_ids: Sequence[int], n_layers: int) -> list[int]:
    """The tap ids (HF decoder-layer ids) no runtime reads the same way, for an ``n_layers`` target: the one tap
    rule of every command (convert, inspect, parity, accept, the runtime).

    A tap id i is the output of decoder layer i = the hidden state entering layer i + 1, which must exist:
    0 <= i <= n − 2. llama.cpp reads exactly that input and aborts ("layer input tensor is null") from
    i = n − 1 on (checked against a build in tests/test_tap_boundary.py); Hugging Face's ``hidden_states[n]`` would
    be the *normed* final state there, not a layer output."""
    return sorted({int(i) for i in layer_ids if not 0 <= int(i) <= n_layers - 2})


def _taps(spec: DrafterSpec, t: TargetShape) -> Any:
    return taps_out_of_range(spec.target_layer_ids, t.n_layers) or None


def _layer_count(spec: DrafterSpec, t: TargetShape) -> Any:
    return True if spec.num_target_layers is not None and spec.num_target_layers != t.n_layers else None


def _tap_convert(s: DrafterSpec, t: TargetShape, **_: Any) -> str:
    worst = max(s.target_layer_ids)
    return (
        f"{t.path}: drafter target layer id {worst} taps layer {worst + 1} but the target has "
        f"{t.n_layers} layers (ids + 1 must be < {t.n_layers}); llama.cpp aborts on it "
        "('layer input tensor is null' / GGML_ASSERT(lid <= n_layer)) — wrong target, or wrong target_layer_ids"
    )


def _tap_inspect(p: str, t: TargetShape, v: Any, d: Dialect | None, c: str, **_: Any) -> str:
    return (
        f"{p}: target layer id(s) {v} (stored as {d.taps_to_file(v) if d else v}, {c}) tap past the last "
        f"layer of the {t.n_layers}-layer target — llama.cpp aborts ('layer input tensor is null' / GGML_ASSERT); "
        "wrong target, or ids converted with the wrong tap convention"
    )


def _tap_runtime(w: str, t: TargetShape, v: Any, **_: Any) -> str:
    return (
        f"{w}: taps target layer id(s) {v} but target {t.path} has {t.n_layers} layers (ids must be 0 .. "
        f"{t.n_layers - 2}; llama.cpp aborts on the last layer's, transformers would give its normed output) — {_WRONG}"
    )


#: In the converter's order (it stops at the first); inspect sorts by `inspect_rank`.
TARGET_RULES: tuple[TargetRule, ...] = (
    TargetRule(
        "target.hidden_size", _hidden, ("hidden_size",),
        convert="{t.path}: target hidden size {t.hidden_size} ≠ drafter hidden_size {s.target_width} — this drafter was "
                "trained for another target",
        inspect="{p}: drafter hidden size {s.target_width} ≠ target embedding length {t.hidden_size} ({t.path}) — this "
                "drafter belongs to another target",
        inspect_data=lambda s, t, v: {"drafter": s.target_width, "target": t.hidden_size},
        runtime="{w}: hidden_size {s.target_width} ≠ target {t.path} hidden size {t.hidden_size} — " + _WRONG,
        inspect_rank=0,
    ),
    TargetRule(
        "target.mask_token", _mask, ("vocab_size",),
        convert="{t.path}: drafter mask_token_id {s.mask_token_id} is outside the target vocabulary ({t.vocab_size} "
                "tokens)",
        inspect="{p}: mask token id {s.mask_token_id} is outside the target vocabulary ({t.vocab_size} tokens)",
        inspect_data=lambda s, t, v: {"mask_token_id": s.mask_token_id, "vocab": t.vocab_size},
        runtime="{w}: mask_token_id {s.mask_token_id} is not a token of target {t.path} (vocab {t.vocab_size}) — set "
                "it in the drafter's config (dflash_config.mask_token_id)",
        inspect_rank=3,
    ),
    TargetRule(
        "target.selector_vocab", _selector_vocab, ("vocab_size",),
        convert="{t.path}: target vocabulary {t.vocab_size} ≠ drafter vocab_size {s.vocab_size} (the DFlash 2 "
                "selector codebooks have one row per token)",
        # inspect checks the codebook rows against the file's own vocabulary instead
        runtime="{w}: target vocabulary {t.vocab_size} ≠ drafter vocab_size {s.vocab_size} (the DFlash 2 selector "
                "codebooks have one row per token) — " + _WRONG,
    ),
    TargetRule(
        "target.tap_range", _taps, ("n_layers",), convert=_tap_convert, inspect=_tap_inspect,
        inspect_data=lambda s, t, v: {"ids": v, "target_layers": t.n_layers}, runtime=_tap_runtime, inspect_rank=1,
    ),
    TargetRule(
        "target.layer_count", _layer_count, ("n_layers",),
        convert="{t.path}: target has {t.n_layers} layers but the drafter config says num_target_layers = "
                "{s.num_target_layers} — wrong target model",
        inspect="{p}: drafter was trained for a {s.num_target_layers}-layer target, {t.path} has {t.n_layers}",
        inspect_data=lambda s, t, v: {"drafter": s.num_target_layers, "target": t.n_layers},
        runtime="{w}: drafter was trained for a {s.num_target_layers}-layer target, {t.path} has {t.n_layers} — "
                + _WRONG,
        inspect_rank=2,
    ),
)


def check_target_compatibility(spec: DrafterSpec, target: TargetShape) -> None:
    """Refuse a drafter/target pair llama.cpp would mis-run or abort on (the first broken rule)."""
    for rule in TARGET_RULES:
        if rule.convert is None:
            continue
        value = rule.check(spec, target)
        if value is not None:
            raise DFlashError(_say(rule.convert, s=spec, t=target, v=value))


def check_runtime_fit(spec: DrafterSpec, target: TargetShape, where: str,
                      error: type[DFlashError] = DFlashError) -> None:
    """Refuse to run a drafter on a target it does not fit (the first broken rule, as ``error``); a rule whose
    target field the caller does not know is skipped."""
    for rule in TARGET_RULES:
        if rule.runtime is None or any(getattr(target, f, None) is None for f in rule.needs):
            continue
        value = rule.check(spec, target)
        if value is not None:
            raise error(_say(rule.runtime, w=where, s=spec, t=target, v=value))


def target_violations(
    path: str, spec: DrafterSpec, target: TargetShape, dialect: Dialect | None, tap_convention: str
) -> Sequence[tuple[str, str, dict[str, Any]]]:
    """Every broken rule as (finding id, message, data), in inspect's order."""
    out = []
    for rule in sorted((r for r in TARGET_RULES if r.inspect is not None), key=lambda r: r.inspect_rank):
        value = rule.check(spec, target)
        if value is not None:
            assert rule.inspect is not None and rule.inspect_data is not None
            message = _say(rule.inspect, p=path, s=spec, t=target, v=value, d=dialect, c=tap_convention)
            out.append((rule.id, message, rule.inspect_data(spec, target, value)))
    return out


#: where the Gemma-target embedding scale rule comes from, for the messages that name it
GEMMA_SCALE_RULE = ("mainline llama.cpp's converter (b11549, conversion/qwen.py DFlashModel) writes "
                    "dflash.embedding_scale = √hidden_size for a Gemma target when the config gives no "
                    "input_embedding_scale — Gemma scales its token embeddings by √hidden_size in its forward pass "
                    "and the drafter reads the target's raw embeddings (z-lab's MLX runtime applies it too; its "
                    "PyTorch runtime and llama.cpp 0.3.36 use 1.0)")


def gemma_embedding_scale(architecture: str | None, hidden_size: int | None) -> float | None:
    """√hidden_size when the target is a Gemma model (HF ``architectures[0]`` Gemma…, GGUF ``general.architecture``
    gemma…), as mainline llama.cpp's converter decides it; None otherwise."""
    if not architecture or not hidden_size or not architecture.lower().startswith("gemma"):
        return None
    return float(hidden_size) ** 0.5
