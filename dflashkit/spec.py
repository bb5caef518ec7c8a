"""One validated, typed description of a DFlash drafter.

`DrafterSpec` is what every command agrees on: a drafter family (`dflashkit.families`) builds it from
an HF ``config.json``,
the dialect tables encode it into GGUF metadata and decode it back, Inspect checks it and Diff
compares two of them. Target layer ids are always held in the HF convention (decoder-layer ids,
as in z-lab's ``dflash_config.target_layer_ids``); dialects convert on the way in and out.
"""

from __future__ import annotations

import os

import math
import re
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path
from typing import Any, Mapping

from . import bounds
from .errors import DFlashError
from .files import file_kind, read_json

@dataclass(frozen=True)
class DrafterSpec:
    """Everything a runtime needs to know about a drafter besides its tensors."""

    architecture: str  # HF architectures[0]; its family (`dflashkit.families`) owns it
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
    # the per-layer causality the checkpoint's reference runs, where one GGUF flag cannot say it
    # (dflashkit.attention.causal_layers; `dflashkit.causality`): information, not part of the model's identity
    reference_causal_layers: tuple[bool, ...] | None = field(default=None, compare=False)
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
    # ---- zoo semantics (issue 13): None / default = absent from the checkpoint ----------------------
    # RoPE scaling as llama.cpp's converter reads it: {"type": "yarn"|"linear", "factor": float,
    # "original_context_length": int, optional yarn extras "ext_factor", "attn_factor", "beta_fast", "beta_slow"}
    rope_scaling: tuple[tuple[str, Any], ...] | None = None
    rope_is_neox_style: bool = True  # False: interleaved-RoPE checkpoint, q/k permuted to NeoX at conversion
    hidden_act: str | None = None  # "silu" (default when None), "gelu", "gelu_pytorch_tanh"
    # which block slots predict: True = slot 0 predicts too (llama.cpp's default when the key is absent)
    sample_from_anchor: bool | None = None
    draft_vocab_size: int | None = None  # rows of the drafter's own output head (with d2t) when reduced
    markov_rank: int | None = None  # DSpark Markov head rank
    markov_head_type: str | None = None  # DSpark: only "vanilla" converts
    has_confidence_head: bool | None = None  # DSpark
    layout: str | None = None  # checkpoint layout, e.g. "zlab", "speculators", "specforge" (information)
    # True when target_layer_ids came from z-lab's default rule, not from the config.
    target_layer_ids_defaulted: bool = field(default=False, compare=False)
    # ---- DSpark / Gemma-4 DSpark (issue 13) ----------------------------------------------------------
    attention_scale: float | None = None  # attention softmax scale (Gemma-4 DSpark: 1.0); None = 1/sqrt(head_dim)
    # per-dimension RoPE frequency factors (llama.cpp's rope_freqs.weight; Gemma-4 proportional RoPE)
    rope_freq_factors: tuple[float, ...] | None = field(default=None, compare=False)
    # ---- chain drafters fed by a fused projection of target features (EAGLE-3) ----------------------
    target_hidden_size: int | None = None  # width of each tapped target state when it differs from hidden_size
    norm_before_residual: bool | None = None  # the layer's residual is the normed fused state
    norm_before_fc: bool | None = None  # one RMSNorm over the concatenated taps before ``fc``

    @property
    def n_taps(self) -> int:
        return len(self.target_layer_ids)

    @property
    def target_width(self) -> int:
        """Width of one tapped target hidden state (the target's hidden size)."""
        return self.target_hidden_size or self.hidden_size

    @property
    def fc_input_width(self) -> int:
        return self.n_taps * self.target_width

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


class ConfigView:
    """Looks values up in ``dflash_config`` first, then top-level (the rule every z-lab schema follows).

    Shared validation helpers for the families' config rules (`dflashkit.families`): each typed getter
    raises a one-line DFlashError naming the file and the key."""

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


def rope_theta_of(view: ConfigView) -> float:
    # transformers-5 configs move rope_theta into rope_parameters (and sometimes rope_scaling).
    for holder in ("rope_parameters", "rope_scaling"):
        params = view.get(holder)
        if isinstance(params, Mapping) and params.get("rope_theta") is not None:
            sub = ConfigView(params, f"{view.path} ({holder})")
            return sub.float("rope_theta")  # type: ignore[return-value]
    theta = view.float("rope_theta")
    if theta is None:
        raise DFlashError(
            f"{view.path}: required key 'rope_theta' is missing (looked in dflash_config, top level and rope_parameters)"
        )
    return theta


def partial_rotary_factor_of(view: ConfigView) -> float | None:
    factor = view.float("partial_rotary_factor")
    if factor is None:
        params = view.get("rope_parameters")
        if isinstance(params, Mapping) and params.get("partial_rotary_factor") is not None:
            factor = ConfigView(params, view.path).float("partial_rotary_factor")
    return factor


def read_config_json(directory: str | Path) -> dict[str, Any]:
    """``directory/config.json`` as a dict (one-line DFlashError when absent or not JSON)."""
    path = Path(directory) / "config.json"
    if not path.is_file():
        if os.path.lexists(path):  # a directory, FIFO, socket or device by that name: say what it is
            raise DFlashError(f"{path}: is {file_kind(path)}, not a file — config.json must be a JSON file")
        raise DFlashError(f"{directory}: no config.json — expected an HF drafter checkpoint directory")
    config = read_json(path)
    if not isinstance(config, dict):
        raise DFlashError(f"{path}: expected a JSON object at the top level")
    return config


def split_bid(canonical: str) -> tuple[str, str | None]:
    """A canonical tensor id (the families' and dialects' shared naming) as its layer template and layer:
    ``layers.3.mlp.up_proj.weight`` → (``layers.{bid}.mlp.up_proj.weight``, ``"3"``)."""
    m = re.match(r"^layers\.(\d+)\.(.+)$", canonical)
    if m:
        return "layers.{bid}." + m.group(2), m.group(1)
    return canonical, None
