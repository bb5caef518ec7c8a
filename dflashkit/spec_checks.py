"""The rules a `DrafterSpec` must pass before anything is built from it: one list, shared by every command.

An HF config breaking them never gets this far (its family refuses it, naming the config key). A GGUF's
metadata is only decoded, so the commands that write or run a drafter from a GGUF check the decoded spec
here: translation (`converters.plan`, through `check_spec` / `require_mask_in_vocab`, exactly where a
conversion checks it) and Parity / Accept (`check_runnable`, which also compares the spec with the
tensors actually present *before* a model is constructed: a file claiming ``embedding_length = 2^20``
with 64-wide tensors is refused instead of allocating a model of that width). Inspect reports the same
problems as findings.

Layer: beside the families (it reads their tensor sets), below converters and runtime.
"""

from __future__ import annotations

import math
import os
from typing import Any, Mapping

from .errors import DFlashError
from .families.tensor_set import check_tensor_set
from .spec import DrafterSpec

#: Spec fields that count something and must be at least 1.
POSITIVE_FIELDS: tuple[str, ...] = (
    "hidden_size", "n_layers", "n_heads", "n_kv_heads", "head_dim", "intermediate_size", "block_size", "context_length",
)


def size_problems(spec: DrafterSpec, fields: tuple[str, ...] = POSITIVE_FIELDS) -> list[str]:
    """Zero sizes among ``fields``, and a head count that the KV head count does not divide."""
    problems = [f"{name} must be >= 1, got {getattr(spec, name)}" for name in fields if getattr(spec, name) < 1]
    if spec.n_heads >= 1 and spec.n_kv_heads >= 1 and spec.n_heads % spec.n_kv_heads:
        problems.append(f"head count ({spec.n_heads}) must be a multiple of the KV head count ({spec.n_kv_heads})")
    return problems


#: Optional float fields that scale activations: when present they must be finite (NaN / inf poison every logit).
FINITE_FIELDS: tuple[str, ...] = (
    "final_logit_softcapping", "embedding_scale", "logit_scale", "attention_value_scale", "attention_scale",
)


def _positive(x: Any) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x) and x > 0


def value_problems(spec: DrafterSpec) -> list[str]:
    """Numbers no runtime can compute with: a non-positive or non-finite norm epsilon, RoPE base or RoPE scaling
    factor, a non-finite scale. Every command runs these (convert, translate, quantize, parity, accept; inspect as
    ``drafter.values`` findings)."""
    problems = []
    if not _positive(spec.rms_norm_eps):
        problems.append(f"RMS norm epsilon must be > 0, got {spec.rms_norm_eps}")
    if not _positive(spec.rope_theta):
        problems.append(f"RoPE base frequency (rope_theta / rope.freq_base) must be a positive number, got {spec.rope_theta}")
    scaling = dict(spec.rope_scaling or ())
    for key, what in (("factor", "RoPE scaling factor"), ("original_context_length", "RoPE scaling original context")):
        if key in scaling and scaling[key] is not None and not _positive(scaling[key]):
            problems.append(f"{what} ({scaling.get('type') or 'rope'}) must be a positive number, got {scaling[key]}")
    for name in FINITE_FIELDS:
        value = getattr(spec, name, None)
        if value is not None and not (isinstance(value, (int, float)) and math.isfinite(value)):
            problems.append(f"{name} must be a finite number, got {value}")
    return problems


def spec_problems(spec: DrafterSpec) -> list[str]:
    """What makes ``spec`` unusable, first problem first (the mask token: `mask_problem`, checked after
    the target rules, which name the target's vocabulary when there is one)."""
    problems = size_problems(spec)
    ids = list(spec.target_layer_ids)
    if not ids:
        problems.append("no target layer ids")
    elif any(i < 0 for i in ids):
        problems.append(f"target layer ids have a negative id: {ids}")
    elif ids != sorted(set(ids)):
        problems.append(f"target layer ids must be sorted and unique, got {ids}")
    elif spec.num_target_layers is not None and ids[-1] >= spec.num_target_layers:
        problems.append(
            f"target layer id {ids[-1]} is past the target's last layer (num_target_layers = {spec.num_target_layers})"
        )
    if spec.sliding_window_pattern is not None and len(spec.sliding_window_pattern) != spec.n_layers:
        problems.append(
            f"sliding-window pattern has {len(spec.sliding_window_pattern)} entries for {spec.n_layers} layers"
        )
    if spec.rope_dimension_count is not None and not 0 < spec.rope_dimension_count <= spec.head_dim:
        problems.append(f"rope dimension count {spec.rope_dimension_count} must lie in 1 .. head_dim ({spec.head_dim})")
    problems += value_problems(spec)
    # DSpark heads (issue 13): the same rules a DSpark config is held to (families/dspark.py)
    if spec.draft_vocab_size is not None and spec.vocab_size is not None and spec.draft_vocab_size > spec.vocab_size:
        problems.append(
            f"draft vocabulary ({spec.draft_vocab_size} rows) exceeds the vocabulary ({spec.vocab_size} tokens) — "
            "a draft vocabulary is a subset of the target's"
        )
    if spec.markov_head_type not in (None, "vanilla"):
        problems.append(f"unsupported Markov head type {spec.markov_head_type!r} (only 'vanilla' is supported)")
    if spec.markov_rank is not None and spec.markov_rank < 1:
        problems.append(f"Markov rank must be >= 1, got {spec.markov_rank}")
    return problems


def mask_problem(spec: DrafterSpec) -> str | None:
    """The mask token must be a token of the drafter's own vocabulary (when both are known)."""
    if spec.mask_token_id is not None and spec.vocab_size is not None and spec.mask_token_id >= spec.vocab_size:
        return f"mask token id {spec.mask_token_id} is outside the vocabulary ({spec.vocab_size} tokens)"
    return None


def check_spec(spec: DrafterSpec, source: str) -> None:
    """Raise a one-line `DFlashError` ``SOURCE: problem`` for the first of `spec_problems`."""
    problems = spec_problems(spec)
    if problems:
        raise DFlashError(f"{source}: {problems[0]}")


def require_mask_in_vocab(spec: DrafterSpec, source: str) -> None:
    """Raise a one-line `DFlashError` ``SOURCE: mask token id … is outside the vocabulary …`` (`mask_problem`)."""
    problem = mask_problem(spec)
    if problem:
        raise DFlashError(f"{source}: {problem}")


def check_runnable(spec: DrafterSpec, tensors: Mapping[str, Any], path: str | os.PathLike[str],
                   action: str = "run this drafter") -> None:
    """Raise a one-line `DFlashError` naming ``path`` unless a model can be built from ``spec`` with exactly
    the tensors present (``tensors``: canonical id → object with a ``shape``); ``action`` is what is refused."""
    problems = spec_problems(spec)
    mask = mask_problem(spec)
    if mask:
        problems.append(mask)
    if problems:
        raise DFlashError(f"{path}: {problems[0]} — refusing to {action} (dflash-inspect lists every problem)")
    if spec.n_layers > len(tensors):  # each layer has several tensors: bounded before building the name table
        raise DFlashError(f"{path}: the metadata claims {spec.n_layers} layers but the file holds {len(tensors)} tensors")
    # a tensor is named as the file stores it (blk.0.ffn_up.weight in a GGUF), not by its canonical id
    stored = {k: t.name for k, t in tensors.items() if isinstance(getattr(t, "name", None), str)}
    check_tensor_set(spec, {k: tuple(t.shape) for k, t in tensors.items()}, source=str(path), display_names=stored)
