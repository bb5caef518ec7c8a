"""One reader for every form of a drafter: an HF checkpoint directory or a GGUF of any dialect.

`open_drafter` maps each stored tensor to its canonical id (z-lab's HF name: the family's
`hf_to_canonical` for a checkpoint, the dialect table for a GGUF), exposes shapes in numpy/HF order (GGUF dims reversed), decodes the
metadata into a `DrafterSpec`, and reads any tensor as float32 on demand (dequantizing any
quantized type). Names that map to nothing are kept in ``unmapped`` — never silently skipped.
Conversion, translation, Diff, Runtime and Inspect all load drafters through here.

Layer: above `io` and the families/dialects tables (it joins them), below every command.
"""

from __future__ import annotations

import math
import mmap
import os
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Iterator, Sequence

import numpy as np
from gguf import GGMLQuantizationType

from . import bounds
from .codecs import to_float32
from .dialects import Dialect, detect_dialect, spec_from_gguf_metadata
from .errors import DFlashError
from .families import DEFAULT_FAMILY, DrafterFamily, architecture_of, family_for_spec, read_hf_config
from .io.gguf_reader import GGUFFile, open_gguf
from .quant_types import KNOWN_TYPES, is_quantized
from .io.safetensors_reader import SafetensorsCheckpoint, SafetensorsTensor, open_checkpoint
from .spec import DrafterSpec, read_config_json
from .spec_checks import check_runnable
from .variants import current_layout, detect_variant


_FLOAT_NAMES = frozenset({"F32", "F16", "BF16"})
#: GGUF tensor types a weight may have: the float types and every block-quantized type
_GGUF_WEIGHT_TYPES = _FLOAT_NAMES | {t.name for t in KNOWN_TYPES.values() if is_quantized(t)}
#: checkpoint dtypes dflash-convert reads as weights
_CHECKPOINT_WEIGHT_DTYPES = _FLOAT_NAMES | {"F64"}


def weight_dtype_message(path: str | os.PathLike, name: str, type_name: str, kind: str) -> str:
    """The one wording, in every command, for a tensor of a type no drafter weight has (``kind``: "gguf" or a
    checkpoint)."""
    allowed = (f"float ({', '.join(sorted(_FLOAT_NAMES))}) or a ggml quantized type" if kind == "gguf"
               else f"float ({', '.join(sorted(_CHECKPOINT_WEIGHT_DTYPES))})")
    return f"{path}: tensor '{bounds.escape_name(name)}' has dtype {type_name}; drafter weights must be {allowed}"


@dataclass(frozen=True)
class TensorRef:
    canonical: str
    name: str  # the name stored in the file
    shape: tuple[int, ...]  # numpy / HF order
    type_name: str  # "BF16", "F32", "Q4_K", ...
    nbytes: int
    ggml_type: GGMLQuantizationType | None = None  # GGUF tensors only

    @property
    def n_elements(self) -> int:
        return math.prod(self.shape)

    @property
    def bits_per_weight(self) -> float:
        return 8.0 * self.nbytes / max(1, self.n_elements)


@dataclass
class DrafterFile:
    path: Path
    kind: str  # "hf" | "gguf"
    architecture: str
    dialect: Dialect | None  # GGUF only
    spec: DrafterSpec | None
    spec_error: str | None  # why the metadata could not be decoded (None when it could)
    tensors: dict[str, TensorRef]  # canonical id → ref, in file order
    unmapped: list[str]  # stored names with no canonical id
    metadata: dict[str, Any]  # GGUF key → value, or config.json
    family: DrafterFamily | None = None  # None when the spec could not be decoded
    dropped: list[str] = field(default_factory=list)  # stored names the family drops on purpose (speculators' t2d)
    variant: str | None = None  # a GGUF layout variant in circulation (`dflashkit.variants`), None = current
    _gguf: GGUFFile | None = field(default=None, repr=False)
    _checkpoint: SafetensorsCheckpoint | None = field(default=None, repr=False)

    def __enter__(self) -> DrafterFile:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        if self._gguf is not None:
            self._gguf.close()
        if self._checkpoint is not None:
            self._checkpoint.close()

    @property
    def tap_convention(self) -> str:
        return self.dialect.tap_convention if self.dialect else "raw HF ids (config.json)"

    def weight_type_problem(self) -> str | None:
        """An integer tensor where a weight belongs (I8 / I16 / I32 / I64 / F64 in a GGUF; a checkpoint dtype convert
        cannot read): no runtime multiplies with it as a weight. Tensors the family converts or drops itself (DSpark's
        ``d2t`` ids, speculators' ``t2d``) are not weights."""
        # a GGUF's d2t is I64 ids whatever its family; a checkpoint's is its family's final tensor
        own = {"d2t"} if self.kind == "gguf" or self.family is None else set()
        if self.family is not None:
            own |= set(self.family.final_tensors)
            if self.spec is not None:
                own |= set(self.family.dropped_on_convert(self.spec))
        allowed = _GGUF_WEIGHT_TYPES if self.kind == "gguf" else _CHECKPOINT_WEIGHT_DTYPES
        for canonical, ref in self.tensors.items():
            if canonical not in own and ref.type_name not in allowed:
                return weight_dtype_message(self.path, ref.name, ref.type_name, self.kind)
        return None

    def require_spec(self) -> DrafterSpec:
        if self.spec is None:
            error = self.spec_error or "no drafter metadata"
            raise DFlashError(error if error.startswith(str(self.path)) else f"{self.path}: {error}")
        return self.spec

    def read_raw(self, canonical: str) -> np.ndarray:
        """Stored data, read-only: typed array for float types (BF16 as uint16), uint8 blocks for quants."""
        ref = self._ref(canonical)
        if self._gguf is not None:
            return self._gguf.array(ref.name)
        assert self._checkpoint is not None
        return self._checkpoint.array(ref.name)

    def read_f32(self, canonical: str, *, sanitize: bool = True) -> np.ndarray:
        """The tensor as float32 in numpy/HF shape (dequantized when stored quantized; an HF
        checkpoint's data passes its family's `sanitize_for` unless ``sanitize`` is false — the runtime
        runs an interleaved-RoPE checkpoint in its stored layout)."""
        ref = self._ref(canonical)
        raw = self.read_raw(canonical)
        out = to_float32(raw, ref.type_name, ref.shape, where=f"{self.path}: tensor '{ref.name}'")
        if (sanitize and self.kind == "hf" and self.family is not None and self.spec is not None
                and self.family.rewrites(self.spec, canonical)):
            out = self.family.sanitize_for(self.spec, canonical, out)
        release_pages(raw)  # `out` is a copy: the mapped pages need not stay in this process
        return out

    def display_names(self) -> dict[str, str]:
        """Canonical id → the name to show: the stored name, and for a tensor the spec expects but the
        file lacks, the name this file's dialect would give it."""
        display = {c: t.name for c, t in self.tensors.items()}
        if self.dialect is not None and self.spec is not None:
            family = self.family if self.family is not None else family_for_spec(self.spec)
            for c in family.expected_tensors(self.spec):
                if c not in display and self.dialect.has_tensor(c):
                    display[c] = self.dialect.gguf_name(c)
        return display

    def source_tensor(self, canonical: str) -> SafetensorsTensor:
        """The safetensors entry (file, offset, dtype) behind a canonical id of an HF checkpoint."""
        assert self._checkpoint is not None, "source_tensor is for HF checkpoints"
        return self._checkpoint.tensors[self._ref(canonical).name]

    def read_f32_pieces(self, canonical: str, piece_elements: int = 1 << 24, align: int = 1 << 16) -> Iterator[np.ndarray]:
        """The tensor as flat float32 pieces of whole rows, about ``piece_elements`` each: every piece but
        the last holds a multiple of ``align`` elements where the row length allows it (else: one piece)."""
        ref = self._ref(canonical)
        raw = self.read_raw(canonical)
        ne0 = ref.shape[-1] if ref.shape else 1
        n_rows = int(np.prod(ref.shape[:-1], dtype=np.int64)) if len(ref.shape) > 1 else 1
        unit = align // math.gcd(ne0, align)  # rows per aligned step
        step = max(unit, piece_elements // max(ne0, 1) // unit * unit)
        sanitized = (
            self.kind == "hf" and self.family is not None and self.spec is not None
            and self.family.rewrites(self.spec, canonical)
        )
        if n_rows <= step or raw.ndim == 0 or sanitized:  # a family's sanitize sees the whole tensor
            yield self.read_f32(canonical).reshape(-1)
            return
        rows = raw.reshape(n_rows, -1)
        where = f"{self.path}: tensor '{ref.name}'"
        for a in range(0, n_rows, step):
            b = min(n_rows, a + step)
            yield to_float32(rows[a:b], ref.type_name, (b - a, ne0), where=where).reshape(-1)
            release_pages(raw)

    def _ref(self, canonical: str) -> TensorRef:
        try:
            return self.tensors[canonical]
        except KeyError:
            raise DFlashError(f"{self.path}: has no tensor for '{canonical}'") from None


def release_pages(view: np.ndarray) -> None:
    """Drop the file pages mapped behind a memmap ``view`` from this process (the page cache keeps them).

    Touched pages of a file mapping stay resident — and count towards RSS — until the mapping goes;
    reading a whole drafter tensor by tensor through one map would end at the file's size. The
    mapping stays valid: a later access faults the pages in again.
    """
    obj: object = view
    while obj is not None:
        mm = getattr(obj, "_mmap", None)
        if mm is not None:
            try:
                mm.madvise(mmap.MADV_DONTNEED)
            except (AttributeError, OSError, ValueError):
                pass
            return
        obj = getattr(obj, "base", None)


def is_drafter_path(path: str | os.PathLike) -> bool:
    p = Path(path)
    return p.suffix.lower() == ".gguf" or p.is_dir()


def open_drafter(
    path: str | os.PathLike, *, strict: bool = False, target_layer_ids: Sequence[int] | None = None
) -> DrafterFile:
    """Open an HF drafter directory or a drafter GGUF (llama.cpp, luce or dflash-draft dialect).

    ``strict`` (the converter's mode, HF directories): an invalid config, an unknown tensor name or
    two names for one weight raise at once instead of being reported in ``spec_error`` / ``unmapped``.
    ``target_layer_ids`` (HF ids; ``--target-layer-ids``) supplies the taps of a config that lacks
    them; contradicting the config's own is an error.
    """
    p = Path(path)
    if p.is_dir():
        return _open_hf(p, strict=strict, target_layer_ids=target_layer_ids)
    if not p.exists():
        raise DFlashError(f"{p}: no such file or directory")
    return _open_gguf(p)


def _open_gguf(path: Path, parsed: GGUFFile | None = None) -> DrafterFile:
    g = open_gguf(path, strict=True) if parsed is None else parsed
    arch = str(g.get("general.architecture", ""))
    dialect = detect_dialect(arch)
    metadata = {k: kv.value for k, kv in g.kvs.items()}
    tensors: dict[str, TensorRef] = {}
    unmapped: list[str] = []
    for info in g.tensors.values():
        canonical = dialect.canonical_name(info.name) if dialect else None
        if canonical is None:
            unmapped.append(info.name)
            continue
        tensors[canonical] = TensorRef(canonical, info.name, info.shape, info.ggml_type.name, info.nbytes, info.ggml_type)
    spec: DrafterSpec | None = None
    error: str | None = None
    if dialect is None:
        error = f"general.architecture '{arch}' is not a DFlash drafter dialect (dflash, qwen35-dflash-draft, gemma4-dflash-draft, dflash-draft)"
    else:
        try:
            # a pre-merge llama.cpp file reads as the current layout (its mask id and raw taps moved)
            current = current_layout(metadata)
            spec = spec_from_gguf_metadata(current, dialect, arch, name=metadata.get("general.name"))
            spec = _fill_vocab(spec, metadata, tensors)
            if spec.n_layers > len(g.tensors):  # bounded by what the file holds, before anything sized by it
                raise DFlashError(f"metadata claims {spec.n_layers} layers but the file holds {len(g.tensors)} tensors")
        except (DFlashError, KeyError, TypeError, ValueError) as exc:
            spec = None
            error = str(exc) if isinstance(exc, DFlashError) else f"bad drafter metadata ({exc})"
    family = family_for_spec(spec) if spec is not None else None
    if spec is not None and family is not None:
        spec = family.refine_spec(spec, {c: t.shape for c, t in tensors.items()})
    return DrafterFile(
        path, "gguf", arch, dialect, spec, error, tensors, unmapped, metadata, family, variant=detect_variant(metadata), _gguf=g
    )


def check_drafter_file(path: str | os.PathLike, action: str, *, parsed: GGUFFile | None = None) -> None:
    """The checks every command runs on a drafter before it builds anything from it (one-line DFlashError naming
    the file): its metadata decodes, its weights are float or quantized, the spec rules, its tensor set.
    ``parsed``: the GGUF ``path`` already opened strictly by the caller (its header is not parsed twice — the
    vocabulary of a 248K-token drafter takes half a second); it stays open."""
    d = open_drafter(path) if parsed is None else _open_gguf(Path(path), parsed)
    try:
        spec = d.require_spec()
        problem = d.weight_type_problem()
        if problem is not None:
            raise DFlashError(f"{problem} — refusing to {action}")
        check_runnable(spec, d.tensors, d.path, action)
    finally:
        if parsed is None:
            d.close()


def _fill_vocab(spec: DrafterSpec, metadata: dict[str, Any], tensors: dict[str, TensorRef]) -> DrafterSpec:
    tokens = metadata.get("tokenizer.ggml.tokens")
    if isinstance(tokens, list) and not tokens:  # a tokenizer with no tokens: every token id is out of range
        raise DFlashError("tokenizer.ggml.tokens is an empty list — the vocabulary is lost; re-convert with --target")
    d2t = tensors.get("d2t")
    if d2t is not None and spec.draft_vocab_size is None and len(d2t.shape) == 1:
        spec = replace(spec, draft_vocab_size=d2t.shape[0])  # a reduced draft vocabulary: its row count
    if spec.vocab_size is None and isinstance(tokens, list):
        spec = replace(spec, vocab_size=len(tokens))
    return spec  # else the family may tell it from its tensors (`DrafterFamily.refine_spec`)


def with_target_layer_ids(config: dict[str, Any], ids: Sequence[int], path: str) -> dict[str, Any]:
    """``config`` with ``dflash_config.target_layer_ids`` = ``ids`` (a copy; the file is never touched)."""
    nested = config.get("dflash_config") or {}
    current = nested.get("target_layer_ids", config.get("target_layer_ids")) if isinstance(nested, dict) else None
    flag = ",".join(str(i) for i in ids)
    if current is not None and current != [int(i) for i in ids]:
        raise DFlashError(f"{path}: --target-layer-ids {flag} contradicts the config's target_layer_ids {bounds.quote(current)}")
    if not isinstance(nested, dict):
        return config  # the family names the bad dflash_config
    return {**config, "dflash_config": {**nested, "target_layer_ids": [int(i) for i in ids]}}


def _open_hf(directory: Path, *, strict: bool = False, target_layer_ids: Sequence[int] | None = None) -> DrafterFile:
    config = read_config_json(directory)
    config_path = directory / "config.json"
    if target_layer_ids is not None:
        config = with_target_layer_ids(config, target_layer_ids, str(config_path))
    spec: DrafterSpec | None = None
    error: str | None = None
    family: DrafterFamily | None = None
    try:
        family, spec = read_hf_config(config, str(config_path))
        spec = replace(spec, name=spec.name or directory.resolve().name)
    except DFlashError as exc:
        if strict:
            raise
        error = str(exc)
    ck = open_checkpoint(directory, strict=True)
    naming = family or DEFAULT_FAMILY  # names are still mapped (and reported) when the config is bad
    tensors: dict[str, TensorRef] = {}
    unmapped: list[str] = []
    dropped: list[str] = []
    for t in ck.tensors.values():
        if naming.ignores_hf_tensor(t.name):
            dropped.append(t.name)
            continue
        canonical = naming.hf_to_canonical(t.name)
        if canonical is None:
            unmapped.append(t.name)
            continue
        if strict and canonical in tensors:
            ck.close()
            raise DFlashError(f"{directory}: tensors '{tensors[canonical].name}' and '{t.name}' are the same weight")
        tensors[canonical] = TensorRef(canonical, t.name, tuple(t.shape), t.dtype, t.nbytes)
    if strict and unmapped:
        ck.close()
        shown = ", ".join(bounds.escape_name(n) for n in unmapped[:10]) + (f" (+{len(unmapped) - 10} more)" if len(unmapped) > 10 else "")
        raise DFlashError(
            f"{directory}: {len(unmapped)} tensor name(s) dflashkit does not know: {shown} — "
            "refusing to drop weights silently; this drafter variant is not supported yet"
        )
    if spec is not None and family is not None:
        spec = family.refine_spec(spec, {c: t.shape for c, t in tensors.items()})
    try:
        architecture = architecture_of(config, str(config_path))
    except DFlashError:  # already in spec_error; shown as given, one line
        architecture = bounds.quote(config.get("architectures"))
    return DrafterFile(directory, "hf", architecture, None, spec, error, tensors, unmapped, config, family, dropped, _checkpoint=ck)
