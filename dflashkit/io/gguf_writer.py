"""Streaming, atomic GGUF output shared by every command that writes a GGUF.

gguf-py's `GGUFWriter` serialises the header, metadata and tensor infos; tensor data is then
streamed chunk by chunk (one tensor at a time never has to fit in memory twice) into a temporary
file next to the output, which is renamed over the output only when everything is written. An
interrupted or failed run leaves no output file behind.
"""

from __future__ import annotations

import os
import re
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Iterable, Iterator, Sequence

import numpy as np
from gguf import GGML_QUANT_SIZES, GGMLQuantizationType, GGUFValueType, GGUFWriter
from gguf.gguf_writer import WriterState
from tqdm import tqdm

from ..errors import DFlashError, UsageError

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
        return tensor_nbytes(self.shape, self.ggml_type)


def tensor_nbytes(shape: Sequence[int], ggml_type: GGMLQuantizationType) -> int:
    block, type_size = GGML_QUANT_SIZES[ggml_type]
    n = int(np.prod(shape, dtype=np.int64)) if len(shape) else 1
    if shape and shape[-1] % block:
        raise DFlashError(
            f"row length {shape[-1]} is not a multiple of {GGMLQuantizationType(ggml_type).name}'s block size {block}"
        )
    return n // block * type_size


def check_output_path(out: str | os.PathLike, *, force: bool, inputs: Sequence[str | os.PathLike] = ()) -> Path:
    """Validate an output path before any work: refuses overwrites without --force and
    never lets an output replace one of the inputs."""
    out = Path(out)
    if out.suffix.lower() != ".gguf":
        raise UsageError(f"{out}: the output must be a .gguf path")
    if out.is_dir():
        raise UsageError(f"{out}: is a directory; give the output file name")
    if not out.parent.exists():
        raise DFlashError(f"{out}: the folder {out.parent} does not exist")
    for src in inputs:
        try:
            if Path(src).exists() and out.exists() and os.path.samefile(src, out):
                raise UsageError(f"{out}: is also an input; write to another file (inputs are never modified)")
        except OSError:
            pass
    if out.exists() and not force:
        raise DFlashError(f"{out}: already exists — pass --force to overwrite it")
    return out


def write_gguf(
    out: str | os.PathLike,
    arch: str,
    metadata: Iterable[MetadataEntry],
    tensors: Sequence[TensorToWrite],
    *,
    force: bool = False,
    progress: bool = True,
    alignment: int = 32,
) -> int:
    """Write a GGUF atomically (``OUT.tmp-*`` then rename). Returns the file size in bytes."""
    out = Path(out)
    if out.exists() and not force:
        raise DFlashError(f"{out}: already exists — pass --force to overwrite it")
    writer = GGUFWriter(path=None, arch=arch)
    if alignment != 32:
        writer.add_custom_alignment(alignment)
    for entry in metadata:
        if entry.key == "general.architecture":
            continue  # GGUFWriter writes it first from `arch`
        writer.add_key_value(entry.key, entry.value, entry.type, entry.sub_type)
    for t in tensors:
        writer.add_tensor_info(t.name, t.shape, np.dtype(np.float32), t.nbytes, raw_dtype=t.ggml_type)

    from .kv_pack import install

    install(writer)  # the tokenizer arrays in bulk, not element by element
    fd, tmp_name = tempfile.mkstemp(prefix=out.name + ".tmp-", dir=out.parent)
    tmp = Path(tmp_name)
    # write through mkstemp's descriptor: re-opening with "wb" truncates, and ext4 then flushes
    # the whole file at close (auto_da_alloc), a synchronous writeback of every byte just written
    writer.fout, writer.path, writer.state = [os.fdopen(fd, "wb")], tmp, WriterState.EMPTY
    total = sum(t.nbytes for t in tensors)
    bar = tqdm(
        total=total,
        unit="B",
        unit_scale=True,
        unit_divisor=1024,
        desc=out.name,
        disable=not progress or not sys.stderr.isatty(),
        file=sys.stderr,
        leave=False,
    )
    try:
        writer.write_header_to_file()
        writer.write_kv_data_to_file()
        writer.write_ti_data_to_file()
        assert writer.fout is not None
        fout = writer.fout[0]
        for t in tensors:
            writer.write_padding(fout, fout.tell())
            written = 0
            if t.source is not None:
                written = _copy_source(t, fout)
                bar.update(written)
            for chunk in (() if t.source is not None else t.chunks()):
                data = memoryview(np.ascontiguousarray(chunk)).cast("B")
                fout.write(data)
                written += data.nbytes
                bar.update(data.nbytes)
            if written != t.nbytes:
                raise DFlashError(f"tensor '{t.name}': produced {written} bytes, expected {t.nbytes}")
            writer.write_padding(fout, written)
        writer.close()
        size = tmp.stat().st_size
        os.replace(tmp, out)
        return size
    except BaseException:
        try:
            writer.close()
        except Exception:
            pass
        tmp.unlink(missing_ok=True)
        raise
    finally:
        bar.close()


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


def iter_row_chunks(n_rows: int, row_bytes: int, target_bytes: int = 16 << 20) -> Iterator[tuple[int, int]]:
    """Row ranges of about ``target_bytes`` each (at least one row)."""
    step = max(1, target_bytes // max(1, row_bytes))
    for start in range(0, n_rows, step):
        yield start, min(n_rows, start + step)
