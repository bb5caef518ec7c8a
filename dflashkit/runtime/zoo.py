"""Build a runnable drafter of any family from a `RuntimeConfig` and canonical tensors.

Two entry points:

- `build_model(cfg, tensors)`: the boundary the converter side wires GGUF loading to. ``tensors`` maps
  canonical ids — the module paths of the runtime models, which are the z-lab / speculators HF names
  (``layers.0.self_attn.q_proj.weight``, ``candidate_selector.predecessor_codebook.weight``,
  ``markov_head.markov_w1.weight``, ``confidence_head.proj.bias``, ``layers.0.self_attn.sinks``,
  ``lm_head.weight``) — to float tensors, and ``d2t`` to int64 *absolute* target ids.
- `load_hf_zoo(directory)`: an HF checkpoint of the layouts ``dflashkit.io`` does not read yet
  (vLLM ``speculators`` dflash / dflash2 / dspark, SpecForge / DeepSpec DSpark), straight from
  config.json + safetensors: nested
  hparams through `runtime_config_from_hf`, ``d2t`` offsets (target id = d2t[i] + i) made absolute and
  checked, verifier-owned tensors (``embed_tokens``, ``verifier_*``, ``t2d``) left out.
"""

from __future__ import annotations

import os
from dataclasses import replace
from pathlib import Path
from typing import Mapping

import numpy as np
import torch

from ..errors import DFlashError
from ..codecs import to_float32
from ..spec import read_config_json
from .config import SPECFORGE_DSPARK, UNSUPPORTED, RuntimeConfig, runtime_config_from_hf
from .dflash import DFlashDraftModel, Embedding, Linear
from .dflash2 import DFlash2DraftModel
from .dspark import DSparkDraftModel
from .gemma4_dspark import ARCH_GEMMA4_DSPARK, Gemma4DSparkDraftModel

#: speculators state-dict names → canonical ids (the rest are the same)
_RENAMES = {
    "candidate_selector.predecessor_codebook": "candidate_selector.predecessor_codebook.weight",
    "candidate_selector.successor_codebook": "candidate_selector.successor_codebook.weight",
}
#: tensors a speculators checkpoint may carry that belong to the verifier (target) or training only
_VERIFIER_OWNED = ("embed_tokens.weight", "verifier_norm.weight", "verifier_lm_head.weight", "t2d")


def model_class_for(cfg: RuntimeConfig) -> type[DFlashDraftModel]:
    if cfg.architecture == ARCH_GEMMA4_DSPARK:  # a DSpark on its own backbone
        return Gemma4DSparkDraftModel
    return {"dflash": DFlashDraftModel, "dflash2": DFlash2DraftModel, "dspark": DSparkDraftModel}[cfg.family]


def is_zoo_checkpoint(path: str | os.PathLike) -> bool:
    """An HF directory whose layout only this module reads (speculators, SpecForge DSpark, refused DSparks)."""
    p = Path(path)
    if not (p.is_dir() and (p / "config.json").is_file()):
        return False
    try:
        config = read_config_json(p)
    except DFlashError:
        return False
    archs = config.get("architectures") or []
    arch = archs[0] if isinstance(archs, list) and archs else None
    return "speculators_model_type" in config or arch in SPECFORGE_DSPARK or arch in UNSUPPORTED


def canonical_name(name: str) -> str:
    if name in _RENAMES:
        return _RENAMES[name]
    if name.endswith(".self_attn.attention_sink_bias"):  # MiMo's name for the sinks
        return name[: -len("attention_sink_bias")] + "sinks"
    return name


def absolute_d2t(offsets: np.ndarray, target_vocab: int, where: str) -> torch.Tensor:
    """speculators' ``d2t`` (offsets: target id = d2t[i] + i) → absolute ids, checked in range and unique."""
    ids = offsets.astype(np.int64).reshape(-1) + np.arange(offsets.size, dtype=np.int64)
    bad = np.flatnonzero((ids < 0) | (ids >= target_vocab))
    if bad.size:
        raise DFlashError(f"{where}: d2t row {int(bad[0])} maps to target id {int(ids[bad[0]])}, outside the target "
                          f"vocabulary [0, {target_vocab})")
    if np.unique(ids).size != ids.size:
        raise DFlashError(f"{where}: d2t maps two draft rows to the same target id")
    return torch.from_numpy(ids)


def build_model(cfg: RuntimeConfig, tensors: Mapping[str, torch.Tensor], *, where: str = "drafter",
                device: str | torch.device = "cpu", dtype: torch.dtype = torch.float32) -> DFlashDraftModel:
    """A ready model (eval mode) of ``cfg``'s family with ``tensors`` (canonical ids, see the module doc)."""
    model = model_class_for(cfg)(cfg)
    assign_tensors(model, tensors, where=where, device=device)
    for name, module in model.named_modules():
        if isinstance(module, Linear) and not module.is_loaded or isinstance(module, Embedding) and module.weight is None:
            raise DFlashError(f"{where}: no weight for '{name}'")
        if getattr(module, "base_kernel", False) is None:
            raise DFlashError(f"{where}: no weight for '{name}.base_kernel'")
    if cfg.own_lm_head and (cfg.draft_vocab_size or 0) != (cfg.vocab_size or 0) and model.d2t is None:
        raise DFlashError(f"{where}: a draft vocabulary of {cfg.draft_vocab_size} rows needs a d2t tensor")
    if model.d2t is not None and model.lm_head is not None and model.d2t.numel() != model.lm_head.out_features:
        raise DFlashError(f"{where}: d2t has {model.d2t.numel()} rows, lm_head {model.lm_head.out_features}")
    model.to(device=device, dtype=dtype)
    return model.eval()


def assign_tensors(model: DFlashDraftModel, tensors: Mapping[str, torch.Tensor], *, where: str = "drafter",
                   device: str | torch.device = "cpu") -> None:
    """Put canonical tensors into ``model`` (shapes checked; ``d2t`` kept int64; dtype cast later)."""
    label = getattr(model.spec, "label", model.spec.architecture)
    for name, tensor in tensors.items():
        module_path, _, attr = name.rpartition(".")
        try:
            module = model.get_submodule(module_path) if module_path else model
        except AttributeError:
            raise DFlashError(f"{where}: tensor '{name}' has no place in a {label} drafter with this config") from None
        if name == "d2t":
            model.d2t = tensor.to(device=device, dtype=torch.long)
            continue
        value = tensor.to(device=device, dtype=torch.float32)
        if isinstance(module, Linear) and attr == "weight":
            try:
                module.set_weight(value)
            except ValueError as exc:
                raise DFlashError(f"{where}: tensor '{name}': {exc}") from None
        elif attr in module._buffers:  # registered buffers, None until loaded
            current = getattr(module, attr)
            if current is not None and tuple(current.shape) != tuple(value.shape):
                raise DFlashError(f"{where}: tensor '{name}' has shape {list(value.shape)}, the config implies "
                                  f"{list(current.shape)}")
            if attr == "sinks":
                value = value.reshape(-1)
            setattr(module, attr, value)
        else:
            raise DFlashError(f"{where}: tensor '{name}' has no place in a {label} drafter with this config")


def read_hf_tensors(directory: Path, cfg: RuntimeConfig) -> dict[str, torch.Tensor]:
    """Canonical float32 tensors (and absolute ``d2t``) of an HF checkpoint directory."""
    from ..io.safetensors_reader import open_checkpoint

    out: dict[str, torch.Tensor] = {}
    with open_checkpoint(directory, strict=True) as ck:
        for t in ck.tensors.values():
            if t.name in _VERIFIER_OWNED or (t.name == "lm_head.weight" and not cfg.own_lm_head):
                continue
            raw = ck.array(t.name)
            if t.name == "d2t":
                if cfg.own_lm_head:
                    out["d2t"] = absolute_d2t(np.asarray(raw), int(cfg.vocab_size or 0), f"{directory}: tensor 'd2t'")
                continue
            f32 = to_float32(raw, t.dtype, tuple(t.shape), where=f"{directory}: tensor '{t.name}'")
            out[canonical_name(t.name)] = torch.from_numpy(np.ascontiguousarray(f32))
    return out


def load_hf_zoo(directory: str | os.PathLike, *, device: str | torch.device = "cpu",
                dtype: torch.dtype = torch.float32) -> tuple[DFlashDraftModel, dict[str, int]]:
    """(model, stored tensor types → counts) of an HF drafter directory read through `runtime_config_from_hf`."""
    from ..io.safetensors_reader import open_checkpoint

    d = Path(directory)
    cfg = runtime_config_from_hf(read_config_json(d), str(d / "config.json"))
    cfg = replace(cfg, name=cfg.name or d.resolve().name)
    with open_checkpoint(d, strict=True) as ck:
        types: dict[str, int] = {}
        for t in ck.tensors.values():
            types[t.dtype] = types.get(t.dtype, 0) + 1
    return build_model(cfg, read_hf_tensors(d, cfg), where=str(d), device=device, dtype=dtype), types


#: llama.cpp GGUF names of the zoo's tensors that ``dflashkit.io`` does not map yet → canonical ids
_GGUF_ZOO = {
    "markov_w1.weight": "markov_head.markov_w1.weight",
    "markov_w2.weight": "markov_head.markov_w2.weight",
    "markov_w2.scale": "markov_head.markov_w2_scale",
    "conf_proj.weight": "confidence_head.proj.weight",
    "conf_proj.bias": "confidence_head.proj.bias",
    "d2t": "d2t",
}


def gguf_zoo_canonical(name: str) -> str | None:
    if name in _GGUF_ZOO:
        return _GGUF_ZOO[name]
    parts = name.split(".")
    if len(parts) == 4 and parts[0] == "blk" and parts[2] == "attn_sinks" and parts[3] == "weight":
        return f"layers.{parts[1]}.self_attn.sinks"
    return None


def gguf_zoo_tensors(path: str | os.PathLike, names: list[str] | None = None) -> tuple[dict[str, tuple[int, ...]], dict[str, torch.Tensor]]:
    """(stored name → numpy shape of every tensor, canonical id → tensor for the zoo tensors of ``names``)
    of a llama.cpp GGUF, read with gguf-py (float32; ``d2t`` int64)."""
    import gguf
    from gguf.quants import dequantize

    reader = gguf.GGUFReader(str(path))
    shapes: dict[str, tuple[int, ...]] = {}
    out: dict[str, torch.Tensor] = {}
    for t in reader.tensors:
        shape = tuple(int(x) for x in reversed(t.shape.tolist()))  # ggml order → numpy order
        shapes[t.name] = shape
        canonical = gguf_zoo_canonical(t.name)
        if canonical is None or (names is not None and t.name not in names):
            continue
        if t.name == "d2t":
            out[canonical] = torch.from_numpy(np.array(t.data, dtype=np.int64).reshape(-1))
            continue
        data = np.array(dequantize(t.data, t.tensor_type), dtype=np.float32).reshape(shape)
        out[canonical] = torch.from_numpy(data)
    return shapes, out
