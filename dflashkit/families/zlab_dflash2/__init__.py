"""z-lab DFlash 2 (``DFlash2DraftModel``): DFlash plus per-layer dynamic convolutions and a
low-rank candidate selector. Same config schema and tensor names as `zlab_dflash`; the conv /
selector keys are required, and the conv groups must divide the hidden size."""

from __future__ import annotations

from dataclasses import replace
from typing import Any, Mapping

from ...errors import DFlashError
from ...spec import ConfigView, DrafterSpec
from ..zlab_dflash import ZLabDFlash


#: z-lab DFlash 2's HF architecture string
ARCH_DFLASH2 = "DFlash2DraftModel"


class ZLabDFlash2(ZLabDFlash):
    name = "zlab-dflash2"
    gemma_target_embedding_scale = True
    priority = 10
    architectures = (ARCH_DFLASH2,)
    runtime_module = "dflash2"
    runtime_class = "dflashkit.families.zlab_dflash2.runtime:DFlash2DraftModel"
    folder_modules = ("runtime",)
    labels = {"zlab": "z-lab DFlash 2", "llama.cpp": "DFlash 2 (llama.cpp GGUF)"}
    requires_conv = True
    conv_selector = True
    plain_runtime = True
    llama_cpp_tensor_names = {
        "layers.{bid}.attention_conv.base_kernel": "blk.{bid}.attn_conv_base",
        "layers.{bid}.attention_conv.kernel_projection.weight": "blk.{bid}.attn_conv_proj.weight",
        "layers.{bid}.mlp_conv.base_kernel": "blk.{bid}.ffn_conv_base",
        "layers.{bid}.mlp_conv.kernel_projection.weight": "blk.{bid}.ffn_conv_proj.weight",
        "candidate_selector.predecessor_codebook.weight": "selector_predecessor.weight",
        "candidate_selector.successor_codebook.weight": "selector_successor.weight",
        "candidate_selector.hidden_projection.weight": "selector_hidden.weight",
    }
    # DFlash 2 GGUFs written before llama.cpp settled its names (the codebooks as
    # candidate_selector.{predecessor,successor}_codebook.weight, conv tensors flat): the nested names they used
    llama_cpp_tensor_aliases = {
        "selector.hidden_proj.weight": "selector_hidden.weight",
        "selector.pred_codebook": "selector_predecessor.weight",
        "selector.succ_codebook": "selector_successor.weight",
        "blk.{bid}.attn_conv.base": "blk.{bid}.attn_conv_base",
        "blk.{bid}.attn_conv.proj.weight": "blk.{bid}.attn_conv_proj.weight",
        "blk.{bid}.ffn_conv.base": "blk.{bid}.ffn_conv_base",
        "blk.{bid}.ffn_conv.proj.weight": "blk.{bid}.ffn_conv_proj.weight",
    }
    #: speculators' sliding window is bidirectional in the block unless the config says otherwise
    window_non_causal_default = True

    def check_runtime(self, cfg: Any, path: str) -> None:
        if cfg.sample_from_anchor:
            raise DFlashError(f"{path}: sample_from_anchor must be false for DFlash 2 (speculators requires it)")
        if cfg.own_lm_head:
            raise DFlashError(f"{path}: DFlash 2 needs the full target vocabulary (draft_vocab_size = vocab_size)")

    def matches_gguf(self, fields: Mapping[str, Any]) -> bool:
        # the conv keys are the GGUF signature of a DFlash 2 drafter
        return fields.get("conv_kernel_size") is not None

    def refine_spec(self, spec: DrafterSpec, shapes: Mapping[str, tuple[int, ...]]) -> DrafterSpec:
        # a GGUF without a token list: the selector codebooks have one row per vocabulary entry
        codebook = shapes.get("candidate_selector.predecessor_codebook.weight")
        if spec.vocab_size is None and codebook is not None:
            return replace(spec, vocab_size=codebook[0])
        return spec

    def _conv_fields(self, view: ConfigView, hidden: int, path: str) -> dict[str, int | None]:
        conv = super()._conv_fields(view, hidden, path)
        if hidden % conv["conv_group_size"]:  # type: ignore[operator]
            raise DFlashError(
                f"{path}: hidden_size ({hidden}) must be a multiple of conv_group_size ({conv['conv_group_size']})"
            )
        return conv

    def _layer_extras(self, spec: DrafterSpec, prefix: str, shapes: dict[str, tuple[int, ...]]) -> None:
        h = spec.hidden_size
        k = spec.conv_kernel_size or 0
        groups = h // (spec.conv_group_size or 1)
        for conv in ("attention_conv", "mlp_conv"):
            shapes[prefix + conv + ".base_kernel"] = (2, k, h)
            shapes[prefix + conv + ".kernel_projection.weight"] = (2 * k * groups, h)

    def _global_extras(self, spec: DrafterSpec, vocab_size: int | None, shapes: dict[str, tuple[int, ...]]) -> None:
        rank = spec.selector_rank or 0
        vocab = spec.vocab_size or vocab_size
        # codebook rows = the vocabulary; checked only when the vocab size is known
        shapes["candidate_selector.predecessor_codebook.weight"] = (vocab or -1, rank)
        shapes["candidate_selector.successor_codebook.weight"] = (vocab or -1, rank)
        shapes["candidate_selector.hidden_projection.weight"] = (rank, spec.hidden_size)


FAMILY = ZLabDFlash2.instance
