"""An importance matrix as llama-quantize reads it (``common/imatrix-loader.cpp``, ``tools/quantize``): the GGUF
format llama-imatrix writes (``<tensor>.in_sum2`` and ``<tensor>.counts``, F32, with ``imatrix.datasets`` /
``imatrix.chunk_count`` / ``imatrix.chunk_size``) and the legacy ``.dat`` (``n_entries``, then per entry its name,
``ncall``, ``nval`` and ``nval`` floats, then optionally the chunk count and the dataset's name).

Every file either reads as llama-quantize reads it — the same entries, weights and recorded keys — or is refused in
one line saying why, before any work. What llama-quantize does, and so what this does:

- weights: per expert slice ``in_sum2 / (float)lround(counts)``, 1 where that count is not positive — a count past
  2^63 overflows ``lround`` to LONG_MIN, so it is weight 1 too; legacy: ``sums / ncall`` (raw sums for ncall ≤ 0);
  then ``--exclude-weights`` and ``--include-weights`` by substring, in that order;
- GGUF: ``imatrix.chunk_count`` / ``chunk_size`` (and b11549's ``n_layer_nextn``) must be scalar UINT32 (ggml
  aborts on any other type), read as a signed 32-bit count (a value past 2^31 records no chunk count); the tensors
  must lie back to back, each padded to the alignment, the last one's padding included (ggml refuses the file
  otherwise); a tensor named ``.in_sum2`` is an entry with an empty name; an ``.in_sum`` tensor must have its
  entry's length (b11549 refuses it otherwise; 0.3.36 ignores it); a key or tensor name holding a NUL is refused
  (ggml finds it by its text up to the NUL: it would stand for another);
- legacy: the names and the dataset cut at their first NUL; trailing bytes after the entries are a chunk count even
  when fewer than four (the bytes read, zero-padded); a dataset name whose length runs past the file is dropped;
- the recorded ``quantize.imatrix.file`` / ``dataset`` are the first 127 bytes (``strncpy``), as bytes: a cut
  that splits a character is written as it is.

Hand-written rather than gguf-py's reader for the legacy file (gguf-py has none) and to bound both: the file is
read piece by piece (a sparse or zero tail is never read), and an entry's values are read only when a tensor of the
file being quantized asks for them, after its length is checked (`ImportanceMatrix.values`) — memory depends on
the model, never on what a header claims. Refused on top of llama-quantize, one line naming the tensor: a sum that
is not finite or is negative, a count that is not finite, sums that are not whole expert slices.
"""

from __future__ import annotations

import math
import os
import struct
from dataclasses import dataclass, field
from pathlib import Path
from typing import Sequence

import numpy as np
from gguf import GGMLQuantizationType, GGUFValueType

from ..bounds import escape_name
from ..errors import DFlashError

MAX_NAME_BYTES = 4096  # a legacy entry's name: ggml's tensor names are at most 63 bytes
MAX_ENTRIES = 1 << 20
#: tensors of a GGUF imatrix (two or three per entry): a real one has a few thousand; the header of each costs
#: ~0.7 KB parsed, so 2^18 stay under 200 MB
MAX_GGUF_TENSORS = 1 << 18
#: a numeric array value of a GGUF imatrix (llama-imatrix writes none; its datasets are strings)
MAX_ARRAY_BYTES = 16 << 20
MAGIC = b"GGUF"
#: what llama-quantize's KV overrides keep of a string (``char val_str[128]``, ``strncpy(…, 127)``)
KV_STRING_BYTES = 127
_I32 = struct.Struct("<i")


@dataclass(frozen=True)
class Entry:
    """One importance-matrix entry, its values not read yet: ``n_values`` float32 sums at byte ``sums_at`` of the
    file; GGUF: ``n_counts`` float32 counts (one per expert slice) at ``counts_at``; legacy: ``ncall``."""

    name: str
    n_values: int
    sums_at: int
    n_counts: int = 1
    counts_at: int | None = None
    ncall: int = 0


@dataclass
class ImportanceMatrix:
    """What llama-quantize takes from ``--imatrix FILE`` (after the include / exclude rules)."""

    source: str  # the path as given: llama-quantize records it (quantize.imatrix.file)
    entries: dict[str, Entry]
    path: Path = Path()  # the file the entries' values are read from
    datasets: list[str] = field(default_factory=list)  # for display; the recorded one is `dataset_bytes`
    chunk_count: int = 0  # llama-quantize's m_last_call (a signed 32-bit count)
    legacy: bool = False
    filtered: bool = False  # --include-weights / --exclude-weights dropped entries on purpose
    dataset_bytes: bytes | None = None  # the first dataset's name as llama-quantize records it (up to its NUL)
    recorded_name: str | None = None  # what quantize.imatrix.file records instead of `source` (a release: base name)

    def values(self, name: str) -> np.ndarray:
        """The weights of entry ``name`` as llama-quantize computes them, read now (the caller checked its length
        against the tensor that uses it); a value that is not finite or negative is refused naming the tensor."""
        e = self.entries[name]
        sums = _read_f32(self.path, e.sums_at, e.n_values, name)
        _check_sums(self.path, name, sums)
        if e.counts_at is None:
            return sums / np.float32(e.ncall) if e.ncall > 0 else sums
        return _gguf_weights(self.path, name, sums, _read_f32(self.path, e.counts_at, e.n_counts, name))

    def scan(self, name: str) -> None:
        """`values`' checks on an entry no tensor uses, a slice at a time (llama-quantize checks every entry)."""
        e = self.entries[name]
        step = 1 << 20
        for first in range(0, e.n_values, step):
            _check_sums(self.path, name, _read_f32(self.path, e.sums_at + 4 * first,
                                                   min(step, e.n_values - first), name))

    @property
    def weights(self) -> dict[str, np.ndarray]:
        """Every entry's weights, read now (small files and tests; quantizing reads only what a tensor uses)."""
        return {n: self.values(n) for n in self.entries}

    def metadata(self) -> list[tuple[str, object, GGUFValueType]]:
        """The ``quantize.imatrix.*`` keys llama-quantize adds (as KV overrides: strings the first 127 bytes up to
        a NUL, as bytes; counts as UINT32), in its order."""
        name = self.recorded_name if self.recorded_name is not None else self.source
        keys: list[tuple[str, object, GGUFValueType]] = [
            ("quantize.imatrix.file", _kv_string(os.fsencode(name)), GGUFValueType.STRING)]
        if self.dataset_bytes is not None:
            keys.append(("quantize.imatrix.dataset", _kv_string(self.dataset_bytes), GGUFValueType.STRING))
        keys.append(("quantize.imatrix.entries_count", len(self.entries), GGUFValueType.UINT32))
        if self.chunk_count > 0:
            keys.append(("quantize.imatrix.chunks_count", self.chunk_count, GGUFValueType.UINT32))
        return keys


def _kv_string(raw: bytes) -> bytes:
    """``strncpy(val_str, s.c_str(), 127)``: up to the first NUL, at most 127 bytes (a character may be cut)."""
    return raw.split(b"\0", 1)[0][:KV_STRING_BYTES]


def _read_f32(path: Path, offset: int, count: int, name: str) -> np.ndarray:
    with open(path, "rb") as f:
        f.seek(offset)
        raw = f.read(4 * count)
    if len(raw) != 4 * count:
        raise _bad(path, f"tensor {escape_name(name)}: the file changed while it was read")
    return np.frombuffer(raw, dtype="<f4").astype(np.float32)


def _bad(path: Path, what: str) -> DFlashError:
    return DFlashError(f"{path}: not an importance matrix llama-quantize reads ({what}) — make it with dflash-imatrix "
                       "(a drafter's) or llama-imatrix")


def _check_sums(path: Path, name: str, values: np.ndarray) -> None:
    finite = np.isfinite(values)
    if not finite.all():
        raise DFlashError(f"{path}: tensor {escape_name(name)}: value {values[~finite][0]} is not finite — "
                          "llama-quantize refuses it too; make the imatrix again")
    if (values < 0).any():
        raise DFlashError(f"{path}: tensor {escape_name(name)}: a negative sum of squares ({values[values < 0][0]}) "
                          "— not an importance matrix; make it again")


def _gguf_weights(path: Path, name: str, sums: np.ndarray, counts: np.ndarray) -> np.ndarray:
    """llama-quantize's GGUF normalisation: each expert slice over (float)lround(count), 1 where not positive."""
    _check_sums(path, name, sums)
    if not np.isfinite(counts).all():
        raise DFlashError(f"{path}: tensor {escape_name(name)}: a count that is not finite "
                          f"({counts[~np.isfinite(counts)][0]}) — make the imatrix again")
    ne0 = sums.size // counts.size
    out = np.empty_like(sums)
    for j, c in enumerate(counts.tolist()):
        rounded = math.floor(abs(c) + 0.5) * (1 if c >= 0 else -1)  # std::lround: halves away from zero
        count = np.float32(rounded) if rounded < 2**63 else np.float32(-(2**63))  # overflow: LONG_MIN
        part = slice(j * ne0, (j + 1) * ne0)
        out[part] = sums[part] / count if count > 0 else np.float32(1)
    return out


def _u32_key(path: Path, g: object, key: str) -> int:
    """A scalar UINT32 key as ``gguf_get_val_u32`` reads it (ggml aborts on any other type), as int32."""
    kv = g.kvs.get(key)  # type: ignore[attr-defined]
    if kv is None:
        return 0
    if kv.type != GGUFValueType.UINT32:
        raise _bad(path, f"{key} is a {kv.type.name}{' array' if kv.sub_type is not None else ''}, not a UINT32 — "
                         "llama-quantize aborts on it")
    return int(np.array(kv.value, dtype=np.uint32).view(np.int32))  # common_imatrix keeps an int32_t


def _check_ggml_layout(path: Path, g: object) -> None:
    """What ggml's ``gguf_init_from_file`` checks of the data section: every tensor at the running offset (each
    padded to the alignment) and the whole padded section present — else llama-quantize cannot load the file."""
    running = 0
    align = g.alignment  # type: ignore[attr-defined]
    for info in g.tensors.values():  # type: ignore[attr-defined]
        if info.offset - g.data_start != running:  # type: ignore[attr-defined]
            raise _bad(path, f"tensor {escape_name(info.name)} is not where ggml expects it (offset "
                             f"{info.offset - g.data_start} in the data, expected {running})")  # type: ignore[attr-defined]
        running += -(-info.nbytes // align) * align
    if g.data_start + running > g.file_size:  # type: ignore[attr-defined]
        raise _bad(path, f"the data ends {g.data_start + running - g.file_size} byte(s) short of its last tensor's "  # type: ignore[attr-defined]
                         "padding — ggml refuses the file; re-download or make it again")


def _load_gguf(path: Path) -> ImportanceMatrix:
    from ..io.gguf_reader import open_gguf

    with open_gguf(path, max_tensors=MAX_GGUF_TENSORS, max_array_bytes=MAX_ARRAY_BYTES) as g:
        if len(g.tensors) != g.n_tensors or not g.tensors:
            raise _bad(path, "no data")
        for what, names in (("key", g.kvs), ("tensor name", g.tensors)):
            if (odd := next((n for n in names if "\0" in n), None)) is not None:  # ggml reads it up to the NUL
                raise _bad(path, f"a {what} holding a NUL byte ({escape_name(odd)}): ggml reads it cut there, so "
                                 "it would stand for another")
        if any(k not in g.kvs for k in ("imatrix.datasets", "imatrix.chunk_count", "imatrix.chunk_size")):
            raise DFlashError(f"{path}: missing imatrix metadata (imatrix.datasets, imatrix.chunk_count, "
                              "imatrix.chunk_size) — llama-quantize refuses it too")
        chunk_count = _u32_key(path, g, "imatrix.chunk_count")
        _u32_key(path, g, "imatrix.chunk_size")
        _u32_key(path, g, "imatrix.n_layer_nextn")  # b11549 reads it as gguf_get_val_u32 too
        _check_ggml_layout(path, g)
        datasets_kv = g.kvs["imatrix.datasets"]
        datasets = ([str(d) for d in datasets_kv.value] if datasets_kv.type == GGUFValueType.ARRAY
                    and datasets_kv.sub_type == GGUFValueType.STRING else [])  # another type: ignored, as there
        pairs: dict[str, dict[str, str]] = {}
        for tname in g.tensors:
            for suffix in (".in_sum", ".in_sum2", ".counts"):  # b11549 pairs .in_sum too (0.3.36 ignores it)
                if tname.endswith(suffix):
                    pairs.setdefault(tname[: -len(suffix)], {})[suffix] = tname
                    break
        entries: dict[str, Entry] = {}
        for name, parts in sorted(pairs.items()):
            if ".in_sum2" not in parts or ".counts" not in parts:
                raise DFlashError(f"{path}: tensor {escape_name(name)}: mismatched sums and counts (needs "
                                  f"{name}.in_sum2 and {name}.counts) — llama-quantize refuses it too")
            sums_info, counts_info = g.tensors[parts[".in_sum2"]], g.tensors[parts[".counts"]]
            if ".in_sum" in parts and g.tensors[parts[".in_sum"]].n_elements != sums_info.n_elements:
                raise DFlashError(f"{path}: tensor {escape_name(name)}: {name}.in_sum and {name}.in_sum2 differ in "
                                  "length — llama.cpp b11549 refuses it (mismatched sums and counts)")
            if sums_info.ggml_type != GGMLQuantizationType.F32 or counts_info.ggml_type != GGMLQuantizationType.F32:
                raise DFlashError(f"{path}: tensor {escape_name(name)}: sums and counts must be F32 — llama-quantize "
                                  "refuses them too")
            n_values, n_counts = sums_info.n_elements, counts_info.n_elements
            if n_counts == 0 or n_values % n_counts:
                raise DFlashError(f"{path}: tensor {escape_name(name)}: {n_values} sums for {n_counts} count(s) — not "
                                  "whole expert slices")

            entries[name] = Entry(name, n_values, sums_info.offset, n_counts, counts_info.offset)
        first = datasets_kv.value[0] if datasets else None
        return ImportanceMatrix(str(path), entries, path, datasets, chunk_count, legacy=False,
                                dataset_bytes=None if first is None else str(first).encode("utf-8"))


class _Stream:
    """The legacy file read piece by piece, each read bounded by the bytes the file has."""

    def __init__(self, path: Path, f: object, size: int) -> None:
        self.path, self.f, self.size = path, f, size

    def left(self) -> int:
        return self.size - self.f.tell()  # type: ignore[attr-defined]

    def take(self, n: int, what: str) -> bytes:
        if n < 0 or self.left() < n:
            raise _bad(self.path, f"truncated at byte {self.f.tell()}: {what} needs {n} bytes, {self.left()} left")  # type: ignore[attr-defined]
        return self.f.read(n)  # type: ignore[attr-defined]

    def i32(self, what: str) -> int:
        return int(_I32.unpack(self.take(4, what))[0])


def _load_legacy(path: Path) -> ImportanceMatrix:
    size = path.stat().st_size
    with open(path, "rb") as f:
        r = _Stream(path, f, size)
        n_entries = r.i32("the entry count") if size >= 4 else 0
        if n_entries < 1 or n_entries > min(MAX_ENTRIES, r.left() // 16):
            raise _bad(path, f"{n_entries} entries in {size} bytes")
        entries: dict[str, Entry] = {}
        for i in range(n_entries):
            length = r.i32(f"the name length of entry {i + 1}")
            if not 0 <= length <= MAX_NAME_BYTES:
                raise _bad(path, f"entry {i + 1}: a name of {length} bytes (no tensor has one)")
            name = r.take(length, f"the name of entry {i + 1}").split(b"\0", 1)[0].decode("utf-8", "surrogateescape")
            ncall = r.i32(f"ncall of {escape_name(name)}")
            nval = r.i32(f"nval of {escape_name(name)}")
            if nval < 1:
                raise DFlashError(f"{path}: tensor {escape_name(name)}: {nval} values — llama-quantize refuses it too")
            offset = f.tell()
            if r.left() < 4 * nval:
                raise _bad(path, f"truncated at byte {offset}: the {nval} values of {escape_name(name)} need "
                                 f"{4 * nval} bytes, {r.left()} left")
            f.seek(4 * nval, os.SEEK_CUR)  # read when a tensor asks for it: never the whole file
            entries.pop(name, None)  # a repeated name: the later one is llama-quantize's
            entries[name] = Entry(name, nval, offset, ncall=ncall)
        chunk_count, dataset = 0, None
        if r.left() > 0:  # the optional trailer; a short chunk count is its bytes, zero-padded (istream::read)
            head = f.read(min(4, r.left()))
            chunk_count = int(_I32.unpack(head.ljust(4, b"\0"))[0])
            if len(head) == 4 and r.left() >= 4:
                length = r.i32("the dataset name's length")
                if 0 < length <= r.left():  # a longer one fails to read there: no dataset
                    dataset = f.read(min(length, KV_STRING_BYTES + 1)).split(b"\0", 1)[0]
    return ImportanceMatrix(str(path), entries, path, [] if dataset is None else [dataset.decode("utf-8", "replace")],
                            chunk_count, legacy=True, dataset_bytes=dataset)


def load_imatrix(path: str | os.PathLike[str], *, include: Sequence[str] = (),
                 exclude: Sequence[str] = ()) -> ImportanceMatrix:
    """``--imatrix FILE`` with ``--include-weights`` / ``--exclude-weights`` (substrings of tensor names) applied as
    llama-quantize applies them: exclusions first, then only the included entries are kept."""
    p = Path(path)
    try:
        if not p.is_file():
            raise DFlashError(f"{p}: no such file (--imatrix)" if not os.path.lexists(p) else
                              f"{p}: is not a regular file (--imatrix)")
        with open(p, "rb") as f:
            head = f.read(4)
    except OSError as exc:
        raise DFlashError(f"{p}: cannot read it ({exc.strerror or exc})") from None
    matrix = _load_gguf(p) if head == MAGIC else _load_legacy(p)
    matrix.source = os.fspath(path)
    entries = matrix.entries
    if exclude:
        entries = {k: v for k, v in entries.items() if not any(e in k for e in exclude)}
    if include:
        entries = {k: v for k, v in entries.items() if any(i in k for i in include)}
    matrix.filtered = bool(include or exclude)
    matrix.entries = entries
    return matrix
