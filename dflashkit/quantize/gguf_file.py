"""`dflash-quantize`: an f32/f16/bf16 GGUF -> a quantized GGUF, tensor types as llama-quantize picks them.

Flow (as llama_model_quantize_impl): read the header with the hardened reader, choose every tensor's type
with :mod:`dflashkit.quantize.policy`, refuse what cannot be done (requantizing without permission, a
fallback under ``--no-fallback``) before anything is written, then stream each tensor in row chunks through
the bit-exact quantizers (:mod:`dflashkit.codecs`) into an atomic output (:mod:`dflashkit.files`). A tensor whose type does not
change is copied byte for byte. Data llama-quantize refuses (NaN / ±inf read or made) is refused before publishing. Metadata is copied in order with ``general.file_type`` (and
``general.quantization_version``) updated.
"""

from __future__ import annotations

import mmap
import os
import re
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterator, Sequence

import numpy as np
from gguf import GGMLQuantizationType, GGUFValueType

from dflashkit.dialects import detect_dialect
from dflashkit.drafters import check_drafter_file
from dflashkit.bounds import escape_name
from dflashkit.errors import DFlashError, UsageError
from dflashkit.quant_types import type_size
from dflashkit.io.gguf_reader import DEFAULT_ALIGNMENT, GGUFFile, TensorInfo, open_gguf
from dflashkit.io.gguf_writer import (QUANTIZATION_VERSION, MetadataEntry, TensorToWrite, check_output_path,
    ggml_n_dims_shape, iter_row_chunks, llama_tensor_order_key, write_gguf)

from dflashkit.codecs import (QUANT_TYPES, f16_path_types, preload_quantizers, quantize, quantize_f16_rows,
                              tensor_nbytes, to_float32)
from dflashkit.codecs.values import StoredScan, ValueCounts
from .imatrix_read import ImportanceMatrix, load_imatrix
from .imatrix_apply import check_imatrix, gqa_of, requires_imatrix
from .policy import FileType, TypeChoice, choose_types, get_file_type, get_preset, is_quantized, normalize_overrides

Q = GGMLQuantizationType
_FLOAT_TYPES = (Q.F32, Q.F16, Q.BF16)
# llama_model_quantize_impl drops these (a quantized file is always written as one file)
_SPLIT_KEYS = ("split.no", "split.count", "split.tensors.count")
#: why each count of `ValueCounts` is refused, in llama-quantize's words: it validates every tensor it reads
#: (ggml_validate_row_data on the input type: F32/F16/BF16 values, block scales) and every row it converts
_REFUSED = {
    "nonfinite": 'llama-quantize refuses it too ("has invalid data"): fix the source',
    "f16_overflow": 'they become ±inf in F16, which llama-quantize refuses ("quantized data validation failed"): '
                    "quantize to bf16",
    "bf16_overflow": 'llama-quantize refuses it too ("quantized data validation failed"): fix the source',
    "scale_overflow": 'llama-quantize refuses it too ("quantized data validation failed"): keep this tensor in '
                      "bf16 (--tensor-type '{name}=bf16')",
}


@dataclass
class QuantizeResult:
    src: Path
    out: Path
    file_type: FileType
    architecture: str
    bytes_written: int
    choices: list[TypeChoice]
    bytes_in: dict[str, int]  # tensor name -> input bytes
    bytes_out: dict[str, int]  # tensor name -> output bytes
    warnings: list[str] = field(default_factory=list)

    @property
    def fallbacks(self) -> list[TypeChoice]:
        return [c for c in self.choices if c.fallback]

    def tensor_types(self) -> dict[str, int]:
        types: dict[str, int] = {}
        for c in self.choices:
            types[c.new_type.name] = types.get(c.new_type.name, 0) + 1
        return dict(sorted(types.items()))

    def to_json(self) -> dict[str, Any]:
        total_in, total_out = sum(self.bytes_in.values()), sum(self.bytes_out.values())
        n_weights = sum(int(np.prod(c.shape, dtype=np.int64)) for c in self.choices)
        return {
            "src": str(self.src),
            "out": str(self.out),
            "architecture": self.architecture,
            "file_type": self.file_type.name,
            "file_type_id": self.file_type.file_type,
            "bytes": self.bytes_written,
            "tensor_count": len(self.choices),
            "tensor_types": self.tensor_types(),
            "tensors": [
                {
                    "name": c.name,
                    "shape": list(c.shape),
                    "old_type": c.old_type.name,
                    "new_type": c.new_type.name,
                    "bytes": self.bytes_out[c.name],
                    **({"reason": c.reason} if c.reason else {}),
                    **({"fallback": c.fallback} if c.fallback else {}),
                }
                for c in self.choices
            ],
            "fallbacks": [
                {
                    "name": c.name,
                    "row_length": c.shape[-1],
                    "wanted": c.fallback_from.name if c.fallback_from else None,
                    "new_type": c.new_type.name,
                    "message": c.fallback,
                }
                for c in self.fallbacks
            ],
            "totals": {
                "tensor_bytes_in": total_in,
                "tensor_bytes_out": total_out,
                "bits_per_weight": round(total_out * 8 / n_weights, 3) if n_weights else None,
            },
            "warnings": self.warnings,
        }


def _can_dequantize(t: GGMLQuantizationType) -> bool:
    if t in QUANT_TYPES:
        return True
    import gguf.quants

    try:
        gguf.quants.dequantize(np.zeros(type_size(t), dtype=np.uint8), t)
    except (NotImplementedError, KeyError, ValueError):
        return False
    return True


def _producer(gguf_file: GGUFFile, info: TensorInfo, new_type: GGMLQuantizationType, counts: ValueCounts,
              weights: np.ndarray | None = None, from_f16: frozenset[GGMLQuantizationType] = frozenset(),
              ) -> Callable[[], Iterator[np.ndarray]]:
    """Chunks of the output tensor: the raw bytes when the type is kept, else rows dequantized and requantized
    (F16 rows to a type of ``from_f16`` through `quantize_f16_rows`)."""
    ne0 = info.dims[0] if info.dims else 1
    n_rows = info.n_elements // ne0 if ne0 else 0
    src_row = tensor_nbytes(info.ggml_type, (ne0,))
    same = info.ggml_type == new_type
    # F16 rows to a block type: decoded and quantized together on every thread, a cache-sized run at a time
    fused_f16 = info.ggml_type == GGMLQuantizationType.F16 and new_type in from_f16

    def chunks() -> Iterator[np.ndarray]:
        gguf_file.raw(info.name)  # validates the tensor lies inside the file
        ranges = list(iter_row_chunks(n_rows, max(src_row, ne0 * 4)))  # by the float32 working size
        if not ranges:
            return
        # Chunks are numpy views of a map of the file: no copy through a read buffer (a pread
        # of every chunk cost a quarter of a Q8_0 run). Each chunk's pages leave our resident set once it
        # is quantized (MADV_DONTNEED; the page cache keeps them), so the peak stays about one chunk, and
        # the next chunk is read ahead (MADV_WILLNEED) while this one is quantized. The file's size is
        # checked before each chunk (one line, exit 1); a file truncated by another process in the middle
        # of a chunk still ends the run with SIGBUS, as it would any mapped reader (llama.cpp's loader too).
        f = open(gguf_file.path, "rb")  # noqa: SIM115 - closed in the finally below, with the map
        # A private map (copy-on-write, never written): its views are writable to numpy, so the numba
        # kernels see the array type their preload compiled. A read-only view is another specialization,
        # compiled (seconds) on first use; its preloaded twin, compiling on a daemon thread, was then cut
        # off at exit and never cached, so every run compiled it again.
        mm = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_COPY)
        try:
            for i, (a, b) in enumerate(ranges):
                first, n = info.offset + a * src_row, (b - a) * src_row
                if min(len(mm), os.fstat(f.fileno()).st_size) < first + n:
                    raise DFlashError(f"{gguf_file.path}: tensor '{info.name}' is truncated (file shrank while reading it)")
                if i + 1 < len(ranges):
                    _advise(mm, "MADV_WILLNEED", first + n, (ranges[i + 1][1] - ranges[i + 1][0]) * src_row)
                part = np.frombuffer(mm, np.uint8, count=n, offset=first)
                try:
                    # a kept type is copied (no view may outlive the map); every conversion makes new arrays
                    if same:
                        out = part.copy()
                    elif fused_f16:
                        out, bad_input = quantize_f16_rows(part.reshape(-1, src_row), new_type, imatrix=weights)
                        counts.record(info.name, bad_input, 0)
                        if not bad_input:  # scales that overflow F16 from finite values (--strict refuses them)
                            counts.add_blocks(info.name, out, new_type.name)
                    else:
                        x = to_float32(part.reshape(-1, src_row), info.ggml_type, copy=False)
                        bad_input = counts.add(info.name, x, to_f16=new_type == GGMLQuantizationType.F16,
                                               to_bf16=new_type == GGMLQuantizationType.BF16)
                        out = quantize(x, new_type, imatrix=weights)
                        if not bad_input:  # scales that overflow F16 from finite values (--strict refuses them)
                            counts.add_blocks(info.name, out, new_type.name)
                        del x
                finally:
                    del part
                yield out
                _advise(mm, "MADV_DONTNEED", first, n)
        finally:
            f.close()
            try:
                mm.close()
            except BufferError:  # a traceback still holds a view of it: the map goes with the last view
                pass

    return chunks


def _advise(mm: mmap.mmap, advice: str, first: int, n: int) -> None:
    """madvise the whole pages inside [first, first + n) (a hint: skipped where the platform lacks it)."""
    code = getattr(mmap, advice, None)
    if code is None or not hasattr(mm, "madvise"):
        return
    lo = first // mmap.PAGESIZE * mmap.PAGESIZE  # madvise wants a page-aligned start
    hi = min(len(mm), first + n)
    if hi > lo:
        mm.madvise(code, lo, hi - lo)


def _metadata(gguf_file: GGUFFile, ft: FileType, imatrix: ImportanceMatrix | None) -> list[MetadataEntry]:
    """Every KV in file order, then general.quantization_version and general.file_type re-added at
    the end as UINT32 — what llama-quantize does (gguf_set_val_u32 removes a key and appends it) —, then the
    ``quantize.imatrix.*`` keys of an importance matrix (its KV overrides, set the same way).
    A non-default general.alignment is re-added by the writer (it pads with it), so it is left out here."""
    updates = [MetadataEntry("general.quantization_version", QUANTIZATION_VERSION, GGUFValueType.UINT32),
               MetadataEntry("general.file_type", ft.file_type, GGUFValueType.UINT32)]
    if imatrix is not None and imatrix.entries:
        updates += [MetadataEntry(k, v, t) for k, v, t in imatrix.metadata()]
    replaced = {u.key for u in updates}
    entries = []
    for kv in gguf_file.kvs.values():
        if kv.key in _SPLIT_KEYS or kv.key in replaced or (
            kv.key == "general.alignment" and gguf_file.alignment != DEFAULT_ALIGNMENT
        ):
            continue
        entries.append(MetadataEntry(kv.key, kv.value, kv.type, kv.sub_type))
    return entries + updates


def _n_layers(gguf_file: GGUFFile, arch: str, warnings: list[str]) -> int:
    n = gguf_file.get(f"{arch}.block_count")
    if isinstance(n, int) and not isinstance(n, bool) and n > 0:
        return n
    layers = [int(m.group(1)) for name in gguf_file.tensors if (m := re.match(r"blk\.(\d+)\.", name))]
    n = max(layers) + 1 if layers else 1
    warnings.append(f"{gguf_file.path}: no {arch}.block_count key; using {n} layers from the tensor names")
    return n


def _check_conversions(src: Path, choices: list[TypeChoice], allow_requantize: bool,
                       warnings: list[str]) -> None:
    """Refuse what llama-quantize refuses: requantizing without --allow-requantize, non-float inputs."""
    changed = [c for c in choices if c.new_type != c.old_type]
    requant = [c for c in changed if is_quantized(c.old_type)]
    for c in changed:
        if not is_quantized(c.old_type) and c.old_type not in _FLOAT_TYPES:
            raise DFlashError(f"{src}: tensor '{c.name}' is {c.old_type.name}, which cannot be converted to "
                              f"{c.new_type.name} — only F32/F16/BF16 (or quantized) weights can be quantized")
    if not requant:
        return
    first = requant[0]
    if not allow_requantize:
        more = f" (and {len(requant) - 1} more)" if len(requant) > 1 else ""
        raise DFlashError(f"{src}: tensor '{first.name}' is already {first.old_type.name}{more} — quantize the "
                          "f32/f16/bf16 original, or pass --allow-requantize to dequantize it first (quality loss)")
    for c in requant:
        if not _can_dequantize(c.old_type):
            raise DFlashError(f"{src}: tensor '{c.name}' is {c.old_type.name}, which dflashkit cannot dequantize "
                              "— quantize the f32/f16/bf16 original")
    olds = ", ".join(sorted({c.old_type.name for c in requant}))
    warnings.append(f"requantizing {len(requant)} already-quantized tensor(s) ({olds}): the errors add up — "
                    "quantizing the f32/f16/bf16 original gives a better file")


def quantize_gguf(
    src: str | os.PathLike[str],
    out: str | os.PathLike[str],
    file_type: str | FileType,
    *,
    pure: bool = False,
    overrides: Sequence[str | tuple[re.Pattern[str] | str, GGMLQuantizationType | str]] = (),
    allow_fallback: bool = True,
    allow_requantize: bool = False,
    force: bool = False,
    progress: bool = True,
    warn: Callable[[str], None] | None = None,
    strict: bool = False,
    allow_nonfinite: bool = False,
    imatrix: str | os.PathLike[str] | ImportanceMatrix | None = None,
    include_weights: Sequence[str] = (),
    exclude_weights: Sequence[str] = (),
    imatrix_name: str | None = None,
) -> QuantizeResult:
    """Quantize the GGUF ``src`` to ``out`` with llama-quantize's per-tensor policy for ``file_type``.

    ``overrides``: ``"REGEX=TYPE"`` strings or (pattern, type) pairs, first match wins (``--tensor-type``).
    NaN / inf values in any tensor, and values a conversion turns into ±inf (past F16 / BF16, or an F16 block
    scale), are refused as llama-quantize refuses them, naming the first such tensor (`codecs.values`; nothing is
    written); ``allow_nonfinite`` writes them with a warning instead. ``strict`` is that default, kept for callers
    that ask for it. ``imatrix``: an importance matrix
    (``--imatrix``; `imatrix.load_imatrix` with ``include_weights`` / ``exclude_weights``), applied as
    llama-quantize applies it, its ``quantize.imatrix.*`` keys recorded (``imatrix_name``: what
    ``quantize.imatrix.file`` records instead of the path as given, and the dataset then by its last path part —
    a release publishes no path of the machine).
    Raises DFlashError / UsageError (one line) before writing anything; ``out`` appears only when complete.
    """
    warn = warn or (lambda msg: print(f"warning: {msg}", file=sys.stderr))
    if strict and allow_nonfinite:
        raise UsageError("--strict and --allow-nonfinite contradict each other: refusing is the default, "
                         "--allow-nonfinite writes them with a warning — give one")
    preset = get_preset(file_type) if isinstance(file_type, str) else None
    if preset is not None:  # a recipe: its file type, the user's overrides first (first match wins), then its own
        file_type, overrides = preset.file_type, (*overrides, *preset.overrides)
    ft = get_file_type(file_type)
    patterns = normalize_overrides(overrides)
    src_path = Path(src)
    if (include_weights or exclude_weights) and imatrix is None:
        raise UsageError("--include-weights / --exclude-weights choose entries of an importance matrix: give --imatrix")
    if include_weights and exclude_weights:
        raise UsageError("--include-weights and --exclude-weights cannot be used together (llama-quantize refuses "
                         "both at once): give one of them")
    matrix = imatrix if isinstance(imatrix, ImportanceMatrix) or imatrix is None else \
        load_imatrix(imatrix, include=include_weights, exclude=exclude_weights)
    has_imatrix = matrix is not None and bool(matrix.entries)
    if matrix is not None and imatrix_name is not None:  # a release: nothing of the machine in the metadata
        matrix.recorded_name = imatrix_name
        if matrix.dataset_bytes is not None:  # llama-imatrix records its -f as typed, often a path
            matrix.dataset_bytes = re.split(rb"[/\\]", matrix.dataset_bytes.split(b"\0", 1)[0])[-1]
    with open_gguf(src_path) as gf:
        out_path = check_output_path(out, force=force, inputs=[src_path, *([] if imatrix is None or isinstance(
            imatrix, ImportanceMatrix) else [Path(imatrix)])])
        arch = gf.get("general.architecture")
        if not isinstance(arch, str) or not arch:
            raise DFlashError(f"{src_path}: no general.architecture key — not a model GGUF")
        if detect_dialect(arch) is not None:
            check_drafter_file(src_path, "quantize this drafter", parsed=gf)  # what every command checks of a drafter
        split_count = gf.get("split.count")
        if isinstance(split_count, int) and split_count > 1:
            raise DFlashError(f"{src_path}: is shard {gf.get('split.no', 0) + 1} of {split_count} — merge the "
                              "shards first (llama-gguf-split --merge)")
        warnings: list[str] = []
        n_layers = _n_layers(gf, arch, warnings)
        n_expert = gf.get(f"{arch}.expert_count", 0)
        # llama-quantize writes tensors in its loader's order (layer, then name)
        infos = sorted(gf.tensors.values(), key=lambda t: llama_tensor_order_key(t.name))
        choices = choose_types(
            [(t.name, t.shape, t.ggml_type) for t in infos],
            ft,
            n_layers=n_layers,
            pure=pure,
            overrides=patterns,
            allow_fallback=allow_fallback,
            n_expert=n_expert if isinstance(n_expert, int) else 0,
            n_gqa=gqa_of(gf, arch),
            has_imatrix=has_imatrix,
        )
        _check_conversions(src_path, choices, allow_requantize, warnings)
        if matrix is None and (need := next((c for c in choices if c.new_type != c.old_type
                                             and requires_imatrix(c.name, c.new_type, ft)), None)):
            raise UsageError(f"{ft.name} needs an importance matrix, as llama-quantize does: its tensor "
                             f"{escape_name(need.name)} is quantized to {need.new_type.name}, garbage without one — "
                             "pass --imatrix FILE (dflash-imatrix makes a drafter's)")
        weights = check_imatrix(matrix, ft, infos, choices) if matrix is not None else {}
        if patterns and not ft.quantized:
            warnings.append(f"--tensor-type is ignored for {ft.name} (llama-quantize applies overrides only "
                            "to quantized file types)")
        elif patterns:
            for pattern, _ in patterns:
                if not any(pattern.search(t.name) for t in infos):
                    warnings.append(f"--tensor-type pattern '{pattern.pattern}' matches no tensor")
        for w in warnings:
            warn(w)
        # numba and the kernels this file needs load on a background thread while the header is written
        # and the first chunk is read (~0.4 s of start-up otherwise spent before the first quantization)
        changed = [c for c in choices if c.new_type != c.old_type]
        from_f16 = [(t, c) for t, c in zip(infos, choices) if c in changed and t.ggml_type == GGMLQuantizationType.F16]
        fused = f16_path_types(sum(t.n_elements for t, _ in from_f16), {c.new_type for _, c in from_f16})
        preload_quantizers({c.new_type for c in changed if c.name not in weights},
                           weighted={c.new_type for c in changed if c.name in weights}, from_f16=fused)

        # ggml_n_dims_shape only drops leading 1-dims from the header (same bytes), so a same-type tensor
        # is still a kernel copy of the source's bytes
        counts = ValueCounts(str(src_path))  # every tensor counted: the first in the file's order is named
        plan = [TensorToWrite(t.name, ggml_n_dims_shape(t.shape), c.new_type,
                              _producer(gf, t, c.new_type, counts, weights.get(t.name), fused),
                              (src_path, t.offset) if t.ggml_type == c.new_type and t.nbytes else None)  # kernel copy
                for t, c in zip(infos, choices)]
        copied = StoredScan(counts, [(t.name, src_path, t.offset, t.nbytes, t.ggml_type.name)
                                     for t, p in zip(infos, plan) if p.source is not None])

        def refuse_what_llama_quantize_refuses() -> None:
            copied.finish()
            problem = None if allow_nonfinite else counts.first_problem([t.name for t in infos])
            if problem is not None:
                kind, name, what = problem
                raise DFlashError(f"{what} — {_REFUSED[kind].format(name=name)}, or pass --allow-nonfinite to write "
                                  "it with a warning")

        try:
            size = write_gguf(out_path, arch, _metadata(gf, ft, matrix if has_imatrix else None), plan, force=force,
                              progress=progress, alignment=gf.alignment,
                              before_publish=refuse_what_llama_quantize_refuses)
        finally:
            copied.cancel()
        for w in counts.warnings([t.name for t in infos]):
            warn(w)
            warnings.append(w)
    return QuantizeResult(
        src=src_path,
        out=out_path,
        file_type=ft,
        architecture=arch,
        bytes_written=size,
        choices=choices,
        bytes_in={t.name: t.nbytes for t in infos},
        bytes_out={p.name: p.nbytes for p in plan},
        warnings=warnings,
    )
