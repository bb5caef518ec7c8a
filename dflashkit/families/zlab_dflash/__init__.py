"""z-lab DFlash (``DFlashDraftModel``): the original block-diffusion drafter.

Config rules: every z-lab / speculators / Luce schema in the wild — values live in
``dflash_config`` or at the top level (`ConfigView`), transformers-5 ``rope_parameters``,
sliding-window layers, partial rotary, Gemma-4 scalings. Tensors: z-lab's HF names, optionally
under ``model.``; the DFlash 2 names are known too (so a DFlash checkpoint carrying them is
reported as "tensors this config does not use", not as unknown names).

The zoo variants, as llama.cpp's converter (``conversion/qwen.py`` ``DFlashModel``) treats them:
RoPE scaling (`rope_scaling_of`), interleaved RoPE (``rope_is_neox_style: false``: q/k and their
norms permuted to NeoX order, `interleaved_to_neox`, via `rewrites` / `sanitize_for`), ``hidden_act``
gelu (written as ``dflash.hidden_activation``, which llama.cpp's converter omits), attention sinks
(every HF spelling → one canonical id), self-contained embeddings/head. No target_layer_ids is an
error naming ``--target-layer-ids``: z-lab's old default rule is not applied.
"""

from __future__ import annotations

from typing import Any, Mapping

import numpy as np
from gguf import GGUFValueType

from ... import bounds
from ...errors import DFlashError
from ...io.gguf_writer import MetadataEntry
from ...spec import (
    ConfigView,
    DrafterSpec,
    build_target_layer_ids,
    partial_rotary_factor_of,
    rope_theta_of,
    split_bid,
)
from ..base import DrafterFamily

#: z-lab DFlash's HF architecture string
ARCH_DFLASH = "DFlashDraftModel"

#: Canonical tensor templates of the z-lab lineage (``{bid}`` = layer index); both DFlash generations.
ZLAB_TENSORS: tuple[str, ...] = (
    "fc.weight",
    "hidden_norm.weight",
    "norm.weight",
    "embed_tokens.weight",
    "lm_head.weight",
    "layers.{bid}.input_layernorm.weight",
    "layers.{bid}.self_attn.q_proj.weight",
    "layers.{bid}.self_attn.k_proj.weight",
    "layers.{bid}.self_attn.v_proj.weight",
    "layers.{bid}.self_attn.o_proj.weight",
    "layers.{bid}.self_attn.q_proj.bias",
    "layers.{bid}.self_attn.k_proj.bias",
    "layers.{bid}.self_attn.v_proj.bias",
    "layers.{bid}.self_attn.o_proj.bias",
    "layers.{bid}.self_attn.q_norm.weight",
    "layers.{bid}.self_attn.k_norm.weight",
    # attention sinks (gpt-oss ``sinks``, MiMo ``attention_sink_bias``): one logit per head
    "layers.{bid}.self_attn.sinks",
    "layers.{bid}.post_attention_layernorm.weight",
    "layers.{bid}.mlp.gate_proj.weight",
    "layers.{bid}.mlp.up_proj.weight",
    "layers.{bid}.mlp.down_proj.weight",
    # DFlash 2
    "layers.{bid}.attention_conv.base_kernel",
    "layers.{bid}.attention_conv.kernel_projection.weight",
    "layers.{bid}.mlp_conv.base_kernel",
    "layers.{bid}.mlp_conv.kernel_projection.weight",
    "candidate_selector.predecessor_codebook.weight",
    "candidate_selector.successor_codebook.weight",
    "candidate_selector.hidden_projection.weight",
)
_ZLAB_TEMPLATES = frozenset(ZLAB_TENSORS)

#: HF checkpoints store the DFlash 2 codebooks with or without ``.weight``.
HF_ALIASES: dict[str, str] = {
    "candidate_selector.predecessor_codebook": "candidate_selector.predecessor_codebook.weight",
    "candidate_selector.successor_codebook": "candidate_selector.successor_codebook.weight",
}


#: Other HF spellings of a per-layer tensor (llama.cpp's gguf-py maps all of them to ``attn_sinks``;
#: its DFlash converter appends ``.weight`` to any sink name without it).
HF_LAYER_ALIASES: dict[str, str] = {
    f"layers.{{bid}}.self_attn.{name}{suffix}": "layers.{bid}.self_attn.sinks"
    for name in ("sinks", "attention_sink_bias", "learnable_sink_param")
    for suffix in ("", ".weight")
    if (name, suffix) != ("sinks", "")
}

#: q/k projections and norms that an interleaved-RoPE checkpoint (``rope_is_neox_style: false``)
#: stores per head as (re, im) pairs; llama.cpp's DFlash graph ropes NeoX-style (halves).
_ROPE_PERMUTED = ("self_attn.q_proj.weight", "self_attn.k_proj.weight", "self_attn.q_norm.weight", "self_attn.k_norm.weight")

#: hidden_act values llama.cpp's DFlash loader runs (``dflash.hidden_activation``; absent = silu)
HIDDEN_ACTIVATIONS = ("silu", "gelu", "gelu_pytorch_tanh")


def zlab_hf_to_canonical(hf_name: str) -> str | None:
    """Canonical id of a z-lab HF tensor name (``model.`` prefix stripped, codebook aliases resolved)."""
    name = hf_name[len("model."):] if hf_name.startswith("model.") else hf_name
    name = HF_ALIASES.get(name, name)
    template, bid = split_bid(name)
    if template in HF_LAYER_ALIASES:
        template = HF_LAYER_ALIASES[template]
        name = template.replace("{bid}", bid or "")
    return name if template in _ZLAB_TEMPLATES else None


def interleaved_to_neox(array: np.ndarray, head_dim: int) -> np.ndarray:
    """Per head, the even dims first, then the odd ones (rows of a projection, entries of a norm):
    what llama.cpp's DFlash converter does to q/k of a ``rope_is_neox_style: false`` checkpoint
    (``reshape(-1, head_dim // 2, 2, *rest).transpose(1, 2)``). Any dtype: only data moves."""
    shape = array.shape
    return np.ascontiguousarray(array.reshape((-1, head_dim // 2, 2) + shape[1:]).swapaxes(1, 2)).reshape(shape)


def _rope_entry(config: Mapping[str, Any], path: str) -> Mapping[str, Any] | None:
    """The RoPE dict llama.cpp's converter reads: ``rope_parameters``, else ``rope_scaling``, its
    ``full_attention`` entry when per layer type (None when there is none)."""
    rope = config.get("rope_parameters") or config.get("rope_scaling") or {}
    if not isinstance(rope, Mapping):
        raise DFlashError(f"{path}: 'rope_parameters' / 'rope_scaling' must be an object, got {bounds.quote(rope)}")
    rope = rope.get("full_attention", rope)
    return rope if isinstance(rope, Mapping) else None


def rope_type_of(config: Mapping[str, Any], path: str) -> Any:
    """The config's RoPE type (``rope_type``, or transformers-4's ``type``) as `rope_scaling_of` reads it."""
    rope = _rope_entry(config, path)
    return None if rope is None else rope.get("rope_type", rope.get("type"))


def rope_scaling_of(config: Mapping[str, Any], path: str) -> tuple[tuple[str, Any], ...] | None:
    """RoPE scaling as llama.cpp's converter writes it, from config.json as transformers' AutoConfig
    normalises it (llama.cpp reads hparams through AutoConfig; transformers is not imported here).

    ``rope_parameters`` (transformers 5) or ``rope_scaling`` (4: ``type`` / ``rope_type``), a
    ``full_attention`` sub-dict when per layer type; yarn: ``original_max_position_embeddings``
    defaults to ``max_position_embeddings`` (transformers fills it so), extras only when present;
    linear: type + factor; su/longrope: type only; default/dynamic/llama3: nothing (llama.cpp writes
    nothing for them either)."""
    rope = _rope_entry(config, path)
    if rope is None:
        return None
    rope_type = rope.get("rope_type", rope.get("type"))
    factor = rope.get("factor")
    if rope_type in ("su", "longrope"):
        return (("type", "longrope"),)
    if rope_type not in ("linear", "yarn") or factor is None:
        return None
    where = "rope_parameters" if config.get("rope_parameters") else "rope_scaling"
    view = ConfigView(rope, path)
    pairs: list[tuple[str, Any]] = [("type", rope_type), ("factor", view.float("factor"))]
    if rope_type == "yarn":
        original = rope.get("original_max_position_embeddings", config.get("max_position_embeddings"))
        if original is None:
            raise DFlashError(f"{path}: YaRN '{where}' needs 'original_max_position_embeddings'")
        pairs.append(("original_context_length", ConfigView({"original_max_position_embeddings": original}, path).int("original_max_position_embeddings", minimum=1)))
        attn = rope.get("attention_factor", rope.get("attn_factor"))
        for field_name, value in (
            ("ext_factor", rope.get("extrapolation_factor")),
            ("attn_factor", attn),
            ("beta_fast", rope.get("beta_fast")),
            ("beta_slow", rope.get("beta_slow")),
        ):
            if value is not None:
                pairs.append((field_name, ConfigView({field_name: value}, f"{path} ({where})").float(field_name)))
    return tuple(pairs)


class ZLabDFlash(DrafterFamily):
    name = "zlab-dflash"
    gemma_target_embedding_scale = True
    priority = 20
    default = True
    architectures = (ARCH_DFLASH,)
    runtime_module = "dflash"
    runtime_class = "dflashkit.runtime.dflash:DFlashDraftModel"  # the shared block every family builds on
    labels = {"zlab": "z-lab DFlash", "llama.cpp": "DFlash (llama.cpp GGUF)"}
    #: the layout a spec that names none is labelled in (z-lab's own checkpoints)
    label_layout = "zlab"
    #: a plain `DrafterSpec` of this architecture runs in this family's block
    plain_runtime = True
    #: per-layer dynamic convolutions and a candidate selector (DFlash 2): tensors only llama.cpp's dialect names,
    #: and a selector over the target's full vocabulary
    conv_selector = False
    #: DFlash 2's conv/selector keys are required (DFlash reads them when present, as today)
    requires_conv = False

    def matches_gguf(self, fields: Mapping[str, Any]) -> bool:
        return fields.get("conv_kernel_size") is None

    def hf_to_canonical(self, hf_name: str) -> str | None:
        return zlab_hf_to_canonical(hf_name)

    def rewrites(self, spec: DrafterSpec, canonical: str) -> bool:
        return not spec.rope_is_neox_style and canonical.endswith(_ROPE_PERMUTED)

    def sanitize_for(self, spec: DrafterSpec, canonical: str, array: np.ndarray) -> np.ndarray:
        if self.rewrites(spec, canonical):
            return interleaved_to_neox(array, spec.head_dim)
        return array

    # ---- config → spec ---------------------------------------------------------------------------
    def spec_from_config(self, config: Mapping[str, Any], view: ConfigView, architecture: str, path: str) -> DrafterSpec:
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
        rope_theta = rope_theta_of(view)
        context_length = view.int("max_position_embeddings", 32768, minimum=1)
        block_size = view.int("block_size", 16, minimum=1, maximum=bounds.MAX_BLOCK_SIZE)
        mask_token_id = view.int("mask_token_id", maximum=bounds.MAX_VOCAB)
        vocab_size = view.int("vocab_size", minimum=1, maximum=bounds.MAX_VOCAB)
        num_target_layers = view.int("num_target_layers", minimum=1, maximum=bounds.MAX_LAYERS)

        raw_ids = view.get("target_layer_ids")
        if raw_ids is None:
            # z-lab's old evenly-spaced default rule is wrong for most published checkpoints (z-lab
            # removed it): the taps must come from the config or the user. The rule only shapes the
            # example of the flag's syntax.
            example = (
                build_target_layer_ids(num_target_layers, n_layers) if num_target_layers else [1, 9, 17, 25, 33]
            )
            raise DFlashError(
                f"{path}: no target_layer_ids (dflash_config or top level), so the target layers this drafter "
                f"taps are unknown — pass them from its model card or training config: --target-layer-ids "
                f"{','.join(str(i) for i in example)}"
            )
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
            # no layer_types: Qwen3Config derives them — sliding from layer max_window_layers (default 28) on
            first = view.int("max_window_layers", maximum=bounds.I32_MAX)
            first = 28 if first is None else first
            if first < n_layers:
                pattern = tuple(i >= first for i in range(n_layers))
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
        prf = partial_rotary_factor_of(view)
        rope_dims = None
        if prf is not None and not 0 < prf <= 1:
            raise DFlashError(f"{path}: 'partial_rotary_factor' must lie in (0, 1], got {prf!r}")
        if prf is not None and prf != 1.0:
            rope_dims = int(head_dim * prf)

        conv = self._conv_fields(view, hidden, path)

        attention_bias = view.bool("attention_bias") or False
        torch_dtype = view.get("torch_dtype") or view.get("dtype")
        # llama.cpp reads these two at the top level only
        neox = config.get("rope_is_neox_style", True)
        if not isinstance(neox, bool):
            raise DFlashError(f"{path}: 'rope_is_neox_style' must be true or false, got {bounds.quote(neox)}")
        hidden_act = config.get("hidden_act")
        if hidden_act is not None and hidden_act not in HIDDEN_ACTIVATIONS:
            raise DFlashError(
                f"{path}: hidden_act {bounds.quote(hidden_act)} is not supported (llama.cpp's DFlash loader runs "
                f"{', '.join(HIDDEN_ACTIVATIONS)})"
            )
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
            rope_scaling=rope_scaling_of(config, path),
            rope_is_neox_style=neox,
            # silu is the loader's default: no key (what llama.cpp's converter writes)
            hidden_act=hidden_act if hidden_act not in (None, "silu") else None,
            **conv,  # type: ignore[arg-type]
        )

    def _conv_fields(self, view: ConfigView, hidden: int, path: str) -> dict[str, int | None]:
        return {
            key: view.int(key, required=self.requires_conv, minimum=1, maximum=bounds.MAX_WIDTH)
            for key in ("conv_kernel_size", "conv_group_size", "selector_rank", "selector_top_k")
        }

    # ---- metadata ----------------------------------------------------------------------------------
    #: written here (after every dialect key, where llama.cpp's DSpark converter puts it), not by the table
    metadata_fields = frozenset({"sample_from_anchor"})

    def extra_metadata(self, spec: DrafterSpec, dialect: Any, arch: str) -> list[MetadataEntry]:
        # a drafter whose block slot 0 is the anchor (speculators DFlash / DFlash 2) must say so: the
        # loader reads a missing dflash.sample_from_anchor as true
        if spec.sample_from_anchor is None or dialect.key_for_field("sample_from_anchor", arch) is None:
            return []
        return [MetadataEntry(f"{arch}.sample_from_anchor", bool(spec.sample_from_anchor), GGUFValueType.BOOL)]

    # ---- tensor set ------------------------------------------------------------------------------
    def expected_tensors(self, spec: DrafterSpec, *, vocab_size: int | None = None) -> dict[str, tuple[int, ...]]:
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
            self._layer_extras(spec, p, shapes)
        self._global_extras(spec, vocab_size, shapes)
        return shapes

    def _layer_extras(self, spec: DrafterSpec, prefix: str, shapes: dict[str, tuple[int, ...]]) -> None:
        """Per-layer tensors a subclass adds (inserted right after each layer's own, in this order)."""

    def _global_extras(self, spec: DrafterSpec, vocab_size: int | None, shapes: dict[str, tuple[int, ...]]) -> None:
        """Tensors outside the layers a subclass adds (after all layers)."""

    def optional_tensors(self, spec: DrafterSpec) -> dict[str, tuple[int, ...]]:
        h, hd = spec.hidden_size, spec.head_dim
        head_rows = spec.draft_vocab_size or spec.vocab_size or -1
        shapes: dict[str, tuple[int, ...]] = {
            "embed_tokens.weight": (spec.vocab_size or -1, h),
            "lm_head.weight": (head_rows, h),
        }
        if spec.draft_vocab_size is not None:  # a reduced draft vocabulary (GGUF: d2t present)
            shapes["d2t"] = (spec.draft_vocab_size,)
        for i in range(spec.n_layers):
            p = f"layers.{i}.self_attn."
            shapes[p + "o_proj.bias"] = (h,)
            shapes[p + "sinks"] = (spec.n_heads,)
            if not spec.attention_bias:
                shapes[p + "q_proj.bias"] = (spec.n_heads * hd,)
                shapes[p + "k_proj.bias"] = (spec.n_kv_heads * hd,)
                shapes[p + "v_proj.bias"] = (spec.n_kv_heads * hd,)
        return shapes


FAMILY = ZLabDFlash.instance
