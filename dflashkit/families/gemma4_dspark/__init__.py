"""Gemma-4 DSpark (``Gemma4DSparkModel``): a DSpark drafter on a Gemma-4 backbone.

Read as llama.cpp's converter reads it (``conversion/gemma.py`` ``Gemma4DSparkModel``, a DFlash
converter, not a DSpark one: no ``d2t`` — it requires a full draft vocabulary). Requirements, checked
in llama.cpp's order and refused with its reason plus the config key: ``attention_k_eq_v`` (keys double
as values: no ``v_proj``), uniform ``full_attention`` ``layer_types``, ``hidden_activation``
gelu_pytorch_tanh, no ``attention_bias`` / ``enable_moe_block``, ``draft_vocab_size`` = ``vocab_size``,
a vanilla Markov head (``dflash_config`` first, then top level), ``rope_parameters.full_attention``
of type default or proportional, ``global_head_dim`` and ``num_global_key_value_heads``,
``mask_token_id``, ``target_layer_ids``, no ``final_logit_softcapping``; ``lm_head.weight`` (mainline llama.cpp
requires it even with ``tie_word_embeddings``).

What it writes beyond DFlash: the attention runs on the global head dim and KV heads
(``head_count_kv``, ``key_length``, ``value_length`` take those values in the base keys' positions —
gguf-py overwrites a duplicated key where it first stood), ``rope.dimension_count`` = global head dim,
``embedding_scale`` = sqrt(hidden), ``attention.scale`` 1.0, ``hidden_activation``, the DSpark flags;
``rope_freqs.weight`` for proportional RoPE (1.0 for the rotated dims, 1e30 for the rest), written
first. Tensor renames (Gemma's sandwich norms): ``post_attention_layernorm`` → ``post_attention_norm``,
``pre_feedforward_layernorm`` → ``ffn_norm``, ``post_feedforward_layernorm`` → ``post_ffw_norm``,
``layer_scalar`` → ``layer_output_scale.weight``, ``confidence_proj.`` → ``confidence_head.proj.``.

Canonical ids: Gemma's pre-FFN norm takes z-lab's id for the pre-FFN norm
(``layers.N.post_attention_layernorm.weight``, llama.cpp's ``ffn_norm``); Gemma's norm after attention
is ``layers.N.post_attention_norm.weight``; ``layers.N.layer_scalar.weight``; ``rope_freqs.weight``.
"""

from __future__ import annotations

import math
import re
from dataclasses import replace
from typing import Any, Mapping

import numpy as np
from gguf import GGUFValueType

from ...errors import DFlashError
from ...io.gguf_writer import MetadataEntry
from ...spec import ConfigView, DrafterSpec
from ..dspark import CONF_B, CONF_W, DSpark, dspark_flags, dspark_hf_to_canonical

ARCH_GEMMA4_DSPARK = "Gemma4DSparkModel"
ROPE_FREQS = "rope_freqs.weight"
#: Gemma-4 HF name (``model.`` stripped) → canonical id, per layer
_GEMMA_LAYER_NAMES = {
    "post_attention_layernorm.weight": "post_attention_norm.weight",
    "pre_feedforward_layernorm.weight": "post_attention_layernorm.weight",
    "post_feedforward_layernorm.weight": "post_feedforward_layernorm.weight",
    "layer_scalar": "layer_scalar.weight",
    "layer_scalar.weight": "layer_scalar.weight",
}
#: Gemma4TextConfig's default when rope_parameters is absent (llama.cpp uses the same)
_DEFAULT_ROPE = {"rope_type": "proportional", "partial_rotary_factor": 0.25, "rope_theta": 1000000.0}


class Gemma4DSpark(DSpark):
    name = "gemma4-dspark"
    priority = 70
    architectures = (ARCH_GEMMA4_DSPARK,)
    own_backbone = True
    runtime_class = "dflashkit.families.gemma4_dspark.runtime:Gemma4DSparkDraftModel"
    folder_modules = ("runtime",)
    labels = {None: "Gemma-4 DSpark", "llama.cpp": "Gemma-4 DSpark (llama.cpp GGUF)"}
    #: always its own full-vocabulary head (llama.cpp's converter writes it)
    own_head = True
    gguf_architecture_note = ""
    llama_cpp_tensor_names = {
        ROPE_FREQS: "rope_freqs.weight",
        "layers.{bid}.post_attention_norm.weight": "blk.{bid}.post_attention_norm.weight",
        "layers.{bid}.post_feedforward_layernorm.weight": "blk.{bid}.post_ffw_norm.weight",
        "layers.{bid}.layer_scalar.weight": "blk.{bid}.layer_output_scale.weight",
    }
    metadata_fields = frozenset({"embedding_scale", "attention_scale", "hidden_act", "sample_from_anchor", "has_confidence_head"})
    final_tensors = ()
    layout = "specforge"

    def matches(self, config: Mapping[str, Any], architecture: str) -> bool:
        return architecture == ARCH_GEMMA4_DSPARK

    def matches_gguf(self, fields: Mapping[str, Any]) -> bool:
        return fields.get("has_confidence_head") is not None and fields.get("attention_scale") is not None

    def owns(self, spec: DrafterSpec) -> bool:
        return spec.architecture == ARCH_GEMMA4_DSPARK

    def hf_to_canonical(self, hf_name: str) -> str | None:
        name = hf_name[len("model."):] if hf_name.startswith("model.") else hf_name
        name = name.replace("confidence_proj.", "confidence_head.proj.")
        if name == ROPE_FREQS:
            return name
        m = re.match(r"^layers\.(\d+)\.(.+)$", name)
        if m and m.group(2) in _GEMMA_LAYER_NAMES:
            return f"layers.{m.group(1)}.{_GEMMA_LAYER_NAMES[m.group(2)]}"
        if m and m.group(2) == "self_attn.v_proj.weight":
            return None  # k_eq_v: a v_proj is a tensor this family does not know
        return dspark_hf_to_canonical(name)

    # ---- config → spec --------------------------------------------------------------------------
    def spec_from_config(self, config: Mapping[str, Any], view: ConfigView, architecture: str, path: str) -> DrafterSpec:
        def refuse(reason: str, key: str, value: Any) -> DFlashError:
            return DFlashError(f"{path}: Gemma4 DSpark {reason} ('{key}' is {value!r})")

        n_layers = view.int("num_hidden_layers", required=True, minimum=1)
        if config.get("attention_k_eq_v", False) is not True:
            raise refuse("currently requires attention_k_eq_v", "attention_k_eq_v", config.get("attention_k_eq_v"))
        if config.get("layer_types") != ["full_attention"] * n_layers:
            raise refuse("currently requires uniform full_attention layer types", "layer_types", config.get("layer_types"))
        act = config.get("hidden_activation", "gelu_pytorch_tanh")
        if act != "gelu_pytorch_tanh":
            raise refuse("currently requires hidden_activation=gelu_pytorch_tanh", "hidden_activation", act)
        for key in ("attention_bias", "enable_moe_block"):
            if config.get(key, False):
                raise refuse("attention bias and MoE are not supported", key, config.get(key))
        vocab = view.int("vocab_size", required=True, minimum=1)
        draft = config.get("draft_vocab_size") or vocab
        if draft != vocab:
            raise refuse(f"currently requires a full draft vocabulary (vocab_size {vocab})", "draft_vocab_size", draft)
        nested = view.nested
        markov = nested.get("markov_head_type", config.get("markov_head_type", "vanilla"))
        if markov != "vanilla":
            key = "dflash_config.markov_head_type" if "markov_head_type" in nested else "markov_head_type"
            raise refuse("currently requires a vanilla Markov head", key, markov)
        rope_all = config.get("rope_parameters") or {"full_attention": dict(_DEFAULT_ROPE)}
        if not isinstance(rope_all, Mapping):
            raise refuse("requires rope_parameters to be an object", "rope_parameters", rope_all)
        rope = rope_all.get("full_attention", rope_all)
        if not isinstance(rope, Mapping) or rope.get("rope_type") not in ("default", "proportional"):
            raise refuse("requires default or proportional RoPE", "rope_parameters.full_attention.rope_type",
                         rope.get("rope_type") if isinstance(rope, Mapping) else rope)
        for key in ("global_head_dim", "num_global_key_value_heads"):
            if config.get(key) is None:
                raise DFlashError(f"{path}: Gemma4 DSpark requires '{key}' (the full-attention layers' head geometry)")
        head_dim = view.int("global_head_dim", minimum=1)
        n_kv = view.int("num_global_key_value_heads", minimum=1)
        if view.get("mask_token_id") is None:
            raise DFlashError(f"{path}: Gemma4 DSpark requires mask_token_id (dflash_config.mask_token_id or top level)")
        if not view.get("target_layer_ids"):
            raise DFlashError(f"{path}: Gemma4 DSpark requires target_layer_ids (dflash_config.target_layer_ids)")
        if config.get("final_logit_softcapping"):
            raise refuse("logit softcapping is not supported", "final_logit_softcapping", config.get("final_logit_softcapping"))

        theta = rope.get("rope_theta", 1000000.0)
        factor = rope.get("partial_rotary_factor", 0.25) if rope.get("rope_type") == "proportional" else None
        freq_factors = None
        if factor is not None:
            if isinstance(factor, bool) or not isinstance(factor, (int, float)):
                raise refuse("partial_rotary_factor must be numeric", "rope_parameters.full_attention.partial_rotary_factor", factor)
            n_rot = int(head_dim * float(factor) / 2)
            if not 0 < factor <= 1 or head_dim * float(factor) != 2 * n_rot:
                raise refuse("rotary dimension count must be positive and even",
                             "rope_parameters.full_attention.partial_rotary_factor", factor)
            freq_factors = (1.0,) * n_rot + (1e30,) * (head_dim // 2 - n_rot)

        # the z-lab rules on the geometry the full-attention layers use (sliding layers are refused above)
        backbone = {
            **{k: v for k, v in config.items() if k not in ("rope_parameters", "sliding_window", "layer_types")},
            "head_dim": head_dim,
            "num_key_value_heads": n_kv,
            "rope_parameters": {"rope_type": "default", "rope_theta": theta},
        }
        backbone.pop("use_sliding_window", None)
        backbone_view = ConfigView(backbone, path)
        spec = super(DSpark, self).spec_from_config(backbone, backbone_view, architecture, path)
        sample = config.get("sample_from_anchor", True)
        return replace(
            spec,
            rope_dimension_count=head_dim,
            embedding_scale=float(config["hidden_size"]) ** 0.5,
            attention_scale=1.0,
            hidden_act="gelu_pytorch_tanh",
            sample_from_anchor=bool(sample),
            draft_vocab_size=None,
            markov_rank=view.int("markov_rank", minimum=1),
            markov_head_type="vanilla",
            rope_freq_factors=freq_factors,
            layout=self.layout,
            # llama.cpp's GGUF has no key for tie_word_embeddings; lm_head presence is checked on the tensors
        )

    # ---- tensors --------------------------------------------------------------------------------
    def expected_tensors(self, spec: DrafterSpec, *, vocab_size: int | None = None) -> dict[str, tuple[int, ...]]:
        shapes = super().expected_tensors(spec, vocab_size=vocab_size)
        return {k: v for k, v in shapes.items() if not k.endswith("self_attn.v_proj.weight")}

    def _layer_extras(self, spec: DrafterSpec, prefix: str, shapes: dict[str, tuple[int, ...]]) -> None:
        h = spec.hidden_size
        shapes[prefix + "post_attention_norm.weight"] = (h,)
        shapes[prefix + "post_feedforward_layernorm.weight"] = (h,)
        shapes[prefix + "layer_scalar.weight"] = (1,)

    def _global_extras(self, spec: DrafterSpec, vocab_size: int | None, shapes: dict[str, tuple[int, ...]]) -> None:
        super()._global_extras(spec, vocab_size, shapes)
        shapes.pop("d2t", None)

    def optional_tensors(self, spec: DrafterSpec) -> dict[str, tuple[int, ...]]:
        shapes = super().optional_tensors(spec)
        shapes.pop("t2d", None)
        shapes[ROPE_FREQS] = (spec.head_dim // 2,)
        return shapes

    def check_source(self, spec: DrafterSpec, shapes: Mapping[str, tuple[int, ...]], source: str) -> None:
        if "lm_head.weight" not in shapes:
            # mainline llama.cpp (b11549) refuses it whatever tie_word_embeddings says (0.3.36 let a tied one through,
            # and its GGUF then had no output head: mainline's loader runs such a file with the target's head)
            raise DFlashError(
                f"{source}: Gemma4 DSpark requires lm_head.weight — mainline llama.cpp refuses a drafter without it "
                "even with tie_word_embeddings: true (its loader would run the file with the target's head); add "
                "lm_head.weight (a copy of embed_tokens.weight for a tied drafter)"
            )

    def dropped_on_convert(self, spec: DrafterSpec) -> frozenset[str]:
        return frozenset()  # full vocabulary, own lm_head kept as output.weight

    def generated_tensors(self, spec: DrafterSpec) -> dict[str, np.ndarray]:
        if spec.rope_freq_factors is None:
            return {}
        return {ROPE_FREQS: np.asarray(spec.rope_freq_factors, dtype=np.float32)}

    def refine_spec(self, spec: DrafterSpec, shapes: Mapping[str, tuple[int, ...]]) -> DrafterSpec:
        spec = super().refine_spec(spec, shapes)
        return replace(spec, draft_vocab_size=None)

    # ---- metadata -------------------------------------------------------------------------------
    def extra_metadata(self, spec: DrafterSpec, dialect: Any, arch: str) -> list[MetadataEntry]:
        # llama.cpp writes these after the DFlash keys (embedding_scale included: its own add_*, not the base's)
        return [
            MetadataEntry(f"{arch}.embedding_scale", float(spec.embedding_scale or math.sqrt(spec.hidden_size)), GGUFValueType.FLOAT32),
            MetadataEntry(f"{arch}.attention.scale", float(spec.attention_scale if spec.attention_scale is not None else 1.0), GGUFValueType.FLOAT32),
            MetadataEntry(f"{arch}.hidden_activation", spec.hidden_act or "gelu_pytorch_tanh", GGUFValueType.STRING),
            *dspark_flags(spec, arch),
        ]


FAMILY = Gemma4DSpark.instance

__all__ = ["ARCH_GEMMA4_DSPARK", "CONF_B", "CONF_W", "FAMILY", "Gemma4DSpark"]
