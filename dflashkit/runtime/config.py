"""What the runtime needs to know about a drafter of any family: `RuntimeConfig`.

A drafter's `DrafterSpec` comes from its family (`dflashkit.families`: every HF layout, and the GGUF
metadata through the dialect tables) with the zoo fields (``layout``, ``sample_from_anchor``,
``draft_vocab_size``, ``markov_rank``, ``markov_head_type``, ``has_confidence_head``, ``hidden_act``,
``rope_scaling``, ``rope_is_neox_style``). `RuntimeConfig` is that spec plus only what the runtime computes
with and the spec does not say (`runtime_fields` derives them from the family, the tensors present and the
file kind — no config is parsed here a second time):

- ``family``: the family's ``runtime_module``, the id of the runtime block that runs it (a family on a
  backbone of its own runs in that backbone's block: `dflashkit.families.runtime_family`);
- ``own_embed_tokens`` / ``own_lm_head``: the drafter's own embeddings / head replace the target's, as
  llama.cpp's loader does (own head rows mapped to target ids through ``d2t``);
- ``confidence_head_with_markov``: the DSpark confidence head also sees the Markov features;
- ``rope_interleaved``: the weights *in this file* are in the interleaved-RoPE order (an HF checkpoint with
  ``rope_is_neox_style: false``; a converted GGUF is already NeoX-permuted and leaves it false);
- ``attention_sinks``; ``window_from_anchor`` / ``sliding_window_non_causal``: speculators' sliding-window
  mask (the window is counted back from the anchor; the block is bidirectional unless the layer is causal).

Spec fields left None mean z-lab DFlash behaviour here: ``sample_from_anchor`` None = slot 0 is only the
anchor (block_size − 1 draft tokens), ``hidden_act`` None = silu, ``markov_rank`` None = no Markov head.
``rope_scaling`` is held as the spec holds it (llama.cpp's names: ``type``, ``factor``,
``original_context_length``, ``attn_factor``, ``ext_factor``, ``beta_fast``, ``beta_slow``);
`rope_parameters` gives transformers' form, which the rotary embedding computes with.

Entry points: `runtime_config` (a family's spec + the tensors at hand; what the loader uses),
`runtime_config_from_hf` (a config.json alone) and `runtime_config_from_spec` (a spec + explicit fields).
"""

from __future__ import annotations

from dataclasses import dataclass, fields
from typing import Any, Mapping

from ..causality import masks_differ_in_llama_cpp, window_non_causal
from ..divergences.heads import llama_cpp_reads_anchor_slot
from ..errors import DFlashError
from ..families import (DEFAULT_FAMILY, DrafterFamily, family_for_architecture, label_for, plain_runtime_block,
                        read_hf_config, rope_type_of, runtime_blocks, runtime_family)
from ..spec import DrafterSpec

HIDDEN_ACTS = ("silu", "gelu", "gelu_pytorch_tanh")
ROPE_TYPES = ("default", "linear", "yarn")


#: DrafterSpec.rope_scaling key (llama.cpp's converter names) → transformers' rope_parameters key
_ROPE_KEYS_TO_HF = {"type": "rope_type", "original_context_length": "original_max_position_embeddings",
                    "attn_factor": "attention_factor", "ext_factor": "extrapolation_factor"}


def rope_parameters(scaling: Any) -> dict[str, Any] | None:
    """``DrafterSpec.rope_scaling`` (pairs, llama.cpp names) → transformers' ``rope_parameters`` dict."""
    if not scaling:
        return None
    return {_ROPE_KEYS_TO_HF.get(k, k): v for k, v in dict(scaling).items()}


@dataclass(frozen=True, eq=False)
class RuntimeConfig(DrafterSpec):
    """A `DrafterSpec` plus the runtime-only fields (defaults = z-lab DFlash behaviour)."""

    family: str = DEFAULT_FAMILY.runtime_module
    own_embed_tokens: bool = False
    own_lm_head: bool = False
    confidence_head_with_markov: bool = True
    rope_interleaved: bool = False
    attention_sinks: bool = False
    window_from_anchor: bool = False
    sliding_window_non_causal: bool = False
    #: a GGUF run as llama.cpp runs it: one causal flag for every layer, a window on the past side only
    #: (`dflashkit.causality`); set where that differs from the checkpoint's reference
    llama_cpp_masks: bool = False
    #: a GGUF of the llama.cpp dialect: run by llama.cpp's rule wherever the audit found one that differs from the
    #: reference's (`dflashkit.divergences`)
    llama_cpp_rules: bool = False

    @property
    def label(self) -> str:
        return label_for(self.architecture, self.family, self.layout or DEFAULT_FAMILY.label_layout)

    @property
    def first_draft_slot(self) -> int:
        return first_draft_slot(self)

    @property
    def draft_tokens(self) -> int:
        """Draft tokens per round: block_size with sample_from_anchor, block_size − 1 without."""
        return self.block_size - self.first_draft_slot


def first_draft_slot(spec: DrafterSpec) -> int:
    """Block slot of a drafter's first prediction: 0 with sample_from_anchor, else 1 (slot 0 is the anchor; a plain
    `DrafterSpec` has no sample_from_anchor). A llama.cpp GGUF (``llama_cpp_rules``) by llama.cpp's rule: slot 0 only
    for DSpark — its DFlash path reads slots 1.. whatever the key says (`dflashkit.divergences.heads`)."""
    if not getattr(spec, "sample_from_anchor", False):
        return 1
    if getattr(spec, "llama_cpp_rules", False) and not llama_cpp_reads_anchor_slot(spec):
        return 1
    return 0


def runtime_config_from_spec(spec: DrafterSpec, **extra: Any) -> RuntimeConfig:
    """A `DrafterSpec` (e.g. from a GGUF) with the zoo fields in ``extra`` (names of `RuntimeConfig`)."""
    return _checked(_lift(spec, extra), "drafter")


def _lift(spec: DrafterSpec, extra: Mapping[str, Any]) -> RuntimeConfig:
    base = {f.name: getattr(spec, f.name) for f in fields(DrafterSpec)}
    if isinstance(spec, RuntimeConfig):
        base.update({f.name: getattr(spec, f.name) for f in fields(RuntimeConfig)})
    else:
        base["family"] = plain_runtime_block(spec.architecture)
    unknown = sorted(set(extra) - {f.name for f in fields(RuntimeConfig)})
    if unknown:
        raise TypeError(f"runtime_config_from_spec: unknown field(s) {unknown}")
    base.update(extra)
    return RuntimeConfig(**base)


#: canonical ids of the tensors that decide runtime-only fields (`runtime_fields`)
EMBED_TOKENS, LM_HEAD = "embed_tokens.weight", "lm_head.weight"


def refuse_unsupported(architecture: str, path: str) -> None:
    """A one-line DFlashError for an architecture whose backbone this runtime does not implement."""
    family = family_for_architecture(architecture)
    if family is not None and family.runtime_unsupported:
        raise DFlashError(f"{path}: {architecture} is {family.runtime_unsupported}, which dflashkit's "
                          "runtime does not run")


def runtime_fields(family: DrafterFamily, spec: DrafterSpec, *, kind: str, shapes: Mapping[str, tuple[int, ...]] | None,
                   config: Mapping[str, Any] | None = None, one_causal_flag: bool = False) -> dict[str, Any]:
    """The `RuntimeConfig`-only fields of a drafter its family has read into ``spec``.

    ``kind``: "hf" or "gguf"; ``shapes``: canonical id → shape of the tensors the runtime uses (None: a
    config alone, then a reduced draft vocabulary means an own head); ``config``: the HF config.json, for
    the one speculators key no `DrafterSpec` field holds (``sliding_window_non_causal``); ``one_causal_flag``: a GGUF
    whose dialect's consumer reads one causal flag (llama.cpp), run with its masks where they differ.

    As llama.cpp's loader (``src/models/dflash.cpp``) decides them for a GGUF: an own ``token_embd``
    replaces the target's embeddings, an own ``output`` the target's head, and an own ``token_embd``
    without an ``output`` is the head too (``TENSOR_DUPLICATED``); the confidence head sees the Markov
    features when its width is hidden + rank.
    """
    out: dict[str, Any] = {"family": family.runtime_module}
    if shapes is None:  # a family with a head of its own always has it (llama.cpp's converter writes it)
        own_embed, own_head = False, spec.draft_vocab_size is not None or family.own_head
    else:
        own_embed = EMBED_TOKENS in shapes
        own_head = LM_HEAD in shapes or own_embed
    out["own_embed_tokens"], out["own_lm_head"] = own_embed, own_head
    out.update(family.runtime_fields(spec, shapes or {}))
    out["rope_interleaved"] = kind == "hf" and not spec.rope_is_neox_style  # stored interleaved, run so
    out["attention_sinks"] = any(c.endswith(".self_attn.sinks") for c in shapes or ())
    if kind == "hf" and family.window_from_anchor:  # its sliding window counts back from the anchor (speculators' mask)
        out.update(window_from_anchor=True, sliding_window_non_causal=window_non_causal(family, config))
    if kind == "gguf" and one_causal_flag and masks_differ_in_llama_cpp(spec):
        out["llama_cpp_masks"] = True
    if kind == "gguf" and one_causal_flag:
        out["llama_cpp_rules"] = True
    return out


_RUNTIME_DEFAULTS = {f.name: f.default for f in fields(RuntimeConfig) if f.name not in DrafterSpec.field_names()}


def runtime_config(family: DrafterFamily, spec: DrafterSpec, *, kind: str,
                   shapes: Mapping[str, tuple[int, ...]] | None = None, config: Mapping[str, Any] | None = None,
                   path: str = "drafter", one_causal_flag: bool = False) -> DrafterSpec:
    """``spec`` (what ``family`` read from an HF config or a GGUF's metadata) lifted to a `RuntimeConfig` with
    `runtime_fields` — or unchanged when the runtime computes nothing beyond z-lab DFlash with it (a plain
    z-lab checkpoint keeps its `DrafterSpec`, so its HF and GGUF forms compare equal). A lifted GGUF is
    labelled with llama.cpp's layout."""
    refuse_unsupported(spec.architecture, path)
    extra = runtime_fields(family, spec, kind=kind, shapes=shapes, config=config, one_causal_flag=one_causal_flag)
    plain_family = plain_runtime_block(spec.architecture)
    differs = [k for k, v in extra.items() if k != "family" and k in _RUNTIME_DEFAULTS and v != _RUNTIME_DEFAULTS[k]]
    variant = kind == "hf" and (spec.layout not in (None, DEFAULT_FAMILY.label_layout) or spec.hidden_act not in (None, "silu")
                                or spec.rope_scaling is not None)
    if spec.rope_scaling is not None and dict(spec.rope_scaling).get("type") not in ROPE_TYPES:
        raise DFlashError(f"{path}: rope scaling type '{dict(spec.rope_scaling).get('type')}' is not supported by the "
                          f"runtime (one of {', '.join(ROPE_TYPES)})")
    dropped = _rope_type_llama_cpp_drops(config, path) if kind == "hf" else None
    if dropped is not None:
        # the checkpoint's own model (transformers) rotates with it, so plain RoPE here would be silently wrong;
        # its GGUF is another matter: llama.cpp runs plain RoPE for these types, and so does the runtime
        raise DFlashError(f"{path}: rope type '{dropped}' is not run by dflashkit's runtime from the HF checkpoint "
                          f"(one of {', '.join(ROPE_TYPES)}); llama.cpp ignores it too — run the converted GGUF to see "
                          "what llama.cpp computes")
    if not (differs or variant or extra["family"] != plain_family):
        return spec
    if kind == "gguf":
        extra["layout"] = "llama.cpp"
    return _checked(_lift(spec, extra), path)


#: RoPE types llama.cpp's converter writes nothing for (`dflashkit.families.zlab_dflash.rope_scaling_of`)
_ROPE_TYPES_LLAMA_CPP_DROPS = ("dynamic", "llama3")


def _rope_type_llama_cpp_drops(config: Mapping[str, Any] | None, path: str) -> str | None:
    """The config's RoPE type when llama.cpp's converter drops it (top level, or speculators' nested layer)."""
    for where in (config or {}, (config or {}).get("transformer_layer_config")):
        if isinstance(where, Mapping) and (kind := rope_type_of(where, path)) in _ROPE_TYPES_LLAMA_CPP_DROPS:
            return kind
    return None


def runtime_config_from_hf(config: Mapping[str, Any], path: str = "config.json") -> RuntimeConfig:
    """Any HF drafter ``config.json`` (z-lab and its variants, vLLM ``speculators`` dflash / dflash2 / dspark,
    SpecForge / DeepSpec DSpark), read by its family (`dflashkit.families`) and lifted with the runtime-only
    fields a config alone decides (no tensors: a reduced draft vocabulary means an own head)."""
    if isinstance(config, Mapping):
        archs = config.get("architectures")
        refuse_unsupported(archs[0] if isinstance(archs, list) and archs and isinstance(archs[0], str) else "", path)
    family, spec = read_hf_config(config, path)
    extra = runtime_fields(family, spec, kind="hf", shapes=None, config=config)
    if spec.markov_rank and spec.has_confidence_head is None:
        # the family decides it from the tensors (`refine_spec`); without them, the head the config announces
        extra["has_confidence_head"] = config.get("enable_confidence_head") is True
    return _checked(_lift(spec, extra), path)


def _checked(cfg: RuntimeConfig, path: str) -> RuntimeConfig:
    if cfg.family not in runtime_blocks():
        raise DFlashError(f"{path}: unknown drafter family '{cfg.family}' (one of {', '.join(runtime_blocks())})")
    if (cfg.hidden_act or "silu") not in HIDDEN_ACTS:
        raise DFlashError(f"{path}: hidden_act '{cfg.hidden_act}' is not supported (one of {', '.join(HIDDEN_ACTS)})")
    runtime_family(cfg.architecture, cfg.family).check_runtime(cfg, path)
    if cfg.has_confidence_head and cfg.confidence_head_with_markov and (cfg.markov_rank or 0) <= 0:
        raise DFlashError(f"{path}: confidence_head_with_markov needs markov_rank > 0")
    if cfg.block_size >= 1 and cfg.block_size - first_draft_slot(cfg) < 1:  # < 1: check_runnable names it
        raise DFlashError(f"{path}: block_size {cfg.block_size} drafts nothing")
    return cfg


