"""The drafter ↔ target rules, once: which pairs llama.cpp would mis-run or abort on.

One table (`TARGET_RULES`), iterated by the converter and translation (`converters.plan`: the first
broken rule is a DFlashError naming the target) and by ``dflash-inspect --target`` (every broken
rule is a finding). Each rule carries the one-line message of each caller; the messages are the
ones those commands have always printed.

The target is anything with ``path``, ``hidden_size``, ``n_layers`` and ``vocab_size``
(`dflashkit.converters.target.TargetInfo`), so this module stays below the commands.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Protocol, Sequence

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
class TargetRule:
    id: str  # inspect finding id
    #: the broken value(s), or None when the pair is fine
    check: Callable[[DrafterSpec, TargetShape], Any]
    #: converter/translation message: (spec, target, value) → text
    convert_message: Callable[[DrafterSpec, TargetShape, Any], str] | None
    #: inspect message: (path, spec, target, value, dialect) → (text, finding data)
    inspect_message: Callable[[str, DrafterSpec, TargetShape, Any, Dialect | None, str], tuple[str, dict[str, Any]]] | None
    #: where inspect lists the finding (its report keeps its historical order)
    inspect_rank: int = 0


def _hidden(spec: DrafterSpec, t: TargetShape) -> Any:
    return True if spec.hidden_size != t.hidden_size else None


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


def _tap_convert(spec: DrafterSpec, t: TargetShape, bad: Any) -> str:
    worst = max(spec.target_layer_ids)
    return (
        f"{t.path}: drafter target layer id {worst} taps layer {worst + 1} but the target has "
        f"{t.n_layers} layers (ids + 1 must be < {t.n_layers}); llama.cpp aborts on it "
        "('layer input tensor is null' / GGML_ASSERT(lid <= n_layer)) — wrong target, or wrong target_layer_ids"
    )


def _tap_inspect(path: str, spec: DrafterSpec, t: TargetShape, bad: Any, dialect: Dialect | None, convention: str) -> tuple[str, dict[str, Any]]:
    stored = dialect.taps_to_file(bad) if dialect else bad
    return (
        f"{path}: target layer id(s) {bad} (stored as {stored}, {convention}) tap past the last "
        f"layer of the {t.n_layers}-layer target — llama.cpp aborts ('layer input tensor is null' / GGML_ASSERT); "
        "wrong target, or ids converted with the wrong tap convention",
        {"ids": bad, "target_layers": t.n_layers},
    )


#: In the converter's order (it stops at the first); inspect sorts by `inspect_rank`.
TARGET_RULES: tuple[TargetRule, ...] = (
    TargetRule(
        "target.hidden_size", _hidden,
        lambda s, t, v: (
            f"{t.path}: target hidden size {t.hidden_size} ≠ drafter hidden_size {s.hidden_size} "
            "— this drafter was trained for another target"
        ),
        lambda p, s, t, v, d, c: (
            f"{p}: drafter hidden size {s.hidden_size} ≠ target embedding length {t.hidden_size} "
            f"({t.path}) — this drafter belongs to another target",
            {"drafter": s.hidden_size, "target": t.hidden_size},
        ),
        inspect_rank=0,
    ),
    TargetRule(
        "target.mask_token", _mask,
        lambda s, t, v: (
            f"{t.path}: drafter mask_token_id {s.mask_token_id} is outside the target vocabulary "
            f"({t.vocab_size} tokens)"
        ),
        lambda p, s, t, v, d, c: (
            f"{p}: mask token id {s.mask_token_id} is outside the target vocabulary ({t.vocab_size} tokens)",
            {"mask_token_id": s.mask_token_id, "vocab": t.vocab_size},
        ),
        inspect_rank=3,
    ),
    TargetRule(
        "target.selector_vocab", _selector_vocab,
        lambda s, t, v: (
            f"{t.path}: target vocabulary {t.vocab_size} ≠ drafter vocab_size {s.vocab_size} "
            "(the DFlash 2 selector codebooks have one row per token)"
        ),
        None,  # inspect checks the codebook rows against the file's own vocabulary instead
    ),
    TargetRule("target.tap_range", _taps, _tap_convert, _tap_inspect, inspect_rank=1),
    TargetRule(
        "target.layer_count", _layer_count,
        lambda s, t, v: (
            f"{t.path}: target has {t.n_layers} layers but the drafter config says "
            f"num_target_layers = {s.num_target_layers} — wrong target model"
        ),
        lambda p, s, t, v, d, c: (
            f"{p}: drafter was trained for a {s.num_target_layers}-layer target, {t.path} has {t.n_layers}",
            {"drafter": s.num_target_layers, "target": t.n_layers},
        ),
        inspect_rank=2,
    ),
)


def check_target_compatibility(spec: DrafterSpec, target: TargetShape) -> None:
    """Refuse a drafter/target pair llama.cpp would mis-run or abort on (the first broken rule)."""
    for rule in TARGET_RULES:
        if rule.convert_message is None:
            continue
        value = rule.check(spec, target)
        if value is not None:
            raise DFlashError(rule.convert_message(spec, target, value))


def target_violations(
    path: str, spec: DrafterSpec, target: TargetShape, dialect: Dialect | None, tap_convention: str
) -> Sequence[tuple[str, str, dict[str, Any]]]:
    """Every broken rule as (finding id, message, data), in inspect's order."""
    out = []
    for rule in sorted((r for r in TARGET_RULES if r.inspect_message is not None), key=lambda r: r.inspect_rank):
        value = rule.check(spec, target)
        if value is not None:
            assert rule.inspect_message is not None
            message, data = rule.inspect_message(path, spec, target, value, dialect, tap_convention)
            out.append((rule.id, message, data))
    return out
