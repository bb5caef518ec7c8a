"""What the runtime needs to know about a drafter of any family: `RuntimeConfig`.

`RuntimeConfig` is a `DrafterSpec` — including the zoo fields main's spec carries (``layout``,
``sample_from_anchor``, ``draft_vocab_size``, ``markov_rank``, ``markov_head_type``,
``has_confidence_head``, ``hidden_act``, ``rope_scaling``, ``rope_is_neox_style``) — plus only what the
runtime computes with and the spec does not say:

- ``family`` (dflash / dflash2 / dspark): which runtime file runs it (a DSpark on a backbone of its own,
  `BACKBONE_LABELS` — Gemma-4 — runs in ``runtime/gemma4_dspark.py``);
- ``own_lm_head``: the drafter has a head of its own (rows mapped to target ids through ``d2t``);
- ``confidence_head_with_markov``: the DSpark confidence head also sees the Markov features;
- ``rope_interleaved``: the weights *in this file* are in the interleaved-RoPE order (an HF checkpoint with
  ``rope_is_neox_style: false``; a converted GGUF is already NeoX-permuted and leaves it false);
- ``attention_sinks``; ``window_from_anchor`` / ``sliding_window_non_causal``: speculators' sliding-window
  mask (the window is counted back from the anchor; the block is bidirectional unless the layer is causal).

Spec fields left None mean z-lab DFlash behaviour here: ``sample_from_anchor`` None = slot 0 is only the
anchor (block_size − 1 draft tokens), ``hidden_act`` None = silu, ``markov_rank`` None = no Markov head.
``rope_scaling`` is held as the spec holds it (llama.cpp's names: ``type``, ``factor``,
``original_context_length``, ``attn_factor``, ``ext_factor``, ``beta_fast``, ``beta_slow``; other
transformers keys such as ``mscale`` / ``truncate`` kept under their own names); `rope_parameters` gives
transformers' form, which the rotary embedding computes with.

Two entry points: `runtime_config_from_hf` reads an HF ``config.json`` of any layout, and
`runtime_config_from_spec` lifts a `DrafterSpec` (what ``dflashkit.drafters`` reads from a GGUF) and the
extra fields. The converters own the zoo's *file* semantics; this module only says what the runtime
computes with.
"""

from __future__ import annotations

from dataclasses import dataclass, fields
from typing import Any, Mapping

from ..errors import DFlashError
from ..families import spec_from_hf_config
from ..spec import ARCH_DFLASH, ARCH_DFLASH2, DrafterSpec

FAMILIES = ("dflash", "dflash2", "dspark")
LAYOUTS = ("zlab", "speculators", "specforge", "llama.cpp")  # DrafterSpec.layout spellings
HIDDEN_ACTS = ("silu", "gelu", "gelu_pytorch_tanh")
ROPE_TYPES = ("default", "linear", "yarn")
#: What reports call each (layout, family).
FAMILY_LABELS = {
    ("zlab", "dflash"): "z-lab DFlash", ("zlab", "dflash2"): "z-lab DFlash 2",
    ("speculators", "dflash"): "speculators DFlash", ("speculators", "dflash2"): "speculators DFlash 2",
    ("speculators", "dspark"): "speculators DSpark", ("specforge", "dspark"): "SpecForge DSpark",
    ("zlab", "dspark"): "DSpark",
    ("llama.cpp", "dflash"): "DFlash (llama.cpp GGUF)", ("llama.cpp", "dflash2"): "DFlash 2 (llama.cpp GGUF)",
    ("llama.cpp", "dspark"): "DSpark (llama.cpp GGUF)",
}


#: DrafterSpec.rope_scaling key (llama.cpp's converter names) → transformers' rope_parameters key
_ROPE_KEYS_TO_HF = {"type": "rope_type", "original_context_length": "original_max_position_embeddings",
                    "attn_factor": "attention_factor", "ext_factor": "extrapolation_factor"}
_ROPE_KEYS_FROM_HF = {v: k for k, v in _ROPE_KEYS_TO_HF.items()}


def rope_parameters(scaling: Any) -> dict[str, Any] | None:
    """``DrafterSpec.rope_scaling`` (pairs, llama.cpp names) → transformers' ``rope_parameters`` dict."""
    if not scaling:
        return None
    return {_ROPE_KEYS_TO_HF.get(k, k): v for k, v in dict(scaling).items()}


def spec_rope_scaling(params: Mapping[str, Any]) -> tuple[tuple[str, Any], ...]:
    """transformers' ``rope_parameters`` (or llama.cpp-named keys) → ``DrafterSpec.rope_scaling`` pairs,
    ``type`` and ``factor`` first."""
    named = {_ROPE_KEYS_FROM_HF.get(k, k): v for k, v in params.items()}
    head = [k for k in ("type", "factor") if k in named]
    return tuple((k, named[k]) for k in head + [k for k in named if k not in head])


@dataclass(frozen=True, eq=False)
class RuntimeConfig(DrafterSpec):
    """A `DrafterSpec` plus the runtime-only fields (defaults = z-lab DFlash behaviour)."""

    family: str = "dflash"
    own_lm_head: bool = False
    confidence_head_with_markov: bool = True
    rope_interleaved: bool = False
    attention_sinks: bool = False
    window_from_anchor: bool = False
    sliding_window_non_causal: bool = False

    @property
    def is_dflash2(self) -> bool:
        return self.family == "dflash2"

    @property
    def label(self) -> str:
        layout = self.layout or "zlab"
        if self.architecture in BACKBONE_LABELS:
            backbone = BACKBONE_LABELS[self.architecture]
            return f"{backbone} (llama.cpp GGUF)" if layout == "llama.cpp" else backbone
        return FAMILY_LABELS.get((layout, self.family), f"{layout} {self.family}")

    @property
    def first_draft_slot(self) -> int:
        """Block slot of the first prediction: 0 with sample_from_anchor, else 1 (slot 0 is the anchor)."""
        return 0 if self.sample_from_anchor else 1

    @property
    def draft_tokens(self) -> int:
        """Draft tokens per round: block_size with sample_from_anchor, block_size − 1 without."""
        return self.block_size - self.first_draft_slot


def runtime_config_from_spec(spec: DrafterSpec, **extra: Any) -> RuntimeConfig:
    """A `DrafterSpec` (e.g. from a GGUF) with the zoo fields in ``extra`` (names of `RuntimeConfig`)."""
    base = {f.name: getattr(spec, f.name) for f in fields(DrafterSpec)}
    if isinstance(spec, RuntimeConfig):
        base.update({f.name: getattr(spec, f.name) for f in fields(RuntimeConfig)})
    else:
        base["family"] = "dflash2" if spec.architecture == ARCH_DFLASH2 else "dflash"
    unknown = sorted(set(extra) - {f.name for f in fields(RuntimeConfig)})
    if unknown:
        raise TypeError(f"runtime_config_from_spec: unknown field(s) {unknown}")
    base.update(extra)
    return _checked(RuntimeConfig(**base), "drafter")


#: SpecForge / DeepSpec DSpark architectures on a Qwen3-style DFlash backbone (llama.cpp's ``DSparkModel``)
SPECFORGE_DSPARK = ("DSparkDraftModel", "Qwen3DSparkModel", "DSparkSpeculator", "Lfm2DSparkDraftModel",
                    "LingDSparkModel")
#: DSpark architectures on a backbone of their own (runtime/gemma4_dspark.py) → what reports call them
BACKBONE_LABELS = {"Gemma4DSparkModel": "Gemma-4 DSpark"}
#: DSpark architectures whose backbone this runtime does not implement, refused by name
UNSUPPORTED = {
    "DeepseekV4DSparkModel": "a DeepSeek-V4 backbone (hyper-connections, MLA, MoE)",
}


def runtime_config_from_hf(config: Mapping[str, Any], path: str = "config.json") -> RuntimeConfig:
    """Any HF drafter ``config.json``: z-lab (+ its variants) or vLLM ``speculators`` (dflash / dflash2 / dspark).

    Kept for now: the converter-side families (`dflashkit.families`, issue 13) will read these layouts
    into `DrafterSpec` themselves and then feed the runtime; until then the runtime reads them here.

    A speculators config is told by ``speculators_model_type`` + ``transformer_layer_config`` (its
    ``architectures`` holds the same class names as z-lab's); its hparams are nested and its taps
    (``aux_hidden_state_layer_ids``) count the embedding output as 0, so HF ids are those − 1.
    """
    if not isinstance(config, Mapping):
        raise DFlashError(f"{path}: expected a JSON object at the top level")
    if "speculators_model_type" in config:
        return _from_speculators(config, path)
    archs = config.get("architectures") or []
    arch = archs[0] if isinstance(archs, list) and archs else None
    if arch in UNSUPPORTED:
        raise DFlashError(f"{path}: {arch} is {UNSUPPORTED[arch]}, which dflashkit's runtime does not run")
    if arch in SPECFORGE_DSPARK:
        return _from_specforge_dspark(config, path)
    if arch in BACKBONE_LABELS:
        return backbone_dspark_config(spec_from_hf_config(config, path),
                                      with_markov=bool(config.get("confidence_head_with_markov", True)), path=path)
    spec = spec_from_hf_config(config, path)
    return _checked(runtime_config_from_spec(spec, **_variant_fields(config, _nested(config), path)), path)


def with_hf_variants(spec: DrafterSpec, config: Mapping[str, Any], path: str = "config.json") -> DrafterSpec:
    """A z-lab `DrafterSpec` read from ``config`` (an HF config.json), lifted to a `RuntimeConfig` when the
    config uses a variant the spec has no field for (gelu, linear / yarn RoPE, interleaved RoPE);
    unchanged otherwise."""
    extra = _variant_fields(config, _nested(config), path)
    plain = {"hidden_act": ("silu", None), "rope_interleaved": (False,), "rope_is_neox_style": (True,)}
    if all(value in plain.get(key, ()) for key, value in extra.items()):
        return spec
    return runtime_config_from_spec(spec, **extra)


def _nested(config: Mapping[str, Any]) -> Mapping[str, Any]:
    nested = config.get("dflash_config")
    return nested if isinstance(nested, Mapping) else {}


def _variant_fields(layer: Mapping[str, Any], top: Mapping[str, Any], path: str) -> dict[str, Any]:
    """hidden_act, RoPE scaling and layout, shared by every layout (``layer``: where the Qwen3 keys sit)."""
    out: dict[str, Any] = {}
    act = top.get("hidden_act", layer.get("hidden_act"))
    if act is not None:
        out["hidden_act"] = act
    neox = top.get("rope_is_neox_style", layer.get("rope_is_neox_style"))
    if neox is not None:
        if not isinstance(neox, bool):
            raise DFlashError(f"{path}: 'rope_is_neox_style' must be true or false, got {neox!r}")
        out["rope_is_neox_style"], out["rope_interleaved"] = neox, not neox  # HF layout: weights interleaved
    scaling = _rope_scaling(layer, path)
    if scaling is not None:
        out["rope_scaling"] = spec_rope_scaling(scaling)
    return out


def _rope_scaling(layer: Mapping[str, Any], path: str) -> dict[str, Any] | None:
    """transformers-5 ``rope_parameters`` or transformers-4 ``rope_scaling`` (``type`` or ``rope_type``)."""
    for key in ("rope_parameters", "rope_scaling"):
        params = layer.get(key)
        if not isinstance(params, Mapping):
            continue
        kind = params.get("rope_type", params.get("type"))
        if kind in (None, "default"):
            continue
        if kind not in ROPE_TYPES:
            raise DFlashError(f"{path}: {key}.rope_type '{kind}' is not supported by the runtime "
                              f"(one of {', '.join(ROPE_TYPES)})")
        out = {k: v for k, v in params.items() if k not in ("type", "rope_theta")}
        out["rope_type"] = kind
        if not isinstance(out.get("factor"), (int, float)) or isinstance(out.get("factor"), bool) or out["factor"] <= 0:
            raise DFlashError(f"{path}: {key}.factor must be a positive number for rope_type {kind}")
        if kind == "yarn" and not isinstance(out.get("original_max_position_embeddings"), int):
            raise DFlashError(f"{path}: {key}.original_max_position_embeddings (an integer) is required for yarn")
        return out
    return None


def _from_speculators(config: Mapping[str, Any], path: str) -> RuntimeConfig:
    kind = config.get("speculators_model_type")
    if kind not in FAMILIES:
        raise DFlashError(f"{path}: speculators_model_type '{kind}' is not a DFlash-family drafter "
                          f"(one of {', '.join(FAMILIES)})")
    layer = config.get("transformer_layer_config")
    if not isinstance(layer, Mapping):
        raise DFlashError(f"{path}: speculators config without a 'transformer_layer_config' object — it holds the "
                          "drafter's hidden_size, layers and heads")
    aux = config.get("aux_hidden_state_layer_ids")
    if not isinstance(aux, list) or not aux or not all(isinstance(i, int) and not isinstance(i, bool) for i in aux):
        raise DFlashError(f"{path}: 'aux_hidden_state_layer_ids' must be a non-empty list of integers, got {aux!r}")
    if any(i < 1 for i in aux):
        raise DFlashError(f"{path}: 'aux_hidden_state_layer_ids' counts the embedding output as 0, so every tap is "
                          f">= 1; got {aux}")
    nested = {"target_layer_ids": [i - 1 for i in aux], "block_size": config.get("block_size", 8),
              "mask_token_id": config.get("mask_token_id")}
    if kind == "dflash2":  # speculators' DFlash2SpeculatorConfig defaults
        for key, default in (("conv_kernel_size", 2), ("conv_group_size", 16), ("selector_rank", 256),
                             ("selector_top_k", 16)):
            nested[key] = config.get(key, default)
    flat = {k: v for k, v in layer.items() if k not in ("architectures", "dflash_config", "is_causal", "causal")}
    flat["architectures"] = [ARCH_DFLASH2 if kind == "dflash2" else ARCH_DFLASH]
    flat["dflash_config"] = nested
    spec = spec_from_hf_config(flat, path)
    target_vocab = spec.vocab_size
    draft_vocab = config.get("draft_vocab_size", 32000)
    if not isinstance(draft_vocab, int) or isinstance(draft_vocab, bool) or draft_vocab < 1:
        raise DFlashError(f"{path}: 'draft_vocab_size' must be a positive integer, got {draft_vocab!r}")
    default_anchor = kind == "dspark"
    sample_from_anchor = config.get("sample_from_anchor", default_anchor)
    extra: dict[str, Any] = dict(
        family=kind, layout="speculators", sample_from_anchor=bool(sample_from_anchor),
        own_lm_head=draft_vocab != target_vocab, draft_vocab_size=draft_vocab,
        window_from_anchor=True,
        sliding_window_non_causal=bool(config.get("sliding_window_non_causal", kind == "dflash2")),
        causal=None, **_variant_fields(layer, config, path),
    )
    if kind == "dspark":
        rank = config.get("markov_rank", 256)
        extra.update(markov_rank=int(rank), markov_head_type=config.get("markov_head_type", "vanilla"),
                     has_confidence_head=bool(config.get("enable_confidence_head", True)),
                     confidence_head_with_markov=bool(config.get("confidence_head_with_markov", True)))
    return _checked(runtime_config_from_spec(spec, **extra), path)


def _from_specforge_dspark(config: Mapping[str, Any], path: str) -> RuntimeConfig:
    """SpecForge / DeepSpec DSpark: a z-lab-style config (``dflash_config`` first, then top level) with the
    DSpark keys; ``sample_from_anchor`` defaults to true (llama.cpp's converter), a ``draft_vocab_size``
    below the target's means an own ``lm_head`` + ``d2t``."""
    nested = _nested(config)

    def get(key: str, default: Any = None) -> Any:
        if nested.get(key) is not None:
            return nested[key]
        return config.get(key, default)

    arch = (config.get("architectures") or ["?"])[0]
    flat = dict(config)
    flat["architectures"] = [ARCH_DFLASH]
    spec = spec_from_hf_config(flat, path)
    draft_vocab = get("draft_vocab_size")
    own = draft_vocab is not None and draft_vocab != spec.vocab_size
    extra: dict[str, Any] = dict(
        family="dspark", layout="specforge", architecture=arch, sample_from_anchor=bool(get("sample_from_anchor", True)),
        own_lm_head=own, draft_vocab_size=draft_vocab if own else None,
        markov_rank=int(get("markov_rank", 0) or 0), markov_head_type=get("markov_head_type", "vanilla"),
        has_confidence_head=bool(get("enable_confidence_head", False)),
        confidence_head_with_markov=bool(get("confidence_head_with_markov", True)),
        **_variant_fields(config, nested, path),
    )
    return _checked(runtime_config_from_spec(spec, **extra), path)


def backbone_dspark_config(spec: DrafterSpec, shapes: Mapping[str, tuple[int, ...]] | None = None, *,
                           with_markov: bool = True, path: str = "drafter") -> RuntimeConfig:
    """A Gemma-4 DSpark spec (HF or GGUF, as `dflashkit.families.gemma4_dspark` reads it) → what
    runtime/gemma4_dspark.py runs: a DSpark with its own full-vocabulary ``lm_head`` (llama.cpp uses a
    drafter's ``output`` whenever it has one). ``shapes`` (canonical id → shape): the confidence head sees
    the Markov features when its width is hidden + rank (the only shape llama.cpp loads), else ``with_markov``."""
    rank = int(spec.markov_rank or 0)
    conf = (shapes or {}).get("confidence_head.proj.weight")
    if conf is not None:
        with_markov = int(conf[-1]) == spec.hidden_size + rank
    return _checked(runtime_config_from_spec(
        spec, family="dspark", own_lm_head=True, draft_vocab_size=None, layout=spec.layout or "llama.cpp",
        confidence_head_with_markov=with_markov and rank > 0), path)


def _checked(cfg: RuntimeConfig, path: str) -> RuntimeConfig:
    if cfg.family not in FAMILIES:
        raise DFlashError(f"{path}: unknown drafter family '{cfg.family}' (one of {', '.join(FAMILIES)})")
    if (cfg.hidden_act or "silu") not in HIDDEN_ACTS:
        raise DFlashError(f"{path}: hidden_act '{cfg.hidden_act}' is not supported (one of {', '.join(HIDDEN_ACTS)})")
    if cfg.family == "dspark" and (cfg.markov_rank or 0) > 0 and cfg.markov_head_type != "vanilla":
        raise DFlashError(f"{path}: markov_head_type '{cfg.markov_head_type}' is not supported — only 'vanilla' "
                          "runs (as in llama.cpp)")
    if cfg.has_confidence_head and cfg.confidence_head_with_markov and (cfg.markov_rank or 0) <= 0:
        raise DFlashError(f"{path}: confidence_head_with_markov needs markov_rank > 0")
    if cfg.family == "dflash2" and cfg.sample_from_anchor:
        raise DFlashError(f"{path}: sample_from_anchor must be false for DFlash 2 (speculators requires it)")
    if cfg.family == "dflash2" and cfg.own_lm_head:
        raise DFlashError(f"{path}: DFlash 2 needs the full target vocabulary (draft_vocab_size = vocab_size)")
    if cfg.block_size - (0 if cfg.sample_from_anchor else 1) < 1:
        raise DFlashError(f"{path}: block_size {cfg.block_size} drafts nothing")
    return cfg


# ---------------------------------------------------------------------------------------------
# GGUF (llama.cpp's DFlash / DSpark files): the zoo fields from metadata and tensor shapes
# ---------------------------------------------------------------------------------------------

#: llama.cpp's key for the MLP activation (vendor gguf-py ``Keys.LLM.HIDDEN_ACT``; older gguf wheels lack it)
HIDDEN_ACT_KEY = "{arch}.hidden_activation"


def runtime_config_from_gguf(spec: DrafterSpec, metadata: Mapping[str, Any], shapes: Mapping[str, tuple[int, ...]],
                             arch: str = "dflash", path: str = "drafter.gguf") -> DrafterSpec:
    """What llama.cpp's loader (``src/models/dflash.cpp``, ``common/speculative.cpp``) reads beyond the spec:
    a ``markov_w1.weight`` tensor makes a DSpark (rank = its rows in numpy order [n_vocab, rank] → shape[1]),
    ``conf_proj.weight`` its confidence head, ``d2t`` (absolute ids) an own ``output`` of that many rows,
    ``dflash.sample_from_anchor`` (missing = true, read for DSpark only), ``{arch}.rope.scaling.*`` and
    ``{arch}.hidden_activation``, ``blk.N.attn_sinks.weight``. ``shapes``: stored name → numpy shape. A file
    with none of these keeps its `DrafterSpec` (unchanged)."""
    import gguf

    def key(template: str) -> str:
        return template.format(arch=arch)

    extra: dict[str, Any] = {}
    if "markov_w1.weight" in shapes:
        rank = int(shapes["markov_w1.weight"][-1])
        extra.update(family="dspark", markov_rank=rank, markov_head_type="vanilla")
        value = metadata.get(f"{arch}.sample_from_anchor")
        extra["sample_from_anchor"] = True if value is None else bool(value)
        if "conf_proj.weight" in shapes:
            width = int(shapes["conf_proj.weight"][-1])
            extra.update(has_confidence_head=True, confidence_head_with_markov=width == spec.hidden_size + rank)
    if "d2t" in shapes:
        extra.update(own_lm_head=True, draft_vocab_size=int(shapes["d2t"][0]))
    if any(name.endswith(".attn_sinks.weight") for name in shapes):
        extra["attention_sinks"] = True
    act = metadata.get(key(HIDDEN_ACT_KEY))
    if act is not None:
        extra["hidden_act"] = str(act)
    kind = metadata.get(key(gguf.Keys.Rope.SCALING_TYPE))
    if kind not in (None, "none"):
        scaling: dict[str, Any] = {"type": str(kind), "factor": float(metadata[key(gguf.Keys.Rope.SCALING_FACTOR)])}
        for template, name in ((gguf.Keys.Rope.SCALING_ORIG_CTX_LEN, "original_context_length"),
                               (gguf.Keys.Rope.SCALING_YARN_EXT_FACTOR, "ext_factor"),
                               (gguf.Keys.Rope.SCALING_YARN_ATTN_FACTOR, "attn_factor"),
                               (gguf.Keys.Rope.SCALING_YARN_BETA_FAST, "beta_fast"),
                               (gguf.Keys.Rope.SCALING_YARN_BETA_SLOW, "beta_slow")):
            if metadata.get(key(template)) is not None:
                scaling[name] = metadata[key(template)]
        if scaling["type"] not in ROPE_TYPES:
            raise DFlashError(f"{path}: rope scaling type '{kind}' is not supported by the runtime")
        extra["rope_scaling"] = spec_rope_scaling(scaling)
    if not extra:
        return spec
    extra["layout"] = "llama.cpp"
    return _checked(runtime_config_from_spec(spec, **extra), path)
