"""vLLM ``speculators`` DFlash and DFlash 2 (``speculators_model_type`` dflash / dflash2).

Saved checkpoints carry ``DFlashDraftModel`` / ``DFlash2DraftModel`` in ``architectures`` — the same
strings as z-lab's — so the layout is told by the config's SHAPE (`matches`): a
``speculators_model_type`` or a ``transformer_layer_config`` block. The layout:

- hparams nested in ``transformer_layer_config`` (a transformers config; its ``model_type`` picks the
  config class in speculators — qwen3 by default — while the decoder layer is always speculators'
  Qwen3-style one, so the keys read here are the same for every accepted type);
- top level: ``block_size`` (default 8), ``mask_token_id``, ``aux_hidden_state_layer_ids`` (= HF
  decoder-layer ids + 1: speculators counts the embedding output as 0; held in the spec as ``i - 1``),
  ``draft_vocab_size`` (default 32000, as speculators' config class), ``sample_from_anchor`` (default
  false; DFlash 2 requires false), DFlash 2's ``conv_kernel_size`` / ``conv_group_size`` /
  ``selector_rank`` / ``selector_top_k`` (speculators' defaults 2 / 16 / 256 / 16);
- tensors: z-lab's names, plus a reduced draft vocabulary's ``lm_head.weight`` {draft_vocab, hidden}
  and ``d2t`` (I64 offsets: target id = d2t[i] + i) with ``t2d`` (a bool mask nothing reads at run time:
  dropped, as llama.cpp's converter drops it for speculators DSpark). DFlash 2 codebooks are saved as
  bare parameters (``candidate_selector.predecessor_codebook``): ``.weight`` is appended.

llama.cpp's converter cannot read this layout (its ``DFlashModel`` does not merge
``transformer_layer_config``: KeyError on the layer count), so the GGUF written is the one its loader
reads — what its ``DSparkModel`` writes for the same config shape, minus the DSpark-only heads and
``has_confidence_head`` (README "speculators DFlash": which loader lines read which key).
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any, Mapping

import numpy as np
from gguf import GGMLQuantizationType

from ...errors import DFlashError
from ...spec import ConfigView, DrafterSpec
from ..dspark import D2T, d2t_absolute, is_speculators_config
from ..zlab_dflash import ARCH_DFLASH, ZLabDFlash, zlab_hf_to_canonical
from ..zlab_dflash2 import ARCH_DFLASH2, ZLabDFlash2

#: speculators_model_type → the architecture written into specs
MODEL_TYPES = {"dflash": ARCH_DFLASH, "dflash2": ARCH_DFLASH2}
#: transformer_layer_config.model_type values whose config class reads the keys below the same way
LAYER_MODEL_TYPES = ("qwen3", "qwen2", "llama")
#: keys every transformer_layer_config must carry (speculators saves the full config class dict)
_REQUIRED_LAYER_KEYS = ("hidden_size", "num_hidden_layers", "num_attention_heads", "intermediate_size", "vocab_size")
#: stored tensors nothing reads at run time (llama.cpp's converter filters ``t2d`` out too)
DROPPED_TENSORS = frozenset({"t2d"})
#: speculators' pydantic defaults (speculators/models/dflash{,2}/config.py)
DEFAULT_BLOCK_SIZE = 8
DEFAULT_DRAFT_VOCAB = 32000
DFLASH2_DEFAULTS = {"conv_kernel_size": 2, "conv_group_size": 16, "selector_rank": 256, "selector_top_k": 16}


def _layer_config(config: Mapping[str, Any], path: str) -> Mapping[str, Any]:
    layer = config.get("transformer_layer_config")
    if layer is None:
        raise DFlashError(
            f"{path}: speculators config without 'transformer_layer_config' — the drafter's hparams live there "
            "(re-save the checkpoint with speculators)"
        )
    if not isinstance(layer, Mapping):
        raise DFlashError(f"{path}: 'transformer_layer_config' must be an object, got {type(layer).__name__}")
    model_type = layer.get("model_type", "qwen3")  # speculators' default config class is Qwen3Config
    if model_type not in LAYER_MODEL_TYPES:
        raise DFlashError(
            f"{path}: transformer_layer_config.model_type '{model_type}' is not supported "
            f"(known: {', '.join(LAYER_MODEL_TYPES)})"
        )
    for key in _REQUIRED_LAYER_KEYS:
        if layer.get(key) is None:
            raise DFlashError(f"{path}: required key 'transformer_layer_config.{key}' is missing")
    return layer


def _tap_ids(config: Mapping[str, Any], path: str) -> list[int]:
    aux = config.get("aux_hidden_state_layer_ids")
    if aux is None:
        raise DFlashError(
            f"{path}: 'aux_hidden_state_layer_ids' is missing — the target layers this drafter taps are unknown"
        )
    if not isinstance(aux, list) or not aux or not all(isinstance(i, int) and not isinstance(i, bool) for i in aux):
        raise DFlashError(f"{path}: 'aux_hidden_state_layer_ids' must be a non-empty list of integers, got {aux!r}")
    if any(i < 1 for i in aux):
        # speculators counts the embedding output as 0; a drafter never taps it
        raise DFlashError(f"{path}: 'aux_hidden_state_layer_ids' must be >= 1 (HF layer id + 1), got {aux}")
    return [i - 1 for i in aux]


class _SpeculatorsMixin:
    """What the speculators layout changes on top of the z-lab family it subclasses."""

    layout = "speculators"
    model_type = ""
    #: speculators counts its sliding window back from the anchor
    window_from_anchor = True
    #: d2t is rewritten (offsets → absolute ids) and written last, as llama.cpp's DSpark converter does
    final_tensors = (D2T,)
    @property
    def speculators_model_types(self) -> tuple[str, ...]:  # type: ignore[override]
        return (self.model_type,)

    def spec_from_config_zlab(self, *args: Any) -> DrafterSpec:
        """z-lab's spec_from_config, reached through the MRO (ZLabDFlash / ZLabDFlash2)."""
        return super().spec_from_config(*args)  # type: ignore[misc]

    def matches(self, config: Mapping[str, Any], architecture: str) -> bool:
        if not is_speculators_config(config):
            return False
        kind = config.get("speculators_model_type")
        if kind is None:  # a transformer_layer_config without the type: go by the architecture name
            return architecture in self.architectures  # type: ignore[attr-defined]
        return kind == self.model_type

    def owns(self, spec: DrafterSpec) -> bool:
        return spec.layout == self.layout and spec.architecture in self.architectures  # type: ignore[attr-defined]

    def matches_gguf(self, fields: Mapping[str, Any]) -> bool:
        return False  # a GGUF is the llama.cpp DFlash layout; the z-lab families read it

    def hf_to_canonical(self, hf_name: str) -> str | None:
        if hf_name == D2T:
            return D2T
        return zlab_hf_to_canonical(hf_name)

    def ignores_hf_tensor(self, hf_name: str) -> bool:
        return hf_name in DROPPED_TENSORS

    def spec_from_config(self, config: Mapping[str, Any], view: ConfigView, architecture: str, path: str) -> DrafterSpec:
        layer = _layer_config(config, path)
        kind = config.get("speculators_model_type", self.model_type)
        if kind not in MODEL_TYPES:
            raise DFlashError(f"{path}: speculators_model_type '{kind}' is not a DFlash drafter (known: {', '.join(MODEL_TYPES)})")
        taps = _tap_ids(config, path)
        target_hidden = config.get("target_hidden_size")
        if target_hidden is not None and target_hidden != layer["hidden_size"]:
            # llama.cpp's loader sizes fc as taps × the drafter's own hidden size
            raise DFlashError(
                f"{path}: 'target_hidden_size' {target_hidden} differs from transformer_layer_config.hidden_size "
                f"{layer['hidden_size']}; llama.cpp's DFlash loader needs them equal"
            )
        top = ConfigView({k: v for k, v in config.items() if k != "dflash_config"}, path)
        mask = top.int("mask_token_id")
        block_size = top.int("block_size", DEFAULT_BLOCK_SIZE, minimum=1)
        anchor = top.bool("sample_from_anchor")
        anchor = False if anchor is None else anchor
        if anchor and self.model_type == "dflash2":
            raise DFlashError(
                f"{path}: 'sample_from_anchor' is true, but speculators DFlash 2 requires false "
                "(the anchor slot holds the bonus token) — set \"sample_from_anchor\": false"
            )
        # z-lab's rules read the merged view: the layer config wins over the top level (as llama.cpp's
        # DSparkModel merges them), taps and the mask id go where z-lab keeps them
        merged: dict[str, Any] = {
            k: v for k, v in config.items()
            if k not in ("transformer_layer_config", "dflash_config", "architectures", "auto_map", "speculators_config")
        }
        merged.update(layer)
        if self.model_type == "dflash2":
            for key, default in DFLASH2_DEFAULTS.items():
                merged[key] = config.get(key, default)
        merged["dflash_config"] = {"target_layer_ids": taps, "mask_token_id": mask, "block_size": block_size}
        spec = self.spec_from_config_zlab(merged, ConfigView(merged, path), architecture, path)
        vocab = int(layer["vocab_size"])
        draft_vocab = top.int("draft_vocab_size", DEFAULT_DRAFT_VOCAB, minimum=1)
        if draft_vocab > vocab:
            default = " (speculators' default: the key is absent)" if config.get("draft_vocab_size") is None else ""
            raise DFlashError(
                f"{path}: 'draft_vocab_size' {draft_vocab}{default} is larger than the target vocabulary "
                f"(transformer_layer_config.vocab_size {vocab})"
            )
        if self.model_type == "dflash2" and draft_vocab != vocab:
            raise DFlashError(
                f"{path}: 'draft_vocab_size' {draft_vocab} differs from transformer_layer_config.vocab_size {vocab}; "
                "speculators DFlash 2 needs the full vocabulary (its candidate selector scores every token)"
            )
        return replace(
            spec,
            architecture=MODEL_TYPES[self.model_type],
            layout=self.layout,
            sample_from_anchor=anchor,
            draft_vocab_size=draft_vocab if draft_vocab < vocab else None,
            vocab_size=vocab,
        )

    # ---- tensors ---------------------------------------------------------------------------------
    def _global_extras(self, spec: DrafterSpec, vocab_size: int | None, shapes: dict[str, tuple[int, ...]]) -> None:
        super()._global_extras(spec, vocab_size, shapes)  # type: ignore[misc]
        if spec.draft_vocab_size is not None:
            # a reduced draft vocabulary brings its own head and the row → target id table
            shapes["lm_head.weight"] = (spec.draft_vocab_size, spec.hidden_size)
            shapes[D2T] = (spec.draft_vocab_size,)

    def finalize_tensor(
        self, spec: DrafterSpec, canonical: str, data: np.ndarray, source: str
    ) -> tuple[np.ndarray, GGMLQuantizationType]:
        assert canonical == D2T
        return d2t_absolute(np.asarray(data), spec.vocab_size or 0, source), GGMLQuantizationType.I64

class SpeculatorsDFlash(_SpeculatorsMixin, ZLabDFlash):
    name = "speculators-dflash"
    priority = 40
    model_type = "dflash"
    labels = {"speculators": "speculators DFlash"}


class SpeculatorsDFlash2(_SpeculatorsMixin, ZLabDFlash2):
    name = "speculators-dflash2"
    priority = 30
    model_type = "dflash2"
    labels = {"speculators": "speculators DFlash 2"}


DFLASH = SpeculatorsDFlash.instance
DFLASH2 = SpeculatorsDFlash2.instance
