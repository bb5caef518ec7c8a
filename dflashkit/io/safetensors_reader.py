"""Hardened reader for Hugging Face safetensors checkpoints (single file or index + shards).

Each file's header is parsed here rather than by the ``safetensors`` package so that every
problem gets a stable id and a one-line message: the 8-byte little-endian header length must be
sane (at most 100 MB and inside the file), the JSON header well-formed, every dtype known, and
each tensor's ``data_offsets`` ordered, consistent with shape x dtype size and inside the data
section. Like the ``safetensors`` library, holes between tensors and bytes after the last one are
refused. For sharded checkpoints every shard listed in ``model.safetensors.index.json`` must exist
and hold the tensors the index says it holds. Data is never read at open: :meth:`array` returns
read-only ``numpy.memmap`` views.
"""

from __future__ import annotations

import json
import math
import os
import reprlib
import stat
import struct
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from dflashkit.errors import FormatError
from dflashkit.files import MAX_JSON_CONTAINERS, json_container_count

from .extent import TensorExtent

__all__ = [
    "CheckpointFormatError",
    "SafetensorsCheckpoint",
    "SafetensorsFileInfo",
    "SafetensorsTensor",
    "open_checkpoint",
    "DTYPE_BITS",
    "INDEX_NAME",
    "SINGLE_NAME",
]

MAX_HEADER_LENGTH = 100_000_000  # the safetensors library's own limit
MAX_INDEX_SIZE = 100_000_000
MAX_ELEMENTS = 2**64  # no file can hold more
INDEX_NAME = "model.safetensors.index.json"
SINGLE_NAME = "model.safetensors"
_FIX_REDOWNLOAD = "re-download the checkpoint"

# Every dtype the safetensors format defines, with its size in bits (F4/F6 are packed sub-byte types).
DTYPE_BITS: dict[str, int] = {
    "BOOL": 8, "U8": 8, "I8": 8,
    "F8_E5M2": 8, "F8_E4M3": 8, "F8_E8M0": 8, "F8_E4M3FNUZ": 8, "F8_E5M2FNUZ": 8,
    "I16": 16, "U16": 16, "F16": 16, "BF16": 16,
    "I32": 32, "U32": 32, "F32": 32,
    "I64": 64, "U64": 64, "F64": 64, "C64": 64,
    "F4": 4, "F6_E2M3": 6, "F6_E3M2": 6,
}
# numpy views; BF16 and every F8 come back as raw integers (callers convert), sub-byte types as raw uint8.
_NUMPY_DTYPES: dict[str, str] = {
    "BOOL": "?", "U8": "u1", "I8": "i1",
    "F8_E5M2": "u1", "F8_E4M3": "u1", "F8_E8M0": "u1", "F8_E4M3FNUZ": "u1", "F8_E5M2FNUZ": "u1",
    "I16": "<i2", "U16": "<u2", "F16": "<f2", "BF16": "<u2",
    "I32": "<i4", "U32": "<u4", "F32": "<f4",
    "I64": "<i8", "U64": "<u8", "F64": "<f8", "C64": "<c8",
}


# Bounded repr for values quoted from a header: never proportional to (or as deep as) the input.
_SHORT = reprlib.Repr()
_SHORT.maxlevel, _SHORT.maxlist, _SHORT.maxdict, _SHORT.maxstring, _SHORT.maxother, _SHORT.maxlong = 3, 6, 4, 40, 40, 40
_short = _SHORT.repr


class CheckpointFormatError(FormatError):
    """A safetensors checkpoint is malformed. See `dflashkit.errors.FormatError`."""


@dataclass(frozen=True)
class SafetensorsTensor(TensorExtent):
    name: str
    dtype: str
    shape: tuple[int, ...]
    file: Path
    offset: int  # absolute file offset
    nbytes: int

    @property
    def n_elements(self) -> int:
        return math.prod(self.shape)


@dataclass(frozen=True)
class SafetensorsFileInfo:
    path: Path
    file_size: int
    header_length: int
    data_start: int
    metadata: dict[str, str]


class _Collector:
    """Raises problems when strict, collects them otherwise."""

    def __init__(self, strict: bool) -> None:
        self.strict = strict
        self.problems: list[CheckpointFormatError] = []

    def problem(self, path: Path, check_id: str, message: str, **values: Any) -> None:
        err = CheckpointFormatError(path, check_id, message, **values)
        if self.strict:
            raise err
        self.problems.append(err)

    def add(self, err: CheckpointFormatError) -> None:
        if self.strict:
            raise err
        self.problems.append(err)


@dataclass(eq=False)  # holds memory maps: compare by identity
class SafetensorsCheckpoint:
    directory: Path
    files: list[Path]
    tensors: dict[str, SafetensorsTensor]  # sorted by (file, offset)
    problems: list[CheckpointFormatError] = field(default_factory=list)
    file_info: dict[Path, SafetensorsFileInfo] = field(default_factory=dict)
    index_path: Path | None = None
    weight_map: dict[str, str] | None = None  # tensor -> shard file name, from the index
    _maps: dict[Path, np.memmap] = field(default_factory=dict, repr=False)

    def __enter__(self) -> SafetensorsCheckpoint:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        self._maps.clear()  # views already handed out keep their own reference

    @property
    def total_size(self) -> int:
        return sum(info.file_size for info in self.file_info.values())

    def array(self, name: str) -> np.ndarray:
        """Read-only view in numpy shape. BF16 -> uint16, F8 -> uint8, F4/F6 -> raw packed uint8 bytes."""
        t = self.tensors.get(name)
        if t is None:
            raise CheckpointFormatError(self.directory, "safetensors.tensor_missing", f"no tensor named {name!r} in the checkpoint", tensor=name)
        size = self.file_info[t.file].file_size
        if t.end > size:  # only reachable with strict=False
            raise CheckpointFormatError(
                t.file, "safetensors.truncated",
                f"tensor {name!r} data ends at byte {t.end} but the file is {size} bytes — {_FIX_REDOWNLOAD}",
                tensor=name, end=t.end, file_size=size,
            )
        np_dtype = _NUMPY_DTYPES.get(t.dtype)
        if t.nbytes == 0:
            empty = np.zeros(t.shape if np_dtype else (0,), dtype=np_dtype or np.uint8)
            empty.flags.writeable = False
            return empty
        mm = self._maps.get(t.file)
        if mm is None:
            try:
                mm = self._maps[t.file] = np.memmap(t.file, dtype=np.uint8, mode="r")
            except (OSError, ValueError) as exc:
                raise CheckpointFormatError(t.file, "safetensors.unreadable", f"cannot map the file for reading: {exc}") from None
        raw = mm[t.offset : t.end]
        if raw.size != t.nbytes:  # the file shrank after it was opened
            raise CheckpointFormatError(t.file, "safetensors.truncated", f"tensor {name!r}: file shrank to {mm.size} bytes after it was opened", tensor=name)
        if np_dtype is None:
            return raw
        return raw.view(np_dtype).reshape(t.shape)


def _stat_file(path: Path, missing_id: str, missing_msg: str) -> int:
    """Size of a regular file; every OS failure becomes a CheckpointFormatError."""
    try:
        st = os.stat(path)
    except FileNotFoundError:
        raise CheckpointFormatError(path, missing_id, missing_msg) from None
    except OSError as exc:
        raise CheckpointFormatError(path, "safetensors.unreadable", f"cannot read the file: {exc.strerror or exc}") from None
    if not stat.S_ISREG(st.st_mode):
        raise CheckpointFormatError(path, "safetensors.not_a_file", "is not a regular file, expected a .safetensors file")
    return st.st_size


def _read_exact(path: Path, offset: int, n: int) -> bytes:
    try:
        with open(path, "rb") as f:
            f.seek(offset)
            data = f.read(n)
    except OSError as exc:
        raise CheckpointFormatError(path, "safetensors.unreadable", f"cannot read the file: {exc.strerror or exc}") from None
    if len(data) != n:  # the file shrank since stat
        raise CheckpointFormatError(path, "safetensors.truncated", f"file ended after {offset + len(data)} bytes while reading {n} at offset {offset}")
    return data


def _load_json(raw: bytes, path: Path, check_id: str, what: str) -> Any:
    def no_duplicates(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
        out: dict[str, Any] = {}
        for k, v in pairs:
            if k in out:
                raise ValueError(f"duplicate key {k!r}")
            out[k] = v
        return out

    if (n := json_container_count(raw)) > MAX_JSON_CONTAINERS:
        raise CheckpointFormatError(path, check_id, f"{what} holds {n} objects/arrays, over the cap of "
                                    f"{MAX_JSON_CONTAINERS} (a header has one object per tensor)")
    try:
        return json.loads(raw.decode("utf-8"), object_pairs_hook=no_duplicates)
    except UnicodeDecodeError as exc:
        raise CheckpointFormatError(path, check_id, f"{what} is not valid UTF-8 (byte {exc.start})") from None
    except RecursionError:
        raise CheckpointFormatError(path, check_id, f"{what} nests JSON too deeply") from None
    except ValueError as exc:  # JSONDecodeError, duplicate keys, over-long integer literals
        reason = str(exc).splitlines()[0][:200]
        raise CheckpointFormatError(path, check_id, f"{what} is not valid JSON: {reason}") from None


def _is_uint(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool) and v >= 0


def _read_header(path: Path, size: int) -> tuple[int, dict[str, Any]]:
    """Header length and parsed JSON header; raises on anything that stops parsing this file."""
    if size == 0:
        raise CheckpointFormatError(path, "safetensors.empty", f"file is empty (0 bytes) — {_FIX_REDOWNLOAD}")
    if size < 8:
        raise CheckpointFormatError(path, "safetensors.header_length", f"file is {size} bytes, too short for the 8-byte header length — {_FIX_REDOWNLOAD}", file_size=size)
    (n,) = struct.unpack("<Q", _read_exact(path, 0, 8))
    if n > MAX_HEADER_LENGTH or n > size - 8:
        limit = f"the {size - 8} bytes after it" if n <= MAX_HEADER_LENGTH else f"the {MAX_HEADER_LENGTH}-byte limit"
        raise CheckpointFormatError(
            path, "safetensors.header_length",
            f"header length {n} exceeds {limit} (corrupt or truncated file, or not safetensors) — {_FIX_REDOWNLOAD}",
            header_length=n, file_size=size, limit=MAX_HEADER_LENGTH,
        )
    raw = _read_exact(path, 8, n)
    if not raw.startswith(b"{"):
        raise CheckpointFormatError(path, "safetensors.header_json", f"header does not start with '{{' (starts with {raw[:8]!r})", header_length=n)
    header = _load_json(raw, path, "safetensors.header_json", "header")
    if not isinstance(header, dict):
        raise CheckpointFormatError(path, "safetensors.header_json", "header is not a JSON object")
    return n, header


def _parse_entry(path: Path, name: str, entry: Any, data_start: int, out: _Collector) -> SafetensorsTensor | None:
    """One header entry -> tensor, or None (after reporting) when it is unusable."""
    what = f"tensor {name!r}"
    if not isinstance(entry, dict) or not {"dtype", "shape", "data_offsets"} <= entry.keys():
        out.problem(path, "safetensors.tensor_entry", f"{what} header entry needs dtype, shape and data_offsets, got {_short(entry)}", tensor=name)
        return None
    dtype, shape, offsets = entry["dtype"], entry["shape"], entry["data_offsets"]
    if not isinstance(dtype, str) or dtype not in DTYPE_BITS:
        out.problem(
            path, "safetensors.dtype",
            f"{what} has unknown dtype {_short(dtype)} (known: {', '.join(DTYPE_BITS)}) — the file is corrupt or needs a newer reader",
            tensor=name, dtype=_short(dtype),
        )
        return None
    if not isinstance(shape, list) or not all(_is_uint(d) for d in shape):
        out.problem(path, "safetensors.shape", f"{what} shape {_short(shape)} is not a list of non-negative integers", tensor=name)
        return None
    if not (isinstance(offsets, list) and len(offsets) == 2 and all(_is_uint(o) for o in offsets) and offsets[0] <= offsets[1]):
        out.problem(path, "safetensors.data_offsets", f"{what} data_offsets {_short(offsets)} must be [begin, end] with 0 <= begin <= end", tensor=name)
        return None
    n_elements = 0 if 0 in shape else 1
    for d in shape:
        n_elements *= d
        if n_elements > MAX_ELEMENTS:  # stop early: thousands of huge dims would be slow bignum work
            out.problem(path, "safetensors.shape", f"{what} shape {_short(shape)} has more than 2^64 elements", tensor=name)
            return None
    bits = n_elements * DTYPE_BITS[dtype]
    begin, end = offsets
    if bits % 8 or end - begin != bits // 8:
        expected = f"{bits / 8:g}"
        out.problem(
            path, "safetensors.data_offsets",
            f"{what} data_offsets [{begin}, {end}) span {end - begin} bytes but shape {_short(shape)} x {dtype} needs {expected}",
            tensor=name, begin=begin, end=end, expected_nbytes=bits / 8, shape=list(shape), dtype=dtype,
        )
        return None
    return SafetensorsTensor(name, dtype, tuple(shape), path, data_start + begin, end - begin)


def _check_layout(path: Path, tensors: list[SafetensorsTensor], data_start: int, size: int, out: _Collector, *, complete: bool) -> None:
    """Truncation, overlaps, holes and trailing bytes (the safetensors library refuses all of them).
    Holes and trailing bytes are only meaningful when no header entry was rejected (``complete``)."""
    ordered = sorted(tensors, key=lambda t: (t.offset, t.end))
    past_end = [t for t in ordered if t.end > size]
    if past_end:
        last = max(past_end, key=lambda t: t.end)
        more = f" (and {len(past_end) - 1} more tensors past the end)" if len(past_end) > 1 else ""
        out.problem(
            path, "safetensors.truncated",
            f"tensor {last.name!r} data ends at byte {last.end} but the file is {size} bytes{more}: "
            f"{last.end - size} bytes missing (truncated file or corrupt offset) — {_FIX_REDOWNLOAD}",
            tensor=last.name, end=last.end, file_size=size, missing=last.end - size, tensors_past_end=len(past_end),
        )
    cursor, prev = data_start, None
    for t in ordered:
        if t.offset < cursor and prev is not None:
            out.problem(
                path, "safetensors.tensor_overlap",
                f"tensor {t.name!r} data [{t.offset - data_start}, {t.end - data_start}) overlaps tensor {prev.name!r} (ends at {cursor - data_start})",
                tensor=t.name, other=prev.name,
            )
        elif t.offset > cursor and complete:
            out.problem(
                path, "safetensors.tensor_gap",
                f"{t.offset - cursor} unused bytes before tensor {t.name!r} (data offset {t.offset - data_start}); "
                "the safetensors library refuses files with holes — re-save the checkpoint",
                tensor=t.name, gap=t.offset - cursor,
            )
        if t.end > cursor:
            cursor, prev = t.end, t
    if cursor < size and not past_end and complete:
        out.problem(
            path, "safetensors.trailing_bytes",
            f"{size - cursor} bytes after the last tensor's data (file is {size} bytes, data ends at {cursor}); "
            "the safetensors library refuses this — re-save the checkpoint",
            trailing=size - cursor, file_size=size,
        )


def _parse_file(path: Path, size: int, out: _Collector) -> tuple[SafetensorsFileInfo, list[SafetensorsTensor]]:
    header_length, header = _read_header(path, size)
    data_start = 8 + header_length
    metadata = header.pop("__metadata__", {})
    if not isinstance(metadata, dict) or not all(isinstance(v, str) for v in metadata.values()):
        out.problem(path, "safetensors.metadata", "__metadata__ must map strings to strings", metadata=_short(metadata))
        metadata = {}
    tensors = [t for name, entry in header.items() if (t := _parse_entry(path, name, entry, data_start, out)) is not None]
    _check_layout(path, tensors, data_start, size, out, complete=len(tensors) == len(header))
    return SafetensorsFileInfo(path, size, header_length, data_start, metadata), tensors


def _read_index(index: Path, out: _Collector) -> tuple[dict[str, str], list[Path]]:
    """weight_map and the shard paths it names (kept inside the checkpoint directory)."""
    size = _stat_file(index, "safetensors.not_found", "no such file")
    if size > MAX_INDEX_SIZE:
        raise CheckpointFormatError(index, "safetensors.index_json", f"index is {size} bytes, over the {MAX_INDEX_SIZE}-byte limit")
    doc = _load_json(_read_exact(index, 0, size), index, "safetensors.index_json", "index")
    weight_map = doc.get("weight_map") if isinstance(doc, dict) else None
    if not isinstance(weight_map, dict) or not all(isinstance(v, str) for v in weight_map.values()):
        raise CheckpointFormatError(index, "safetensors.index_json", "index has no \"weight_map\" object mapping tensor names to shard files — re-download the checkpoint")
    shards: list[Path] = []
    for shard in sorted(set(weight_map.values())):
        # A shard name must be a plain file name: never follow the index out of its directory.
        if not shard or shard != os.path.basename(shard) or shard in (".", "..") or "\x00" in shard:
            out.problem(index, "safetensors.index_shard_path", f"shard name {_short(shard)} is not a plain file name in the checkpoint directory", shard=_short(shard))
            continue
        shards.append(index.parent / shard)
    return weight_map, shards


def _resolve(path: Path) -> tuple[Path, Path | None, list[Path]]:
    """(directory, index or None, files) for a checkpoint directory, an index file or one .safetensors file."""
    try:
        is_dir = path.is_dir()
        exists = is_dir or path.exists()
    except OSError as exc:
        raise CheckpointFormatError(path, "safetensors.unreadable", f"cannot access: {exc.strerror or exc}") from None
    if not exists:
        raise CheckpointFormatError(path, "safetensors.not_found", "no such file or directory")
    if not is_dir:
        if path.name.endswith(".index.json"):
            return path.parent, path, []
        return path.parent, None, [path]
    if (path / INDEX_NAME).exists():
        return path, path / INDEX_NAME, []
    if (path / SINGLE_NAME).exists():
        return path, None, [path / SINGLE_NAME]
    try:
        files = sorted(p for p in path.iterdir() if p.name.endswith(".safetensors"))
    except OSError as exc:
        raise CheckpointFormatError(path, "safetensors.unreadable", f"cannot list the directory: {exc.strerror or exc}") from None
    if not files:
        raise CheckpointFormatError(
            path, "safetensors.no_checkpoint",
            f"no {SINGLE_NAME}, {INDEX_NAME} or *.safetensors file in this directory — point at the checkpoint directory",
        )
    return path, None, files


def open_checkpoint(directory: str | os.PathLike[str], *, strict: bool = True) -> SafetensorsCheckpoint:
    """Open a checkpoint directory (``model.safetensors`` or index + shards), an index file or one
    ``.safetensors`` file. strict=True raises on the first problem; strict=False raises only when
    nothing can be read (missing directory, unreadable index) and collects the rest in ``problems``."""
    out = _Collector(strict)
    directory, index, files = _resolve(Path(directory))
    weight_map: dict[str, str] | None = None
    if index is not None:
        weight_map, files = _read_index(index, out)

    ckpt = SafetensorsCheckpoint(directory=directory, files=[], tensors={}, index_path=index, weight_map=weight_map)
    found: list[SafetensorsTensor] = []
    for f in files:
        try:
            missing = f"listed in {INDEX_NAME} but missing — {_FIX_REDOWNLOAD}" if index else "no such file"
            size = _stat_file(f, "safetensors.index_missing_shard" if index else "safetensors.not_found", missing)
            info, tensors = _parse_file(f, size, out)
        except CheckpointFormatError as err:  # this file is unusable; the others are still checked
            out.add(err)
            continue
        ckpt.files.append(f)
        ckpt.file_info[f] = info
        found.extend(tensors)

    for t in found:  # already in (file, offset) order per file
        if t.name in ckpt.tensors:
            other = ckpt.tensors[t.name].file.name
            out.problem(t.file, "safetensors.duplicate_tensor", f"tensor {t.name!r} is also in {other}; the first is used", tensor=t.name, other_file=other)
            continue
        ckpt.tensors[t.name] = t
    file_order = {f: i for i, f in enumerate(ckpt.files)}
    ckpt.tensors = dict(sorted(ckpt.tensors.items(), key=lambda kv: (file_order[kv[1].file], kv[1].offset)))

    if weight_map is not None:
        readable = {f.name for f in ckpt.files}
        for name, shard in weight_map.items():
            t = ckpt.tensors.get(name)
            if shard in readable and (t is None or t.file.name != shard):
                out.problem(
                    directory / shard, "safetensors.index_missing_tensor",
                    f"tensor {name!r} is listed in {INDEX_NAME} for this shard but not found in it — {_FIX_REDOWNLOAD}",
                    tensor=name, shard=shard,
                )
    ckpt.problems = out.problems
    return ckpt
