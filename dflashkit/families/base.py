"""The interface every drafter family implements (one module per family in this package).

A family is what mlx-lm calls a model file and llama.cpp's converter a model class: it knows one
checkpoint lineage — which HF configs it claims, how their keys become a `DrafterSpec`, how its HF
tensor names map to canonical ids (z-lab's names without ``model.``), which data quirks to undo
(`sanitize`), and which tensor set a spec implies. Everything above this layer (converter, inspect,
diff, runtime loader) asks the registry (`dflashkit.families`) for the family and never branches on
architecture strings itself.
"""

from __future__ import annotations

from typing import Any, Mapping

import numpy as np
from gguf import GGMLQuantizationType

from ..io.gguf_writer import MetadataEntry
from ..spec import ConfigView, DrafterSpec


#: Every family class that names itself, in definition order (`DrafterFamily.__init_subclass__`); the
#: registry (`dflashkit.families`) orders their singletons by `DrafterFamily.priority`.
REGISTERED: list["DrafterFamily"] = []


class DrafterFamily:
    """Base class: override what differs. A subclass that sets ``name`` registers itself (as gguf-py's
    ``quants.py`` registers quant types): its singleton is ``cls.instance``, listed by the registry."""

    #: short id, e.g. "zlab-dflash"
    name: str = ""
    #: matching order: a higher priority is asked first (a family claimed by config shape before one
    #: claimed by architecture string; ties keep definition order)
    priority: int = 0
    #: claims an HF config with no ``architectures`` list and names the tensors of a config no family claims
    default: bool = False
    #: what reports call a drafter of this family, per checkpoint layout (``None`` key: any other layout)
    labels: Mapping[str | None, str] = {}
    #: modules of the family's folder imported by the layer that needs them: ``checks`` (inspect checks,
    #: registered on import) and ``runtime`` (its PyTorch block, imports torch) — never by the registry
    folder_modules: tuple[str, ...] = ()

    #: HF ``architectures[0]`` strings this family claims (the first is written into specs)
    architectures: tuple[str, ...] = ()
    #: id of the runtime block that runs this family (`RuntimeConfig.family`); families sharing a block share it
    runtime_module: str = ""
    #: ``"module:Class"`` of that block's model (imports torch; resolved by ``dflashkit.runtime.zoo``, never here)
    runtime_class: str = ""
    #: runs on a backbone of its own (its ``runtime_class``), whatever block its heads share
    own_backbone: bool = False
    #: canonical id → the runtime block's parameter path, where they differ
    runtime_param_paths: Mapping[str, str] = {}
    #: why dflashkit's runtime does not run this family (refused by name), or "" when it does
    runtime_unsupported: str = ""
    #: ``speculators_model_type`` values this family reads (speculators' own configs)
    speculators_model_types: tuple[str, ...] = ()
    #: its tensors include per-layer convolutions and a candidate selector that only some dialects name
    conv_selector: bool = False
    #: always carries its own full-vocabulary head (decided without the tensors)
    own_head: bool = False
    #: its sliding window counts back from the anchor (speculators' mask) ...
    window_from_anchor: bool = False
    #: ... and is bidirectional within the block unless the config says ``sliding_window_non_causal``
    window_non_causal_default: bool = False
    #: canonical id → llama.cpp GGUF name (``{bid}`` = layer) of the tensors only this family has; the llama.cpp
    #: dialect table adds them (the other dialects' loaders do not name them)
    llama_cpp_tensor_names: Mapping[str, str] = {}
    #: older GGUF names of those tensors, read and rewritten on translate
    llama_cpp_tensor_aliases: Mapping[str, str] = {}
    #: the layout a spec that names none is labelled in (the default family's)
    label_layout: str = ""
    #: a plain `DrafterSpec` of its architecture runs in this family's block (asked of the family's own class)
    plain_runtime: bool = False
    #: why a GGUF cannot tell this family's architecture names apart ("" when it can): `dflash-diff` then
    #: does not count an architecture-name difference between a checkpoint and its GGUF
    gguf_architecture_note: str = ""
    #: True when `sanitize` changes tensor data (the converter then cannot copy bytes raw)
    transforms_data: bool = False
    #: DrafterSpec fields whose GGUF keys this family writes itself (`extra_metadata`, in its own
    #: order), so the dialect table leaves them out
    metadata_fields: frozenset[str] = frozenset()
    #: canonical ids rewritten by `finalize_tensor` and written after every other tensor (DSpark ``d2t``)
    final_tensors: tuple[str, ...] = ()
    #: converted as llama.cpp's ``DFlashModel`` converts it: a Gemma target's √hidden embedding scale is written
    #: when the config gives no ``input_embedding_scale`` (mainline b11549; `target_rules.gemma_embedding_scale`)
    gemma_target_embedding_scale: bool = False
    #: llama.cpp's ``--spec-type`` for a drafter of this family (llama.cpp picks it from the file by the same rule)
    llama_cpp_spec_type: str = "draft-dflash"
    #: ---- a family with a GGUF architecture of its own (EAGLE-3: ``eagle3``) --------------------------------
    #: its ``general.architecture`` in llama.cpp's dialect ("": the dialect's DFlash architecture); the dialects
    #: package builds that architecture's table from the three rows below (`dflashkit.dialects.family_dialect`)
    gguf_architecture: str = ""
    #: its metadata rows in llama.cpp's order: (spec field, key template, GGUFValueType, sub type, placement) with
    #: placement "" (after general.*), "leading" (before general.*, as llama.cpp's converter writes them from
    #: ``__init__``), "required" or "after_file_type" (written after general.file_type)
    gguf_keys: tuple[tuple[Any, ...], ...] = ()
    #: canonical id → GGUF name template of every tensor it writes
    gguf_tensor_names: Mapping[str, str] = {}
    #: spec fields that no key stores, taken from the family on read (e.g. a chain drafter's default block)
    gguf_defaults: Mapping[str, Any] = {}
    #: its converter reads the target's vocabulary through llama.cpp's ``LlamaModel.set_vocab`` (which first writes
    #: ``tokenizer.ggml.add_space_prefix`` from the target's tokenizer_config), whatever the target's architecture
    llama_vocab: bool = False
    #: the model card's tag for the family (Hugging Face hub ``tags``)
    hub_tag: str = "dflash"
    #: llama.cpp clamps its ``--spec-draft-n-max`` to the block (DFlash); a chain drafter drafts any n-max
    clamps_n_max: bool = True
    #: its drafts embed a mask token (a DFlash block); a chain drafter (EAGLE-3) has none
    uses_mask_token: bool = True
    #: converting needs the target (llama.cpp's converter reads its config and tokenizer: ``--target-model-dir``)
    needs_target: bool = False

    instance: "DrafterFamily"

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        if "name" in cls.__dict__:
            cls.instance = cls()
            REGISTERED.append(cls.instance)

    # ---- runtime facts (the runtime asks these; it never names a family) ---------------------------
    def runtime_fields(self, spec: DrafterSpec, shapes: Mapping[str, tuple[int, ...]]) -> dict[str, Any]:
        """`RuntimeConfig` fields this family decides from its tensors (``shapes``: canonical id → shape of the
        tensors at hand; empty for a config alone) beyond what every family derives."""
        return {}

    def check_runtime(self, cfg: Any, path: str) -> None:
        """Family rules on a lifted `RuntimeConfig` (one-line DFlashError naming the key)."""

    def card_kind(self, block_size: int) -> str:
        """What a model card calls a drafter of this family (`dflashkit.release.card`)."""
        return f"DFlash-family drafter ({self.name}, block size {block_size})"

    def n_max_note(self, n_max: int) -> str:
        """Why a card's llama-server line passes ``--spec-draft-n-max n_max`` (the block's default)."""
        return (f"`--spec-draft-n-max {n_max}`: the drafter's whole block (llama-server drafts only 3 tokens a round "
                "unless told).")

    def label(self, layout: str | None) -> str:
        """What reports call a drafter of this family stored in ``layout``."""
        return self.labels.get(layout) or self.labels.get(None) or self.name

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

    def with_target(self, spec: DrafterSpec, target: Any, source: str) -> DrafterSpec:
        """What only the target tells this family (``target``: a `converters.target.TargetInfo`, with ``config``
        when it is an HF directory), after the shared drafter ↔ target rules. Identity by default."""
        return spec

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
