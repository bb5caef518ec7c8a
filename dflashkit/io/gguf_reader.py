"""The project's one hardened GGUF reader.

Every command reads GGUF through :func:`open_gguf`. Nothing read from the file is trusted: counts
and lengths are bounded by the bytes actually left in the file *before* anything is allocated,
value and tensor types must be known, and every tensor's byte range (ggml block size x type size)
must lie inside the file. Tensor data is never read at open; :meth:`GGUFFile.raw` and
:meth:`GGUFFile.array` hand out read-only ``numpy.memmap`` slices.

The header is parsed from a read-only ``mmap`` of the file with ``struct`` (no per-element numpy
views, unlike ``gguf.GGUFReader``), so a 150k-token vocabulary parses in a fraction of a second.

This module holds the parsing (header, key-value pairs, tensor infos, the tensors' placement in the data) and
the `GGUFFile` it builds; the limits, value-type tables and bounded reads it parses with are ``gguf_bounds``
(its public names are importable from here too).

Layout (little-endian; versions 2 and 3 are identical on disk)::

    "GGUF" | u32 version | u64 n_tensors | u64 n_kv
    n_kv x      (string key | u32 value_type | value)
    n_tensors x (string name | u32 n_dims | n_dims x u64 ne | u32 ggml_type | u64 offset)
    padding to `general.alignment` | tensor data (offsets relative to this data start)
"""

from __future__ import annotations

import mmap
import math
import os
import stat
import struct
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
from gguf import GGMLQuantizationType, GGUFValueType

from dflashkit.codecs import tensor_nbytes
from dflashkit.quant_types import KNOWN_TYPES, sizes
from dflashkit.quant_types import block_size as quant_block_size

from .extent import TensorExtent
from .gguf_bounds import (
    FIX_REDOWNLOAD, HEADER_SIZE, INT64_MAX, MAX_ARRAY_NESTING, MAX_DIMS, MAX_INNER_ARRAYS, MAX_NAME_LEN, MIN_KV_SIZE,
    MIN_TENSOR_INFO_SIZE, BoundedCursor, GGUFFormatError, NumericArray,
)

__all__ = [
    "GGUFFormatError",
    "GGUFFile",
    "GGUFValueType",
    "GGMLQuantizationType",
    "KV",
    "NumericArray",
    "TensorInfo",
    "open_gguf",
    "tensor_nbytes",
    "DEFAULT_ALIGNMENT",
    "MAX_DIMS",
    "MAX_NAME_LEN",
    "MAX_INNER_ARRAYS",
    "MAX_ARRAY_NESTING",
]

MAGIC = b"GGUF"
SUPPORTED_VERSIONS = (2, 3)
DEFAULT_ALIGNMENT = 32
_GGML_TYPES = KNOWN_TYPES

# Typed numpy views for unquantized ggml types (BF16 as raw uint16: callers convert).
_GGML_NUMPY_DTYPES: dict[GGMLQuantizationType, np.dtype] = {
    GGMLQuantizationType.F32: np.dtype("<f4"),
    GGMLQuantizationType.F16: np.dtype("<f2"),
    GGMLQuantizationType.BF16: np.dtype("<u2"),
    GGMLQuantizationType.F64: np.dtype("<f8"),
    GGMLQuantizationType.I8: np.dtype("i1"),
    GGMLQuantizationType.I16: np.dtype("<i2"),
    GGMLQuantizationType.I32: np.dtype("<i4"),
    GGMLQuantizationType.I64: np.dtype("<i8"),
}


@dataclass(frozen=True)
class KV:
    key: str
    type: GGUFValueType
    value: Any  # int/float/bool/str; ARRAY: a list (strings, arrays) or a NumericArray (element type in sub_type)
    sub_type: GGUFValueType | None = None


@dataclass(frozen=True)
class TensorInfo(TensorExtent):
    name: str
    dims: tuple[int, ...]  # GGUF order, ne0 first
    ggml_type: GGMLQuantizationType
    offset: int  # absolute file offset of the data
    nbytes: int

    @property
    def shape(self) -> tuple[int, ...]:
        """numpy order (reversed GGUF dims)."""
        return tuple(reversed(self.dims))

    @property
    def n_elements(self) -> int:
        return math.prod(self.dims)


@dataclass(eq=False)  # holds memory maps: compare by identity
class GGUFFile:
    """A parsed GGUF header plus lazy, read-only access to tensor data. Use :func:`open_gguf`."""

    path: Path
    version: int
    alignment: int
    file_size: int
    data_start: int
    n_tensors: int  # as declared in the header (``tensors`` omits entries that failed validation)
    n_kv: int
    kvs: dict[str, KV] = field(default_factory=dict)
    tensors: dict[str, TensorInfo] = field(default_factory=dict)
    problems: list[GGUFFormatError] = field(default_factory=list)
    _data: np.memmap | None = field(default=None, repr=False)

    def __enter__(self) -> GGUFFile:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        # Views already handed out keep their own reference to the mapping; we only drop ours.
        self._data = None

    def get(self, key: str, default: Any = None) -> Any:
        kv = self.kvs.get(key)
        return default if kv is None else kv.value

    def _error(self, check_id: str, message: str, **values: Any) -> GGUFFormatError:
        return GGUFFormatError(self.path, check_id, message, **values)

    def _info(self, name: str) -> TensorInfo:
        try:
            return self.tensors[name]
        except KeyError:
            raise self._error("gguf.tensor_missing", f"no tensor named {name!r} in the file", tensor=name) from None

    def raw(self, name: str) -> np.ndarray:
        """The tensor's bytes as a read-only uint8 1-D memmap view."""
        info = self._info(name)
        if info.end > self.file_size:  # only reachable with strict=False
            raise self._error(
                "gguf.truncated",
                f"tensor {name!r} data ends at byte {info.end} but the file is {self.file_size} bytes — {FIX_REDOWNLOAD}",
                tensor=name, end=info.end, file_size=self.file_size,
            )
        if info.nbytes == 0:
            empty = np.zeros(0, dtype=np.uint8)
            empty.flags.writeable = False
            return empty
        if self._data is None:
            try:
                self._data = np.memmap(self.path, dtype=np.uint8, mode="r")
            except (OSError, ValueError) as exc:
                raise self._error("gguf.unreadable", f"cannot map the file for reading: {exc}") from None
        view = self._data[info.offset : info.end]
        if view.size != info.nbytes:  # the file shrank after it was opened
            raise self._error("gguf.truncated", f"tensor {name!r}: file shrank to {self._data.size} bytes after it was opened", tensor=name)
        return view

    def array(self, name: str) -> np.ndarray:
        """Typed view in numpy order. BF16 comes back as uint16; quantized types as uint8
        ``[*shape[:-1], row_bytes]`` (one row of ggml blocks per innermost row)."""
        info = self._info(name)
        raw = self.raw(name)
        dtype = _GGML_NUMPY_DTYPES.get(info.ggml_type)
        if dtype is not None:
            return raw.view(dtype).reshape(info.shape)
        block, nbytes = sizes(info.ggml_type)
        row_bytes = info.dims[0] // block * nbytes if info.dims else nbytes
        return raw.reshape(*info.shape[:-1], row_bytes)


def _check_version(p: BoundedCursor) -> int:
    version = p.u32("the version")
    if version in SUPPORTED_VERSIONS:
        return version
    swapped = int.from_bytes(version.to_bytes(4, "little"), "big")
    if version & 0xFFFF == 0 and swapped in (1, 2, 3):
        p.fatal(
            "gguf.version",
            f"big-endian GGUF (version {swapped} byte-swapped); only little-endian files are supported — "
            "re-convert without --bigendian",
            version=version,
        )
    if version == 1:
        p.fatal("gguf.version", "GGUF version 1 is no longer supported — re-convert with a current llama.cpp / gguf-py", version=1)
    p.fatal(
        "gguf.version",
        f"unsupported GGUF version {version} (supported: 2, 3) — the file is corrupt or from a newer format",
        version=version,
    )


def _check_counts(p: BoundedCursor, n_tensors: int, n_kv: int) -> None:
    room = p.size - HEADER_SIZE
    max_tensors = room // MIN_TENSOR_INFO_SIZE
    truncated = f"(corrupt header or truncated file) — {FIX_REDOWNLOAD}"
    if n_tensors > max_tensors:
        p.fatal("gguf.tensor_count", f"header claims {n_tensors} tensors but a {p.size}-byte file holds at most "
                f"{max_tensors} {truncated}", n_tensors=n_tensors, max_tensors=max_tensors, file_size=p.size)
    max_kv = (room - n_tensors * MIN_TENSOR_INFO_SIZE) // MIN_KV_SIZE
    if n_kv > max_kv:
        p.fatal("gguf.kv_count", f"header claims {n_kv} key-value pairs but a {p.size}-byte file with {n_tensors} "
                f"tensors holds at most {max_kv} {truncated}", n_kv=n_kv, max_kv=max_kv, file_size=p.size)


def _parse_kvs(p: BoundedCursor, n_kv: int) -> dict[str, KV]:
    kvs: dict[str, KV] = {}
    for i in range(n_kv):
        key_offset = p.pos
        key = p.decode(p.string_bytes(f"key #{i}"), f"key #{i}")
        what = f"key {key!r}"
        if not key:
            p.problem("gguf.kv_key", f"key #{i} at offset {key_offset} is empty", offset=key_offset, index=i)
        vtype = p.value_type(what)
        value, sub = p.value(vtype, what)
        if key in kvs:
            p.problem("gguf.kv_duplicate", f"key {key!r} appears twice (second at offset {key_offset}); the first is used", key=key, offset=key_offset)
            continue
        kvs[key] = KV(key, vtype, value, sub)
    return kvs


def _alignment(p: BoundedCursor, kvs: dict[str, KV]) -> int:
    kv = kvs.get("general.alignment")
    if kv is None:
        return DEFAULT_ALIGNMENT
    ok_type = kv.type is GGUFValueType.UINT32
    if ok_type and kv.value > 0 and kv.value & (kv.value - 1) == 0:
        return kv.value
    got = f"type {kv.type.name}" if not ok_type else f"value {kv.value}"
    p.problem(
        "gguf.alignment",
        f"general.alignment must be a non-zero power-of-two UINT32, got {got}; using {DEFAULT_ALIGNMENT}",
        alignment=kv.value, type=kv.type.name,
    )
    return DEFAULT_ALIGNMENT


@dataclass
class _RawTensor:
    name: str
    dims: tuple[int, ...]
    ggml_type: GGMLQuantizationType | None
    rel_offset: int
    valid: bool


def _parse_tensor_infos(p: BoundedCursor, n_tensors: int) -> list[_RawTensor]:
    out: list[_RawTensor] = []
    seen: set[str] = set()
    for i in range(n_tensors):
        name_offset = p.pos
        name = p.decode(p.string_bytes(f"the name of tensor #{i}"), f"the name of tensor #{i}")
        what = f"tensor {name!r}"
        valid = True
        if len(name.encode("utf-8")) > MAX_NAME_LEN:
            p.problem("gguf.tensor_name", f"{what} name is {len(name)} bytes; llama.cpp allows at most {MAX_NAME_LEN} — shorten it", tensor=name)
        if name in seen:
            p.problem("gguf.tensor_duplicate", f"{what} appears twice (second at offset {name_offset}); the first is used", tensor=name, offset=name_offset)
            valid = False
        seen.add(name)

        n_dims = p.u32(f"the dimension count of {what}")
        if n_dims * 8 > p.size - p.pos:
            p.fatal(
                "gguf.tensor_dims",
                f"{what} claims {n_dims} dimensions but only {p.size - p.pos} bytes are left — {FIX_REDOWNLOAD}",
                tensor=name, n_dims=n_dims,
            )
        # Past MAX_DIMS the dims are skipped, not unpacked: a crafted count must not cost memory or time.
        dims = struct.unpack_from(f"<{n_dims}Q", p.buf, p.pos) if n_dims <= MAX_DIMS else ()
        p.pos += 8 * n_dims
        raw_type = p.u32(f"the type of {what}")
        rel_offset = p.u64(f"the data offset of {what}")

        n_elements = 1
        for d in dims:
            n_elements *= d
        if n_dims > MAX_DIMS:
            p.problem("gguf.tensor_dims", f"{what} has {n_dims} dimensions; ggml supports at most {MAX_DIMS}", tensor=name, n_dims=n_dims)
            valid = False
        elif any(d > INT64_MAX for d in dims) or n_elements > INT64_MAX:
            p.problem("gguf.tensor_dims", f"{what} has impossible dimensions {list(dims)} (negative or over 2^63 elements)", tensor=name, dims=list(dims))
            valid = False
        ggml_type = _GGML_TYPES.get(raw_type)
        if ggml_type is None:
            p.problem("gguf.tensor_type", f"{what} has unknown ggml type {raw_type} — the file is corrupt or needs a "
                      "newer gguf-py", tensor=name, ggml_type=raw_type)
            valid = False
        elif valid:
            block_size = quant_block_size(ggml_type)
            ne0 = dims[0] if dims else 1
            if ne0 % block_size:
                p.problem(
                    "gguf.tensor_block",
                    f"{what} of type {ggml_type.name} has {ne0} elements per row, not a multiple of its block size {block_size}",
                    tensor=name, ne0=ne0, block_size=block_size, ggml_type=ggml_type.name,
                )
                valid = False
        out.append(_RawTensor(name, tuple(dims), ggml_type, rel_offset, valid))
    return out


def _place_tensors(p: BoundedCursor, raw: list[_RawTensor], data_start: int, alignment: int) -> dict[str, TensorInfo]:
    tensors: dict[str, TensorInfo] = {}
    for t in raw:
        if not t.valid:
            continue
        assert t.ggml_type is not None
        if t.rel_offset % alignment:
            p.problem(
                "gguf.tensor_offset",
                f"tensor {t.name!r} data offset {t.rel_offset} is not a multiple of the alignment {alignment}",
                tensor=t.name, offset=t.rel_offset, alignment=alignment,
            )
        tensors[t.name] = TensorInfo(t.name, t.dims, t.ggml_type, data_start + t.rel_offset, tensor_nbytes(t.ggml_type, tuple(reversed(t.dims))))

    past_end = [t for t in tensors.values() if t.end > p.size]
    if past_end:
        last = max(past_end, key=lambda t: t.end)
        more = f" (and {len(past_end) - 1} more tensors past the end)" if len(past_end) > 1 else ""
        p.problem(
            "gguf.truncated",
            f"tensor {last.name!r} data ends at byte {last.end} but the file is {p.size} bytes{more}: "
            f"{last.end - p.size} bytes missing (truncated file or corrupt offset) — {FIX_REDOWNLOAD}",
            tensor=last.name, end=last.end, file_size=p.size, missing=last.end - p.size, tensors_past_end=len(past_end),
        )

    # Overlap: sweep in offset order; zero-byte tensors occupy nothing.
    prev: TensorInfo | None = None
    for t in sorted((t for t in tensors.values() if t.nbytes), key=lambda t: (t.offset, t.end)):
        if prev is not None and t.offset < prev.end:
            p.problem(
                "gguf.tensor_overlap",
                f"tensor {t.name!r} data [{t.offset}, {t.end}) overlaps tensor {prev.name!r} [{prev.offset}, {prev.end})",
                tensor=t.name, other=prev.name, offset=t.offset, other_end=prev.end,
            )
        if prev is None or t.end > prev.end:
            prev = t
    return tensors


def _stat(path: Path) -> int:
    """File size, with every OS-level failure turned into a GGUFFormatError."""
    try:
        st = os.stat(path)
    except FileNotFoundError:
        raise GGUFFormatError(path, "gguf.not_found", "no such file") from None
    except OSError as exc:
        raise GGUFFormatError(path, "gguf.unreadable", f"cannot read the file: {exc.strerror or exc}") from None
    if stat.S_ISDIR(st.st_mode):
        raise GGUFFormatError(path, "gguf.not_a_file", "is a directory, expected a .gguf file")
    if not stat.S_ISREG(st.st_mode):
        # FIFOs and devices could block or never end: refuse rather than hang.
        raise GGUFFormatError(path, "gguf.not_a_file", "is not a regular file, expected a .gguf file")
    if st.st_size == 0:
        raise GGUFFormatError(path, "gguf.empty", "file is empty (0 bytes) — re-download or re-convert the file")
    return st.st_size


def open_gguf(path: str | os.PathLike[str], *, strict: bool = True, max_tensors: int | None = None,
              max_array_bytes: int | None = None) -> GGUFFile:
    """Parse a GGUF header and validate the layout.

    strict=True raises :class:`GGUFFormatError` on the first problem. strict=False raises only when
    parsing cannot continue and collects the rest in ``GGUFFile.problems``. ``max_tensors`` /
    ``max_array_bytes``: tighter bounds for a kind of file that never has more (an importance matrix).
    """
    path = Path(path)
    size = _stat(path)
    try:
        with open(path, "rb") as f, mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as buf:
            return _parse(buf, path, size, strict, max_tensors, max_array_bytes)
    except OSError as exc:
        raise GGUFFormatError(path, "gguf.unreadable", f"cannot read the file: {exc.strerror or exc}") from None
    except ValueError as exc:  # mmap of a file that shrank to 0 bytes meanwhile
        raise GGUFFormatError(path, "gguf.unreadable", f"cannot map the file: {exc}") from None


def _parse(buf: mmap.mmap, path: Path, size: int, strict: bool, max_tensors: int | None = None,
           max_array_bytes: int | None = None) -> GGUFFile:
    size = min(size, len(buf))
    p = BoundedCursor(buf, path, size, strict)
    p.max_array_bytes = max_array_bytes
    head = buf[:4]
    if head != MAGIC[: len(head)]:
        p.fatal("gguf.magic", f"not a GGUF file: starts with {head!r}, expected {MAGIC!r}", magic=head.hex())
    p.need(HEADER_SIZE, "the 24-byte GGUF header")
    p.pos = 4
    version = _check_version(p)
    n_tensors = p.u64("the tensor count")
    n_kv = p.u64("the key-value count")
    _check_counts(p, n_tensors, n_kv)
    if max_tensors is not None and n_tensors > max_tensors:
        p.fatal("gguf.tensor_count", f"header claims {n_tensors} tensors, over the cap of {max_tensors} for this kind "
                "of file", n_tensors=n_tensors, max_tensors=max_tensors, file_size=p.size)

    kvs = _parse_kvs(p, n_kv)
    alignment = _alignment(p, kvs)
    raw = _parse_tensor_infos(p, n_tensors)
    data_start = -(-p.pos // alignment) * alignment
    tensors = _place_tensors(p, raw, data_start, alignment)
    return GGUFFile(
        path=path, version=version, alignment=alignment, file_size=size, data_start=data_start,
        n_tensors=n_tensors, n_kv=n_kv, kvs=kvs, tensors=tensors, problems=p.problems,
    )
