"""One validated, typed description of a DFlash drafter.

`DrafterSpec` is what every command agrees on: the converter builds it from an HF ``config.json``,
the dialect tables encode it into GGUF metadata and decode it back, Inspect checks it and Diff
compares two of them. Target layer ids are always held in the HF convention (decoder-layer ids,
as in z-lab's ``dflash_config.target_layer_ids``); dialects convert on the way in and out.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path
from typing import Any, Mapping

from . import bounds
from .errors import DFlashError

ARCH_DFLASH = "DFlashDraftModel"
ARCH_DFLASH2 = "DFlash2DraftModel"
KNOWN_ARCHITECTURES = (ARCH_DFLASH, ARCH_DFLASH2)


@dataclass(frozen=True)
class DrafterSpec:
    """Everything a runtime needs to know about a drafter besides its tensors."""

    architecture: str  # ARCH_DFLASH or ARCH_DFLASH2
    hidden_size: int
    n_layers: int
    n_heads: int
    n_kv_heads: int
    head_dim: int
    intermediate_size: int
    rms_norm_eps: float
    rope_theta: float
    context_length: int
    block_size: int
    target_layer_ids: tuple[int, ...]  # HF convention
    mask_token_id: int | None = None
    vocab_size: int | None = None
    num_target_layers: int | None = None  # layer count of the target model, when known
    sliding_window: int | None = None
    sliding_window_pattern: tuple[bool, ...] | None = None  # per layer, True = sliding
    causal: bool | None = None
    final_logit_softcapping: float | None = None
    embedding_scale: float | None = None
    logit_scale: float | None = None  # HF output_multiplier
    attention_value_scale: float | None = None
    rope_dimension_count: int | None = None  # partial rotary: head_dim * partial_rotary_factor
    # M-RoPE targets (Qwen3.5/3.6): the drafter ropes on the temporal section only, [n_rot/2, 0, 0, 0]
    rope_dimension_sections: tuple[int, ...] | None = None
    attention_bias: bool = False
    conv_kernel_size: int | None = None
    conv_group_size: int | None = None
    selector_rank: int | None = None
    selector_top_k: int | None = None
    torch_dtype: str | None = None
    name: str | None = None
    # True when target_layer_ids came from z-lab's default rule, not from the config.
    target_layer_ids_defaulted: bool = field(default=False, compare=False)

    @property
    def is_dflash2(self) -> bool:
        return self.architecture == ARCH_DFLASH2

    @property
    def n_taps(self) -> int:
        return len(self.target_layer_ids)

    @property
    def fc_input_width(self) -> int:
        return self.n_taps * self.hidden_size

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        for k, v in d.items():
            if isinstance(v, tuple):
                d[k] = list(v)
        return d

    @classmethod
    def field_names(cls) -> tuple[str, ...]:
        return tuple(f.name for f in fields(cls))


def build_target_layer_ids(num_target_layers: int, num_draft_layers: int) -> list[int]:
    """z-lab's published default tap rule (``dflash.model.build_target_layer_ids``).

    Evenly spaced ids from layer 1 to ``num_target_layers - 3``, one per drafter layer; a
    one-layer drafter taps the middle layer.
    """
    if num_draft_layers == 1:
        return [num_target_layers // 2]
    start, end = 1, num_target_layers - 3
    span = end - start
    # Python's round() is round-half-even, exactly as the reference code uses it.
    return [round(start + (i * span) / (num_draft_layers - 1)) for i in range(num_draft_layers)]


class _ConfigView:
    """Looks values up in ``dflash_config`` first, then top-level (the rule every schema follows)."""

    def __init__(self, config: Mapping[str, Any], path: str) -> None:
        self.config = config
        self.nested = config.get("dflash_config") or {}
        if not isinstance(self.nested, Mapping):
            raise DFlashError(f"{path}: 'dflash_config' must be an object, got {type(self.nested).__name__}")
        self.path = path

    def get(self, key: str, default: Any = None) -> Any:
        if key in self.nested and self.nested[key] is not None:
            return self.nested[key]
        if key in self.config and self.config[key] is not None:
            return self.config[key]
        return default

    def has(self, key: str) -> bool:
        return self.get(key) is not None

    def where(self, key: str) -> str:
        return f"dflash_config.{key}" if key in self.nested else key

    def int(self, key: str, default: Any = None, *, required: bool = False, minimum: int | None = 0,
            maximum: int = bounds.U32_MAX) -> Any:
        value = self.get(key, default)
        if value is None:
            if required:
                raise DFlashError(f"{self.path}: required key '{key}' is missing (looked in dflash_config and top level)")
            return None
        if isinstance(value, bool) or not isinstance(value, (int, float)) or (
            isinstance(value, float) and not math.isfinite(value)  # json accepts NaN / Infinity
        ) or int(value) != value:
            raise DFlashError(f"{self.path}: '{self.where(key)}' must be an integer, got {bounds.quote(value)}")
        value = int(value)
        if minimum is not None and value < minimum:
            raise DFlashError(f"{self.path}: '{self.where(key)}' must be >= {minimum}, got {value}")
        if value > maximum:  # also what the GGUF field that carries it can hold
            raise DFlashError(f"{self.path}: '{self.where(key)}' must be <= {maximum}, got {bounds.quote(value)}")
        return value

    def float(self, key: str, default: Any = None, *, required: bool = False) -> float | None:
        value = self.get(key, default)
        if value is None:
            if required:
                raise DFlashError(f"{self.path}: required key '{key}' is missing (looked in dflash_config and top level)")
            return None
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
            raise DFlashError(f"{self.path}: '{self.where(key)}' must be a finite number, got {bounds.quote(value)}")
        if abs(value) > bounds.F32_MAX:  # stored as a GGUF f32
            raise DFlashError(f"{self.path}: '{self.where(key)}' = {value!r} does not fit a 32-bit float (|x| <= 3.4e38)")
        return float(value)

    def bool(self, key: str) -> bool | None:
        value = self.get(key)
        if value is None:
            return None
        if not isinstance(value, bool):
            raise DFlashError(f"{self.path}: '{self.where(key)}' must be true or false, got {value!r}")
        return value


def _rope_theta(view: _ConfigView) -> float:
    # transformers-5 configs move rope_theta into rope_parameters (and sometimes rope_scaling).
    for holder in ("rope_parameters", "rope_scaling"):
        params = view.get(holder)
        if isinstance(params, Mapping) and params.get("rope_theta") is not None:
            sub = _ConfigView(params, f"{view.path} ({holder})")
            return sub.float("rope_theta")  # type: ignore[return-value]
    theta = view.float("rope_theta")
    if theta is None:
        raise DFlashError(
            f"{view.path}: required key 'rope_theta' is missing (looked in dflash_config, top level and rope_parameters)"
        )
    return theta


def _partial_rotary_factor(view: _ConfigView) -> float | None:
    factor = view.float("partial_rotary_factor")
    if factor is None:
        params = view.get("rope_parameters")
        if isinstance(params, Mapping) and params.get("partial_rotary_factor") is not None:
            factor = _ConfigView(params, view.path).float("partial_rotary_factor")
    return factor


def spec_from_hf_config(config: Mapping[str, Any], path: str = "config.json") -> DrafterSpec:
    """Validate an HF drafter ``config.json`` (any schema in the wild) into a `DrafterSpec`."""
    if not isinstance(config, Mapping):
        raise DFlashError(f"{path}: expected a JSON object at the top level")
    view = _ConfigView(config, path)

    archs = config.get("architectures") or [ARCH_DFLASH]
    if isinstance(archs, str):  # a bare string is accepted as a one-element list
        archs = [archs]
    if not isinstance(archs, list) or not archs:
        raise DFlashError(f"{path}: 'architectures' must be a non-empty list")
    architecture = archs[0]
    if not isinstance(architecture, str) or architecture not in KNOWN_ARCHITECTURES:
        raise DFlashError(
            f"{path}: architecture {bounds.quote(architecture)} is not a DFlash drafter "
            f"(expected one of {', '.join(KNOWN_ARCHITECTURES)})"
        )

    hidden = view.int("hidden_size", required=True, minimum=1, maximum=bounds.MAX_WIDTH)
    n_layers = view.int("num_hidden_layers", required=True, minimum=1, maximum=bounds.MAX_LAYERS)
    n_heads = view.int("num_attention_heads", required=True, minimum=1, maximum=bounds.MAX_WIDTH)
    n_kv = view.int("num_key_value_heads", n_heads, minimum=1, maximum=bounds.MAX_WIDTH)
    if n_heads % n_kv:
        raise DFlashError(
            f"{path}: num_attention_heads ({n_heads}) must be a multiple of num_key_value_heads ({n_kv})"
        )
    # Like transformers: head_dim defaults to hidden // heads (odd Gemma head counts included).
    head_dim = view.int("head_dim", hidden // n_heads, minimum=1, maximum=bounds.MAX_WIDTH)
    intermediate = view.int("intermediate_size", required=True, minimum=1, maximum=bounds.MAX_WIDTH)
    eps = view.float("rms_norm_eps", 1e-6)
    rope_theta = _rope_theta(view)
    context_length = view.int("max_position_embeddings", 32768, minimum=1)
    block_size = view.int("block_size", 16, minimum=1, maximum=bounds.MAX_BLOCK_SIZE)
    mask_token_id = view.int("mask_token_id", maximum=bounds.MAX_VOCAB)
    vocab_size = view.int("vocab_size", minimum=1, maximum=bounds.MAX_VOCAB)
    num_target_layers = view.int("num_target_layers", minimum=1, maximum=bounds.MAX_LAYERS)

    raw_ids = view.get("target_layer_ids")
    defaulted = False
    if raw_ids is None:
        if num_target_layers is None:
            raise DFlashError(
                f"{path}: neither 'target_layer_ids' nor 'num_target_layers' is set, so the tap layers are unknown "
                "— add dflash_config.target_layer_ids"
            )
        ids = tuple(build_target_layer_ids(num_target_layers, n_layers))
        defaulted = True
    else:
        if not isinstance(raw_ids, list) or not raw_ids or not all(
            isinstance(i, int) and not isinstance(i, bool) for i in raw_ids
        ) or len(raw_ids) > bounds.MAX_LAYERS:
            raise DFlashError(
                f"{path}: '{view.where('target_layer_ids')}' must be a non-empty list of integers, got {bounds.quote(raw_ids)}"
            )
        ids = tuple(raw_ids)
    if any(i < 0 for i in ids):
        raise DFlashError(f"{path}: '{view.where('target_layer_ids')}' has a negative id: {list(ids)}")
    if ids[-1] >= bounds.MAX_LAYERS:
        raise DFlashError(f"{path}: '{view.where('target_layer_ids')}' has an id above {bounds.MAX_LAYERS - 1}: {ids[-1]}")
    if list(ids) != sorted(set(ids)):
        raise DFlashError(f"{path}: '{view.where('target_layer_ids')}' must be sorted and unique, got {list(ids)}")
    if num_target_layers is not None and ids[-1] >= num_target_layers:
        raise DFlashError(
            f"{path}: target layer id {ids[-1]} is past the target's last layer (num_target_layers = {num_target_layers})"
        )

    # Sliding-window attention: per-layer `layer_types` (Qwen3.5/3.6, Gemma-4) or dflash_config.use_swa.
    layer_types = view.get("layer_types")
    window = view.int("swa_window_size", maximum=bounds.I32_MAX) or view.int("sliding_window", maximum=bounds.I32_MAX)
    pattern: tuple[bool, ...] | None = None
    if view.bool("use_swa"):
        pattern = (True,) * n_layers
    elif layer_types is not None:
        if not isinstance(layer_types, list) or len(layer_types) != n_layers:
            raise DFlashError(
                f"{path}: 'layer_types' must list one entry per layer ({n_layers}), got {bounds.quote(layer_types)}"
            )
        unknown = sorted({bounds.quote(t) for t in layer_types if t not in ("sliding_attention", "full_attention")})
        if unknown:
            raise DFlashError(
                f"{path}: 'layer_types' has unknown entries {unknown} (expected sliding_attention / full_attention)"
            )
        if "sliding_attention" in layer_types:
            pattern = tuple(t == "sliding_attention" for t in layer_types)
    elif view.bool("use_sliding_window") and window:
        pattern = (True,) * n_layers
    if pattern is not None and not window:
        raise DFlashError(f"{path}: sliding-window layers are configured but 'sliding_window' is not set")
    if pattern is None:
        window = None

    causal = view.bool("is_causal")
    if causal is None:
        causal = view.bool("causal")

    softcap = view.float("final_logit_softcapping")
    if softcap is not None and softcap <= 0:
        softcap = None  # the reference treats <= 0 as "no softcap"
    prf = _partial_rotary_factor(view)
    rope_dims = None
    if prf is not None and not 0 < prf <= 1:
        raise DFlashError(f"{path}: 'partial_rotary_factor' must lie in (0, 1], got {prf!r}")
    if prf is not None and prf != 1.0:
        rope_dims = int(head_dim * prf)

    conv: dict[str, int | None] = {}
    for key in ("conv_kernel_size", "conv_group_size", "selector_rank", "selector_top_k"):
        conv[key] = view.int(key, required=architecture == ARCH_DFLASH2, minimum=1, maximum=bounds.MAX_WIDTH)
    if architecture == ARCH_DFLASH2 and hidden % conv["conv_group_size"]:  # type: ignore[operator]
        raise DFlashError(
            f"{path}: hidden_size ({hidden}) must be a multiple of conv_group_size ({conv['conv_group_size']})"
        )

    attention_bias = view.bool("attention_bias") or False
    torch_dtype = view.get("torch_dtype") or view.get("dtype")
    return DrafterSpec(
        architecture=architecture,
        hidden_size=hidden,
        n_layers=n_layers,
        n_heads=n_heads,
        n_kv_heads=n_kv,
        head_dim=head_dim,
        intermediate_size=intermediate,
        rms_norm_eps=eps,  # type: ignore[arg-type]
        rope_theta=rope_theta,
        context_length=context_length,
        block_size=block_size,
        target_layer_ids=ids,
        mask_token_id=mask_token_id,
        vocab_size=vocab_size,
        num_target_layers=num_target_layers,
        sliding_window=window,
        sliding_window_pattern=pattern,
        causal=causal,
        final_logit_softcapping=softcap,
        embedding_scale=view.float("input_embedding_scale"),
        logit_scale=view.float("output_multiplier"),
        attention_value_scale=view.float("attention_value_scale"),
        rope_dimension_count=rope_dims,
        attention_bias=attention_bias,
        torch_dtype=str(torch_dtype) if torch_dtype is not None else None,
        target_layer_ids_defaulted=defaulted,
        **conv,  # type: ignore[arg-type]
    )


def read_config_json(directory: str | Path) -> dict[str, Any]:
    """``directory/config.json`` as a dict (one-line DFlashError when absent or not JSON)."""
    path = Path(directory) / "config.json"
    if not path.is_file():
        raise DFlashError(f"{directory}: no config.json — expected an HF drafter checkpoint directory")
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise DFlashError(f"{path}: cannot read JSON ({exc})") from None
    config = bounds.loads_json(text, str(path))
    if not isinstance(config, dict):
        raise DFlashError(f"{path}: expected a JSON object at the top level")
    return config


def load_hf_config(directory: str | Path) -> tuple[dict[str, Any], DrafterSpec]:
    """Read and validate ``directory/config.json``."""
    config = read_config_json(directory)
    spec = spec_from_hf_config(config, str(Path(directory) / "config.json"))
    if spec.name is None:
        spec = _with_name(spec, Path(directory).resolve().name)
    return config, spec


def _with_name(spec: DrafterSpec, name: str) -> DrafterSpec:
    from dataclasses import replace

    return replace(spec, name=name)
