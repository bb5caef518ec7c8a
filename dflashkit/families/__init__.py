"""Drafter families and their registry.

One module per family (``zlab_dflash.py``, ``zlab_dflash2.py``, ``dspark.py``, ``speculators_dspark.py``,
``gemma4_dspark.py``, ``deepseek_v4_dspark.py``), each a `DrafterFamily`
(`base.py`). The registry below is the only place that lists them: HF configs are claimed by
`DrafterFamily.matches` (architecture string, or config shape), GGUF metadata by
`DrafterFamily.matches_gguf`, specs by their ``architecture``.

Adding a family: one module here, one line in `FAMILIES`, its tests.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Mapping

from .. import bounds
from ..errors import DFlashError
from ..spec import ARCH_DFLASH, ConfigView, DrafterSpec, read_config_json
from . import speculators_dflash, zlab_dflash, zlab_dflash2
# DSpark families (issue 13, 13B)
from . import deepseek_v4_dspark, dspark, gemma4_dspark, speculators_dspark
from .base import DrafterFamily

#: Every family, in matching order (the first whose `matches` is true wins).
FAMILIES: tuple[DrafterFamily, ...] = (
    # DSpark (13B): before z-lab, whose GGUF signature (no conv keys) claims every other dflash file;
    # the speculators layout before SpecForge's (both carry DSparkDraftModel; told apart by shape)
    speculators_dspark.FAMILY,
    gemma4_dspark.FAMILY,
    dspark.FAMILY,
    deepseek_v4_dspark.FAMILY,
    # speculators DFlash / DFlash 2 (13C): same architecture strings as z-lab, claimed by config
    # shape — so they come before the z-lab families, which claim by name
    speculators_dflash.DFLASH,
    speculators_dflash.DFLASH2,
    # z-lab DFlash
    zlab_dflash.FAMILY,
    zlab_dflash2.FAMILY,
)
#: Claims an HF config with no ``architectures`` list (z-lab's early configs) and names tensors of
#: a config no family claims.
DEFAULT_FAMILY: DrafterFamily = zlab_dflash.FAMILY
#: Every HF architecture string a family claims by name.
KNOWN_ARCHITECTURES: tuple[str, ...] = tuple(dict.fromkeys(a for f in FAMILIES for a in f.architectures))


def _not_a_drafter(path: str, architecture: Any) -> DFlashError:
    return DFlashError(
        f"{path}: architecture {bounds.quote(architecture)} is not a DFlash drafter "
        f"(expected one of {', '.join(KNOWN_ARCHITECTURES)})"
    )


def architecture_of(config: Mapping[str, Any], path: str = "config.json") -> str:
    """``architectures[0]`` of an HF config (z-lab's early configs have none: DFlash). A bare string is
    taken as a one-element list; anything else but a non-empty list of strings is a one-line error."""
    archs = config.get("architectures") or [ARCH_DFLASH]
    if isinstance(archs, str):  # a bare string is accepted as a one-element list
        archs = [archs]
    if not isinstance(archs, list) or not archs:
        raise DFlashError(f"{path}: 'architectures' must be a non-empty list")
    if not isinstance(archs[0], str):
        raise _not_a_drafter(path, archs[0])
    return archs[0]


#: ``speculators_model_type`` values of the DFlash families (speculators' other algorithms, e.g. eagle3, are not)
SPECULATORS_MODEL_TYPES = ("dflash", "dflash2", "dspark")


def family_for_config(config: Mapping[str, Any], path: str = "config.json") -> DrafterFamily:
    """The family that reads an HF ``config.json`` (one-line DFlashError when none does)."""
    kind = config.get("speculators_model_type")
    if kind is not None and kind not in SPECULATORS_MODEL_TYPES:  # before a family claims it by its shape
        raise DFlashError(f"{path}: speculators_model_type {bounds.quote(kind)} is not a DFlash-family drafter "
                          f"(one of {', '.join(SPECULATORS_MODEL_TYPES)})")
    architecture = architecture_of(config, path)
    for family in FAMILIES:
        if family.matches(config, architecture):
            return family
    raise _not_a_drafter(path, architecture)


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


def optional_tensors(spec: DrafterSpec) -> dict[str, tuple[int, ...]]:
    return family_for_spec(spec).optional_tensors(spec)


__all__ = [
    "DEFAULT_FAMILY",
    "FAMILIES",
    "KNOWN_ARCHITECTURES",
    "DrafterFamily",
    "architecture_of",
    "expected_tensors",
    "family_for_config",
    "family_for_gguf",
    "family_for_spec",
    "load_hf_config",
    "optional_tensors",
    "read_hf_config",
    "spec_from_hf_config",
]
