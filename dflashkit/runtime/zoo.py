"""Which runtime block runs a drafter, and where a canonical tensor goes in it.

Every drafter — an HF checkpoint of any layout or a GGUF of any dialect — is read by
`dflashkit.drafters.open_drafter` (its family names the tensors with canonical ids, the z-lab / speculators
HF names; a GGUF's dialect table maps llama.cpp's names to the same ids), so the runtime has one read path.
This module only joins the two sides: the family that runs a spec (`dflashkit.families.runtime_family`) →
its ``runtime_class`` (the shared block in `dflash.py`, or a ``runtime.py`` in the family's folder), and the
few canonical ids whose runtime module path differs from the id.
"""

from __future__ import annotations

import importlib

from ..families import plain_runtime_block, runtime_family, runtime_param_paths
from ..spec import DrafterSpec
from .config import RuntimeConfig
from .dflash import DFlashDraftModel

#: canonical id → the runtime model's parameter path, where they differ (each family says its own)
_MODULE_PATHS = runtime_param_paths()


def model_class_for(spec: DrafterSpec) -> type[DFlashDraftModel]:
    """The model class of a spec: its runtime block's (`RuntimeConfig.family`; a plain `DrafterSpec` runs in
    the block of its architecture's family); a family on a backbone of its own runs in that backbone's class."""
    block = spec.family if isinstance(spec, RuntimeConfig) else plain_runtime_block(spec.architecture)
    module, _, name = runtime_family(spec.architecture, block).runtime_class.partition(":")
    return getattr(importlib.import_module(module), name)


def module_path(canonical: str) -> str:
    """Where a canonical tensor id goes in the runtime model (``module.path.attr``)."""
    return _MODULE_PATHS.get(canonical, canonical)
