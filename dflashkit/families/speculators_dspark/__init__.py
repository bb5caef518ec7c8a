"""DSpark in vLLM ``speculators``' layout (``speculators_model_type: dspark``).

speculators saves its model class name in ``architectures`` — ``DSparkDraftModel``, the same string
SpecForge uses — so this layout is told apart by the config's shape (`matches`), never by that name:
the drafter's hparams are nested in ``transformer_layer_config`` (a Qwen3-style config), the top level
holds ``block_size`` (default 8), ``draft_vocab_size``, ``mask_token_id``, ``sample_from_anchor`` and the
DSpark head keys, and the taps are ``aux_hidden_state_layer_ids`` = HF decoder-layer ids + 1.

Read as llama.cpp's ``DSparkModel`` reads it: the top level merged with ``transformer_layer_config``
(the nested block wins), ``target_layer_ids = [i - 1 for i in aux_hidden_state_layer_ids]``,
``sample_from_anchor`` the explicit value else false. Tensors and heads: `dspark`.
"""

from __future__ import annotations

from typing import Any, Mapping

from ... import bounds
from ...errors import DFlashError
from ...spec import ConfigView, DrafterSpec
from ..dspark import DSpark


class SpeculatorsDSpark(DSpark):
    name = "speculators-dspark"
    priority = 80
    layout = "speculators"
    labels = {"speculators": "speculators DSpark"}
    speculators_model_types = ("dspark",)
    window_from_anchor = True

    def matches(self, config: Mapping[str, Any], architecture: str) -> bool:
        if config.get("speculators_model_type") == "dspark":
            return True
        return architecture in self.architectures and (
            "transformer_layer_config" in config or "aux_hidden_state_layer_ids" in config
        )

    def matches_gguf(self, fields: Mapping[str, Any]) -> bool:
        return False  # a GGUF keeps no trace of the HF layout: `dspark` reads it

    def owns(self, spec: DrafterSpec) -> bool:
        return spec.layout == "speculators" and spec.architecture not in ("DFlashDraftModel", "DFlash2DraftModel")

    def spec_from_config(self, config: Mapping[str, Any], view: ConfigView, architecture: str, path: str) -> DrafterSpec:
        nested = config.get("transformer_layer_config")
        if nested is None and config.get("speculators_model_type") is None:
            nested = {}  # a flat config with speculators' tap key: llama.cpp reads it as is
        if nested is None:
            raise DFlashError(
                f"{path}: 'transformer_layer_config' is missing — a speculators checkpoint "
                f"(speculators_model_type {config.get('speculators_model_type')!r}) keeps the drafter's hidden size, "
                "layers and heads there; re-save it with speculators' save_pretrained"
            )
        if not isinstance(nested, Mapping):
            raise DFlashError(f"{path}: 'transformer_layer_config' must be an object, got {type(nested).__name__}")
        aux = config.get("aux_hidden_state_layer_ids")
        if aux is None:
            raise DFlashError(
                f"{path}: 'aux_hidden_state_layer_ids' is missing — the speculators layout names the target layers "
                "the drafter reads there (HF decoder-layer ids + 1)"
            )
        if not isinstance(aux, list) or not aux or not all(isinstance(i, int) and not isinstance(i, bool) for i in aux) \
                or len(aux) > bounds.MAX_LAYERS:
            raise DFlashError(f"{path}: 'aux_hidden_state_layer_ids' must be a non-empty list of integers, got {bounds.quote(aux)}")
        if min(aux) < 1:
            raise DFlashError(
                f"{path}: 'aux_hidden_state_layer_ids' has {min(aux)}, but speculators counts the embedding output "
                f"as 0, so tapped layers are >= 1: {aux}"
            )
        merged: dict[str, Any] = {**config, **nested}
        merged.pop("dflash_config", None)
        merged["dflash_config"] = {"mask_token_id": config.get("mask_token_id"), "target_layer_ids": [i - 1 for i in aux]}
        merged.setdefault("block_size", 8)  # speculators' default
        merged_view = ConfigView(merged, path)
        spec = super(DSpark, self).spec_from_config(merged, merged_view, architecture, path)
        return self._dspark_fields(spec, merged, merged_view, path, default_sample_from_anchor=False)


FAMILY = SpeculatorsDSpark.instance
