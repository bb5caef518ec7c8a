"""The interface every drafter family implements (one module per family in this package).

A family is what mlx-lm calls a model file and llama.cpp's converter a model class: it knows one
checkpoint lineage — which HF configs it claims, how their keys become a `DrafterSpec`, how its HF
tensor names map to canonical ids (z-lab's names without ``model.``), which data quirks to undo
(`sanitize`), and which tensor set a spec implies. Everything above this layer (converter, inspect,
diff, runtime loader) asks the registry (`dflashkit.families`) for the family and never branches on
architecture strings itself.
"""

from __future__ import annotations

from typing import Any, Callable, Mapping

import numpy as np
from gguf import GGMLQuantizationType

from ..io.gguf_writer import MetadataEntry
from ..spec import ConfigView, DrafterSpec


class DrafterFamily:
    """Base class: override what differs. Instances are module-level singletons, listed in the registry."""

    #: short id, e.g. "zlab-dflash"
    name: str = ""
    #: HF ``architectures[0]`` strings this family claims (the first is written into specs)
    architectures: tuple[str, ...] = ()
    #: module under ``dflashkit.runtime`` that runs this family (imports torch; never imported here)
    runtime_module: str = ""
    #: True when `sanitize` changes tensor data (the converter then cannot copy bytes raw)
    transforms_data: bool = False
    #: DrafterSpec fields whose GGUF keys this family writes itself (`extra_metadata`, in its own
    #: order), so the dialect table leaves them out
    metadata_fields: frozenset[str] = frozenset()
    #: canonical ids rewritten by `finalize_tensor` and written after every other tensor (DSpark ``d2t``)
    final_tensors: tuple[str, ...] = ()

    # ---- claiming a checkpoint ------------------------------------------------------------------
    def matches(self, config: Mapping[str, Any], architecture: str) -> bool:
        """Whether this family reads ``config`` (``architecture`` = its ``architectures[0]``).

        The default claims by architecture string; a family told apart by config shape (keys,
        nested blocks) overrides this.
        """
        return architecture in self.architectures

    def matches_gguf(self, fields: Mapping[str, Any]) -> bool:
        """Whether decoded GGUF metadata fields (`dialects.decode_metadata`) belong to this family."""
        return False

    def owns(self, spec: DrafterSpec) -> bool:
        return spec.architecture in self.architectures

    # ---- config → spec --------------------------------------------------------------------------
    def spec_from_config(self, config: Mapping[str, Any], view: ConfigView, architecture: str, path: str) -> DrafterSpec:
        raise NotImplementedError

    # ---- tensors --------------------------------------------------------------------------------
    def hf_to_canonical(self, hf_name: str) -> str | None:
        """Canonical id of one HF checkpoint tensor name, or None when the family has no such tensor."""
        raise NotImplementedError

    def ignores_hf_tensor(self, hf_name: str) -> bool:
        """Whether a stored HF tensor is dropped on purpose (nothing reads it at run time, e.g.
        speculators' ``t2d``); it is listed in `DrafterFile.dropped`, never silently lost."""
        return False

    def sanitize(self, canonical: str, array: np.ndarray) -> np.ndarray:
        """Undo a checkpoint quirk in one tensor's data (float32, HF shape). Identity by default."""
        return array

    def rewrites(self, spec: DrafterSpec, canonical: str) -> bool:
        """Whether `sanitize_for` changes this tensor's data for this spec (the converter then cannot
        copy its bytes raw). Default: every tensor when `transforms_data`, else none."""
        return self.transforms_data

    def sanitize_for(self, spec: DrafterSpec, canonical: str, array: np.ndarray) -> np.ndarray:
        """`sanitize` with the spec at hand (for quirks that depend on the config, e.g. an
        interleaved-RoPE permutation); ``array`` is the stored data in HF shape, any dtype."""
        return self.sanitize(canonical, array)

    def expected_tensors(self, spec: DrafterSpec, *, vocab_size: int | None = None) -> dict[str, tuple[int, ...]]:
        """Required canonical tensors and their numpy/HF shapes (-1: not determined by the spec)."""
        raise NotImplementedError

    def optional_tensors(self, spec: DrafterSpec) -> dict[str, tuple[int, ...]]:
        """Tensors the family may carry; -1 = not determined by the spec (vocabulary rows)."""
        return {}

    def extra_metadata(self, spec: DrafterSpec, dialect: Any, arch: str) -> list[MetadataEntry]:
        """Metadata entries this family writes beyond the dialect's spec keys (after them, before the
        tokenizer); ``dialect`` is the `dflashkit.dialects.Dialect` being written. None by default."""
        return []

    # ---- conversion hooks (DSpark / Gemma-4 DSpark; identity for the z-lab families) ------------------
    def refine_spec(self, spec: DrafterSpec, shapes: Mapping[str, tuple[int, ...]]) -> DrafterSpec:
        """What the tensors tell beyond the config or metadata (e.g. a head's rank, the draft vocabulary).
        ``shapes``: canonical id → numpy/HF shape, of an HF checkpoint or a GGUF."""
        return spec

    def check_source(self, spec: DrafterSpec, shapes: Mapping[str, tuple[int, ...]], source: str) -> None:
        """Family rules on a checkpoint's tensor set that the shape table cannot express (one-line
        DFlashError naming the tensor or key); run by the converter before anything is written."""

    def dropped_on_convert(self, spec: DrafterSpec) -> frozenset[str]:
        """Canonical ids read from a checkpoint but not written to GGUF (as llama.cpp's converter drops them)."""
        return frozenset()

    def generated_tensors(self, spec: DrafterSpec) -> dict[str, np.ndarray]:
        """Tensors the converter writes that no checkpoint holds (float32, numpy shape), written first."""
        return {}

    def finalize_tensor(
        self, spec: DrafterSpec, canonical: str, data: np.ndarray, source: str
    ) -> tuple[np.ndarray, GGMLQuantizationType]:
        """The GGUF data and type of a `final_tensors` entry from its stored data."""
        raise NotImplementedError
