"""Build a runnable drafter from any file `dflashkit.drafters.open_drafter` reads, and the target's head.

A drafter comes from an HF checkpoint directory of any layout (z-lab, vLLM ``speculators``, SpecForge /
DeepSpec DSpark) or a GGUF of any dialect and any tensor type, always through `open_drafter`: its family
reads the config (or the dialect the metadata) into a `DrafterSpec`, `runtime_config` adds the
runtime-only fields, and weights are read by canonical id and dequantized to float32 (``read_f32``), or — with
``keep_quantized=True`` and when ``dflashkit.runtime.kernels`` provides ``qmatmul`` — kept as ggml blocks
and multiplied by the fused kernels. The target's ``embed_tokens`` / ``lm_head`` come from a target
GGUF (``token_embd.weight`` / ``output.weight``) or an HF target directory — unless the drafter has its
own (``embed_tokens`` / ``lm_head``; MiMo's ``mask_embedding.pt`` row), which replace them as in llama.cpp.
"""

from __future__ import annotations

import mmap
import os
from dataclasses import dataclass, field
from pathlib import Path
from types import SimpleNamespace
from typing import Any, Mapping

import numpy as np
import torch

from ..codecs import to_float32
from ..converters.mask_embedding import read_mask_embedding
from ..io.gguf_reader import open_gguf
from ..io.safetensors_reader import open_checkpoint
from ..errors import DFlashError, UsageError
from ..drafters import DrafterFile, open_drafter, release_pages
from ..spec_checks import check_runnable
from ..spec import DrafterSpec, read_config_json
from ..families import architecture_of, expected_tensors, family_for_spec, plain_label
from .dflash import DFlashDraftModel, Embedding, Linear, RMSNorm, TargetHead
from .config import RuntimeConfig, refuse_unsupported, runtime_config
from .ggml_rounding import round_as_ggml
from .zoo import model_class_for, module_path

DTYPES: dict[str, torch.dtype] = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}
_DTYPE_ALIASES = {"f32": "float32", "fp32": "float32", "bf16": "bfloat16", "f16": "float16", "fp16": "float16", "half": "float16"}
_FLOAT_TYPES = {"F32", "F16", "BF16", "F64"}



def resolve_dtype(dtype: str | torch.dtype) -> torch.dtype:
    if isinstance(dtype, torch.dtype):
        if dtype not in DTYPES.values():
            raise UsageError(f"dtype {dtype} is not supported (float32, bfloat16, float16)")
        return dtype
    name = _DTYPE_ALIASES.get(str(dtype).lower(), str(dtype).lower())
    if name not in DTYPES:
        raise UsageError(f"unknown dtype '{dtype}' (choose float32, bfloat16 or float16)")
    return DTYPES[name]


def resolve_device(device: str | torch.device) -> torch.device:
    dev = torch.device(device)
    if dev.type == "cuda" and not torch.cuda.is_available():
        raise UsageError("device 'cuda' requested but torch sees no CUDA GPU")
    if dev.type == "mps" and not (getattr(torch.backends, "mps", None) and torch.backends.mps.is_available()):
        raise UsageError("device 'mps' requested but the MPS backend is not available")
    if dev.type not in ("cpu", "cuda", "mps"):
        raise UsageError(f"unsupported device '{device}' (cpu, cuda or mps)")
    return dev


def kernels_available() -> bool:
    """True when ``dflashkit.runtime.kernels`` provides the fused quantized matmul (``qmatmul``)."""
    try:
        from .kernels import QuantizedWeight, qmatmul  # noqa: F401
    except ImportError:
        return False
    return True


@dataclass
class LoadInfo:
    """How a drafter was loaded (for reports)."""

    path: str
    kind: str  # "hf" | "gguf"
    dialect: str | None
    architecture: str
    tensor_types: dict[str, int]  # stored type → tensor count
    matmul: str  # which linear-layer path runs
    device: str
    dtype: str
    notes: list[str] = field(default_factory=list)
    family: str = ""  # e.g. "z-lab DFlash", "speculators DSpark" (reports name it)

    @property
    def family_name(self) -> str:
        return self.family or plain_label(self.architecture) or self.architecture

    def to_json(self) -> dict[str, Any]:
        return {
            "path": self.path, "kind": self.kind, "dialect": self.dialect, "architecture": self.architecture,
            "family": self.family_name, "tensor_types": self.tensor_types, "matmul": self.matmul,
            "device": self.device, "dtype": self.dtype, "notes": self.notes,
        }


#: How every dflashkit runtime verifies a draft (reports say it: tree-verify numbers are not chain τ).
VERIFY_MODE = ("chain verify (one draft path per round, longest accepted prefix + bonus token; not tree "
               "verification such as Luce DDTree, whose numbers are not chain τ)")


def reference_notes(spec: DrafterSpec) -> list[str]:
    """Config values the reference implementation does not act on (so neither does the runtime) — or, for a
    llama.cpp GGUF (``llama_cpp_rules``), what llama.cpp does with them (and so does the runtime)."""
    notes = []
    llama = getattr(spec, "llama_cpp_rules", False)
    n, d = spec.rope_dimension_count, spec.head_dim
    if n is not None and n != d:
        notes.append(f"partial rotary: the first {n} of {d} dims rotate, as llama.cpp ropes n_rot" if llama else
                     f"partial rotary ({n} of {d} dims) is ignored: z-lab's reference rotates the full head")
    if spec.attention_value_scale is not None and not (llama and spec.attention_value_scale == 0):  # 0: llama.cpp skips
        s = spec.attention_value_scale
        notes.append(f"attention_value_scale {s} scales each attention output, as llama.cpp does" if llama else
                     f"attention_value_scale {s} is ignored: z-lab's reference does not use it")
    return notes


def load_drafter(
    path: str | os.PathLike,
    *,
    device: str | torch.device = "cpu",
    dtype: str | torch.dtype = "float32",
    keep_quantized: bool = False,
    packed: bool = False,
    ggml_activations: bool = True,
) -> DFlashDraftModel:
    """A ready-to-run drafter (eval mode) from an HF dir or a GGUF; ``model.load_info`` says how.

    ``packed`` (float32 only): matrices stay in the file's 16-bit or ggml type and are unpacked at each
    matmul (`Linear.set_packed`) — the same results at a fraction of the memory (dflash-parity).
    ``ggml_activations``: a llama.cpp GGUF multiplies each matrix with the activations rounded as ggml's CPU backend
    rounds them (`ggml_rounding`: F16, BF16 or Q8_0 / Q8_1 / Q8_K by the weight's type); False: with the float32
    activations, so only the weights' own rounding shows. An HF checkpoint always multiplies float32 activations."""
    dev, dt = resolve_device(device), resolve_dtype(dtype)
    _name_unsupported(path)
    with open_drafter(path) as f:
        spec, used, shapes = _runtime_spec(f, path)
        model = model_class_for(spec)(spec)
        quantized = keep_quantized and kernels_available()
        notes = reference_notes(spec)
        if keep_quantized and not quantized:
            notes.append("--keep-quantized: dflashkit.runtime.kernels is not available; weights were dequantized")
        mask = _mask_embedding(f, spec)
        if mask is not None:
            model.mask_embedding = mask.to(dev)
            notes.append("mask_embedding.pt replaces the mask token's embedding row (as llama.cpp's converter does)")
        _fill(model, f, used, shapes, dev, dt, quantized, notes, packed=packed and dt == torch.float32,
              ggml_activations=ggml_activations)
        types: dict[str, int] = {}
        for ref in f.tensors.values():
            types[ref.type_name] = types.get(ref.type_name, 0) + 1
        kept = any(isinstance(m, Linear) and m.is_quantized for m in model.modules())
        if kept:
            matmul = f"quantized, dflashkit.runtime.kernels.qmatmul ({_qmatmul_path(model, dev)} path)"
        elif any(t not in _FLOAT_TYPES for t in types):
            matmul = f"dense {_dtype_name(dt)} (dequantized on load)"
        else:
            matmul = f"dense {_dtype_name(dt)}"
        info = LoadInfo(
            path=str(path),
            kind=f.kind,
            dialect=f.dialect.name if f.dialect else None,
            architecture=spec.architecture,
            tensor_types=types,
            matmul=matmul,
            device=str(dev),
            dtype=_dtype_name(dt),
            notes=notes,
            family=getattr(spec, "label", ""),  # RuntimeConfig: the zoo family; z-lab: from the architecture
        )
    model.load_info = info  # type: ignore[attr-defined]
    return model.eval()


def runtime_spec(path: str | os.PathLike) -> DrafterSpec:
    """The spec `load_drafter` would run ``path`` with, every check of it made, no weight read: what a command
    checks two drafters by before it loads either (dflash-parity loads them one at a time)."""
    _name_unsupported(path)
    with open_drafter(path) as f:
        return _runtime_spec(f, path)[0]


def _name_unsupported(path: str | os.PathLike) -> None:
    if Path(path).is_dir():  # named before its family reads the config (which may refuse it in its own words)
        refuse_unsupported(_hf_architecture(Path(path)), str(Path(path) / "config.json"))


def _runtime_spec(f: DrafterFile, path: str | os.PathLike) -> tuple[DrafterSpec, list[str], dict[str, tuple[int, ...]]]:
    spec = f.require_spec()
    if (problem := f.weight_type_problem()) is not None:  # e.g. I32 weights: never multiplied as integers
        raise DFlashError(f"{problem} — refusing to run this drafter")
    refuse_unsupported(spec.architecture, str(path))  # e.g. a Gemma-4 DSpark GGUF: a backbone this runtime lacks
    family = f.family or family_for_spec(spec)
    used = runtime_tensors(f, spec)
    # the runtime-only fields (own embeddings / head, DSpark heads, interleaved RoPE, speculators' window)
    # from the family's spec and the tensors at hand
    spec = runtime_config(family, spec, kind=f.kind, shapes={c: f.tensors[c].shape for c in used},
                          config=f.metadata if f.kind == "hf" else None,
                          path=str(Path(path) / "config.json") if f.kind == "hf" else str(path),
                          one_causal_flag=bool(f.dialect and f.dialect.one_causal_flag))
    shapes = _loader_shapes(f, spec)
    # same rules as convert, and shapes before allocating (a d2t sets the own head's rows)
    stored = {c: f.tensors[c].name for c in shapes if c in f.tensors}  # errors name a tensor as the file does
    check_runnable(spec, {c: SimpleNamespace(shape=s, name=stored.get(c, c)) for c, s in shapes.items()}, f.path)
    return spec, used, shapes


def _loader_shapes(f: DrafterFile, spec: DrafterSpec) -> dict[str, tuple[int, ...]]:
    """Canonical id → shape, a GGUF's taken as llama.cpp's loader takes them: ggml pads ``ne`` with 1s, and a
    file records only up to its last dim > 1 (llama-quantize writes DSpark's ``conf_proj.weight`` {n_embd + rank, 1}
    as one dim), so a shape that differs from the expected one only by leading 1s (numpy order) is that one."""
    shapes = {c: tuple(r.shape) for c, r in f.tensors.items()}
    if f.kind != "gguf":
        return shapes
    for c, want in expected_tensors(spec, vocab_size=spec.vocab_size).items():
        got = shapes.get(c)
        pad = len(want) - len(got) if got is not None else 0
        if pad > 0 and all(w == 1 for w in want[:pad]) and all(w in (-1, g) for w, g in zip(want[pad:], got)):
            shapes[c] = (1,) * pad + got
    return shapes


def _hf_architecture(directory: Path) -> str:
    try:
        return architecture_of(read_config_json(directory))
    except DFlashError:
        return ""  # open_drafter reports the config


def runtime_tensors(f: DrafterFile, spec: DrafterSpec) -> list[str]:
    """Canonical ids of the tensors the runtime loads: every mapped one of a GGUF (what llama.cpp's loader
    reads), and of an HF checkpoint those its family keeps in a conversion (``dropped_on_convert``: e.g.
    DSpark's ``t2d``, a full-vocabulary DSpark's ``lm_head``) — so both forms run the same drafter."""
    if f.kind != "hf":
        return list(f.tensors)
    family = f.family or family_for_spec(spec)
    dropped = family.dropped_on_convert(spec)
    return [c for c in f.tensors if c not in dropped]


def _mask_embedding(f: DrafterFile, spec: DrafterSpec) -> torch.Tensor | None:
    """MiMo's ``mask_embedding.pt`` beside an HF checkpoint (float32 [hidden]); None without one. A GGUF already
    holds it in its ``token_embd`` (llama.cpp's converter writes the target's embeddings with that row)."""
    if f.kind != "hf":
        return None
    # (with embeddings of its own, the converter writes the row into those: the same lookup as here)

    vector = read_mask_embedding(Path(f.path), spec)
    return None if vector is None else vector.detach().to(torch.float32).reshape(-1)


def _kernel_types() -> frozenset[Any]:
    """Quantized ggml types dflashkit.runtime.kernels can multiply (empty without the kernels)."""
    try:
        from .kernels import TORCH_DEQUANT
    except ImportError:
        return frozenset()
    return frozenset(t for t in TORCH_DEQUANT if t.name not in _FLOAT_TYPES)


def _dequantize(raw: np.ndarray, ggml_type: Any, shape: tuple[int, ...], dev: torch.device, dt: torch.dtype) -> torch.Tensor:
    """ggml blocks → ``dt`` on ``dev``, through dflashkit.runtime.kernels (on the device itself: a GPU dequantizes in
    place of the CPU); numpy's dequantizer when the kernels cannot take the type."""
    if ggml_type in _kernel_types():
        from .kernels import dequantize_torch

        data = torch.from_numpy(np.array(raw, dtype=np.uint8)).to(dev)  # a copy: the memmap is read-only
        return dequantize_torch(data, ggml_type, shape).to(dtype=dt)
    return torch.from_numpy(to_float32(raw, ggml_type.name, shape)).to(device=dev, dtype=dt)


#: bytes copied out of a file mapping before its pages are dropped again (`_packed_bytes`)
_COPY_CHUNK_BYTES = 64 << 20


def _packed_bytes(raw: np.ndarray, rows: int) -> torch.Tensor:
    """A tensor's stored bytes as uint8 [rows, row_bytes] (a copy: the memmap is read-only), copied in chunks
    whose mapped pages are dropped before the next: the copy plus at most one chunk of the file is resident,
    not the copy plus the whole tensor's pages (413 MB more for a Qwen3 vocabulary in Q8_0)."""
    src = np.ascontiguousarray(raw).view(np.uint8).reshape(rows, -1)
    data = torch.empty(src.shape, dtype=torch.uint8)
    dst = data.numpy()
    step = max(1, _COPY_CHUNK_BYTES // max(1, src.shape[1]))
    for a in range(0, rows, step):
        dst[a : a + step] = src[a : a + step]
        release_pages(raw)
    return data


def _mapped_bytes(path: Path, offset: int, nbytes: int, rows: int) -> tuple[torch.Tensor, mmap.mmap]:
    """A tensor's stored bytes as uint8 [rows, row_bytes] over a private (copy-on-write, never written) map of the
    file: no copy, pages resident only once read (the reader checked the extent against the file's size)."""
    with open(path, "rb") as f:
        mm = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_COPY)  # the map outlives the descriptor
    if offset + nbytes > len(mm):
        raise DFlashError(f"{path}: a tensor's data runs past the end of the file (it shrank since it was read)")
    return torch.from_numpy(np.frombuffer(mm, dtype=np.uint8, count=nbytes, offset=offset).reshape(rows, -1)), mm


def _qmatmul_path(model: DFlashDraftModel, dev: torch.device) -> str:
    from .kernels import QuantizedWeight, qmatmul_path

    lin = next(m for m in model.modules() if isinstance(m, Linear) and m.is_quantized)
    return qmatmul_path(dev, QuantizedWeight(lin.qdata, lin.ggml_type, (lin.out_features, lin.in_features)))


def _dtype_name(dt: torch.dtype) -> str:
    return next(k for k, v in DTYPES.items() if v == dt)


def _fill(model: DFlashDraftModel, f: DrafterFile, used: list[str], shapes: Mapping[str, tuple[int, ...]],
          dev: torch.device, dt: torch.dtype, quantized: bool, notes: list[str], *, packed: bool = False,
          ggml_activations: bool = True) -> None:
    spec = model.spec
    expected = expected_tensors(spec, vocab_size=spec.vocab_size)
    # an HF interleaved-RoPE checkpoint runs in its own layout (RuntimeConfig.rope_interleaved): its q/k are
    # read as stored, not NeoX-permuted as `open_drafter` gives them to the converter
    as_stored = isinstance(spec, RuntimeConfig) and spec.rope_interleaved
    missing = [n for n in expected if n not in f.tensors]
    if missing:
        shown = ", ".join(missing[:6]) + (f" (+{len(missing) - 6} more)" if len(missing) > 6 else "")
        raise DFlashError(f"{f.path}: missing tensor(s) the drafter needs: {shown}")
    if f.unmapped:
        notes.append(f"ignored {len(f.unmapped)} tensor(s) with no DFlash meaning: {', '.join(f.unmapped[:4])}")
    family = f.family or family_for_spec(spec)
    ggml_activations = ggml_activations and bool(getattr(spec, "llama_cpp_rules", False))  # a llama.cpp GGUF
    embed: str | None = None  # the drafter's own token_embd (its head too when it has no output)
    for canonical in used:
        ref = f.tensors[canonical]
        if canonical == "d2t":  # absolute target ids: a GGUF stores them (I64), an HF checkpoint offsets
            raw = f.read_raw(canonical)
            ids = family.finalize_tensor(spec, canonical, raw, str(f.path))[0] if f.kind == "hf" else np.array(raw)
            model.d2t = torch.from_numpy(np.asarray(ids).astype(np.int64).reshape(-1)).to(dev)
            continue
        module_path_, _, attr = module_path(canonical).rpartition(".")
        try:
            module = model.get_submodule(module_path_)
        except AttributeError:
            raise DFlashError(f"{f.path}: tensor '{ref.name}' has no place in a {spec.architecture} with this config") from None
        want, shape = expected.get(canonical), shapes[canonical]
        if want is not None and (len(want) != len(shape) or any(w not in (-1, g) for w, g in zip(want, shape))):
            raise DFlashError(f"{f.path}: tensor '{ref.name}' has shape {list(shape)}, the config implies {list(want)}")
        if isinstance(module, Linear) and attr == "weight" and ggml_activations:
            round_as_ggml(module, ref.type_name, lambda: f.read_raw(canonical), dev)
        if module is model.embed_tokens and attr == "weight":
            embed = canonical
        if isinstance(module, Linear) and attr == "weight" and quantized and ref.ggml_type in _kernel_types():
            data = torch.from_numpy(np.array(f.read_raw(canonical), dtype=np.uint8)).to(dev)
            module.set_quantized(data, ref.ggml_type)
            continue
        if (isinstance(module, Linear) and attr == "weight" and packed and ref.type_name != "F32" and len(ref.shape) == 2
                and (as_stored or not (f.kind == "hf" and f.family is not None and f.spec is not None
                                       and f.family.rewrites(f.spec, canonical)))):  # sanitize needs float32
            module.set_packed(_packed_bytes(f.read_raw(canonical), ref.shape[0]).to(dev), ref.ggml_type or ref.type_name)
            continue
        if ref.ggml_type is not None and ref.type_name not in _FLOAT_TYPES:
            tensor = _dequantize(f.read_raw(canonical), ref.ggml_type, ref.shape, dev, dt)
        else:
            tensor = torch.from_numpy(np.ascontiguousarray(f.read_f32(canonical, sanitize=not as_stored))).to(device=dev, dtype=dt)
        tensor = tensor.reshape(shape)
        if isinstance(module, Linear) and attr == "weight":
            try:
                module.set_weight(tensor)
            except ValueError as exc:
                raise DFlashError(f"{f.path}: tensor '{ref.name}': {exc}") from None
        elif isinstance(module, (Linear, RMSNorm, Embedding)) or attr in module._buffers:  # base_kernel, sinks, ...
            setattr(module, attr, tensor.reshape(-1) if attr == "sinks" else tensor)
        else:  # pragma: no cover - every canonical id maps to one of the above
            raise DFlashError(f"{f.path}: tensor '{ref.name}' cannot be loaded into {type(module).__name__}")
    if model.embed_tokens is not None and model.lm_head is not None and not model.lm_head.is_loaded:
        # llama.cpp: a drafter with its own token_embd and no output uses token_embd as its head too
        model.lm_head.set_weight(model.embed_tokens.weight)
        if ggml_activations and embed is not None:  # as any matrix of its type, Q4_1 / Q5_1 block minimums too
            round_as_ggml(model.lm_head, f.tensors[embed].type_name, lambda: f.read_raw(embed), dev)
    if any(isinstance(m, Linear) and m.activation_type for m in model.modules()):
        notes.append("activations rounded before each matmul as ggml's CPU backend rounds them (F16 / BF16 / Q8_0 / "
                     "Q8_1 / Q8_K by the weight's type), as llama.cpp multiplies")
    # Norms default to ones, so only the shape check above guards them; everything else must be set.
    for name, module in model.named_modules():
        if isinstance(module, Linear) and not module.is_loaded or isinstance(module, Embedding) and module.weight is None:
            raise DFlashError(f"{f.path}: no weight for '{name}'")
        if getattr(module, "base_kernel", False) is None:
            raise DFlashError(f"{f.path}: no weight for '{name}.base_kernel'")
    if model.d2t is not None and model.lm_head is not None and model.d2t.numel() != model.lm_head.out_features:
        raise DFlashError(f"{f.path}: d2t has {model.d2t.numel()} rows, lm_head {model.lm_head.out_features}")
    model.to(device=dev, dtype=dt)  # float buffers only: quantized blocks stay uint8


# ---------------------------------------------------------------------------------------------
# The target's embeddings and lm_head
# ---------------------------------------------------------------------------------------------


def load_target_head(target: str | os.PathLike, *, device: str | torch.device = "cpu", dtype: str | torch.dtype = "float32",
                     keep_quantized: bool = False, packed: bool = False, mapped: bool = False) -> TargetHead:
    """``embed_tokens`` and ``lm_head`` of a target GGUF (``token_embd`` / ``output``) or HF directory.

    A target without a separate output matrix ties the head to the embedding, as llama.cpp and
    transformers do. ``mapped`` (with ``packed``, a GGUF on the CPU): the stored bytes are not copied but read
    through a private map of the file — resident only while a matmul or a lookup reads them, and dropped again
    with `TargetHead.release` (dflash-parity applies a 151 k vocabulary's head once, after both drafters).
    """
    dev, dt = resolve_device(device), resolve_dtype(dtype)
    p = Path(target)
    if p.is_dir():
        embed, head, bias = _hf_head(p)
    elif p.is_file():
        packed = packed and dt == torch.float32 and not keep_quantized
        return _gguf_head(p, dev, dt, keep_quantized, packed=packed, mapped=mapped and packed and dev.type == "cpu")
    else:
        raise DFlashError(f"target {p}: no such file or directory")
    lm = Linear(embed.shape[1], head.shape[0])
    lm.set_weight(torch.from_numpy(head).to(device=dev, dtype=dt))
    if bias is not None:
        lm.bias = torch.from_numpy(bias).to(device=dev, dtype=dt)
    return TargetHead(torch.from_numpy(embed).to(device=dev, dtype=dt), lm, source=str(p))


def _gguf_head(path: Path, dev: torch.device, dt: torch.dtype, keep_quantized: bool, *, packed: bool = False,
               mapped: bool = False) -> TargetHead:

    with open_gguf(path) as g:
        if "token_embd.weight" not in g.tensors:
            raise DFlashError(f"target {path}: no token_embd.weight tensor — not a llama.cpp language-model GGUF")
        if packed:  # embedding rows unpacked on lookup, the vocabulary projection in row blocks

            def table(name: str) -> Linear:
                info = g.tensors[name]
                lin = Linear(info.shape[1], info.shape[0])
                if mapped:
                    data, lin.file_map = _mapped_bytes(path, info.offset, info.nbytes, info.shape[0])
                else:
                    data = _packed_bytes(g.array(name), info.shape[0]).to(dev)
                lin.set_packed(data, info.ggml_type)
                return lin

            embed_table = table("token_embd.weight")
            lm = table("output.weight") if "output.weight" in g.tensors else embed_table
            if "output.bias" in g.tensors:
                info = g.tensors["output.bias"]
                f32 = to_float32(g.array("output.bias"), info.ggml_type.name, info.shape, where=f"{path}: tensor 'output.bias'")
                if lm is embed_table:
                    lm = table("token_embd.weight")
                lm.bias = torch.from_numpy(np.ascontiguousarray(f32)).to(device=dev, dtype=dt)
            return TargetHead(embed_table, lm, source=str(path))

        def read(name: str) -> torch.Tensor:
            info = g.tensors[name]
            if info.ggml_type.name not in _FLOAT_TYPES:
                return _dequantize(g.array(name), info.ggml_type, info.shape, dev, dt)
            f32 = to_float32(g.array(name), info.ggml_type.name, info.shape, where=f"{path}: tensor '{name}'")
            return torch.from_numpy(np.ascontiguousarray(f32)).to(device=dev, dtype=dt)

        embed = read("token_embd.weight")
        name = "output.weight" if "output.weight" in g.tensors else "token_embd.weight"  # tied embeddings
        info = g.tensors[name]
        lm = Linear(info.shape[1], info.shape[0])
        if keep_quantized and info.ggml_type in _kernel_types():
            lm.set_quantized(torch.from_numpy(np.array(g.array(name), dtype=np.uint8)).to(dev), info.ggml_type)
        else:
            lm.set_weight(embed if name == "token_embd.weight" else read(name))
        if "output.bias" in g.tensors:
            lm.bias = read("output.bias")
    return TargetHead(embed, lm, source=str(path))


def _hf_head(directory: Path) -> tuple[np.ndarray, np.ndarray, np.ndarray | None]:

    ck = open_checkpoint(directory, strict=True)
    # Multimodal checkpoints nest the language model (model.language_model.embed_tokens.weight).
    embeds = sorted((n for n in ck.tensors if n.endswith("embed_tokens.weight")), key=len)
    if not embeds:
        raise DFlashError(f"target {directory}: no *embed_tokens.weight tensor in the checkpoint")
    heads = sorted((n for n in ck.tensors if n.endswith("lm_head.weight")), key=len)

    def f32(name: str) -> np.ndarray:
        t = ck.tensors[name]
        return np.ascontiguousarray(to_float32(ck.array(name), t.dtype, tuple(t.shape), where=f"{directory}: tensor '{name}'"))

    embed = f32(embeds[0])
    head = f32(heads[0]) if heads else embed  # no lm_head tensor: tied to the embedding
    bias_name = heads[0][: -len("weight")] + "bias" if heads else None
    bias = f32(bias_name) if bias_name and bias_name in ck.tensors else None
    ck.close()
    return embed, head, bias
