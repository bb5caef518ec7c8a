"""The checks a drafter must pass before anything is built from it, shared by every command that runs one.

Conversion refuses an HF config that breaks these rules (`dflashkit.spec`); a GGUF's metadata is only
decoded (Inspect reports each problem as a finding). Parity and Accept construct a model from the
spec, so they run the same rules here, then compare the spec with the tensors actually present
*before* constructing it: a file claiming ``embedding_length = 2^20`` with 64-wide tensors is refused
instead of allocating a model of that width.
"""

from __future__ import annotations

import os
from typing import Any, Mapping

from .errors import DFlashError
from .spec import DrafterSpec
from .tensors import check_tensor_set


def spec_problems(spec: DrafterSpec) -> list[str]:
    """What makes ``spec`` unusable (the rules `dflashkit.spec.spec_from_hf_config` enforces on a config)."""
    problems: list[str] = []
    ids = list(spec.target_layer_ids)
    if not ids:
        problems.append("target layer ids are empty")
    elif any(i < 0 for i in ids):
        problems.append(f"target layer ids include a negative id: {ids}")
    elif ids != sorted(set(ids)):
        problems.append(f"target layer ids must be sorted and unique, got {ids}")
    elif spec.num_target_layers is not None and ids[-1] >= spec.num_target_layers:
        problems.append(f"target layer id {ids[-1]} is past the target's last layer (num_target_layers = {spec.num_target_layers})")
    if spec.block_size < 1:
        problems.append(f"block size must be >= 1, got {spec.block_size}")
    if spec.n_heads < 1 or spec.n_kv_heads < 1 or spec.n_heads % spec.n_kv_heads:
        problems.append(f"head count {spec.n_heads} must be a positive multiple of the KV head count {spec.n_kv_heads}")
    if spec.mask_token_id is not None and spec.vocab_size is not None and spec.mask_token_id >= spec.vocab_size:
        problems.append(f"mask token id {spec.mask_token_id} is outside the vocabulary ({spec.vocab_size} tokens)")
    if spec.sliding_window_pattern is not None and len(spec.sliding_window_pattern) != spec.n_layers:
        problems.append(
            f"sliding-window pattern has {len(spec.sliding_window_pattern)} entries for {spec.n_layers} layers"
        )
    if spec.rope_dimension_count is not None and not 0 < spec.rope_dimension_count <= spec.head_dim:
        problems.append(f"rope dimension count {spec.rope_dimension_count} must lie in 1 .. head_dim ({spec.head_dim})")
    if not spec.rms_norm_eps > 0:
        problems.append(f"RMS norm epsilon must be > 0, got {spec.rms_norm_eps}")
    return problems


def check_runnable(spec: DrafterSpec, tensors: Mapping[str, Any], path: str | os.PathLike[str]) -> None:
    """Raise a one-line `DFlashError` naming ``path`` unless a model can be built from ``spec`` with exactly
    the tensors present (``tensors``: canonical id → object with a ``shape``)."""
    problems = spec_problems(spec)
    if problems:
        raise DFlashError(f"{path}: {problems[0]} — refusing to run this drafter (dflash-inspect lists every problem)")
    if spec.n_layers > len(tensors):  # each layer has several tensors: bounded before building the name table
        raise DFlashError(f"{path}: the metadata claims {spec.n_layers} layers but the file holds {len(tensors)} tensors")
    check_tensor_set(spec, {k: tuple(t.shape) for k, t in tensors.items()}, source=str(path))


def require_mask_in_vocab(spec: DrafterSpec, source: str) -> None:
    """The mask token must be a token of the vocabulary (``mask_token_id`` < ``vocab_size``, both known)."""
    if spec.mask_token_id is not None and spec.vocab_size is not None and spec.mask_token_id >= spec.vocab_size:
        raise DFlashError(f"{source}: 'mask_token_id' ({spec.mask_token_id}) must be below 'vocab_size' ({spec.vocab_size})")
