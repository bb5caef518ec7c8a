"""`dflash-convert`: an HF DFlash drafter checkpoint → a GGUF for llama.cpp (or another dialect).

Pipeline: resolve the source → open it with `dflashkit.drafters.open_drafter` (its family
validates config.json into a `DrafterSpec`, every safetensors header is opened, every tensor name
mapped: unknown names are an error, never dropped) → the shared checks of `converters.plan` (spec,
tensor set, target) → plan the output types → stream tensor by tensor into ``OUT.tmp-*`` → rename.
Nothing is written before all checks pass. A GGUF source goes to `translate.translate_gguf`.
"""

from __future__ import annotations

import math
import os
import sys
from collections import deque
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import replace
from pathlib import Path
from typing import Any, Callable, Iterator, Sequence

import numpy as np
from gguf import GGMLQuantizationType

from ..bounds import escape_name
from ..dialects import DEFAULT_DIALECT, Dialect, family_dialect, get_dialect
from ..drafters import DrafterFile, open_drafter, weight_dtype_message
from ..errors import DFlashError, UsageError
from ..files import signals_deferred
from ..filetypes import CONVERT_OUTTYPES, CONVERT_POLICY_OUTTYPES, outtype_file_type
from ..io.gguf_writer import (TensorToWrite, check_output_path, ggml_n_dims_shape, iter_row_chunks,
    llama_tensor_order_key, write_gguf)
from ..io.copy import prefetch
from ..io.safetensors_reader import SafetensorsTensor
from ..spec import DrafterSpec
from ..target_rules import GEMMA_SCALE_RULE, gemma_embedding_scale
from .. import codecs  # through the module: tests swap its kernels
from ..codecs.values import StoredScan, ValueCounts
from ..quantize.policy import choose_types, get_file_type
from .plan import ConvertResult, PlannedTensor, build_metadata, converter_layout, ordered_canonical, validate
from .general import Provenance, general_metadata, resolve_provenance
from .causal_flag import decide_causal_flag, divergence_warnings
from .mask_embedding import MASK_EMBEDDING_FILE, mask_embedding_tensors
from .source import is_gguf_path, resolve_checkpoint_dir
from .target import TargetInfo
from .tokenizer import llama_add_space_prefix
from .translate import translate_gguf

Q = GGMLQuantizationType

#: --outtype → (llama.cpp general.file_type, ggml type of the weight matrices), from `dflashkit.filetypes`
OUTTYPES: dict[str, tuple[int, GGMLQuantizationType]] = {
    o: (outtype_file_type(o).file_type, outtype_file_type(o).default_type) for o in CONVERT_OUTTYPES
}

CHUNK_BYTES = 4 << 20  # ~4 MB of source per chunk: temporaries stay small and cache-resident
WORKERS = max(1, min(4, os.cpu_count() or 1))
PREFETCH = WORKERS + 1
_SAFETENSORS_FLOAT = {"F32": np.float32, "F16": np.float16, "BF16": np.uint16, "F64": np.float64}


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
QUANTIZED_OUTTYPES = {o: outtype_file_type(o).name for o in CONVERT_POLICY_OUTTYPES}


def plan_tensor_types(
    tensors: Sequence[tuple[str, str, tuple[int, ...]]], outtype: str, n_layers: int, n_gqa: int = 0
) -> tuple[int, list[tuple[GGMLQuantizationType, str | None]]]:
    """(general.file_type, [(type, note)]) for (canonical, gguf name, shape) in output order.

    f32/f16/bf16/q8_0 follow llama.cpp's converter; K-quant outtypes give exactly what converting to
    f32 and running llama-quantize (``dflash-quantize``) would give.
    """
    if outtype in QUANTIZED_OUTTYPES:
        ft = get_file_type(QUANTIZED_OUTTYPES[outtype])
        base = [convert_tensor_type(c, shape, Q.F32)[0] for c, _, shape in tensors]
        choices = choose_types([(name, shape, t) for (_, name, shape), t in zip(tensors, base)], ft, n_layers=n_layers,
                               n_gqa=n_gqa)
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
        raise DFlashError(weight_dtype_message(t.file, t.name, t.dtype, "checkpoint")) from None


def _read_rows(t: SafetensorsTensor, fd: int, start: int, stop: int, row_elems: int, dtype: np.dtype) -> np.ndarray:
    buf = np.empty((stop - start) * row_elems, dtype=dtype)
    # pread: no shared file position, so chunks can be read from several threads
    n = os.preadv(fd, [memoryview(buf).cast("B")], t.offset + start * row_elems * dtype.itemsize)
    if n != buf.nbytes:
        raise DFlashError(f"{t.file}: tensor '{escape_name(t.name)}' is truncated (file ended while reading it) — re-download the checkpoint")
    return buf


#: (safetensors dtype, output type) pairs whose bytes are copied unchanged
_SAME_BYTES = {("BF16", Q.BF16), ("F16", Q.F16), ("F32", Q.F32)}


#: bf16 → f16 values in a job above which the numba kernel (one pass, ~1.5 G values/s per thread) beats numpy's
#: two passes (~0.1 G values/s) despite loading numba (~0.4 s, started in the background: `preload_bf16_to_f16`)
FAST_F16_MIN_VALUES = 1 << 25


def _convert_chunk(raw: np.ndarray, src_tag: str, out_type: GGMLQuantizationType, row_elems: int,
                   fast_f16: bool = False, counts: ValueCounts | None = None, name: str = "") -> np.ndarray:

    # Same-type copies keep the exact bits (bf16 NaN payloads included).
    if (src_tag, out_type) in _SAME_BYTES:
        return raw
    if fast_f16 and src_tag == "BF16" and out_type == Q.F16:  # the same bits as numpy's astype below
        out = codecs.bf16_bits_to_f16_bits(raw, threads=1).view(np.float16)
        if counts is not None:
            counts.add_bf16_to_f16(name, raw)
        return out
    x = codecs.to_float32(raw, src_tag, copy=False)
    bad_input = counts.add(name, x, to_f16=out_type == Q.F16, to_bf16=out_type == Q.BF16) \
        if counts is not None else 1
    if out_type == Q.F32:
        return x
    if out_type == Q.F16:
        with np.errstate(over="ignore"):  # counted and named above (ValueCounts), not numpy's RuntimeWarning
            return x.astype(np.float16)  # IEEE round-to-nearest-even, as ggml's fp32→fp16
    out = codecs.quantize(x.reshape(-1, row_elems), out_type)
    if counts is not None and not bad_input:  # scales that overflow F16 from finite values (--strict refuses them)
        counts.add_blocks(name, out, out_type.name)
    return out


def _chunk_producer(t: SafetensorsTensor, out_type: GGMLQuantizationType, fast_f16: bool = False,
                    counts: ValueCounts | None = None) -> Callable[[], Iterator[np.ndarray]]:
    dtype = _source_dtype(t)
    row_elems = t.shape[-1] if t.shape else 1
    n_rows = int(np.prod(t.shape[:-1], dtype=np.int64)) if len(t.shape) > 1 else 1

    def chunks() -> Iterator[np.ndarray]:
        fd = os.open(t.file, os.O_RDONLY)
        try:
            def work(rows: tuple[int, int]) -> np.ndarray:
                return _convert_chunk(_read_rows(t, fd, *rows, row_elems, dtype), t.dtype, out_type, row_elems, fast_f16,
                                      counts, t.name)

            ranges = list(iter_row_chunks(n_rows, row_elems * dtype.itemsize, CHUNK_BYTES))
            if len(ranges) == 1:  # a norm, a bias: nothing to overlap, and a pool's thread costs ~1 ms to start
                yield work(ranges[0])
                return
            # Read + convert the next chunks on worker threads (numpy releases the GIL) while the
            # caller writes the current one; in-order, at most PREFETCH chunks in flight.
            with ThreadPoolExecutor(max_workers=WORKERS) as pool:
                pending: deque[Future[np.ndarray]] = deque()
                try:
                    for rows in ranges:
                        with signals_deferred():  # see files.signals_deferred: submit must not be split
                            pending.append(pool.submit(work, rows))
                        if len(pending) > PREFETCH:
                            yield pending.popleft().result()
                    while pending:
                        yield pending.popleft().result()
                finally:  # Ctrl-C or an error: chunks not started are dropped, not read (exit waits for none)
                    for f in pending:
                        f.cancel()
        finally:
            os.close(fd)

    return chunks


def _ids_producer(array: np.ndarray) -> Callable[[], Iterator[np.ndarray]]:
    """An in-memory integer tensor (DSpark's d2t, I64) written as is."""

    def chunks() -> Iterator[np.ndarray]:
        yield np.ascontiguousarray(array)

    return chunks


def _rewritten_producer(
    drafter: DrafterFile, spec: DrafterSpec, canonical: str, t: SafetensorsTensor, out_type: GGMLQuantizationType,
    counts: ValueCounts | None = None,
) -> Callable[[], Iterator[np.ndarray]]:
    """A tensor whose data the family rewrites (`DrafterFamily.sanitize_for`, e.g. the NeoX permutation
    of an interleaved-RoPE q/k): read whole, rewritten in its stored dtype (only data moves, so
    converting afterwards gives llama.cpp's bytes), then converted in row chunks."""
    family = drafter.family
    assert family is not None

    def chunks() -> Iterator[np.ndarray]:
        data = family.sanitize_for(spec, canonical, np.array(drafter.read_raw(canonical)))
        yield from _array_producer(data, t.dtype, out_type, counts, t.name)()

    return chunks


def _array_producer(data: np.ndarray, tag: str, out_type: GGMLQuantizationType, counts: ValueCounts | None = None,
                    name: str = "") -> Callable[[], Iterator[np.ndarray]]:
    """An in-memory tensor (stored dtype ``tag``; BF16 as uint16) converted in row chunks."""
    row_elems = data.shape[-1] if data.shape else 1

    def chunks() -> Iterator[np.ndarray]:
        rows = data.reshape(-1, row_elems)
        for start, stop in iter_row_chunks(rows.shape[0], row_elems * data.dtype.itemsize, CHUNK_BYTES):
            yield _convert_chunk(rows[start:stop].reshape(-1), tag, out_type, row_elems, counts=counts, name=name)

    return chunks


def convert(
    src: str | os.PathLike,
    out: str | os.PathLike,
    *,
    outtype: str = "auto",
    target: str | os.PathLike | None = None,
    dialect: str = DEFAULT_DIALECT.name,
    num_target_layers: int | None = None,
    mask_token_id: int | None = None,
    taps_are_raw: bool = False,
    target_layer_ids: Sequence[int] | None = None,
    source_repo: str | None = None,
    source_revision: str | None = None,
    force: bool = False,
    progress: bool = True,
    warn: Callable[[str], None] | None = None,
    strict: bool = False,
    embedding_scale: float | None = None,
    llama_cpp_causal: bool | None = None,
) -> ConvertResult:
    """Convert an HF drafter checkpoint (local dir or hub repo id) — or translate a drafter GGUF —
    to a GGUF file in ``dialect``.

    NaN / inf values and values beyond F16 in the tensors it converts are warned about with their names
    (`codecs.values`; a tensor copied byte for byte, as in a translation, keeps its values and is not read);
    ``strict`` refuses them instead (nothing is written).

    ``target_layer_ids`` (HF decoder-layer ids) supplies the taps of a config without them;
    ``source_repo`` / ``source_revision`` record where a local checkpoint came from (a hub download
    knows it from its cache path) in gguf-py's ``general.source.*`` keys.

    ``embedding_scale`` sets ``{arch}.embedding_scale`` (the drafter's noise-embedding multiplier) whatever the
    config and the target say; without it, a DFlash drafter whose target is a Gemma model and whose config gives
    no ``input_embedding_scale`` gets √hidden_size, as mainline llama.cpp writes it (`target_rules.GEMMA_SCALE_RULE`),
    and a warning says so. ``llama_cpp_causal`` sets llama.cpp's one causal flag (`causal_flag`)."""
    warn = warn or (lambda msg: print(f"warning: {msg}", file=sys.stderr))
    if is_gguf_path(src):
        if source_repo is not None or source_revision is not None:
            raise UsageError(f"{src}: --source-repo / --source-revision describe an HF checkpoint; a GGUF keeps its own general.* keys")
        if embedding_scale is not None:
            raise UsageError(f"{src}: --embedding-scale applies when converting a checkpoint; a GGUF keeps its "
                             "own keys")
        if llama_cpp_causal is not None:
            raise UsageError(f"{src}: --llama-cpp-causal applies when converting a checkpoint; a GGUF keeps its own keys")
        if outtype != "auto":
            raise UsageError(
                f"{src}: translating a GGUF copies its tensors untouched; --outtype does not apply "
                "(use dflash-quantize to change tensor types)"
            )
        return translate_gguf(
            src, out, dialect=dialect, target=target, num_target_layers=num_target_layers,
            mask_token_id=mask_token_id, target_layer_ids=target_layer_ids, taps_are_raw=taps_are_raw,
            force=force, progress=progress, warn=warn, strict=strict,
        )
    if taps_are_raw:
        raise UsageError(f"{src}: --taps-are-raw applies to a GGUF source (an HF config's target_layer_ids are HF ids)")
    out_path = check_output_path(out, force=force, inputs=[src] + ([target] if target else []))
    dialect_table = get_dialect(dialect)

    if Path(src).exists():
        directory = resolve_checkpoint_dir(src)
        provenance = resolve_provenance(directory, source_repo=source_repo, source_revision=source_revision)
    else:  # a hub repo id: --source-revision picks the revision to fetch, the cache path tells the commit
        directory = resolve_checkpoint_dir(src, revision=source_revision)
        provenance = resolve_provenance(directory, source_repo=source_repo)
    # one reader for every drafter form: config → spec through its family, names → canonical ids
    with open_drafter(directory, strict=True, target_layer_ids=target_layer_ids) as drafter:
        return _convert_checkpoint(
            drafter, directory, out_path, outtype=outtype, target=target, dialect_table=dialect_table,
            num_target_layers=num_target_layers, mask_token_id=mask_token_id, provenance=provenance,
            force=force, progress=progress, warn=warn, strict=strict, embedding_scale=embedding_scale,
            llama_cpp_causal=llama_cpp_causal,
        )


def _embedding_scale(spec: DrafterSpec, family: Any, target: TargetInfo | None, override: float | None,
                     source: Path) -> tuple[DrafterSpec, str | None]:
    """The spec with its embedding scale decided (the override, else the Gemma-target rule), and the note that
    says which rule applied (None when the config decided)."""
    if override is not None:
        if not math.isfinite(override) or override <= 0:
            raise UsageError(f"--embedding-scale {override}: give a positive number (1 = no scaling)")
        was = "none" if spec.embedding_scale is None else f"{spec.embedding_scale:g}"
        return replace(spec, embedding_scale=float(override)), (
            f"{source}: dflash.embedding_scale = {override:g} from --embedding-scale (the config and the target "
            f"gave {was})")
    if spec.embedding_scale is not None or target is None or not family.gemma_target_embedding_scale:
        return spec, None
    scale = gemma_embedding_scale(target.architecture, target.hidden_size)
    if scale is None:
        return spec, None
    return replace(spec, embedding_scale=scale), (
        f"{source}: dflash.embedding_scale = {scale:g} (√{target.hidden_size}): the target {target.architecture} is a "
        f"Gemma model and the config gives no input_embedding_scale; {GEMMA_SCALE_RULE} — pass --embedding-scale 1 "
        "for a drafter trained on unscaled embeddings")


def _convert_checkpoint(
    drafter: DrafterFile,
    directory: Path,
    out_path: Path,
    *,
    outtype: str,
    target: str | os.PathLike | None,
    dialect_table: Dialect,
    num_target_layers: int | None,
    mask_token_id: int | None,
    provenance: Provenance,
    force: bool,
    progress: bool,
    warn: Callable[[str], None],
    strict: bool = False,
    embedding_scale: float | None = None,
    llama_cpp_causal: bool | None = None,
) -> ConvertResult:
    family = drafter.family
    assert family is not None
    dialect_table = family_dialect(family, dialect_table, str(directory))
    mapped = {c: drafter.source_tensor(c) for c in drafter.tensors}
    prefetch(sorted({t.file for t in mapped.values()}))  # shard reads overlap the target/tokenizer work
    fast_f16 = (resolve_outtype(outtype, mapped) == "f16"
                and sum(t.n_elements for t in mapped.values() if t.dtype == "BF16") >= FAST_F16_MIN_VALUES)
    if fast_f16:
        codecs.preload_bf16_to_f16()  # numba loads while the checks run and the target's tokenizer is read
    checked = validate(
        drafter.require_spec(), source=str(directory), dialect=dialect_table,
        shapes={c: tuple(t.shape) for c, t in mapped.items()}, display={c: t.name for c, t in mapped.items()},
        overrides={"num_target_layers": num_target_layers, "mask_token_id": mask_token_id}, target=target,
        family=family, read_raw=drafter.read_raw, mask_source=str(directory / "config.json"),
        hint=" — use --dialect llama.cpp",
    )
    spec, target_info, finals = checked.spec, checked.target, checked.finals
    spec, scale_note = _embedding_scale(spec, family, target_info, embedding_scale, directory)
    checkpoint_spec = spec  # the reference's reading, before llama.cpp's flag is chosen
    spec, causal_note = decide_causal_flag(spec, family, drafter.metadata, one_causal_flag=dialect_table.one_causal_flag,
                                           choice=llama_cpp_causal, strict=strict, source=str(directory / "config.json"))
    # family-level tensor changes (DSpark / Gemma-4 DSpark): tensors llama.cpp's converter drops,
    # rewrites and writes last (d2t → absolute I64 ids, `finals`), or generates and writes first (rope_freqs)
    family_generated = family.generated_tensors(spec)
    dropped = family.dropped_on_convert(spec)
    mapped = {c: t for c, t in mapped.items() if c not in dropped and c not in finals}

    warnings: list[str] = [n for n in (scale_note, causal_note) if n]
    warnings += divergence_warnings(checkpoint_spec, drafter.metadata, one_causal_flag=dialect_table.one_causal_flag,
                                    strict=strict, source=str(directory / "config.json"), family=family)
    if target is None:
        warnings.append(
            f"no --target given: {out_path.name} will have no tokenizer and llama.cpp will refuse to load it "
            "(key not found in model: tokenizer.ggml.model) — re-run with --target TARGET.gguf or --target TARGET_HF_DIR"
        )

    outtype = resolve_outtype(outtype, mapped)
    # tensors llama.cpp's converter generates (MiMo's mask_embedding.pt): written first
    extra = mask_embedding_tensors(directory, spec, mapped, target, drafter.read_raw)
    generated, replaced = extra if extra is not None else ([], [])
    for canonical in replaced:
        mapped.pop(canonical)
    order = ordered_canonical(
        mapped, dialect_table, file_type=outtype_file_type(outtype).file_type,
        source_order=lambda c: (Path(mapped[c].file).name, mapped[c].name),
    )
    if not converter_layout(outtype_file_type(outtype).file_type):  # llama-quantize's loader order for all
        order = ordered_canonical([*order, *(g.canonical for g in generated)], dialect_table, file_type=outtype_file_type(outtype).file_type)
    else:
        order = [g.canonical for g in generated] + order
    made = {g.canonical: g for g in generated}
    shapes = [tuple(int(d) for d in (made[c].shape if c in made else mapped[c].shape)) for c in order]
    file_type, types = plan_tensor_types(
        [(c, dialect_table.gguf_name(c), shape) for c, shape in zip(order, shapes)], outtype, spec.n_layers,
        n_gqa=spec.n_heads // spec.n_kv_heads if spec.n_kv_heads else 0,
    )
    arch = dialect_table.pick_architecture(spec)
    tokenizer = list(target_info.tokenizer.entries) if target_info and target_info.tokenizer else []
    if tokenizer and family.llama_vocab and target_info is not None and target_info.kind == "hf":
        tokenizer = llama_add_space_prefix(target_info.path) + tokenizer
    general = general_metadata(
        directory, [(dialect_table.gguf_name(c), shape) for c, shape in zip(order, shapes)], provenance=provenance
    )
    metadata = build_metadata(spec, family, dialect_table, arch, file_type=file_type, tokenizer=tokenizer,
                              general=general)

    counts = ValueCounts(str(directory), strict)
    plan: list[PlannedTensor] = []
    producers: list[Callable[[], Iterator[np.ndarray]]] = []
    # kernel copies (TensorToWrite.source): only a checkpoint tensor written with its stored bytes
    # unchanged — never one the family rewrites, generates or re-types (d2t), never a re-shaped one
    copies: list[tuple[Path, int] | None] = []

    def copy_of(t: SafetensorsTensor, ggml_type: GGMLQuantizationType) -> tuple[Path, int] | None:
        return (Path(t.file), t.offset) if (t.dtype, ggml_type) in _SAME_BYTES and t.nbytes else None
    for canonical, array in family_generated.items():  # written first, as llama.cpp's generate_extra_tensors
        ggml_type, note = convert_tensor_type(canonical, array.shape, OUTTYPES.get(outtype, (0, Q.F32))[1])
        plan.append(PlannedTensor(canonical, dialect_table.gguf_name(canonical), "(generated)", array.shape, ggml_type, "F32", note))
        producers.append(_array_producer(array, "F32", ggml_type))
        copies.append(None)
    for canonical, shape, (ggml_type, note) in zip(order, shapes, types):
        g = made.get(canonical)
        if g is not None:
            source_name = g.source.name if g.source is not None else MASK_EMBEDDING_FILE
            plan.append(PlannedTensor(canonical, dialect_table.gguf_name(canonical), source_name, shape, ggml_type, g.dtype, note))
            producers.append(
                _chunk_producer(g.source, ggml_type, counts=counts) if g.source is not None
                else _array_producer(g.data, g.dtype, ggml_type, counts, g.canonical)  # type: ignore[arg-type]
            )
            copies.append(copy_of(g.source, ggml_type) if g.source is not None else None)
            continue
        t = mapped[canonical]
        plan.append(PlannedTensor(canonical, dialect_table.gguf_name(canonical), t.name, shape, ggml_type, t.dtype, note))
        rewritten = family.rewrites(spec, canonical)
        producers.append(
            _rewritten_producer(drafter, spec, canonical, t, ggml_type, counts) if rewritten
            else _chunk_producer(t, ggml_type, fast_f16, counts)
        )
        copies.append(None if rewritten else copy_of(t, ggml_type))
    for canonical, (array, ggml_type) in finals.items():  # written last, as llama.cpp's prepare_tensors
        stored = drafter.tensors[canonical]
        plan.append(PlannedTensor(canonical, dialect_table.gguf_name(canonical), stored.name, array.shape, ggml_type, stored.type_name))
        producers.append(_ids_producer(array))
        copies.append(None)
    if not converter_layout(file_type):
        # what llama-quantize writes: its loader order (the family's generated and rewritten tensors
        # included) and ggml_n_dims shapes
        # (ggml_n_dims_shape only drops leading 1-dims of the header: the bytes, and so a kernel copy, are unchanged)
        triples = sorted(zip(plan, producers, copies), key=lambda pp: llama_tensor_order_key(pp[0].gguf_name))
        plan = [replace(p, shape=ggml_n_dims_shape(p.shape)) for p, _, _ in triples]
        producers, copies = [q for _, q, _ in triples], [c for _, _, c in triples]
    for p in plan:
        if p.note:
            warnings.append(f"{p.gguf_name}: {p.note}")

    for w in warnings:
        warn(w)
    tensors = [TensorToWrite(p.gguf_name, p.shape, p.ggml_type, producer, copy)
               for p, producer, copy in zip(plan, producers, copies)]
    copied = StoredScan(counts, [(p.source_name, t.source[0], t.source[1], t.nbytes, p.source_type)
                                 for p, t in zip(plan, tensors) if t.source is not None])
    try:
        size = write_gguf(out_path, arch, metadata, tensors, force=force, progress=progress,
                          before_publish=copied.finish)
    finally:
        copied.cancel()
    for w in counts.warnings([p.source_name for p in plan]):  # known once every chunk was counted, copies too
        warn(w)
        warnings.append(w)
    return ConvertResult(out_path, dialect_table.name, arch, outtype, file_type, size, plan, metadata, spec,
                         str(target) if target is not None else None, warnings)
