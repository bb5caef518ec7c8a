"""DSpark (SpecForge / DeepSpec layout): DFlash plus a semi-autoregressive Markov head, an optional
confidence head and an optional reduced draft vocabulary (``d2t``).

Architectures ``Qwen3DSparkModel``, ``DSparkDraftModel``, ``DSparkSpeculator``, ``Lfm2DSparkDraftModel``,
``LingDSparkModel`` — the names llama.cpp's converter (``conversion/qwen.py`` ``DSparkModel``) registers.
The backbone is z-lab DFlash's (config rules and tensor names of `zlab_dflash`); on top:

- config: ``markov_head_type`` (top level, as llama.cpp reads it) must be ``vanilla``; ``markov_rank``;
  ``draft_vocab_size`` (default: the full vocabulary) must not exceed ``vocab_size``;
  ``sample_from_anchor`` — the explicit value, else llama.cpp's rule: true unless the config is
  speculators-shaped (`speculators_dspark` reads that layout);
- tensors (HF → llama.cpp): ``markov_head.markov_w1.weight`` {vocab, rank} → ``markov_w1.weight``,
  ``markov_head.markov_w2.weight`` {draft_vocab, rank} → ``markov_w2.weight`` (+ optional ``.scale``),
  ``confidence_head.proj.{weight,bias}`` → ``conf_proj.*``; ``t2d`` is dropped (unused at run time);
  ``lm_head.weight`` is dropped with a full draft vocabulary (the target's head is used), else written as
  ``output.weight``; ``d2t`` (offsets: target id = d2t[i] + i) is written last as I64 absolute ids, after
  the range and uniqueness checks llama.cpp makes;
- metadata: ``dflash.sample_from_anchor`` and ``dflash.has_confidence_head`` (= the checkpoint has the
  confidence head's tensors), after every DFlash key.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any, Mapping

import numpy as np
from gguf import GGMLQuantizationType, GGUFValueType

from ...errors import DFlashError
from ...io.gguf_writer import MetadataEntry
from ...spec import ConfigView, DrafterSpec
from ..zlab_dflash import ZLabDFlash, zlab_hf_to_canonical

DSPARK_ARCHITECTURES: tuple[str, ...] = (
    "Qwen3DSparkModel",
    "DSparkDraftModel",
    "DSparkSpeculator",
    "Lfm2DSparkDraftModel",
    "LingDSparkModel",
)

MARKOV_W1 = "markov_head.markov_w1.weight"
MARKOV_W2 = "markov_head.markov_w2.weight"
MARKOV_W2_SCALE = "markov_head.markov_w2.scale"
CONF_W = "confidence_head.proj.weight"
CONF_B = "confidence_head.proj.bias"
D2T = "d2t"
T2D = "t2d"
#: Canonical ids of the DSpark heads (HF names, ``model.`` stripped).
DSPARK_TENSORS: frozenset[str] = frozenset({MARKOV_W1, MARKOV_W2, MARKOV_W2_SCALE, CONF_W, CONF_B, D2T, T2D})


def is_speculators_config(config: Mapping[str, Any]) -> bool:
    """Whether a config has the speculators shape (llama.cpp's test: hparams nested in
    ``transformer_layer_config`` or speculators' tap key), whatever its ``architectures`` says."""
    return (
        "transformer_layer_config" in config
        or "aux_hidden_state_layer_ids" in config
        or config.get("speculators_model_type") is not None
    )


def dspark_hf_to_canonical(hf_name: str) -> str | None:
    name = hf_name[len("model."):] if hf_name.startswith("model.") else hf_name
    if name in DSPARK_TENSORS:
        return name
    return zlab_hf_to_canonical(hf_name)


class DSpark(ZLabDFlash):
    name = "dspark"
    llama_cpp_spec_type = "draft-dspark"  # the Markov head (common_speculative_types_from_gguf)
    gemma_target_embedding_scale = True
    priority = 60
    architectures = DSPARK_ARCHITECTURES
    runtime_module = "dspark"  # runtime.py here (runtime.load lifts the spec to a RuntimeConfig)
    runtime_class = "dflashkit.families.dspark.runtime:DSparkDraftModel"
    folder_modules = ("checks", "runtime")
    labels = {"specforge": "SpecForge DSpark", "zlab": "DSpark", "llama.cpp": "DSpark (llama.cpp GGUF)"}
    gguf_architecture_note = ("the five DSpark architecture names convert alike; a GGUF does not record which one "
                              "the checkpoint used")
    window_non_causal_default = False
    runtime_param_paths = {MARKOV_W2_SCALE: "markov_head.markov_w2_scale"}
    llama_cpp_tensor_names = {
        MARKOV_W1: "markov_w1.weight", MARKOV_W2: "markov_w2.weight", MARKOV_W2_SCALE: "markov_w2.scale",
        CONF_W: "conf_proj.weight", CONF_B: "conf_proj.bias",
    }
    metadata_fields = frozenset({"sample_from_anchor", "has_confidence_head"})
    final_tensors = (D2T,)
    #: the checkpoint layout this family reads (DrafterSpec.layout)
    layout = "specforge"

    def runtime_fields(self, spec: DrafterSpec, shapes: Mapping[str, tuple[int, ...]]) -> dict[str, Any]:
        width = shapes.get(CONF_W)  # the confidence head sees the Markov features when its width is hidden + rank
        if width is None:
            return {}
        return {"confidence_head_with_markov": bool(spec.markov_rank) and width[-1] == spec.hidden_size + (spec.markov_rank or 0)}

    def check_runtime(self, cfg: Any, path: str) -> None:
        if (cfg.markov_rank or 0) > 0 and cfg.markov_head_type != "vanilla":
            raise DFlashError(f"{path}: markov_head_type '{cfg.markov_head_type}' is not supported — only 'vanilla' "
                              "runs (as in llama.cpp)")

    # ---- claiming -------------------------------------------------------------------------------
    def matches(self, config: Mapping[str, Any], architecture: str) -> bool:
        return architecture in self.architectures and not is_speculators_config(config)

    def matches_gguf(self, fields: Mapping[str, Any]) -> bool:
        # llama.cpp's DSpark converters always write has_confidence_head (DFlash ones never do)
        return fields.get("has_confidence_head") is not None

    def owns(self, spec: DrafterSpec) -> bool:
        return spec.architecture in self.architectures and spec.layout != "speculators"

    def hf_to_canonical(self, hf_name: str) -> str | None:
        return dspark_hf_to_canonical(hf_name)

    # ---- config → spec --------------------------------------------------------------------------
    def spec_from_config(self, config: Mapping[str, Any], view: ConfigView, architecture: str, path: str) -> DrafterSpec:
        spec = super().spec_from_config(config, view, architecture, path)
        return self._dspark_fields(spec, config, view, path, default_sample_from_anchor=not is_speculators_config(config))

    def _dspark_fields(
        self, spec: DrafterSpec, config: Mapping[str, Any], view: ConfigView, path: str, *, default_sample_from_anchor: bool
    ) -> DrafterSpec:
        # llama.cpp reads markov_head_type from the (merged) top level only, default vanilla
        head_type = config.get("markov_head_type", "vanilla")
        if head_type != "vanilla":
            raise DFlashError(
                f"{path}: unsupported markov_head_type {head_type!r} (only 'vanilla' is supported) — "
                "llama.cpp runs the vanilla Markov head only"
            )
        top = ConfigView({k: v for k, v in config.items() if k != "dflash_config"}, path)
        vocab = spec.vocab_size
        if vocab is None:
            raise DFlashError(f"{path}: required key 'vocab_size' is missing (a DSpark Markov head has one row per token)")
        draft = top.int("draft_vocab_size", minimum=1) or vocab
        if draft > vocab:
            raise DFlashError(
                f"{path}: draft_vocab_size {draft} exceeds vocab_size {vocab} — a draft vocabulary is a subset of the target's"
            )
        sample = top.bool("sample_from_anchor")
        return replace(
            spec,
            sample_from_anchor=default_sample_from_anchor if sample is None else sample,
            draft_vocab_size=draft if draft < vocab else None,
            markov_rank=top.int("markov_rank", minimum=1),
            markov_head_type="vanilla",
            layout=self.layout,
        )

    # ---- tensors --------------------------------------------------------------------------------
    def refine_spec(self, spec: DrafterSpec, shapes: Mapping[str, tuple[int, ...]]) -> DrafterSpec:
        changes: dict[str, Any] = {}
        w1 = shapes.get(MARKOV_W1)
        if w1 is not None and len(w1) == 2:
            if spec.markov_rank is None:
                changes["markov_rank"] = w1[1]
            if spec.vocab_size is None:
                changes["vocab_size"] = w1[0]
        if spec.has_confidence_head is None:
            changes["has_confidence_head"] = CONF_W in shapes or CONF_B in shapes
        if spec.draft_vocab_size is None and spec.layout is None:  # a GGUF: d2t gives the draft rows
            d2t = shapes.get(D2T)
            if d2t is not None and len(d2t) == 1:
                changes["draft_vocab_size"] = d2t[0]
        if spec.markov_head_type is None and w1 is not None:
            changes["markov_head_type"] = "vanilla"  # the only head a GGUF holds
        return replace(spec, **changes) if changes else spec

    def _head_shapes(self, spec: DrafterSpec, vocab_size: int | None) -> tuple[int, int, int]:
        vocab = spec.vocab_size or vocab_size or -1
        draft = spec.draft_vocab_size or vocab
        return vocab, draft, spec.markov_rank or -1

    def _global_extras(self, spec: DrafterSpec, vocab_size: int | None, shapes: dict[str, tuple[int, ...]]) -> None:
        vocab, draft, rank = self._head_shapes(spec, vocab_size)
        shapes[MARKOV_W1] = (vocab, rank)
        shapes[MARKOV_W2] = (draft, rank)
        if spec.has_confidence_head:
            shapes[CONF_W] = _confidence_shape(spec)
            shapes[CONF_B] = (1,)
        if spec.draft_vocab_size is not None:
            shapes[D2T] = (spec.draft_vocab_size,)
            shapes["lm_head.weight"] = (spec.draft_vocab_size, spec.hidden_size)

    def optional_tensors(self, spec: DrafterSpec) -> dict[str, tuple[int, ...]]:
        shapes = super().optional_tensors(spec)
        shapes[MARKOV_W2_SCALE] = (1,)
        shapes[T2D] = (spec.vocab_size or -1,)
        if not spec.has_confidence_head:
            # a head the config does not announce is still read (llama.cpp: any confidence_head.proj tensor)
            shapes[CONF_W] = _confidence_shape(spec)
            shapes[CONF_B] = (1,)
        return shapes

    def check_source(self, spec: DrafterSpec, shapes: Mapping[str, tuple[int, ...]], source: str) -> None:
        vocab = spec.vocab_size
        if spec.draft_vocab_size is not None and D2T not in shapes:
            raise DFlashError(
                f"{source}: draft_vocab_size {spec.draft_vocab_size} < vocab_size {vocab} but no d2t table found — "
                "a reduced draft vocabulary needs the checkpoint's d2t tensor (draft row → target id)"
            )
        d2t = shapes.get(D2T)
        if d2t is not None:
            draft = spec.draft_vocab_size or vocab
            n = int(np.prod(d2t)) if d2t else 1
            if n != draft:
                raise DFlashError(
                    f"{source}: d2t size {n} does not match draft_vocab_size {draft} — check config.json "
                    "'draft_vocab_size' against the checkpoint's d2t tensor"
                )

    def dropped_on_convert(self, spec: DrafterSpec) -> frozenset[str]:
        # t2d is not used at run time; a full-vocabulary drafter uses the target's head
        return frozenset({T2D} if spec.draft_vocab_size is not None else {T2D, "lm_head.weight"})

    def finalize_tensor(
        self, spec: DrafterSpec, canonical: str, data: np.ndarray, source: str
    ) -> tuple[np.ndarray, GGMLQuantizationType]:
        assert canonical == D2T
        return d2t_absolute(data, spec.vocab_size or 0, source), GGMLQuantizationType.I64

    # ---- metadata -------------------------------------------------------------------------------
    def extra_metadata(self, spec: DrafterSpec, dialect: Any, arch: str) -> list[MetadataEntry]:
        return dspark_flags(spec, arch)


def _confidence_shape(spec: DrafterSpec) -> tuple[int, int]:
    """[1, hidden + rank] (llama.cpp's loader shape: the head sees the Markov features). The runtime also runs
    speculators' ``confidence_head_with_markov: false`` head, [1, hidden], from an HF checkpoint: its spec
    (a ``dflashkit.runtime`` RuntimeConfig) says so in that field, which a converter's spec does not have."""
    if not spec.markov_rank:
        return (1, -1)
    if getattr(spec, "confidence_head_with_markov", True) is False:
        return (1, spec.hidden_size)
    return (1, spec.hidden_size + spec.markov_rank)


def dspark_flags(spec: DrafterSpec, arch: str) -> list[MetadataEntry]:
    """``{arch}.sample_from_anchor`` and ``{arch}.has_confidence_head``, in llama.cpp's order."""
    return [
        MetadataEntry(f"{arch}.sample_from_anchor", bool(spec.sample_from_anchor if spec.sample_from_anchor is not None else True), GGUFValueType.BOOL),
        MetadataEntry(f"{arch}.has_confidence_head", bool(spec.has_confidence_head), GGUFValueType.BOOL),
    ]


def d2t_absolute(stored: np.ndarray, vocab_size: int, source: str) -> np.ndarray:
    """speculators' ``d2t`` offsets (target id = d2t[i] + i) → absolute target ids (int64), refusing ids
    outside the target vocabulary and duplicates, as llama.cpp's converter does."""
    if stored.dtype.kind not in "iu":
        raise DFlashError(f"{source}: tensor 'd2t' has dtype {stored.dtype}; expected integer offsets (I64)")
    data = stored.astype(np.int64).reshape(-1) + np.arange(stored.size, dtype=np.int64)
    bad = np.flatnonzero((data < 0) | (data >= vocab_size))
    if bad.size:
        i = int(bad[0])
        raise DFlashError(
            f"{source}: d2t target ids out of range for target vocab size {vocab_size} "
            f"({bad.size} of {data.size}; first: row {i} → {int(data[i])})"
        )
    unique, counts = np.unique(data, return_counts=True)
    if unique.size != data.size:
        dup = int(unique[counts > 1][0])
        rows = np.flatnonzero(data == dup)[:2].tolist()
        raise DFlashError(f"{source}: d2t contains duplicate target ids (target id {dup} at rows {rows})")
    return data


FAMILY = DSpark.instance
