"""`dflash-convert`: an HF DFlash drafter checkpoint → a GGUF for llama.cpp (or another dialect).

Pipeline: resolve the source → validate config.json into a `DrafterSpec` → open every safetensors
header (shards, truncation) → map every tensor name (unknown names are an error, never dropped)
→ cross-check shapes against the config → check the target → plan the output types → stream
tensor by tensor into ``OUT.tmp-*`` → rename. Nothing is written before all checks pass.
"""

from __future__ import annotations

import os
import sys
from collections import deque
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from dataclasses import replace
from typing import Any, Callable, Iterable, Iterator, Sequence

import numpy as np
from gguf import GGMLQuantizationType, GGUFValueType

from ..dialects import DEFAULT_DIALECT, Dialect, encode_metadata, get_dialect, hf_canonical_name
from ..errors import DFlashError, UsageError
from ..io.gguf_writer import (
    QUANTIZATION_VERSION,
    MetadataEntry,
    TensorToWrite,
    check_output_path,
    iter_row_chunks,
    llama_tensor_order_key,
    write_gguf,
)
from ..io.safetensors_reader import SafetensorsTensor, open_checkpoint
from ..spec import DrafterSpec, load_hf_config
from ..tensors import check_tensor_set
from .source import is_gguf_path, resolve_checkpoint_dir
from .target import TargetInfo, load_target

Q = GGMLQuantizationType

#: --outtype → (llama.cpp general.file_type, ggml type of the weight matrices)
OUTTYPES: dict[str, tuple[int, GGMLQuantizationType]] = {
    "f32": (0, Q.F32),
    "f16": (1, Q.F16),
    "q8_0": (7, Q.Q8_0),
    "bf16": (32, Q.BF16),
}

CHUNK_BYTES = 4 << 20  # ~4 MB of source per chunk: temporaries stay small and cache-resident
WORKERS = max(1, min(4, os.cpu_count() or 1))
PREFETCH = WORKERS + 1
_SAFETENSORS_FLOAT = {"F32": np.float32, "F16": np.float16, "BF16": np.uint16, "F64": np.float64}


@dataclass
class PlannedTensor:
    canonical: str
    gguf_name: str
    source_name: str
    shape: tuple[int, ...]
    ggml_type: GGMLQuantizationType
    source_type: str
    note: str | None = None  # why the type differs from the requested one

    def summary(self) -> dict[str, Any]:
        return {
            "name": self.gguf_name,
            "source": self.source_name,
            "shape": list(self.shape),
            "source_type": self.source_type,
            "type": self.ggml_type.name,
            **({"note": self.note} if self.note else {}),
        }


@dataclass
class ConvertResult:
    out: Path
    dialect: str
    architecture: str
    outtype: str
    file_type: int
    bytes_written: int
    tensors: list[PlannedTensor]
    metadata: list[MetadataEntry]
    spec: DrafterSpec
    target: str | None
    warnings: list[str] = field(default_factory=list)

    def to_json(self) -> dict[str, Any]:
        types: dict[str, int] = {}
        for t in self.tensors:
            types[t.ggml_type.name] = types.get(t.ggml_type.name, 0) + 1
        return {
            "out": str(self.out),
            "dialect": self.dialect,
            "architecture": self.architecture,
            "outtype": self.outtype,
            "file_type": self.file_type,
            "bytes": self.bytes_written,
            "tensor_count": len(self.tensors),
            "tensor_types": types,
            "tensors": [t.summary() for t in self.tensors],
            "metadata": {m.key: _json_value(m) for m in self.metadata},
            "target": self.target,
            "warnings": self.warnings,
        }


def _json_value(entry: MetadataEntry) -> Any:
    v = entry.value
    if entry.type == GGUFValueType.ARRAY and isinstance(v, list) and len(v) > 16:
        return f"[{len(v)} × {entry.sub_type.name if entry.sub_type else '?'}]"
    return v


# ---------------------------------------------------------------------------------------------
# Type policy
# ---------------------------------------------------------------------------------------------


def convert_tensor_type(
    canonical: str, shape: tuple[int, ...], requested: GGMLQuantizationType
) -> tuple[GGMLQuantizationType, str | None]:
    """Output type of one tensor, the way llama.cpp's DFlash converter chooses it.

    1-D tensors and tensors whose name does not end in ``.weight`` (the DFlash 2 conv bases) stay
    F32; with q8_0, a row length (ne0) that is not a multiple of 32 falls back to F16.
    """
    if len(shape) <= 1 or not canonical.endswith(".weight"):
        return Q.F32, None
    if requested == Q.Q8_0 and shape[-1] % 32:
        return Q.F16, f"row length {shape[-1]} is not a multiple of 32: F16 instead of Q8_0"
    return requested, None


#: --outtype values that go through llama-quantize's per-tensor policy (dflashkit.quantize.policy)
QUANTIZED_OUTTYPES = {"q4_k_m": "Q4_K_M", "q4_k_s": "Q4_K_S", "q5_k_m": "Q5_K_M", "q5_k_s": "Q5_K_S", "q6_k": "Q6_K"}


def plan_tensor_types(
    tensors: Sequence[tuple[str, str, tuple[int, ...]]], outtype: str, n_layers: int
) -> tuple[int, list[tuple[GGMLQuantizationType, str | None]]]:
    """(general.file_type, [(type, note)]) for (canonical, gguf name, shape) in output order.

    f32/f16/bf16/q8_0 follow llama.cpp's converter; K-quant outtypes give exactly what converting to
    f32 and running llama-quantize (``dflash-quantize``) would give.
    """
    if outtype in QUANTIZED_OUTTYPES:
        from ..quantize.policy import choose_types, get_file_type

        ft = get_file_type(QUANTIZED_OUTTYPES[outtype])
        base = [convert_tensor_type(c, shape, Q.F32)[0] for c, _, shape in tensors]
        choices = choose_types([(name, shape, t) for (_, name, shape), t in zip(tensors, base)], ft, n_layers=n_layers)
        return ft.file_type, [(ch.new_type, ch.fallback) for ch in choices]
    file_type, requested = OUTTYPES[outtype]
    return file_type, [convert_tensor_type(c, shape, requested) for c, _, shape in tensors]


def resolve_outtype(outtype: str, tensors: dict[str, SafetensorsTensor]) -> str:
    if outtype != "auto":
        if outtype not in OUTTYPES and outtype not in QUANTIZED_OUTTYPES:
            choices = ", ".join(["auto", *OUTTYPES, *QUANTIZED_OUTTYPES])
            raise UsageError(f"unknown --outtype '{outtype}' (choose from {choices})")
        return outtype
    # like llama.cpp: f16 when the checkpoint is f16, else bf16 (the checkpoint's own 16-bit type)
    matrices = [t for t in tensors.values() if len(t.shape) >= 2]
    first = matrices[0] if matrices else next(iter(tensors.values()))
    return "f16" if first.dtype == "F16" else "bf16"


# ---------------------------------------------------------------------------------------------
# Data conversion (streamed in row chunks)
# ---------------------------------------------------------------------------------------------


def _source_dtype(t: SafetensorsTensor) -> np.dtype:
    try:
        return np.dtype(_SAFETENSORS_FLOAT[t.dtype])
    except KeyError:
        raise DFlashError(
            f"{t.file}: tensor '{t.name}' has dtype {t.dtype}; drafter weights must be F32, F16, BF16 or F64"
        ) from None


def _read_rows(t: SafetensorsTensor, fd: int, start: int, stop: int, row_elems: int, dtype: np.dtype) -> np.ndarray:
    buf = np.empty((stop - start) * row_elems, dtype=dtype)
    # pread: no shared file position, so chunks can be read from several threads
    n = os.preadv(fd, [memoryview(buf).cast("B")], t.offset + start * row_elems * dtype.itemsize)
    if n != buf.nbytes:
        raise DFlashError(f"{t.file}: tensor '{t.name}' is truncated (file ended while reading it) — re-download the checkpoint")
    return buf


def _to_float32(raw: np.ndarray, src_tag: str) -> np.ndarray:
    if src_tag == "BF16":
        bits = raw.astype(np.uint32)
        bits <<= 16  # in place: one temporary per chunk, not two
        return bits.view(np.float32)
    return raw.astype(np.float32, copy=False)


#: (safetensors dtype, output type) pairs whose bytes are copied unchanged
_SAME_BYTES = {("BF16", Q.BF16), ("F16", Q.F16), ("F32", Q.F32)}


def _convert_chunk(raw: np.ndarray, src_tag: str, out_type: GGMLQuantizationType, row_elems: int) -> np.ndarray:
    from ..quantize import quantize

    # Same-type copies keep the exact bits (bf16 NaN payloads included).
    if (src_tag, out_type) in _SAME_BYTES:
        return raw
    x = _to_float32(raw, src_tag)
    if out_type == Q.F32:
        return x
    if out_type == Q.F16:
        return x.astype(np.float16)  # IEEE round-to-nearest-even, as ggml's fp32→fp16
    return quantize(x.reshape(-1, row_elems), out_type)


def _chunk_producer(t: SafetensorsTensor, out_type: GGMLQuantizationType) -> Callable[[], Iterator[np.ndarray]]:
    dtype = _source_dtype(t)
    row_elems = t.shape[-1] if t.shape else 1
    n_rows = int(np.prod(t.shape[:-1], dtype=np.int64)) if len(t.shape) > 1 else 1

    def chunks() -> Iterator[np.ndarray]:
        fd = os.open(t.file, os.O_RDONLY)
        try:
            def work(rows: tuple[int, int]) -> np.ndarray:
                return _convert_chunk(_read_rows(t, fd, *rows, row_elems, dtype), t.dtype, out_type, row_elems)

            # Read + convert the next chunks on worker threads (numpy releases the GIL) while the
            # caller writes the current one; in-order, at most PREFETCH chunks in flight.
            with ThreadPoolExecutor(max_workers=WORKERS) as pool:
                pending: deque[Future[np.ndarray]] = deque()
                for rows in iter_row_chunks(n_rows, row_elems * dtype.itemsize, CHUNK_BYTES):
                    pending.append(pool.submit(work, rows))
                    if len(pending) > PREFETCH:
                        yield pending.popleft().result()
                while pending:
                    yield pending.popleft().result()
        finally:
            os.close(fd)

    return chunks


# ---------------------------------------------------------------------------------------------
# Planning
# ---------------------------------------------------------------------------------------------


def map_checkpoint_names(tensors: dict[str, SafetensorsTensor], source: str) -> dict[str, SafetensorsTensor]:
    """Canonical id → tensor. Unknown names are an error that lists them: never silently dropped."""
    mapped: dict[str, SafetensorsTensor] = {}
    unknown: list[str] = []
    for name, t in tensors.items():
        canonical = hf_canonical_name(name)
        if canonical is None:
            unknown.append(name)
        elif canonical in mapped:
            raise DFlashError(f"{source}: tensors '{mapped[canonical].name}' and '{name}' are the same weight")
        else:
            mapped[canonical] = t
    if unknown:
        shown = ", ".join(unknown[:10]) + (f" (+{len(unknown) - 10} more)" if len(unknown) > 10 else "")
        raise DFlashError(
            f"{source}: {len(unknown)} tensor name(s) dflashkit does not know: {shown} — "
            "refusing to drop weights silently; this drafter variant is not supported yet"
        )
    return mapped


def target_uses_mrope(target: TargetInfo) -> bool:
    """Whether the target ropes with M-RoPE sections (Qwen3.5/3.6): its config's rope parameters
    carry ``mrope_section``, or its GGUF has ``{arch}.rope.dimension_sections``."""
    if target.kind == "gguf":
        return f"{target.architecture}.rope.dimension_sections" in target.metadata
    config = target.metadata.get("text_config") or target.metadata
    rope = config.get("rope_parameters") or config.get("rope_scaling") or {}
    return isinstance(rope, dict) and "mrope_section" in rope


def spec_with_target(spec: DrafterSpec, target: TargetInfo, dialect: Dialect) -> DrafterSpec:
    """Check the drafter against its target, then fill what only the target tells: its layer
    count, its vocabulary size and (M-RoPE targets) the rope sections. Used by conversion and
    translation alike."""
    check_target_compatibility(spec, target, dialect)
    if spec.num_target_layers is None:
        spec = replace(spec, num_target_layers=target.n_layers)
    if spec.vocab_size is None:
        spec = replace(spec, vocab_size=target.vocab_size)
    if spec.rope_dimension_sections is None and target_uses_mrope(target):
        # as llama.cpp's converter: the drafter ropes on the temporal section only
        spec = replace(spec, rope_dimension_sections=(spec.head_dim // 2, 0, 0, 0))
    return spec


def check_target_compatibility(spec: DrafterSpec, target: TargetInfo, dialect: Dialect) -> None:
    """Refuse a drafter/target pair llama.cpp would mis-run or abort on."""
    if spec.hidden_size != target.hidden_size:
        raise DFlashError(
            f"{target.path}: target hidden size {target.hidden_size} ≠ drafter hidden_size {spec.hidden_size} "
            "— this drafter was trained for another target"
        )
    if spec.mask_token_id is not None and spec.mask_token_id >= target.vocab_size:
        raise DFlashError(
            f"{target.path}: drafter mask_token_id {spec.mask_token_id} is outside the target vocabulary "
            f"({target.vocab_size} tokens)"
        )
    if spec.vocab_size is not None and spec.vocab_size != target.vocab_size and spec.is_dflash2:
        raise DFlashError(
            f"{target.path}: target vocabulary {target.vocab_size} ≠ drafter vocab_size {spec.vocab_size} "
            "(the DFlash 2 selector codebooks have one row per token)"
        )
    # llama.cpp taps the hidden state entering layer id+1; that layer must exist.
    worst = max(spec.target_layer_ids)
    if worst + 1 >= target.n_layers:
        raise DFlashError(
            f"{target.path}: drafter target layer id {worst} taps layer {worst + 1} but the target has "
            f"{target.n_layers} layers (ids + 1 must be < {target.n_layers}); llama.cpp aborts on it "
            "('layer input tensor is null' / GGML_ASSERT(lid <= n_layer)) — wrong target, or wrong target_layer_ids"
        )
    if spec.num_target_layers is not None and spec.num_target_layers != target.n_layers:
        raise DFlashError(
            f"{target.path}: target has {target.n_layers} layers but the drafter config says "
            f"num_target_layers = {spec.num_target_layers} — wrong target model"
        )


def convert(
    src: str | os.PathLike,
    out: str | os.PathLike,
    *,
    outtype: str = "auto",
    target: str | os.PathLike | None = None,
    dialect: str = DEFAULT_DIALECT.name,
    num_target_layers: int | None = None,
    mask_token_id: int | None = None,
    force: bool = False,
    progress: bool = True,
    warn: Callable[[str], None] | None = None,
) -> ConvertResult:
    """Convert an HF drafter checkpoint (local dir or hub repo id) — or translate a drafter GGUF —
    to a GGUF file in ``dialect``."""
    warn = warn or (lambda msg: print(f"warning: {msg}", file=sys.stderr))
    if is_gguf_path(src):
        if outtype != "auto":
            raise UsageError(
                f"{src}: translating a GGUF copies its tensors untouched; --outtype does not apply "
                "(use dflash-quantize to change tensor types)"
            )
        from .translate import translate_gguf

        return translate_gguf(
            src, out, dialect=dialect, target=target, num_target_layers=num_target_layers,
            mask_token_id=mask_token_id, force=force, progress=progress, warn=warn,
        )
    out_path = check_output_path(out, force=force, inputs=[src] + ([target] if target else []))
    dialect_table = get_dialect(dialect)

    directory = resolve_checkpoint_dir(src)
    _, spec = load_hf_config(directory)
    spec = apply_overrides(spec, str(directory), num_target_layers=num_target_layers, mask_token_id=mask_token_id)
    checkpoint = open_checkpoint(directory, strict=True)
    mapped = map_checkpoint_names(checkpoint.tensors, str(directory))
    if spec.is_dflash2 and not dialect_table.supports_dflash2:
        raise DFlashError(f"{directory}: a DFlash 2 drafter cannot be written in the {dialect_table.name} dialect (it has no conv/selector tensors) — use --dialect llama.cpp")
    codebook = mapped.get("candidate_selector.predecessor_codebook.weight")
    if codebook is not None and spec.vocab_size is None:
        spec = replace(spec, vocab_size=codebook.shape[0])
    check_tensor_set(
        spec,
        {c: tuple(t.shape) for c, t in mapped.items()},
        source=str(directory),
        display_names={c: t.name for c, t in mapped.items()},
    )

    warnings: list[str] = []
    target_info: TargetInfo | None = None
    if target is not None:
        target_info = load_target(target)
        spec = spec_with_target(spec, target_info, dialect_table)
    else:
        warnings.append(
            f"no --target given: {out_path.name} will have no tokenizer and llama.cpp will refuse to load it "
            "(key not found in model: tokenizer.ggml.model) — re-run with --target TARGET.gguf or --target TARGET_HF_DIR"
        )

    outtype = resolve_outtype(outtype, checkpoint.tensors)
    order = ordered_canonical(mapped, dialect_table)
    shapes = [tuple(int(d) for d in mapped[c].shape) for c in order]
    file_type, types = plan_tensor_types(
        [(c, dialect_table.gguf_name(c), shape) for c, shape in zip(order, shapes)], outtype, spec.n_layers
    )
    arch = dialect_table.pick_architecture(spec)
    tokenizer = list(target_info.tokenizer.entries) if target_info and target_info.tokenizer else []
    metadata = build_metadata(spec, dialect_table, arch, file_type=file_type, tokenizer=tokenizer)

    plan: list[PlannedTensor] = []
    sources: list[SafetensorsTensor] = []
    for canonical, shape, (ggml_type, note) in zip(order, shapes, types):
        t = mapped[canonical]
        plan.append(PlannedTensor(canonical, dialect_table.gguf_name(canonical), t.name, shape, ggml_type, t.dtype, note))
        sources.append(t)
    for p in plan:
        if p.note:
            warnings.append(f"{p.gguf_name}: {p.note}")

    for w in warnings:
        warn(w)
    size = write_gguf(
        out_path,
        arch,
        metadata,
        [TensorToWrite(p.gguf_name, p.shape, p.ggml_type, _chunk_producer(t, p.ggml_type),
                       (t.file, t.offset) if (t.dtype, p.ggml_type) in _SAME_BYTES else None)  # kernel copy
         for p, t in zip(plan, sources)],
        force=force,
        progress=progress,
    )
    return ConvertResult(
        out=out_path,
        dialect=dialect_table.name,
        architecture=arch,
        outtype=outtype,
        file_type=file_type,
        bytes_written=size,
        tensors=plan,
        metadata=metadata,
        spec=spec,
        target=str(target) if target is not None else None,
        warnings=warnings,
    )


def build_metadata(
    spec: DrafterSpec,
    dialect: Dialect,
    arch: str,
    *,
    file_type: int,
    tokenizer: Sequence[MetadataEntry] = (),
) -> list[MetadataEntry]:
    """general.name, the dialect's drafter keys, the tokenizer, then general.quantization_version and
    general.file_type last — the order llama-quantize leaves them in, so a one-pass conversion, a
    translation and a conversion + quantization of the same drafter are byte-identical."""
    entries = [MetadataEntry("general.name", spec.name or "DFlash drafter", GGUFValueType.STRING)]
    entries.extend(encode_metadata(spec, dialect, arch))
    own = {e.key for e in entries} | {"general.file_type", "general.quantization_version"}
    # the drafter's own keys (e.g. tokenizer.ggml.mask_token_id) win over the target's
    entries.extend(MetadataEntry(e.key, e.value, e.type, e.sub_type) for e in tokenizer if e.key not in own)
    entries.append(MetadataEntry("general.quantization_version", QUANTIZATION_VERSION, GGUFValueType.UINT32))
    entries.append(MetadataEntry("general.file_type", file_type, GGUFValueType.UINT32))
    return entries


def apply_overrides(
    spec: DrafterSpec,
    source: str,
    *,
    num_target_layers: int | None = None,
    mask_token_id: int | None = None,
) -> DrafterSpec:
    """Fill values the source lacks from explicit flags; a flag contradicting the source is an error."""
    for field_name, flag, value in (
        ("num_target_layers", "--num-target-layers", num_target_layers),
        ("mask_token_id", "--mask-token-id", mask_token_id),
    ):
        if value is None:
            continue
        current = getattr(spec, field_name)
        if current is not None and current != value:
            raise DFlashError(f"{source}: {flag} {value} contradicts the source's {field_name} = {current}")
        spec = replace(spec, **{field_name: value})
    return spec


def ordered_canonical(names: Iterable[str], dialect: Dialect) -> list[str]:
    """Canonical ids in output order: llama.cpp's loader order of their names in ``dialect``."""
    return sorted(names, key=lambda c: llama_tensor_order_key(dialect.gguf_name(c)))
