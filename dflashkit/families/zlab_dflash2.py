"""z-lab DFlash 2 (``DFlash2DraftModel``): DFlash plus per-layer dynamic convolutions and a
low-rank candidate selector. Same config schema and tensor names as `zlab_dflash`; the conv /
selector keys are required, and the conv groups must divide the hidden size."""

from __future__ import annotations

from typing import Any, Mapping

from ..errors import DFlashError
from ..spec import ARCH_DFLASH2, ConfigView, DrafterSpec
from .zlab_dflash import ZLabDFlash


class ZLabDFlash2(ZLabDFlash):
    name = "zlab-dflash2"
    architectures = (ARCH_DFLASH2,)
    runtime_module = "dflash2"
    requires_conv = True

    def matches_gguf(self, fields: Mapping[str, Any]) -> bool:
        # the conv keys are the GGUF signature of a DFlash 2 drafter
        return fields.get("conv_kernel_size") is not None

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


FAMILY = ZLabDFlash2()
