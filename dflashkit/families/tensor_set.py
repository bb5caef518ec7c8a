"""A drafter's tensor set checked against its spec: names (canonical ids) and shapes (numpy order,
HF layout), through the spec's family (`DrafterFamily.expected_tensors` / `optional_tensors`).

Used by the converter and translation (through `dflashkit.converters.plan`) to cross-check a
source against its config, and by Inspect to check a GGUF against its metadata. GGUF stores dims
reversed; these are numpy/HF shapes.
"""

from __future__ import annotations

from typing import Mapping

from ..bounds import escape_name
from ..errors import DFlashError
from ..spec import DrafterSpec
from .base import DrafterFamily
from . import family_for_spec


def _shape_field_hint(canonical: str, spec: DrafterSpec) -> str:
    if canonical == "fc.weight":
        return (
            f"config: {spec.n_taps} target_layer_ids × hidden_size {spec.hidden_size} = {spec.fc_input_width} "
            "input columns"
        )
    if "k_proj" in canonical or "v_proj" in canonical:
        return (
            f"config: num_key_value_heads {spec.n_kv_heads} × head_dim {spec.head_dim} = "
            f"{spec.n_kv_heads * spec.head_dim} rows"
        )
    if "q_proj" in canonical or "o_proj" in canonical:
        return f"config: num_attention_heads {spec.n_heads} × head_dim {spec.head_dim} = {spec.n_heads * spec.head_dim}"
    if "mlp." in canonical:
        return f"config: intermediate_size {spec.intermediate_size}, hidden_size {spec.hidden_size}"
    if "_norm" in canonical or "layernorm" in canonical:
        return f"config: hidden_size {spec.hidden_size} / head_dim {spec.head_dim}"
    if "conv" in canonical:
        return f"config: conv_kernel_size {spec.conv_kernel_size}, conv_group_size {spec.conv_group_size}"
    if "selector" in canonical:
        return f"config: selector_rank {spec.selector_rank}"
    return f"config: hidden_size {spec.hidden_size}"


def tensor_set_problems(
    spec: DrafterSpec,
    shapes: Mapping[str, tuple[int, ...]],
    *,
    source: str,
    display_names: Mapping[str, str] | None = None,
    family: DrafterFamily | None = None,
) -> list[tuple[str, str]]:
    """Every mismatch between canonical tensor ids + shapes and the spec, as (kind, one-line message);
    kind is "layer_count", "missing", "unused" or "shape". ``family``: the spec's family when the caller has
    already resolved it (the registry is asked otherwise)."""
    display = display_names or {}
    family = family if family is not None else family_for_spec(spec)
    problems: list[tuple[str, str]] = []
    layer_ids = [int(n.split(".")[1]) for n in shapes if n.startswith("layers.")]
    if layer_ids and max(layer_ids) + 1 != spec.n_layers:
        problems.append((
            "layer_count",
            f"{source}: config num_hidden_layers = {spec.n_layers} but the highest layer tensor is "
            f"layers.{max(layer_ids)} ({max(layer_ids) + 1} layers)",
        ))
    required = family.expected_tensors(spec)
    missing = [n for n in required if n not in shapes]
    if missing:
        shown = ", ".join(escape_name(display.get(n, n)) for n in missing[:8]) + (f" (+{len(missing) - 8} more)" if len(missing) > 8 else "")
        problems.append(("missing", f"{source}: missing tensor(s) for this config: {shown}"))
    allowed = {**family.optional_tensors(spec), **required}
    extra = [n for n in shapes if n not in allowed]
    if extra:
        shown = ", ".join(escape_name(display.get(n, n)) for n in extra[:8])
        problems.append(("unused", f"{source}: tensor(s) this config does not use: {shown} — check num_hidden_layers / architectures"))
    for name, want in allowed.items():
        got = shapes.get(name)
        if got is None:
            continue
        if len(got) != len(want) or any(w not in (-1, g) for w, g in zip(want, got)):
            problems.append((
                "shape",
                f"{source}: tensor '{escape_name(display.get(name, name))}' has shape {list(got)} but the config implies "
                f"{[w if w >= 0 else 'vocab' for w in want]} ({_shape_field_hint(name, spec)})",
            ))
    return problems


def check_tensor_set(spec: DrafterSpec, shapes: Mapping[str, tuple[int, ...]], *, source: str,
                     display_names: Mapping[str, str] | None = None, family: DrafterFamily | None = None) -> None:
    """Raise on the first mismatch found by `tensor_set_problems`."""
    problems = tensor_set_problems(spec, shapes, source=source, display_names=display_names, family=family)
    if problems:
        raise DFlashError(problems[0][1])
