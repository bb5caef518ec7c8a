"""Rows more than one dialect's table is built from: llama.cpp's tensor names (the others rename a few), the common
hparam keys, RoPE scaling, the keys the Luce and dflash-draft loaders share, and the extension rows.
"""

from __future__ import annotations

from ..families import family_llama_cpp_tensor_names
from .table import KeySpec, T

# --------------------------------------------------------------------------------------------
# Tensor names
# --------------------------------------------------------------------------------------------

#: Canonical (HF) tensor ids → llama.cpp names. ``{bid}`` is the layer index.
_LLAMA_CPP_TENSORS: dict[str, str] = {
    "fc.weight": "fc.weight",
    "hidden_norm.weight": "enc.output_norm.weight",
    "norm.weight": "output_norm.weight",
    "embed_tokens.weight": "token_embd.weight",
    "lm_head.weight": "output.weight",
    "layers.{bid}.input_layernorm.weight": "blk.{bid}.attn_norm.weight",
    "layers.{bid}.self_attn.q_proj.weight": "blk.{bid}.attn_q.weight",
    "layers.{bid}.self_attn.k_proj.weight": "blk.{bid}.attn_k.weight",
    "layers.{bid}.self_attn.v_proj.weight": "blk.{bid}.attn_v.weight",
    "layers.{bid}.self_attn.o_proj.weight": "blk.{bid}.attn_output.weight",
    "layers.{bid}.self_attn.q_proj.bias": "blk.{bid}.attn_q.bias",
    "layers.{bid}.self_attn.k_proj.bias": "blk.{bid}.attn_k.bias",
    "layers.{bid}.self_attn.v_proj.bias": "blk.{bid}.attn_v.bias",
    "layers.{bid}.self_attn.o_proj.bias": "blk.{bid}.attn_output.bias",
    "layers.{bid}.self_attn.q_norm.weight": "blk.{bid}.attn_q_norm.weight",
    "layers.{bid}.self_attn.k_norm.weight": "blk.{bid}.attn_k_norm.weight",
    "layers.{bid}.post_attention_layernorm.weight": "blk.{bid}.ffn_norm.weight",
    "layers.{bid}.mlp.gate_proj.weight": "blk.{bid}.ffn_gate.weight",
    "layers.{bid}.mlp.up_proj.weight": "blk.{bid}.ffn_up.weight",
    "layers.{bid}.mlp.down_proj.weight": "blk.{bid}.ffn_down.weight",
    # a reduced draft vocabulary's map to target ids (speculators DFlash, DSpark)
    "d2t": "d2t",
    # attention sinks (llama.cpp's gguf-py: attn_sinks, F32 {n_head})
    "layers.{bid}.self_attn.sinks": "blk.{bid}.attn_sinks.weight",
}
#: What each family adds to llama.cpp's table (its own heads and layers, `DrafterFamily.llama_cpp_tensor_names`);
#: the other dialects' loaders have no names for them.
_FAMILY_TENSORS: dict[str, str] = family_llama_cpp_tensor_names()

#: tensors only llama.cpp's loader has names for (the Luce and dflash-draft loaders have none)
LLAMA_CPP_ONLY_TENSORS: frozenset[str] = frozenset({"layers.{bid}.self_attn.sinks", "d2t"})


# --------------------------------------------------------------------------------------------
# Metadata keys
# --------------------------------------------------------------------------------------------

_COMMON_HPARAMS = (
    KeySpec("context_length", "{arch}.context_length", T.UINT32, required=True),
    KeySpec("hidden_size", "{arch}.embedding_length", T.UINT32, required=True),
    KeySpec("n_layers", "{arch}.block_count", T.UINT32, required=True),
    KeySpec("intermediate_size", "{arch}.feed_forward_length", T.UINT32, required=True),
    KeySpec("n_heads", "{arch}.attention.head_count", T.UINT32, required=True),
    KeySpec("n_kv_heads", "{arch}.attention.head_count_kv", T.UINT32, required=True),
    KeySpec("head_dim", "{arch}.attention.key_length", T.UINT32, required=True),
    KeySpec("head_dim", "{arch}.attention.value_length", T.UINT32, required=True),
    KeySpec("rms_norm_eps", "{arch}.attention.layer_norm_rms_epsilon", T.FLOAT32, required=True),
    KeySpec("rope_theta", "{arch}.rope.freq_base", T.FLOAT32, required=True),
)

#: RoPE scaling as llama.cpp's converter writes it (``conversion/base.py`` ``set_gguf_parameters``), from
#: the spec's ``rope_scaling`` pairs (see `_derived_value`).
_ROPE_SCALING = (
    KeySpec("rope_scaling.type", "{arch}.rope.scaling.type", T.STRING),
    KeySpec("rope_scaling.factor", "{arch}.rope.scaling.factor", T.FLOAT32),
    KeySpec("rope_scaling.original_context_length", "{arch}.rope.scaling.original_context_length", T.UINT32),
    KeySpec("rope_scaling.ext_factor", "{arch}.rope.scaling.yarn_ext_factor", T.FLOAT32),
    KeySpec("rope_scaling.attn_factor", "{arch}.rope.scaling.yarn_attn_factor", T.FLOAT32),
    KeySpec("rope_scaling.beta_fast", "{arch}.rope.scaling.yarn_beta_fast", T.FLOAT32),
    KeySpec("rope_scaling.beta_slow", "{arch}.rope.scaling.yarn_beta_slow", T.FLOAT32),
)

_HPARAMS_BY_KEY = {ks.key: ks for ks in _COMMON_HPARAMS}


def _hparams(*names: str) -> tuple[KeySpec, ...]:
    """The common hparam rows ``{arch}.<name>``, in the order given (each dialect writes its own order)."""
    return tuple(_HPARAMS_BY_KEY["{arch}." + n] for n in names)


#: Keys the Luce and dflash-draft loaders share (under ``{arch}.dflash.`` / ``{arch}.attention.``)
_DRAFT_LOADER_KEYS = {
    ks.field: ks for ks in (
        KeySpec("block_size", "{arch}.dflash.block_size", T.UINT32, required=True),
        KeySpec("mask_token_id", "{arch}.dflash.mask_token_id", T.UINT32, required=True),
        # The Luce loader ignores target_layer_ids of any element type but INT32, and a non-BOOL pattern.
        KeySpec("target_layer_ids", "{arch}.dflash.target_layer_ids", T.ARRAY, T.INT32, required=True),
        KeySpec("sliding_window", "{arch}.attention.sliding_window", T.UINT32),
        KeySpec("sliding_window_pattern", "{arch}.attention.sliding_window_pattern", T.ARRAY, T.BOOL),
    )
}


def _draft_keys(*fields_: str) -> tuple[KeySpec, ...]:
    return tuple(_DRAFT_LOADER_KEYS[f] for f in fields_)


#: DFlash semantics a dialect has no key of its own for, stored under its arch prefix.
def _extension_keys(*fields_and_keys: tuple) -> tuple[KeySpec, ...]:
    return tuple(KeySpec(*row, extension=True) for row in fields_and_keys)


#: DFlash semantics neither the Luce nor the dflash-draft loader has a key for (written as extensions, after
#: each dialect's own first extension row)
_SHARED_EXTENSIONS = (
    ("embedding_scale", "{arch}.embedding_scale", T.FLOAT32),
    ("logit_scale", "{arch}.logit_scale", T.FLOAT32),
    ("attention_value_scale", "{arch}.attention.value_scale", T.FLOAT32),
    ("rope_dimension_count", "{arch}.rope.dimension_count", T.UINT32),
    ("rope_dimension_sections", "{arch}.rope.dimension_sections", T.ARRAY, T.INT32),
    ("hidden_act", "{arch}.hidden_activation", T.STRING),
    *((ks.field, ks.key, ks.type) for ks in _ROPE_SCALING),
    ("reference_causal_layers", "dflashkit.attention.causal_layers", T.ARRAY, T.BOOL),  # `dflashkit.causality`
)
