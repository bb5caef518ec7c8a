"""The Luce dialect (Luce-Org/lucebox's draft_gguf_loader): its table and its per-target architecture choice (Qwen
or Gemma-4 script, which also decides what ``dflash.n_target_layers`` holds)."""

from __future__ import annotations

from ..spec import DrafterSpec
from .shared_rows import (LLAMA_CPP_ONLY_TENSORS, _COMMON_HPARAMS, _LLAMA_CPP_TENSORS, _SHARED_EXTENSIONS,
                          _draft_keys, _extension_keys)
from .table import Dialect, KeySpec, T

LUCE = Dialect(
    name="luce",
    architectures=("qwen35-dflash-draft", "gemma4-dflash-draft", "dflash-draft"),
    description="Luce-Org/lucebox draft_gguf_loader",
    tap_offset=0,
    names_conv_selector=False,
    target_count_architectures=("gemma4-dflash-draft",),
    architecture_for=lambda spec: _luce_arch(spec),
    tensor_names={
        **{k: v for k, v in _LLAMA_CPP_TENSORS.items() if k not in LLAMA_CPP_ONLY_TENSORS},
        "fc.weight": "dflash.fc.weight",
        "hidden_norm.weight": "dflash.hidden_norm.weight",
    },
    tensor_aliases={
        "dflash_fc.weight": "dflash.fc.weight",
        "dflash_hidden_norm.weight": "dflash.hidden_norm.weight",
        "blk.{bid}.post_attention_norm.weight": "blk.{bid}.ffn_norm.weight",
    },
    keys=_COMMON_HPARAMS
    + (
        KeySpec("vocab_size", "{arch}.vocab_size", T.UINT32),
        KeySpec("luce_n_target_layers", "{arch}.dflash.n_target_layers", T.UINT32, required=True),
    )
    + _draft_keys("block_size", "mask_token_id", "target_layer_ids", "sliding_window", "sliding_window_pattern")
    + (KeySpec("final_logit_softcapping", "{arch}.final_logit_softcapping", T.FLOAT32),)
    + _extension_keys(("causal", "{arch}.attention.causal", T.BOOL), *_SHARED_EXTENSIONS),
)


def _luce_arch(spec: DrafterSpec) -> str:
    # Gemma-4 drafters are the ones with logit softcapping / a scaled input embedding.
    gemma = spec.final_logit_softcapping is not None or spec.embedding_scale is not None
    return "gemma4-dflash-draft" if gemma else "qwen35-dflash-draft"
