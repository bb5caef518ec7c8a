"""Which runtime file runs a drafter, and where a canonical tensor goes in it.

Every drafter — an HF checkpoint of any layout or a GGUF of any dialect — is read by
`dflashkit.drafters.open_drafter` (its family names the tensors with canonical ids, the z-lab / speculators
HF names; a GGUF's dialect table maps llama.cpp's names to the same ids), so the runtime has one read path.
This module only joins the two sides: the family's ``runtime_module`` → the model class, and the few
canonical ids whose runtime module path differs from the id.
"""

from __future__ import annotations

from .config import RuntimeConfig
from .dflash import DFlashDraftModel
from .dflash2 import DFlash2DraftModel
from .dspark import DSparkDraftModel
from .gemma4_dspark import ARCH_GEMMA4_DSPARK, Gemma4DSparkDraftModel
from ..spec import DrafterSpec

#: `RuntimeConfig.family` (= the family's ``runtime_module``) → the model class of its runtime file
RUNTIME_CLASSES: dict[str, type[DFlashDraftModel]] = {
    "dflash": DFlashDraftModel, "dflash2": DFlash2DraftModel, "dspark": DSparkDraftModel,
}
#: architectures whose DSpark heads sit on a backbone of their own → that backbone's model class
BACKBONE_CLASSES: dict[str, type[DFlashDraftModel]] = {ARCH_GEMMA4_DSPARK: Gemma4DSparkDraftModel}
#: canonical id → the runtime model's parameter path, where they differ
_MODULE_PATHS = {"markov_head.markov_w2.scale": "markov_head.markov_w2_scale"}


def model_class_for(spec: DrafterSpec) -> type[DFlashDraftModel]:
    """The model class of a spec (a plain `DrafterSpec`: z-lab DFlash or DFlash 2 by its architecture); a
    DSpark on a backbone of its own (`BACKBONE_CLASSES`) runs in that backbone's file."""
    if spec.architecture in BACKBONE_CLASSES:
        return BACKBONE_CLASSES[spec.architecture]
    family = spec.family if isinstance(spec, RuntimeConfig) else ("dflash2" if spec.is_dflash2 else "dflash")
    return RUNTIME_CLASSES[family]


def module_path(canonical: str) -> str:
    """Where a canonical tensor id goes in the runtime model (``module.path.attr``)."""
    return _MODULE_PATHS.get(canonical, canonical)
