"""The llama.cpp dialect (upstream ``LLM_ARCH_DFLASH``): its table, keys in the order llama.cpp's converter writes
them, tap ids stored as HF id + 1, the only dialect with names for every family's tensors."""

from __future__ import annotations

from ..families import family_llama_cpp_tensor_aliases
from .shared_rows import _FAMILY_TENSORS, _LLAMA_CPP_TENSORS, _ROPE_SCALING, _hparams
from .table import Dialect, KeySpec, T

# The llama.cpp dialect's keys in the order llama.cpp's converter writes them (TextModel's hparams,
# then DFlashModel's own; general.file_type goes after value_length, see `Dialect.file_type_after`).
LLAMA_CPP = Dialect(
    name="llama.cpp",
    architectures=("dflash",),
    description="upstream llama.cpp LLM_ARCH_DFLASH (also llama-cpp-python)",
    tap_offset=1,
    names_conv_selector=True,
    needs_tokenizer=True,
    tensor_names={**_LLAMA_CPP_TENSORS, **_FAMILY_TENSORS},
    # names written before llama.cpp settled them (older DFlash 2 GGUFs' nested selector / conv names), per family:
    # read, rewritten on translate
    tensor_aliases=family_llama_cpp_tensor_aliases(),
    file_type_after="{arch}.attention.value_length",
    one_causal_flag=True,
    keys=_hparams("block_count", "context_length", "embedding_length", "feed_forward_length", "attention.head_count",
                  "attention.head_count_kv")
    + (
        # llama.cpp's TextModel writes a False `is_causal` here; DFlashModel's later write of the same key
        # keeps this position (gguf-py overwrites a duplicated key in place). True is written below.
        KeySpec("causal_false", "{arch}.attention.causal", T.BOOL),
    )
    + _ROPE_SCALING
    + _hparams("rope.freq_base", "attention.layer_norm_rms_epsilon", "attention.key_length", "attention.value_length")
    + (
        KeySpec("rope_dimension_count", "{arch}.rope.dimension_count", T.UINT32),
        KeySpec("attention_value_scale", "{arch}.attention.value_scale", T.FLOAT32),
        KeySpec("block_size", "{arch}.block_size", T.UINT32, required=True),
        KeySpec("conv_kernel_size", "{arch}.conv_kernel_size", T.UINT32),
        KeySpec("conv_group_size", "{arch}.conv_group_size", T.UINT32),
        KeySpec("selector_rank", "{arch}.selector_rank", T.UINT32),
        KeySpec("selector_top_k", "{arch}.selector_top_k", T.UINT32),
        KeySpec("logit_scale", "{arch}.logit_scale", T.FLOAT32),
        KeySpec("final_logit_softcapping", "{arch}.final_logit_softcapping", T.FLOAT32),
        KeySpec("embedding_scale", "{arch}.embedding_scale", T.FLOAT32),
        KeySpec("target_layer_ids", "{arch}.target_layers", T.ARRAY, T.INT32, required=True),
        KeySpec("sliding_window", "{arch}.attention.sliding_window", T.UINT32),
        KeySpec("sliding_window_pattern", "{arch}.attention.sliding_window_pattern", T.ARRAY, T.BOOL),
        KeySpec("causal", "{arch}.attention.causal", T.BOOL),
        # dflashkit's own: the checkpoint's per-layer rule where the one flag above cannot say it (`causality`)
        KeySpec("reference_causal_layers", "dflashkit.attention.causal_layers", T.ARRAY, T.BOOL, extension=True),
        KeySpec("rope_dimension_sections", "{arch}.rope.dimension_sections", T.ARRAY, T.INT32),
        # read by llama.cpp's loader (default SiLU); its converter writes it for Gemma-4 DSpark only
        KeySpec("hidden_act", "{arch}.hidden_activation", T.STRING),
        # DSpark / Gemma-4 DSpark (13B): written by those families in llama.cpp's order (`extra_metadata`)
        KeySpec("sample_from_anchor", "{arch}.sample_from_anchor", T.BOOL, family_only=True),
        KeySpec("has_confidence_head", "{arch}.has_confidence_head", T.BOOL, family_only=True),
        KeySpec("attention_scale", "{arch}.attention.scale", T.FLOAT32, family_only=True),
        # written after the tokenizer (llama.cpp's DFlashModel.set_vocab adds it last)
        KeySpec("mask_token_id", "tokenizer.ggml.mask_token_id", T.UINT32, required=True),
    ),
)
