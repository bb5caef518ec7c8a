"""Streaming, atomic GGUF output shared by every command that writes a GGUF.

gguf-py's `GGUFWriter` serialises the header, metadata and tensor infos; tensor data is then
streamed chunk by chunk (one tensor at a time never has to fit in memory twice) into the file
object of `files.atomic_output`, which publishes the output only when everything is written (never
over an existing file without --force). An interrupted or failed run leaves nothing behind.
"""

from __future__ import annotations

import concurrent.futures
import os
import re
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Iterable, Iterator, Sequence

import numpy as np
from gguf import GGMLQuantizationType, GGUFValueType, GGUFWriter
from gguf.constants import GGUFEndian
from gguf.gguf_writer import WriterState

from ..codecs import tensor_nbytes
from ..errors import DFlashError, UsageError
from ..files import atomic_output, check_output, preallocate, signals_deferred
from .gguf_bounds import NumericArray
from .kv_pack import pack_typed_array

#: Key for the quantization format version llama.cpp writes with quantized files.
QUANTIZATION_VERSION = 2


@dataclass(frozen=True)
class MetadataEntry:
    """One GGUF key/value with its exact value type (and element type for arrays)."""

    key: str
    value: object
    type: GGUFValueType
    sub_type: GGUFValueType | None = None


@dataclass
class TensorToWrite:
    """A tensor of the output: its GGUF name, numpy-order shape, type, and a chunk producer.

    ``chunks()`` yields arrays whose bytes, concatenated, are exactly the tensor's data.
    """

    name: str
    shape: tuple[int, ...]
    ggml_type: GGMLQuantizationType
    chunks: Callable[[], Iterable[np.ndarray]]
    #: (file, byte offset) already holding exactly this tensor's output bytes: the writer then copies
    #: them in the kernel (dflashkit.io.copy) instead of calling ``chunks()``
    source: tuple[str | os.PathLike, int] | None = None

    @property
    def nbytes(self) -> int:
        return tensor_nbytes(self.ggml_type, self.shape)


class _Writer(GGUFWriter):
    """gguf-py's writer, except that an empty array (legal GGUF, which llama.cpp reads and a file we copy
    may carry) is packed as its element type and a zero count instead of raising."""

    def _pack_val(self, val, vtype, add_vtype, sub_type=None):  # type: ignore[no-untyped-def,override]
        if vtype == GGUFValueType.ARRAY and isinstance(val, Sequence) and len(val) == 0 and sub_type is not None:
            return (self._pack("I", vtype) if add_vtype else b"") + self._pack("I", sub_type) + self._pack("Q", 0)
        if vtype == GGUFValueType.ARRAY and isinstance(val, NumericArray) and sub_type is not None:
            # the reader's numpy copy, written as its bytes (element by element it would take minutes)
            fmt = "<" + self._simple_value_packing[sub_type]
            head = (self._pack("I", vtype) if add_vtype else b"") + self._pack("I", sub_type) + self._pack("Q", len(val))
            return head + np.asarray(val.array, dtype=np.dtype(fmt)).tobytes()
        if self.endianess == GGUFEndian.LITTLE:
            packed = pack_typed_array(val, vtype, add_vtype, sub_type)  # the tokenizer arrays in bulk
            if packed is not None:
                return packed
        return super()._pack_val(val, vtype, add_vtype, sub_type)


def check_output_path(out: str | os.PathLike, *, force: bool, inputs: Sequence[str | os.PathLike] = ()) -> Path:
    """Validate a GGUF output path before any work: a ``.gguf`` name, then `files.check_output`
    (no overwrite without --force; never one of the files the inputs stand for)."""
    out = Path(out)
    if out.suffix.lower() != ".gguf":
        raise UsageError(f"{out}: the output must be a .gguf path")
    return check_output(out, inputs=inputs, force=force)


def write_gguf(
    out: str | os.PathLike,
    arch: str,
    metadata: Iterable[MetadataEntry],
    tensors: Sequence[TensorToWrite],
    *,
    force: bool = False,
    progress: bool = True,
    alignment: int = 32,
    before_publish: Callable[[], None] | None = None,
) -> int:
    """Write a GGUF atomically (`files.atomic_output`). Returns the file size in bytes. ``before_publish`` runs once
    every byte is written, before the file appears at ``out``: what it raises leaves nothing behind."""
    out = Path(out)
    writer = _Writer(path=None, arch=arch)
    if alignment != 32:
        writer.add_custom_alignment(alignment)
    for entry in metadata:
        if entry.key == "general.architecture":
            continue  # GGUFWriter writes it first from `arch`
        writer.add_key_value(entry.key, entry.value, entry.type, entry.sub_type)
    for t in tensors:
        writer.add_tensor_info(t.name, t.shape, np.dtype(np.float32), t.nbytes, raw_dtype=t.ggml_type)

    total = sum(t.nbytes for t in tensors)
    bar = _progress_bar(total, out.name) if progress and sys.stderr.isatty() else _NoProgress()
    chunk_writer = _ChunkWriter()
    try:
        with atomic_output(out, force=force) as fout:
            # GGUFWriter writes to our file object instead of opening a path itself.
            writer.fout = [fout]  # type: ignore[list-item]
            writer.state = WriterState.EMPTY
            writer.write_header_to_file()
            writer.write_kv_data_to_file()
            writer.write_ti_data_to_file()
            fout.flush()
            data_start = _aligned(fout.tell(), alignment)
            expected = data_start + sum(_aligned(t.nbytes, alignment) for t in tensors)
            preallocate(fout.fileno(), expected)
            for t in tensors:
                writer.write_padding(fout, fout.tell())
                written = 0
                if t.source is not None:  # unchanged bytes: copied in the kernel, not through Python
                    written = _copy_source(t, fout)
                    bar.update(written)
                else:
                    written = chunk_writer.write(t.chunks(), fout, bar)
                if written != t.nbytes:
                    raise DFlashError(f"tensor '{t.name}': produced {written} bytes, expected {t.nbytes}")
                writer.write_padding(fout, written)
            fout.flush()
            size = fout.tell()
            if size != expected:  # cannot happen with gguf-py's padding; never leave preallocated zeros behind
                raise DFlashError(f"{out}: wrote {size} bytes, expected {expected} (internal error)")
            if before_publish is not None:
                before_publish()
            writer.fout = None  # atomic_output closes and publishes the file
        return size
    finally:
        chunk_writer.close()
        bar.close()


class _ChunkWriter:
    """Writes a tensor's chunks in order, each on a writer thread while the next is made: a write into the page
    cache waits on the disk (a third of a Q8_0 run when it was in line with the quantizer), the producer does
    not. One write in flight at a time, so the file's bytes and their order are the producer's. The thread starts
    with the first tensor of two chunks or more (a one-chunk tensor has nothing to overlap) and serves the file."""

    def __init__(self) -> None:
        self._pool: concurrent.futures.ThreadPoolExecutor | None = None

    def write(self, chunks: Iterable[np.ndarray], fout: Any, bar: Any) -> int:
        """Every chunk of one tensor written; returns the byte count."""
        written = 0
        pending: concurrent.futures.Future[Any] | None = None
        held: memoryview | None = None  # the one chunk not yet written
        try:
            for chunk in chunks:
                data = memoryview(np.ascontiguousarray(chunk)).cast("B")
                if held is not None:  # a second chunk: the first goes to the writer thread
                    if pending is not None:
                        pending.result()
                    with signals_deferred():  # a Ctrl-C inside submit would leave the executor's lock held
                        if self._pool is None:
                            self._pool = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="dflashkit-write")
                        pending = self._pool.submit(fout.write, held)
                held = data
                written += data.nbytes
                bar.update(data.nbytes)
            if pending is not None:
                pending.result()
                pending = None
            if held is not None:
                fout.write(held)
        finally:
            if pending is not None:  # finished before the file is touched again (a failure of its own: above)
                concurrent.futures.wait([pending])
        return written

    def close(self) -> None:
        if self._pool is not None:
            self._pool.shutdown()


def _aligned(n: int, alignment: int) -> int:
    return -(-n // alignment) * alignment


class _NoProgress:
    def update(self, n: int) -> None:
        pass

    def close(self) -> None:
        pass


def _progress_bar(total: int, desc: str) -> Any:
    from tqdm import tqdm  # only for a terminal: importing tqdm costs ~15 ms of every command's start-up

    return tqdm(total=total, unit="B", unit_scale=True, unit_divisor=1024, desc=desc, file=sys.stderr, leave=False)


def _copy_source(t: TensorToWrite, fout) -> int:  # type: ignore[no-untyped-def]
    """Copy ``t``'s bytes from ``t.source`` to the writer's position in the kernel; returns the count."""
    from .copy import copy_range

    assert t.source is not None
    fout.flush()
    pos = fout.tell()
    with open(t.source[0], "rb") as src:
        try:
            copy_range(src.fileno(), t.source[1], fout.fileno(), pos, t.nbytes)
        except EOFError:
            raise DFlashError(f"{t.source[0]}: tensor '{t.name}' is truncated (file ended while reading it)") from None
    fout.seek(pos + t.nbytes)
    return t.nbytes


def llama_tensor_order_key(name: str) -> tuple[int, str]:
    """Sort key of llama.cpp's model loader (``weight_name_comparer``): layer number of
    ``blk.N.*`` (-1 for global tensors), then name. llama-quantize writes tensors in this order,
    so every dflashkit writer does too: the same drafter always gives the same bytes."""
    m = re.match(r"blk\.(\d+)\.", name)
    return (int(m.group(1)) if m else -1, name)


def ggml_n_dims_shape(shape: Sequence[int]) -> tuple[int, ...]:
    """A numpy-order shape as llama-quantize writes it: ``ggml_n_dims`` drops trailing ne dims of 1
    (leading numpy dims), keeping one — e.g. DSpark's conf_proj {80, 1} becomes {80}. gguf-py (the
    Python converter) keeps them."""
    dims = tuple(int(d) for d in shape)
    while len(dims) > 1 and dims[0] == 1:
        dims = dims[1:]
    return dims


def iter_row_chunks(n_rows: int, row_bytes: int, target_bytes: int = 16 << 20) -> Iterator[tuple[int, int]]:
    """Row ranges of about ``target_bytes`` each (at least one row)."""
    step = max(1, target_bytes // max(1, row_bytes))
    for start in range(0, n_rows, step):
        yield start, min(n_rows, start + step)
