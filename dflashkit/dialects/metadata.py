"""Metadata through a dialect's table: a spec to GGUF entries (`encode_metadata`) and GGUF key/values back to spec
fields and a `DrafterSpec` (`decode_metadata`, `spec_from_gguf_metadata`). No dialect is named here: the table
decides every key, type and tap convention."""

from __future__ import annotations

from dataclasses import replace
from typing import Any, Iterable, Mapping

from .. import bounds
from ..errors import DFlashError
from ..families import family_for_gguf
from ..io.gguf_writer import MetadataEntry
from ..spec import DrafterSpec
from .table import Dialect, KeySpec, T


def _derived_value(field_name: str, spec: DrafterSpec, arch: str, dialect: Dialect) -> Any:
    if field_name == "causal_false":  # llama.cpp's early position of a False causal flag
        return False if spec.causal is False else None
    if field_name == "causal" and dialect.keys_field("causal_false"):
        return True if spec.causal else None
    if field_name.startswith("rope_scaling."):
        return dict(spec.rope_scaling).get(field_name.split(".", 1)[1]) if spec.rope_scaling else None
    if field_name == "rope_dimension_count_or_head_dim":  # a key written for every drafter of that architecture
        return spec.rope_dimension_count or spec.head_dim
    if field_name == "n_target_features":
        return spec.fc_input_width
    if field_name == "luce_n_target_layers":
        # Luce's Qwen script stores the tap count, its Gemma script the target's layer count.
        return spec.num_target_layers if dialect.stores_target_count(arch) else spec.n_taps
    return getattr(spec, field_name)


def encode_metadata(
    spec: DrafterSpec, dialect: Dialect, arch: str | None = None, *, skip: Iterable[str] = ()
) -> list[MetadataEntry]:
    """The dialect's metadata entries for ``spec`` (architecture and general.* not included).

    ``skip``: spec fields left out (the drafter's family writes them itself, `DrafterFamily.metadata_fields`).
    Raises a DFlashError naming the key when a required value is unknown.
    """
    arch = arch or dialect.pick_architecture(spec)
    skipped = frozenset(skip)
    entries: list[MetadataEntry] = []
    for ks in dialect.keys:
        if ks.field in skipped or ks.family_only:
            continue
        value = _derived_value(ks.field, spec, arch, dialect)
        key = dialect.key(ks, arch)
        if value is None:
            if ks.required:
                raise DFlashError(_missing_value_message(ks, key, dialect))
            continue
        if ks.field == "target_layer_ids":
            value = dialect.taps_to_file(value)
        if ks.type == T.ARRAY:
            value = list(value)
        elif ks.type == T.FLOAT32:
            value = float(value)
        elif ks.type == T.BOOL:
            value = bool(value)
        elif ks.type == T.STRING:
            value = str(value)
        else:
            value = int(value)
        entries.append(MetadataEntry(key, value, ks.type, ks.sub_type))
    return entries


def _missing_value_message(ks: KeySpec, key: str, dialect: Dialect) -> str:
    hints = {
        "mask_token_id": "set dflash_config.mask_token_id in config.json or pass --mask-token-id",
        "luce_n_target_layers": "pass --target (the target model) or --num-target-layers",
        "num_target_layers": "pass --target (the target model) or --num-target-layers",
    }
    fix = hints.get(ks.field, f"the source does not carry '{ks.field}'")
    return f"the {dialect.name} dialect requires '{key}' but its value is unknown — {fix}"


def decode_metadata(kvs: Mapping[str, Any], dialect: Dialect, arch: str) -> dict[str, Any]:
    """Read the dialect's keys from ``kvs`` (key → value) into spec fields (HF tap convention).

    Returns only the fields present; derived keys come back under their own names
    (``n_target_features``, ``luce_n_target_layers``).
    """
    out: dict[str, Any] = {}
    for ks in dialect.keys:
        key = dialect.key(ks, arch)
        if key not in kvs:
            continue
        value = bounds.metadata_value(kvs[key], key, ks.field, ks.type.name, ks.sub_type.name if ks.sub_type else None)
        if ks.field == "target_layer_ids":
            value = tuple(dialect.taps_from_file(value))
        elif ks.field == "sliding_window_pattern":
            value = tuple(bool(v) for v in value)
        elif ks.field == "rope_dimension_sections":
            value = tuple(int(v) for v in value)
        if ks.field in out and out[ks.field] != value:
            # key_length and value_length both map to head_dim; keep the first and flag the mismatch
            out.setdefault("_conflicts", []).append((ks.field, key, value))
            continue
        out[ks.field] = value
    return out


def spec_from_gguf_metadata(kvs: Mapping[str, Any], dialect: Dialect, arch: str, *, name: str | None = None) -> DrafterSpec:
    """Build a DrafterSpec from a GGUF's metadata. Missing required keys raise DFlashError."""
    fields_ = decode_metadata(kvs, dialect, arch)
    family = family_for_gguf(fields_)
    fields_ = {**family.gguf_defaults, **fields_}  # what no key stores (a chain drafter's block)
    rotated = fields_.pop("rope_dimension_count_or_head_dim", None)
    if rotated is not None and rotated != fields_.get("head_dim"):
        fields_.setdefault("rope_dimension_count", rotated)
    missing = [dialect.key(ks, arch) for ks in dialect.keys if ks.required and dialect.key(ks, arch) not in kvs]
    if missing:
        raise DFlashError(f"missing {dialect.name} metadata key(s): {', '.join(missing)}")
    n_target_layers = fields_.get("num_target_layers")
    if dialect.stores_target_count(arch):
        n_target_layers = fields_.get("luce_n_target_layers")

    spec = DrafterSpec(
        # the family's GGUF signature (DFlash 2: the conv keys) gives the HF architecture back
        architecture=family.architectures[0],
        hidden_size=int(fields_["hidden_size"]),
        n_layers=int(fields_["n_layers"]),
        n_heads=int(fields_["n_heads"]),
        n_kv_heads=int(fields_["n_kv_heads"]),
        head_dim=int(fields_["head_dim"]),
        intermediate_size=int(fields_["intermediate_size"]),
        rms_norm_eps=float(fields_["rms_norm_eps"]),
        rope_theta=float(fields_["rope_theta"]),
        context_length=int(fields_["context_length"]),
        block_size=int(fields_["block_size"]),
        target_layer_ids=tuple(fields_["target_layer_ids"]),
        num_target_layers=n_target_layers,
        name=name,
        rope_scaling=tuple((k.split(".", 1)[1], v) for k, v in fields_.items() if k.startswith("rope_scaling.")) or None,
        **{f: fields_.get(f) for f in _OPTIONAL_FIELDS},
    )
    return spec


#: spec fields a GGUF may leave out (None: the family's default), taken as the file stores them; DSpark's heads and
#: draft vocabulary come from the tensors (`DrafterFamily.refine_spec`)
_OPTIONAL_FIELDS = (
    "mask_token_id", "vocab_size", "sliding_window", "sliding_window_pattern", "causal", "final_logit_softcapping",
    "embedding_scale", "logit_scale", "attention_value_scale", "rope_dimension_count", "rope_dimension_sections",
    "conv_kernel_size", "conv_group_size", "selector_rank", "selector_top_k", "sample_from_anchor",
    "has_confidence_head", "attention_scale", "hidden_act", "reference_causal_layers", "target_hidden_size",
    "norm_before_residual", "norm_before_fc",
)


def with_spec(spec: DrafterSpec, **changes: Any) -> DrafterSpec:
    return replace(spec, **changes)


def all_keys(dialect: Dialect, arch: str) -> Iterable[str]:
    return (dialect.key(ks, arch) for ks in dialect.keys)
