"""EAGLE-3 drafters: one decoder layer on [token embedding; fused target features], a reduced draft vocabulary.

Layouts (docs/design/eagle3.md §1), all read as llama.cpp's converter reads them (``conversion/llama.py``,
identical in both pinned builds): the config merged with ``transformer_layer_config`` (vLLM ``speculators``:
``Eagle3DraftModel`` / ``Eagle3Speculator``, ``speculators_model_type: eagle3``) or flat (the original
``LlamaForCausalLMEagle3``, SpecForge, vLLM's ``Eagle3LlamaForCausalLM``); the layer's tensors under ``midlayer.``,
``layers.0.`` or ``model.layers.0.``, one canonical name here: ``layers.0.*``.

- config → spec: a Llama-style layer; ``draft_vocab_size`` (llama.cpp tells an EAGLE-3 drafter by it and one layer);
  taps = the top-level ``eagle_aux_hidden_state_layer_ids`` (layer-*input* ids: HF id + 1, as llama.cpp stores
  them), else SpecForge's nested ``eagle_config`` ids (layer-*output* ids), else llama.cpp's default — the inputs of
  target layers 2, N//2 and N−3 — once the target is known (`with_target`); ``target_hidden_size`` (else the
  ``fc`` tensor's width / 3, else the target's); ``norm_before_residual`` and ``norm_before_fc`` (default false).
  A chain drafter has no block: ``block_size`` is llama.cpp's default draft length (``--spec-draft-n-max 3``) + 1,
  so every command that drafts "a block minus its anchor" drafts as ``draft-eagle3`` does.
- refused by name, before anything is written, where llama.cpp's graph cannot run the drafter (its converter stops
  with "Can not map tensor", or converts silently into another model): more than one decoder layer, a tap count
  other than 3, q/k norms (a Qwen3-style layer), ``fc_norm``, ``norm_output``, biases, an activation other than
  SiLU, sliding-window layers, ``d2t`` out of range or duplicated, a reduced vocabulary without ``d2t``.
- tensors (HF → llama.cpp): the layer as Llama's with ``hidden_norm`` → ``attn_norm_2`` and q/k permuted as
  ``LlamaModel.permute`` (rotate-half → ggml's interleaved RoPE); ``fc`` as is; ``input_norm`` →
  ``enc.output_norm``; ``t2d`` dropped; ``d2t`` offsets written last as I64 absolute target ids (the range and
  duplicate checks llama.cpp makes); a ``llama3`` RoPE generates ``rope_freqs.weight`` first.
- metadata: ``eagle3.target_layers``, ``target_hidden_size``, ``norm_before_residual``, ``norm_before_fc`` before
  ``general.*`` (llama.cpp writes them from ``__init__``), the Llama hparams, ``general.file_type``, then
  ``vocab_size`` and ``rope.dimension_count``; the target's tokenizer.
"""

from __future__ import annotations

import math
import re
from dataclasses import replace
from typing import Any, Mapping

import numpy as np
from gguf import GGMLQuantizationType, GGUFValueType as T

from ... import bounds
from ...errors import DFlashError
from ...spec import ConfigView, DrafterSpec, rope_theta_of
from ..base import DrafterFamily
from ..dspark import d2t_absolute
from ..zlab_dflash import rope_scaling_of, rope_type_of

EAGLE3_ARCHITECTURES: tuple[str, ...] = (
    "LlamaForCausalLMEagle3", "Eagle3LlamaForCausalLM", "Eagle3Speculator", "Eagle3DraftModel",
)
#: llama.cpp's default ``--spec-draft-n-max`` (``common.h``), the chain length ``draft-eagle3`` drafts per round
DEFAULT_N_MAX = 3
N_TAPS = 3
D2T, T2D = "d2t", "t2d"
FC, INPUT_NORM, ROPE_FREQS = "fc.weight", "input_norm.weight", "rope_freqs.weight"
_LAYER = re.compile(r"^(?:model\.)?(?:midlayer|layers\.(\d+))\.(.+)$")
_LAYER_TENSORS = frozenset({
    "input_layernorm.weight", "hidden_norm.weight", "post_attention_layernorm.weight",
    *(f"self_attn.{p}_proj.{k}" for p in "qkvo" for k in ("weight", "bias")),
    "self_attn.q_norm.weight", "self_attn.k_norm.weight",
    *(f"mlp.{p}_proj.{k}" for p in ("gate", "up", "down") for k in ("weight", "bias")),
})
_GLOBAL_TENSORS = frozenset({FC, "norm.weight", "lm_head.weight", "embed_tokens.weight", D2T, T2D, INPUT_NORM})
_FC_NORM = re.compile(r"^fc_norm\.\d+\.weight$")


def _is_speculators(config: Mapping[str, Any]) -> bool:
    return config.get("speculators_model_type") == "eagle3" or "transformer_layer_config" in config


def merged_config(config: Mapping[str, Any], path: str) -> dict[str, Any]:
    """The config as llama.cpp reads it: ``transformer_layer_config`` (speculators) merged over the top level."""
    nested = config.get("transformer_layer_config")
    if nested is None:
        return dict(config)
    if not isinstance(nested, Mapping):
        raise DFlashError(f"{path}: 'transformer_layer_config' must be an object, got {type(nested).__name__}")
    return {**config, **nested}


def llama_cpp_default_taps(n_target_layers: int) -> tuple[int, ...]:
    """llama.cpp's taps for a config without ``eagle_aux_hidden_state_layer_ids``: the inputs of target layers 2,
    N//2 and N−3, as HF decoder-layer ids (input id − 1)."""
    return tuple(i - 1 for i in (2, n_target_layers // 2, n_target_layers - 3))


def llama3_rope_factors(rope: Mapping[str, Any], theta: float, head_dim: int) -> tuple[float, ...]:
    """llama.cpp's ``rope_freqs.weight`` for a ``llama3`` RoPE (``LlamaModel.generate_extra_tensors``), computed with
    torch's float32 arithmetic as it is, so the bytes are the same."""
    import torch  # only a llama3-RoPE drafter needs it

    freqs = 1.0 / (theta ** (torch.arange(0, head_dim, 2, dtype=torch.float32) / head_dim))
    factor = rope.get("factor", 8.0)
    low, high = rope.get("low_freq_factor", 1.0), rope.get("high_freq_factor", 4.0)
    old = rope.get("original_max_position_embeddings", 8192)
    low_wavelen, high_wavelen = old / low, old / high
    out: list[float] = []
    for freq in freqs:
        wavelen = 2 * math.pi / freq
        if wavelen < high_wavelen:
            out.append(1)
        elif wavelen > low_wavelen:
            out.append(factor)
        else:
            smooth = (old / wavelen - low) / (high - low)
            out.append(1 / ((1 - smooth) / factor + smooth))
    return tuple(float(v) for v in torch.tensor(out, dtype=torch.float32).tolist())


def _refuse(path: str, what: str, why: str) -> DFlashError:
    return DFlashError(f"{path}: {what} — {why}; llama.cpp's EAGLE-3 graph cannot run this drafter")


class Eagle3(DrafterFamily):
    name = "eagle3"
    priority = 90  # by config shape (speculators' eagle3 type) before any family claims the names
    architectures = EAGLE3_ARCHITECTURES
    speculators_model_types = ("eagle3",)
    labels = {"speculators": "speculators EAGLE-3", "specforge": "SpecForge EAGLE-3", None: "EAGLE-3",
              "llama.cpp": "EAGLE-3 (llama.cpp GGUF)"}
    runtime_module = "eagle3"
    runtime_class = "dflashkit.families.eagle3.runtime:Eagle3DraftModel"
    own_backbone = True
    llama_cpp_spec_type = "draft-eagle3"
    gguf_architecture = "eagle3"
    final_tensors = (D2T,)
    needs_target = True
    uses_mask_token = False
    clamps_n_max = False
    llama_vocab = True
    folder_modules = ("checks", "runtime")
    gguf_defaults = {"block_size": DEFAULT_N_MAX + 1}
    gguf_architecture_note = "the four EAGLE-3 architecture names convert alike; a GGUF does not record which one"
    gguf_keys = (
        ("target_layer_ids", "{arch}.target_layers", T.ARRAY, T.INT32, "required leading"),
        ("target_hidden_size", "{arch}.target_hidden_size", T.UINT32, None, "required leading"),
        ("norm_before_residual", "{arch}.norm_before_residual", T.BOOL, None, "leading"),
        ("norm_before_fc", "{arch}.norm_before_fc", T.BOOL, None, "leading"),
        ("n_layers", "{arch}.block_count", T.UINT32, None, "required"),
        ("context_length", "{arch}.context_length", T.UINT32, None, "required"),
        ("hidden_size", "{arch}.embedding_length", T.UINT32, None, "required"),
        ("intermediate_size", "{arch}.feed_forward_length", T.UINT32, None, "required"),
        ("n_heads", "{arch}.attention.head_count", T.UINT32, None, "required"),
        ("n_kv_heads", "{arch}.attention.head_count_kv", T.UINT32, None, "required"),
        ("rope_scaling.type", "{arch}.rope.scaling.type", T.STRING, None, ""),
        ("rope_scaling.factor", "{arch}.rope.scaling.factor", T.FLOAT32, None, ""),
        ("rope_scaling.original_context_length", "{arch}.rope.scaling.original_context_length", T.UINT32, None, ""),
        ("rope_scaling.ext_factor", "{arch}.rope.scaling.yarn_ext_factor", T.FLOAT32, None, ""),
        ("rope_scaling.attn_factor", "{arch}.rope.scaling.yarn_attn_factor", T.FLOAT32, None, ""),
        ("rope_scaling.beta_fast", "{arch}.rope.scaling.yarn_beta_fast", T.FLOAT32, None, ""),
        ("rope_scaling.beta_slow", "{arch}.rope.scaling.yarn_beta_slow", T.FLOAT32, None, ""),
        ("rope_theta", "{arch}.rope.freq_base", T.FLOAT32, None, "required"),
        ("rms_norm_eps", "{arch}.attention.layer_norm_rms_epsilon", T.FLOAT32, None, "required"),
        # written whether or not the config gives head_dim: llama.cpp reads a flat config through transformers'
        # AutoConfig, which fills it in, and a speculators layer config saves it
        ("head_dim", "{arch}.attention.key_length", T.UINT32, None, "required"),
        ("head_dim", "{arch}.attention.value_length", T.UINT32, None, "required"),
        ("vocab_size", "{arch}.vocab_size", T.UINT32, None, "after_file_type"),
        ("rope_dimension_count_or_head_dim", "{arch}.rope.dimension_count", T.UINT32, None, "after_file_type"),
    )
    gguf_tensor_names = {
        ROPE_FREQS: "rope_freqs.weight",
        "embed_tokens.weight": "token_embd.weight",
        FC: "fc.weight",
        INPUT_NORM: "enc.output_norm.weight",
        "layers.{bid}.input_layernorm.weight": "blk.{bid}.attn_norm.weight",
        "layers.{bid}.hidden_norm.weight": "blk.{bid}.attn_norm_2.weight",
        "layers.{bid}.self_attn.q_proj.weight": "blk.{bid}.attn_q.weight",
        "layers.{bid}.self_attn.k_proj.weight": "blk.{bid}.attn_k.weight",
        "layers.{bid}.self_attn.v_proj.weight": "blk.{bid}.attn_v.weight",
        "layers.{bid}.self_attn.o_proj.weight": "blk.{bid}.attn_output.weight",
        "layers.{bid}.post_attention_layernorm.weight": "blk.{bid}.ffn_norm.weight",
        "layers.{bid}.mlp.gate_proj.weight": "blk.{bid}.ffn_gate.weight",
        "layers.{bid}.mlp.up_proj.weight": "blk.{bid}.ffn_up.weight",
        "layers.{bid}.mlp.down_proj.weight": "blk.{bid}.ffn_down.weight",
        "norm.weight": "output_norm.weight",
        "lm_head.weight": "output.weight",
        D2T: "d2t",
    }

    hub_tag = "eagle3"

    def card_kind(self, block_size: int) -> str:
        return (f"EAGLE-3 drafter ({self.name}: one decoder layer over three target layers, drafting a chain of "
                f"--spec-draft-n-max tokens a round, {block_size - 1} by default)")

    def n_max_note(self, n_max: int) -> str:
        return (f"`--spec-draft-n-max {n_max}`: llama.cpp's default for `{self.llama_cpp_spec_type}`, which drafts any "
                "n-max (a longer chain raises τ and the cost of a miss: `dflash-accept --llama-server --draft-n-max "
                "3,8` measures it).")

    # ---- claiming -------------------------------------------------------------------------------
    def matches(self, config: Mapping[str, Any], architecture: str) -> bool:
        return config.get("speculators_model_type") == "eagle3" or architecture in self.architectures

    def matches_gguf(self, fields: Mapping[str, Any]) -> bool:
        return fields.get("target_hidden_size") is not None

    def owns(self, spec: DrafterSpec) -> bool:
        return spec.architecture in self.architectures

    # ---- tensors --------------------------------------------------------------------------------
    def hf_to_canonical(self, hf_name: str) -> str | None:
        m = _LAYER.match(hf_name)
        if m:
            rest = m.group(2)
            return f"layers.{m.group(1) or 0}.{rest}" if rest in _LAYER_TENSORS else None
        name = hf_name[len("model."):] if hf_name.startswith("model.") else hf_name
        return name if name in _GLOBAL_TENSORS or _FC_NORM.match(name) else None

    def rewrites(self, spec: DrafterSpec, canonical: str) -> bool:
        return canonical.endswith(("self_attn.q_proj.weight", "self_attn.k_proj.weight"))

    def sanitize_for(self, spec: DrafterSpec, canonical: str, array: np.ndarray) -> np.ndarray:
        if not self.rewrites(spec, canonical):
            return array
        # LlamaModel.permute: rotate-half pairs (i, i + d/2) → ggml's adjacent pairs (2i, 2i + 1), per head
        heads = spec.n_heads if canonical.endswith("q_proj.weight") else spec.n_kv_heads
        rows = array.shape[0]
        return np.ascontiguousarray(
            array.reshape(heads, 2, rows // heads // 2, *array.shape[1:]).swapaxes(1, 2).reshape(array.shape))

    def expected_tensors(self, spec: DrafterSpec, *, vocab_size: int | None = None) -> dict[str, tuple[int, ...]]:
        h, hd = spec.hidden_size, spec.head_dim
        q, kv, ff = spec.n_heads * hd, spec.n_kv_heads * hd, spec.intermediate_size
        shapes: dict[str, tuple[int, ...]] = {FC: (h, spec.fc_input_width), "norm.weight": (h,)}
        p = "layers.0."
        shapes.update({
            p + "input_layernorm.weight": (h,), p + "hidden_norm.weight": (h,),
            p + "self_attn.q_proj.weight": (q, 2 * h), p + "self_attn.k_proj.weight": (kv, 2 * h),
            p + "self_attn.v_proj.weight": (kv, 2 * h), p + "self_attn.o_proj.weight": (h, q),
            p + "post_attention_layernorm.weight": (h,),
            p + "mlp.gate_proj.weight": (ff, h), p + "mlp.up_proj.weight": (ff, h), p + "mlp.down_proj.weight": (h, ff),
        })
        if spec.norm_before_fc:
            shapes[INPUT_NORM] = (spec.fc_input_width,)
        return shapes

    def optional_tensors(self, spec: DrafterSpec) -> dict[str, tuple[int, ...]]:
        vocab = spec.vocab_size or -1
        draft = spec.draft_vocab_size or vocab
        return {"embed_tokens.weight": (vocab, spec.hidden_size), "lm_head.weight": (draft, spec.hidden_size),
                D2T: (draft,), T2D: (vocab,), ROPE_FREQS: (spec.head_dim // 2,)}

    def refine_spec(self, spec: DrafterSpec, shapes: Mapping[str, tuple[int, ...]]) -> DrafterSpec:
        d2t = shapes.get(D2T)
        if spec.draft_vocab_size is None and spec.layout is None and d2t is not None and len(d2t) == 1:
            spec = replace(spec, draft_vocab_size=d2t[0])  # a GGUF: d2t gives the draft rows
        fc = shapes.get(FC)
        if spec.target_hidden_size is None and fc is not None and len(fc) == 2 and spec.n_taps:
            # the fused features' width tells the target's hidden size (what llama.cpp takes from the target)
            return replace(spec, target_hidden_size=fc[1] // spec.n_taps)
        return spec

    def check_source(self, spec: DrafterSpec, shapes: Mapping[str, tuple[int, ...]], source: str) -> None:
        for canonical in sorted(shapes):
            if canonical.endswith(("q_norm.weight", "k_norm.weight")):
                raise _refuse(source, f"tensor '{canonical}'", "a Qwen3-style decoder layer normalises q and k per "
                              "head, which llama.cpp's graph does not (its converter stops at 'Can not map tensor'); "
                              "train the drafter with a Llama-style layer (speculators: transformer_layer_config "
                              "model_type llama)")
            if _FC_NORM.match(canonical):
                raise _refuse(source, f"tensor '{canonical}'", "per-tap RMSNorms before fc (fc_norm) have no "
                              "tensor in llama.cpp's graph (its converter stops at 'Can not map tensor')")
            if canonical.endswith(".bias"):
                raise _refuse(source, f"tensor '{canonical}'", "llama.cpp's EAGLE-3 layer has no biases")
        if spec.draft_vocab_size is not None and D2T not in shapes:
            raise DFlashError(f"{source}: draft_vocab_size {spec.draft_vocab_size} < vocab_size {spec.vocab_size} but "
                              "no d2t tensor — a reduced draft vocabulary needs its map to target ids")
        if D2T in shapes and "lm_head.weight" not in shapes:
            raise DFlashError(f"{source}: a d2t map but no lm_head.weight — the map indexes the drafter's own head")
        d2t = shapes.get(D2T)
        if d2t is not None and spec.draft_vocab_size is not None and int(np.prod(d2t)) != spec.draft_vocab_size:
            raise DFlashError(f"{source}: d2t has {int(np.prod(d2t))} rows but draft_vocab_size is "
                              f"{spec.draft_vocab_size} — check config.json 'draft_vocab_size' against the checkpoint")

    def dropped_on_convert(self, spec: DrafterSpec) -> frozenset[str]:
        return frozenset({T2D})

    def generated_tensors(self, spec: DrafterSpec) -> dict[str, np.ndarray]:
        if spec.rope_freq_factors is None:
            return {}
        return {ROPE_FREQS: np.asarray(spec.rope_freq_factors, dtype=np.float32)}

    def finalize_tensor(
        self, spec: DrafterSpec, canonical: str, data: np.ndarray, source: str
    ) -> tuple[np.ndarray, GGMLQuantizationType]:
        assert canonical == D2T
        if data.dtype.kind == "f":  # llama.cpp casts through float32, exact below 2^24
            data = data.astype(np.float32).astype(np.int64)
        return d2t_absolute(data, spec.vocab_size or 0, source), GGMLQuantizationType.I64

    def with_target(self, spec: DrafterSpec, target: Any, source: str) -> DrafterSpec:
        changes: dict[str, Any] = {}
        if not spec.target_layer_ids:
            changes["target_layer_ids"] = llama_cpp_default_taps(target.n_layers)
            changes["target_layer_ids_defaulted"] = True
        if spec.target_hidden_size is None:
            changes["target_hidden_size"] = target.hidden_size
        return replace(spec, **changes) if changes else spec

    # ---- config → spec --------------------------------------------------------------------------
    def spec_from_config(self, config: Mapping[str, Any], view: ConfigView, architecture: str, path: str) -> DrafterSpec:
        merged = merged_config(config, path)
        merged.pop("dflash_config", None)
        v = ConfigView(merged, path)
        n_layers = v.int("num_hidden_layers", required=True, minimum=1, maximum=bounds.MAX_LAYERS)
        if n_layers != 1:
            raise _refuse(path, f"num_hidden_layers {n_layers}", "llama.cpp tells an EAGLE-3 drafter by one decoder "
                          "layer and runs exactly one (its converter writes a plain Llama model otherwise)")
        vocab = v.int("vocab_size", required=True, minimum=1, maximum=bounds.MAX_VOCAB)
        draft = v.int("draft_vocab_size", minimum=1, maximum=bounds.MAX_VOCAB)
        if draft is None:
            raise DFlashError(f"{path}: no 'draft_vocab_size' — llama.cpp tells an EAGLE-3 drafter by it (the rows of "
                              "lm_head); add it to config.json")
        if draft > vocab:
            raise DFlashError(f"{path}: draft_vocab_size {draft} exceeds vocab_size {vocab} — a draft vocabulary is a "
                              "subset of the target's")
        hidden = v.int("hidden_size", required=True, minimum=1, maximum=bounds.MAX_WIDTH)
        n_heads = v.int("num_attention_heads", required=True, minimum=1, maximum=bounds.MAX_WIDTH)
        n_kv = v.int("num_key_value_heads", n_heads, minimum=1, maximum=bounds.MAX_WIDTH)
        if n_heads % n_kv:
            raise DFlashError(f"{path}: num_attention_heads ({n_heads}) must be a multiple of num_key_value_heads ({n_kv})")
        head_dim = v.int("head_dim", hidden // n_heads, minimum=1, maximum=bounds.MAX_WIDTH)
        if head_dim % 2:
            raise DFlashError(f"{path}: head_dim {head_dim} is odd — RoPE rotates pairs")
        act = merged.get("hidden_act", "silu")
        if act != "silu":
            raise _refuse(path, f"hidden_act {bounds.quote(act)}", "llama.cpp's EAGLE-3 layer runs SiLU only")
        for key in ("attention_bias", "mlp_bias"):
            if v.bool(key):
                raise _refuse(path, f"{key}: true", "llama.cpp's EAGLE-3 layer has no biases")
        for key, why in (("fc_norm", "per-tap RMSNorms before fc, which llama.cpp's graph has no tensor for"),
                         ("norm_output", "the drafter feeds its normed state back, llama.cpp the pre-norm state (its "
                                         "converter drops the flag silently: the file drafts as another model)")):
            if v.bool(key):
                raise _refuse(path, f"{key}: true", why)
        layer_types = merged.get("layer_types")
        if (isinstance(layer_types, list) and "sliding_attention" in layer_types) or v.bool("use_sliding_window"):
            raise _refuse(path, "a sliding-window layer", "llama.cpp's EAGLE-3 layer attends to its whole cache")
        rope_type = rope_type_of(merged, path)
        theta = rope_theta_of(v)
        factors = None
        if isinstance(rope_type, str) and rope_type.lower() == "llama3":
            rope = merged.get("rope_parameters") or merged.get("rope_scaling") or {}
            factors = llama3_rope_factors(rope.get("full_attention", rope), theta, head_dim)
        return DrafterSpec(
            architecture=architecture, hidden_size=hidden, n_layers=1, n_heads=n_heads, n_kv_heads=n_kv,
            head_dim=head_dim, intermediate_size=v.int("intermediate_size", required=True, minimum=1,
                                                       maximum=bounds.MAX_WIDTH),
            rms_norm_eps=v.float("rms_norm_eps", 1e-6),  # type: ignore[arg-type]
            rope_theta=theta, context_length=v.int("max_position_embeddings", 2048, minimum=1),
            block_size=DEFAULT_N_MAX + 1, target_layer_ids=self._taps(config, path), vocab_size=vocab,
            draft_vocab_size=draft if draft < vocab else None,
            target_hidden_size=v.int("target_hidden_size", minimum=1, maximum=bounds.MAX_WIDTH),
            norm_before_residual=bool(v.bool("norm_before_residual")), norm_before_fc=bool(v.bool("norm_before_fc")),
            rope_scaling=rope_scaling_of(merged, path), rope_freq_factors=factors,
            torch_dtype=str(merged.get("torch_dtype") or merged.get("dtype") or "") or None,
            layout="speculators" if _is_speculators(config) else "specforge" if "eagle_config" in config else None,
        )

    def _taps(self, config: Mapping[str, Any], path: str) -> tuple[int, ...]:
        """HF decoder-layer ids (empty: llama.cpp's default, known with the target)."""
        key, ids, offset = "eagle_aux_hidden_state_layer_ids", config.get("eagle_aux_hidden_state_layer_ids"), 1
        if not ids:
            nested = config.get("eagle_config")
            if isinstance(nested, Mapping) and nested.get(key):
                key, ids, offset = f"eagle_config.{key}", nested[key], 0  # SpecForge: layer-output ids
        if not ids:
            return ()
        if not isinstance(ids, list) or not all(isinstance(i, int) and not isinstance(i, bool) for i in ids):
            raise DFlashError(f"{path}: '{key}' must be a list of integers, got {bounds.quote(ids)}")
        if len(ids) != N_TAPS:
            raise _refuse(path, f"'{key}' lists {len(ids)} target layers", "llama.cpp's EAGLE-3 graph fuses exactly "
                          f"{N_TAPS} (its loader: 'expected 3 extract layers')")
        taps = tuple(i - offset for i in ids)
        if min(taps) < 0:
            raise DFlashError(f"{path}: '{key}' has {min(ids)}: the embedding output is no layer llama.cpp taps "
                              "(layer-input ids start at 1)")
        if list(taps) != sorted(set(taps)) or taps[-1] >= bounds.MAX_LAYERS:
            raise DFlashError(f"{path}: '{key}' must be sorted, unique and below {bounds.MAX_LAYERS}, got {ids}")
        return taps


FAMILY = Eagle3.instance
