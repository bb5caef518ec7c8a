"""Importance matrices for the tests, written the way llama-imatrix writes them: its GGUF format with gguf-py's own
writer (``<tensor>.in_sum2`` / ``<tensor>.counts`` F32, ``imatrix.datasets`` / ``imatrix.chunk_count`` /
``imatrix.chunk_size``) and the legacy ``.dat`` byte layout (``common/imatrix-loader.cpp`` reads both)."""

from __future__ import annotations

import struct
from pathlib import Path
from typing import Callable

import gguf
import numpy as np

from dflashkit.io.gguf_reader import open_gguf


def weight_tensors(model_gguf: Path) -> list[tuple[str, int]]:
    """(name, row length) of every 2-D weight a quantizer would touch."""
    with open_gguf(model_gguf) as g:
        return [(t.name, t.dims[0]) for t in g.tensors.values()
                if len(t.dims) >= 2 and t.name.endswith("weight") and "norm" not in t.name]


def write_gguf_imatrix(out: Path, entries: list[tuple[str, int]], *, seed: int = 0, count: float = 37.0,
                       edit: Callable[[str, np.ndarray], np.ndarray] | None = None,
                       metadata: bool = True) -> Path:
    rng = np.random.default_rng(seed)
    w = gguf.GGUFWriter(str(out), arch="imatrix")
    w.add_type("imatrix")
    for name, ne0 in entries:
        sums = (rng.gamma(0.5, 2.0, ne0) * count).astype(np.float32)
        if edit is not None:
            sums = edit(name, sums)
        w.add_tensor(f"{name}.in_sum2", sums)
        w.add_tensor(f"{name}.counts", np.array([count], np.float32))
    if metadata:
        w.add_array("imatrix.datasets", ["unit-test.txt"])
        w.add_uint32("imatrix.chunk_count", 5)
        w.add_uint32("imatrix.chunk_size", 512)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return out


def write_legacy_imatrix(out: Path, entries: list[tuple[str, int]], *, seed: int = 0, ncall: int = 11,
                         chunks: int = 3, dataset: str = "legacy.txt") -> Path:
    rng = np.random.default_rng(seed)
    data = struct.pack("<i", len(entries))
    for name, ne0 in entries:
        raw = name.encode()
        data += struct.pack("<i", len(raw)) + raw + struct.pack("<ii", ncall, ne0)
        data += (rng.gamma(0.5, 2.0, ne0) * ncall).astype("<f4").tobytes()
    data += struct.pack("<i", chunks) + struct.pack("<i", len(dataset)) + dataset.encode()
    out.write_bytes(data)
    return out
