"""An importance matrix as llama-quantize reads it (``common/imatrix-loader.cpp``, ``tools/quantize``): the GGUF
format llama-imatrix writes (``<tensor>.in_sum2`` and ``<tensor>.counts``, F32, with ``imatrix.datasets`` /
``imatrix.chunk_count`` / ``imatrix.chunk_size``) and the legacy ``.dat`` (``n_entries``, then per entry its name,
``ncall``, ``nval`` and ``nval`` floats, then optionally the chunk count and the dataset's name).

The weights are llama-quantize's: per expert slice ``in_sum2 / lround(counts)`` (1 where the count is 0) for GGUF,
``sums / ncall`` for the legacy format, then ``--exclude-weights`` and ``--include-weights`` by substring, in that
order. Hand-written rather than gguf-py's reader for the legacy file (gguf-py has none) and to bound both: every
count and length is checked against the bytes left before anything is allocated. A value that is not a finite,
non-negative number is refused naming its tensor (llama-quantize refuses non-finite ones; a negative one would
turn its weights into garbage silently).
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

MAX_NAME_BYTES = 4096
MAX_ENTRIES = 1 << 20
MAGIC = b"GGUF"


@dataclass
class ImportanceMatrix:
    """What llama-quantize takes from ``--imatrix FILE`` (after the include / exclude rules)."""

    source: str  # the path as given: llama-quantize records it (quantize.imatrix.file)
    weights: dict[str, np.ndarray]  # tensor name -> float32 weights, one per column (per expert slice)
    datasets: list[str] = field(default_factory=list)
    chunk_count: int = 0  # llama-quantize's m_last_call
    legacy: bool = False
    filtered: bool = False  # --include-weights / --exclude-weights dropped entries on purpose

    def metadata(self) -> list[tuple[str, object, GGUFValueType]]:
        """The ``quantize.imatrix.*`` keys llama-quantize adds (as KV overrides: strings cut at 127 bytes, counts
        as UINT32), in its order."""
        def cut(text: str) -> str:
            return text.encode("utf-8")[:127].decode("utf-8", errors="ignore")
        keys: list[tuple[str, object, GGUFValueType]] = [("quantize.imatrix.file", cut(self.source),
                                                          GGUFValueType.STRING)]
        if self.datasets:
            keys.append(("quantize.imatrix.dataset", cut(self.datasets[0]), GGUFValueType.STRING))
        keys.append(("quantize.imatrix.entries_count", len(self.weights), GGUFValueType.UINT32))
        if self.chunk_count > 0:
            keys.append(("quantize.imatrix.chunks_count", self.chunk_count, GGUFValueType.UINT32))
        return keys


def _bad(path: Path, what: str) -> DFlashError:
    return DFlashError(f"{path}: not an importance matrix llama-quantize reads ({what}) — make it with dflash-imatrix "
                       "(a drafter's) or llama-imatrix")


def _check_values(path: Path, name: str, values: np.ndarray) -> None:
    finite = np.isfinite(values)
    if not finite.all():
        raise DFlashError(f"{path}: tensor {escape_name(name)}: value {values[~finite][0]} is not finite — "
                          "llama-quantize refuses it too; make the imatrix again")
    if (values < 0).any():
        raise DFlashError(f"{path}: tensor {escape_name(name)}: a negative sum of squares ({values[values < 0][0]}) "
                          "— not an importance matrix; make it again")


def _load_gguf(path: Path) -> ImportanceMatrix:
    from ..io.gguf_reader import open_gguf

    with open_gguf(path) as g:
        datasets = g.get("imatrix.datasets")
        if datasets is None or g.get("imatrix.chunk_count") is None or g.get("imatrix.chunk_size") is None:
            raise DFlashError(f"{path}: missing imatrix metadata (imatrix.datasets, imatrix.chunk_count, "
                              "imatrix.chunk_size) — llama-quantize refuses it too")
        chunk_count = g.get("imatrix.chunk_count")
        if isinstance(chunk_count, bool) or not isinstance(chunk_count, int) or chunk_count < 0:
            raise _bad(path, f"imatrix.chunk_count is {chunk_count!r}")
        pairs: dict[str, dict[str, str]] = {}
        for tname in g.tensors:
            for suffix in (".in_sum2", ".counts", ".in_sum"):
                if tname.endswith(suffix) and len(tname) > len(suffix):
                    pairs.setdefault(tname[: -len(suffix)], {})[suffix] = tname
                    break
        if not g.tensors:
            raise _bad(path, "no data")
        weights: dict[str, np.ndarray] = {}
        for name, parts in sorted(pairs.items()):
            if ".in_sum2" not in parts or ".counts" not in parts:
                raise DFlashError(f"{path}: tensor {escape_name(name)}: mismatched sums and counts (needs "
                                  f"{name}.in_sum2 and {name}.counts)")
            sums_info, counts_info = g.tensors[parts[".in_sum2"]], g.tensors[parts[".counts"]]
            if sums_info.ggml_type != GGMLQuantizationType.F32 or counts_info.ggml_type != GGMLQuantizationType.F32:
                raise DFlashError(f"{path}: tensor {escape_name(name)}: sums and counts must be F32")
            if ".in_sum" in parts and g.tensors[parts[".in_sum"]].n_elements != sums_info.n_elements:
                raise DFlashError(f"{path}: tensor {escape_name(name)}: mismatched sums and counts")
            sums = np.array(g.array(parts[".in_sum2"]), dtype=np.float32).reshape(-1)
            counts = np.array(g.array(parts[".counts"]), dtype=np.float32).reshape(-1)
            if counts.size == 0 or sums.size % counts.size:
                raise DFlashError(f"{path}: tensor {escape_name(name)}: {sums.size} sums for {counts.size} "
                                  "count(s) — not whole expert slices")
            _check_values(path, name, sums)
            _check_values(path, name, counts)
            ne0 = sums.size // counts.size
            out = np.empty_like(sums)
            for j, c in enumerate(counts):
                count = np.float32(math.floor(float(c) + 0.5))  # std::lround, then (float)
                slice_ = slice(j * ne0, (j + 1) * ne0)
                out[slice_] = sums[slice_] / count if count > 0 else np.float32(1)
            weights[name] = out
        names = [d for d in datasets] if isinstance(datasets, list) else []
        return ImportanceMatrix(str(path), weights, [str(d) for d in names], int(chunk_count), legacy=False)


class _Reader:
    def __init__(self, path: Path, data: bytes) -> None:
        self.path, self.data, self.pos = path, data, 0

    def left(self) -> int:
        return len(self.data) - self.pos

    def i32(self, what: str) -> int:
        if self.left() < 4:
            raise _bad(self.path, f"truncated at byte {self.pos}, reading {what}")
        (v,) = struct.unpack_from("<i", self.data, self.pos)
        self.pos += 4
        return int(v)

    def take(self, n: int, what: str) -> bytes:
        if n < 0 or self.left() < n:
            raise _bad(self.path, f"truncated at byte {self.pos}: {what} needs {n} bytes, {self.left()} left")
        out = self.data[self.pos:self.pos + n]
        self.pos += n
        return out


def _load_legacy(path: Path, max_bytes: int) -> ImportanceMatrix:
    size = path.stat().st_size
    if size > max_bytes:
        raise _bad(path, f"{size} bytes, over {max_bytes}")
    r = _Reader(path, path.read_bytes())
    n_entries = r.i32("the entry count")
    if n_entries < 1 or n_entries > min(MAX_ENTRIES, r.left() // 16):
        raise _bad(path, f"{n_entries} entries in {size} bytes")
    weights: dict[str, np.ndarray] = {}
    for i in range(n_entries):
        length = r.i32(f"the name length of entry {i + 1}")
        if not 0 <= length <= MAX_NAME_BYTES:
            raise _bad(path, f"entry {i + 1}: a name of {length} bytes")
        name = r.take(length, f"the name of entry {i + 1}").split(b"\0", 1)[0].decode("utf-8", errors="replace")
        ncall = r.i32(f"ncall of {name}")
        nval = r.i32(f"nval of {name}")
        if nval < 1:
            raise DFlashError(f"{path}: tensor {escape_name(name)}: {nval} values — llama-quantize refuses it too")
        sums = np.frombuffer(r.take(4 * nval, f"the {nval} values of {name}"), dtype="<f4").astype(np.float32)
        _check_values(path, name, sums)
        weights[name] = sums / np.float32(ncall) if ncall > 0 else sums.copy()
    chunk_count, datasets = 0, []
    if r.left() >= 4:
        chunk_count = max(r.i32("the chunk count"), 0)
        if r.left() >= 4:
            length = r.i32("the dataset name's length")
            if 0 < length <= min(r.left(), MAX_NAME_BYTES):
                datasets.append(r.take(length, "the dataset name").split(b"\0", 1)[0].decode("utf-8", "replace"))
    return ImportanceMatrix(str(path), weights, datasets, chunk_count, legacy=True)


def load_imatrix(path: str | os.PathLike[str], *, include: Sequence[str] = (), exclude: Sequence[str] = (),
                 max_bytes: int = 4 << 30) -> ImportanceMatrix:
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
    matrix = _load_gguf(p) if head == MAGIC else _load_legacy(p, max_bytes)
    matrix.source = str(path)
    weights = matrix.weights
    if exclude:
        weights = {k: v for k, v in weights.items() if not any(e in k for e in exclude)}
    if include:
        weights = {k: v for k, v in weights.items() if any(i in k for i in include)}
    matrix.filtered = bool(include or exclude)
    matrix.weights = weights
    return matrix
