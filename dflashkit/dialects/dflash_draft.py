"""The dflash-draft dialect (the Anbeeld / beellama.cpp / ht-llama.cpp lineage): its table."""

from __future__ import annotations

from .shared_rows import (LLAMA_CPP_ONLY_TENSORS, _COMMON_HPARAMS, _LLAMA_CPP_TENSORS, _SHARED_EXTENSIONS,
                          _draft_keys, _extension_keys)
from .table import Dialect, KeySpec, T

DFLASH_DRAFT = Dialect(
    name="dflash-draft",
    architectures=("dflash-draft",),
    description="Anbeeld / beellama.cpp / ht-llama.cpp lineage",
    tap_offset=0,
    names_conv_selector=False,
    tensor_names={
        **{k: v for k, v in _LLAMA_CPP_TENSORS.items() if k not in LLAMA_CPP_ONLY_TENSORS},
        "fc.weight": "dflash_fc.weight",
        "hidden_norm.weight": "dflash_hidden_norm.weight",
        "layers.{bid}.post_attention_layernorm.weight": "blk.{bid}.post_attention_norm.weight",
    },
    keys=_COMMON_HPARAMS
    + _draft_keys("target_layer_ids", "block_size", "mask_token_id")
    + (
        KeySpec("n_target_features", "{arch}.dflash.n_target_features", T.UINT32, required=True),
        KeySpec("causal", "{arch}.attention.causal", T.BOOL),
    )
    + _draft_keys("sliding_window", "sliding_window_pattern")
    + _extension_keys(("final_logit_softcapping", "{arch}.final_logit_softcapping", T.FLOAT32), *_SHARED_EXTENSIONS),
)
