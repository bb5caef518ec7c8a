"""The tensor set a `DrafterSpec` implies: names (canonical ids) and shapes (numpy order, HF layout).

Used by the converter to cross-check a checkpoint against its config, and by Inspect to check a
GGUF against its metadata. GGUF stores dims reversed; these are numpy/HF shapes.
"""

from __future__ import annotations

from typing import Mapping

from .bounds import escape_name
from .errors import DFlashError
from .spec import DrafterSpec

def expected_tensors(spec: DrafterSpec, *, vocab_size: int | None = None) -> dict[str, tuple[int, ...]]:
    """Required tensors of a drafter and their shapes (biases and embeddings are optional: see
    `optional_tensors`)."""
    h, hd = spec.hidden_size, spec.head_dim
    q, kv, ff = spec.n_heads * hd, spec.n_kv_heads * hd, spec.intermediate_size
    shapes: dict[str, tuple[int, ...]] = {
        "fc.weight": (h, spec.fc_input_width),
        "hidden_norm.weight": (h,),
        "norm.weight": (h,),
    }
    for i in range(spec.n_layers):
        p = f"layers.{i}."
        shapes.update(
            {
                p + "input_layernorm.weight": (h,),
                p + "self_attn.q_proj.weight": (q, h),
                p + "self_attn.k_proj.weight": (kv, h),
                p + "self_attn.v_proj.weight": (kv, h),
                p + "self_attn.o_proj.weight": (h, q),
                p + "self_attn.q_norm.weight": (hd,),
                p + "self_attn.k_norm.weight": (hd,),
                p + "post_attention_layernorm.weight": (h,),
                p + "mlp.gate_proj.weight": (ff, h),
                p + "mlp.up_proj.weight": (ff, h),
                p + "mlp.down_proj.weight": (h, ff),
            }
        )
        if spec.attention_bias:
            shapes.update(
                {
                    p + "self_attn.q_proj.bias": (q,),
                    p + "self_attn.k_proj.bias": (kv,),
                    p + "self_attn.v_proj.bias": (kv,),
                }
            )
        if spec.is_dflash2:
            k = spec.conv_kernel_size or 0
            groups = h // (spec.conv_group_size or 1)
            for conv in ("attention_conv", "mlp_conv"):
                shapes[p + conv + ".base_kernel"] = (2, k, h)
                shapes[p + conv + ".kernel_projection.weight"] = (2 * k * groups, h)
    if spec.is_dflash2:
        rank = spec.selector_rank or 0
        vocab = spec.vocab_size or vocab_size
        # codebook rows = the vocabulary; checked only when the vocab size is known
        shapes["candidate_selector.predecessor_codebook.weight"] = (vocab or -1, rank)
        shapes["candidate_selector.successor_codebook.weight"] = (vocab or -1, rank)
        shapes["candidate_selector.hidden_projection.weight"] = (rank, h)
    return shapes


def optional_tensors(spec: DrafterSpec) -> dict[str, tuple[int, ...]]:
    """Tensors a drafter may carry; -1 = not determined by the spec (vocabulary rows)."""
    h, hd = spec.hidden_size, spec.head_dim
    shapes: dict[str, tuple[int, ...]] = {
        "embed_tokens.weight": (spec.vocab_size or -1, h),
        "lm_head.weight": (spec.vocab_size or -1, h),
    }
    for i in range(spec.n_layers):
        p = f"layers.{i}.self_attn."
        shapes[p + "o_proj.bias"] = (h,)
        if not spec.attention_bias:
            shapes[p + "q_proj.bias"] = (spec.n_heads * hd,)
            shapes[p + "k_proj.bias"] = (spec.n_kv_heads * hd,)
            shapes[p + "v_proj.bias"] = (spec.n_kv_heads * hd,)
    return shapes


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
) -> list[tuple[str, str]]:
    """Every mismatch between canonical tensor ids + shapes and the spec, as (kind, one-line message);
    kind is "layer_count", "missing", "unused" or "shape"."""
    display = display_names or {}
    problems: list[tuple[str, str]] = []
    layer_ids = [int(n.split(".")[1]) for n in shapes if n.startswith("layers.")]
    if layer_ids and max(layer_ids) + 1 != spec.n_layers:
        problems.append((
            "layer_count",
            f"{source}: config num_hidden_layers = {spec.n_layers} but the highest layer tensor is "
            f"layers.{max(layer_ids)} ({max(layer_ids) + 1} layers)",
        ))
    required = expected_tensors(spec)
    missing = [n for n in required if n not in shapes]
    if missing:
        shown = ", ".join(escape_name(display.get(n, n)) for n in missing[:8]) + (f" (+{len(missing) - 8} more)" if len(missing) > 8 else "")
        problems.append(("missing", f"{source}: missing tensor(s) for this config: {shown}"))
    allowed = {**optional_tensors(spec), **required}
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


def check_tensor_set(
    spec: DrafterSpec,
    shapes: Mapping[str, tuple[int, ...]],
    *,
    source: str,
    display_names: Mapping[str, str] | None = None,
) -> None:
    """Raise on the first mismatch found by `tensor_set_problems`."""
    problems = tensor_set_problems(spec, shapes, source=source, display_names=display_names)
    if problems:
        raise DFlashError(problems[0][1])
