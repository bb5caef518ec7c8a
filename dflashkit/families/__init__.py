"""Drafter families and their registry.

One folder per family (``families/<name>/``): its ``__init__.py`` is a `DrafterFamily` subclass (config →
spec, tensor map and `sanitize`, expected tensors, metadata, labels, runtime facts); ``checks.py`` holds its
inspect checks and ``runtime.py`` its PyTorch block, when it has them. The registry fills itself: every
folder is imported here and every subclass that names itself registers (`base.DrafterFamily.__init_subclass__`),
ordered by `DrafterFamily.priority`. HF configs are claimed by `DrafterFamily.matches` (architecture string,
or config shape), GGUF metadata by `DrafterFamily.matches_gguf`, specs by their ``architecture``. The rest
of the package asks the functions below and never names a family.

Adding a family: one folder here, its fixture, its test, one docs row (docs/adding-a-family.md).
"""

from __future__ import annotations

import importlib
import pkgutil
from pathlib import Path
from typing import Any, Mapping

from .. import bounds
from ..errors import DFlashError
from ..spec import ConfigView, DrafterSpec, read_config_json
from .base import REGISTERED, DrafterFamily
from .zlab_dflash import rope_type_of  # the config reader every family and the runtime share

for _folder in pkgutil.iter_modules(__path__):
    if _folder.ispkg:  # a family folder (its checks / runtime modules are imported by the layers that run them)
        importlib.import_module(f"{__name__}.{_folder.name}")

#: Every family, in matching order (the first whose `matches` is true wins): highest priority first.
FAMILIES: tuple[DrafterFamily, ...] = tuple(sorted(REGISTERED, key=lambda f: -f.priority))
#: Every HF architecture string a family claims by name.
KNOWN_ARCHITECTURES: tuple[str, ...] = tuple(dict.fromkeys(a for f in FAMILIES for a in f.architectures))
#: ``speculators_model_type`` values of the families (speculators' other algorithms, e.g. eagle3, are not ours)
SPECULATORS_MODEL_TYPES: tuple[str, ...] = tuple(sorted({t for f in FAMILIES for t in f.speculators_model_types}))


def _own(family: DrafterFamily, attribute: str, default: Any = None) -> Any:
    """A family's own value of ``attribute`` (not one inherited from the family it extends): what it adds to a
    shared table, or a role only it plays."""
    return type(family).__dict__.get(attribute, default)


def _merged(attribute: str) -> dict[str, str]:
    """Every family's own ``attribute`` table, merged (matching order)."""
    return {k: v for f in FAMILIES for k, v in _own(f, attribute, {}).items()}


#: Claims an HF config with no ``architectures`` list (z-lab's early configs) and names tensors of
#: a config no family claims.
DEFAULT_FAMILY: DrafterFamily = next(f for f in FAMILIES if _own(f, "default"))


def family_llama_cpp_tensor_names() -> dict[str, str]:
    """What the families add to llama.cpp's tensor-name table (canonical id → GGUF name)."""
    return _merged("llama_cpp_tensor_names")


def family_llama_cpp_tensor_aliases() -> dict[str, str]:
    """Older llama.cpp GGUF names of the families' tensors (old name → current name)."""
    return _merged("llama_cpp_tensor_aliases")


def runtime_param_paths() -> dict[str, str]:
    """Canonical id → runtime parameter path, where a family's runtime block names a tensor otherwise."""
    return _merged("runtime_param_paths")


def folder_modules(kind: str) -> list[str]:
    """Import paths of every family's ``kind`` module (``"checks"``, ``"runtime"``) that exists."""
    return [f"{type(f).__module__}.{kind}" for f in FAMILIES if kind in _own(f, "folder_modules", ())]


def family_named(name: str) -> DrafterFamily | None:
    """The family whose `DrafterFamily.name` is ``name`` (a release record keeps the name), or None."""
    return next((f for f in FAMILIES if f.name == name), None)


def family_for_architecture(architecture: str) -> DrafterFamily | None:
    """The first family (matching order) that claims ``architecture`` by name."""
    return next((f for f in FAMILIES if architecture in f.architectures), None)


def _backbone(architecture: str) -> DrafterFamily | None:
    """The family that runs ``architecture`` on a backbone of its own, if one does."""
    return next((f for f in FAMILIES if f.own_backbone and architecture in f.architectures), None)


def _plain(architecture: str) -> DrafterFamily | None:
    """The family that runs a plain `DrafterSpec` of ``architecture`` (``plain_runtime``), if one does."""
    return next((f for f in FAMILIES if _own(f, "plain_runtime") and architecture in f.architectures), None)


def _block_of(architecture: str, runtime_block: str | None) -> str:
    """``runtime_block``, or that of the family claiming ``architecture`` (the default family's for none)."""
    return runtime_block or (family_for_architecture(architecture) or DEFAULT_FAMILY).runtime_module


def runtime_family(architecture: str, runtime_block: str | None = None) -> DrafterFamily:
    """The family whose runtime block runs a drafter: one that runs ``architecture`` on a backbone of its
    own, else the first with ``runtime_block`` (default: that of the family claiming ``architecture``)."""
    backbone = _backbone(architecture)
    if backbone is not None:
        return backbone
    block = _block_of(architecture, runtime_block)
    for f in FAMILIES:
        if f.runtime_module == block and f.runtime_class and not f.own_backbone:
            return f
    raise DFlashError(f"unknown drafter runtime '{block}' (one of {', '.join(runtime_blocks())})")


def plain_runtime_block(architecture: str) -> str:
    """The runtime block of a plain `DrafterSpec` (no runtime fields computed): that of the family that runs
    ``architecture`` as a plain spec (``plain_runtime``), else the default family's."""
    return (_plain(architecture) or DEFAULT_FAMILY).runtime_module


def plain_label(architecture: str) -> str | None:
    """What reports call a plain spec of ``architecture`` (a family that runs it as a plain spec, in its own
    layout), or None when no such family claims it."""
    family = _plain(architecture)
    return family.labels.get(DEFAULT_FAMILY.label_layout) if family is not None else None


def runtime_blocks() -> tuple[str, ...]:
    """Every runtime block id (`RuntimeConfig.family`) a family declares."""
    return tuple(dict.fromkeys(f.runtime_module for f in FAMILIES if f.runtime_module))


def label_for(architecture: str, runtime_block: str | None, layout: str | None) -> str:
    """What reports call a drafter: the label of the family that runs it in ``layout``."""
    backbone = _backbone(architecture)
    if backbone is not None:
        return backbone.label(layout)
    block = _block_of(architecture, runtime_block)
    for f in FAMILIES:
        if f.runtime_module == block and layout in f.labels and not f.own_backbone:
            return f.labels[layout]
    return f"{layout} {block}"


def _not_a_drafter(path: str, architecture: Any) -> DFlashError:
    return DFlashError(
        f"{path}: architecture {bounds.quote(architecture)} is not a DFlash drafter "
        f"(expected one of {', '.join(KNOWN_ARCHITECTURES)})"
    )


def architecture_of(config: Mapping[str, Any], path: str = "config.json") -> str:
    """``architectures[0]`` of an HF config (z-lab's early configs have none: DFlash). A bare string is
    taken as a one-element list; anything else but a non-empty list of strings is a one-line error."""
    archs = config.get("architectures")
    if archs is None:  # z-lab's early configs have none
        archs = [DEFAULT_FAMILY.architectures[0]]
    if isinstance(archs, str):  # a bare string is accepted as a one-element list
        archs = [archs]
    if not isinstance(archs, list) or not archs:
        raise DFlashError(f"{path}: 'architectures' must be a non-empty list")
    if not isinstance(archs[0], str):
        raise _not_a_drafter(path, archs[0])
    return archs[0]


def family_for_config(config: Mapping[str, Any], path: str = "config.json") -> DrafterFamily:
    """The family that reads an HF ``config.json`` (one-line DFlashError when none does)."""
    kind = config.get("speculators_model_type")
    if kind is not None and kind not in SPECULATORS_MODEL_TYPES:  # before a family claims it by its shape
        raise DFlashError(f"{path}: speculators_model_type {bounds.quote(kind)} is not a drafter family dflashkit reads "
                          f"(one of {', '.join(SPECULATORS_MODEL_TYPES)})")
    architecture = architecture_of(config, path)
    for family in FAMILIES:
        if family.matches(config, architecture):
            return family
    raise _not_a_drafter(path, architecture)


def has_conv_selector(spec: DrafterSpec) -> bool:
    """Whether the spec's family carries per-layer convolutions and a candidate selector (DFlash 2)."""
    family = family_for_architecture(spec.architecture)
    return family is not None and family.conv_selector


def family_for_spec(spec: DrafterSpec) -> DrafterFamily:
    for family in FAMILIES:
        if family.owns(spec):
            return family
    raise DFlashError(f"no drafter family for architecture '{spec.architecture}'")


def family_for_gguf(fields: Mapping[str, Any]) -> DrafterFamily:
    """The family of a drafter GGUF from its decoded metadata fields (`dialects.decode_metadata`)."""
    for family in FAMILIES:
        if family.matches_gguf(fields):
            return family
    return DEFAULT_FAMILY


def read_hf_config(config: Mapping[str, Any], path: str = "config.json") -> tuple[DrafterFamily, DrafterSpec]:
    """The family that claims an HF drafter ``config.json`` and the `DrafterSpec` it validates it into."""
    if not isinstance(config, Mapping):
        raise DFlashError(f"{path}: expected a JSON object at the top level")
    view = ConfigView(config, path)
    family = family_for_config(config, path)
    return family, family.spec_from_config(config, view, architecture_of(config, path), path)


def spec_from_hf_config(config: Mapping[str, Any], path: str = "config.json") -> DrafterSpec:
    """Validate an HF drafter ``config.json`` (any schema a family knows) into a `DrafterSpec`."""
    return read_hf_config(config, path)[1]


def load_hf_config(directory: str | Path) -> tuple[dict[str, Any], DrafterSpec]:
    """Read and validate ``directory/config.json`` (the spec is named after the directory)."""
    from dataclasses import replace

    config = read_config_json(directory)
    spec = spec_from_hf_config(config, str(Path(directory) / "config.json"))
    if spec.name is None:
        spec = replace(spec, name=Path(directory).resolve().name)
    return config, spec


def expected_tensors(spec: DrafterSpec, *, vocab_size: int | None = None) -> dict[str, tuple[int, ...]]:
    """Required tensors of a drafter and their shapes (see `DrafterFamily.expected_tensors`)."""
    return family_for_spec(spec).expected_tensors(spec, vocab_size=vocab_size)


__all__ = [
    "DEFAULT_FAMILY",
    "FAMILIES",
    "KNOWN_ARCHITECTURES",
    "DrafterFamily",
    "architecture_of",
    "expected_tensors",
    "family_for_architecture",
    "family_for_config",
    "family_for_gguf",
    "family_for_spec",
    "family_llama_cpp_tensor_aliases",
    "family_llama_cpp_tensor_names",
    "folder_modules",
    "has_conv_selector",
    "plain_label",
    "plain_runtime_block",
    "rope_type_of",
    "label_for",
    "load_hf_config",
    "read_hf_config",
    "runtime_blocks",
    "runtime_family",
    "runtime_param_paths",
    "spec_from_hf_config",
]
