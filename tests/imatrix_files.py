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
                       metadata: bool = True, dataset: str = "unit-test.txt") -> Path:
    w = gguf.GGUFWriter(str(out), arch="imatrix")
    w.add_type("imatrix")
    for name, data in entry_arrays(entries, seed=seed, count=count):
        if edit is not None and name.endswith(".in_sum2"):
            data = edit(name[: -len(".in_sum2")], data)
        w.add_tensor(name, data)
    if metadata:
        w.add_array("imatrix.datasets", [dataset])
        w.add_uint32("imatrix.chunk_count", 5)
        w.add_uint32("imatrix.chunk_size", 512)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return out


def write_legacy_imatrix(out: Path, entries: list[tuple[str, int]], *, seed: int = 0, ncall: int = 11,
                         chunks: int = 3, dataset: str = "legacy.txt") -> Path:
    data = legacy_bytes(entries, seed=seed, ncall=ncall)
    data += struct.pack("<i", chunks) + struct.pack("<i", len(dataset)) + dataset.encode()
    out.write_bytes(data)
    return out


# ---- raw GGUF imatrix files, byte by byte: the hostile shapes gguf-py's writer will not make (issue 47) ----------

def _s(text: bytes) -> bytes:
    return struct.pack("<Q", len(text)) + text


def kv_string(key: str, value: bytes) -> bytes:
    return _s(key.encode()) + struct.pack("<I", 8) + _s(value)


def kv_u32(key: str, value: int) -> bytes:
    return _s(key.encode()) + struct.pack("<II", 4, value)


def kv_u64(key: str, value: int) -> bytes:
    return _s(key.encode()) + struct.pack("<IQ", 10, value)


def kv_strings(key: str, values: list[bytes]) -> bytes:
    return _s(key.encode()) + struct.pack("<IIQ", 9, 8, len(values)) + b"".join(_s(v) for v in values)


def standard_kvs(dataset: bytes = b"unit-test.txt", chunks: int = 5) -> list[bytes]:
    return [kv_string("general.type", b"imatrix"), kv_strings("imatrix.datasets", [dataset]),
            kv_u32("imatrix.chunk_count", chunks), kv_u32("imatrix.chunk_size", 512)]


def write_raw_imatrix(out: Path, kvs: list[bytes], tensors: list[tuple[str, np.ndarray | int]], *,
                      pad_last: bool = True) -> Path:
    """A GGUF v3 imatrix: ``kvs`` (from the kv_* helpers), F32 ``tensors`` as arrays or as an element count whose
    data is left a sparse hole (the file is extended, never written); ``pad_last=False`` drops the last tensor's
    padding (ggml refuses such a file)."""
    head = b"GGUF" + struct.pack("<IQQ", 3, len(tensors), len(kvs)) + b"".join(kvs)
    offset, infos, sizes = 0, [], []
    for name, data in tensors:
        n = data if isinstance(data, int) else data.size
        infos.append(_s(name.encode()) + struct.pack("<IQIQ", 1, n, 0, offset))
        sizes.append(4 * n)
        offset += -(-4 * n // 32) * 32
    head += b"".join(infos)  # joined once: += per tensor was quadratic (13 min for 300,000 headers)
    head += b"\0" * (-len(head) % 32)
    with open(out, "wb") as f:
        f.write(head)
        for (name, data), size in zip(tensors, sizes):
            start = f.tell()
            if isinstance(data, int):
                f.seek(start + size)
            else:
                f.write(np.ascontiguousarray(data, dtype="<f4").tobytes())
            f.seek(start + -(-size // 32) * 32)
        end = f.tell() if pad_last else f.tell() - (-sizes[-1] % 32)
        f.truncate(end)
    return out


def entry_arrays(entries: list[tuple[str, int]], *, seed: int = 0, count: float = 37.0
                 ) -> list[tuple[str, np.ndarray]]:
    """``<name>.in_sum2`` and ``<name>.counts`` arrays of every entry, as `write_gguf_imatrix` makes them."""
    rng = np.random.default_rng(seed)
    out: list[tuple[str, np.ndarray]] = []
    for name, ne0 in entries:
        out += [(f"{name}.in_sum2", (rng.gamma(0.5, 2.0, ne0) * count).astype(np.float32)),
                (f"{name}.counts", np.array([count], np.float32))]
    return out


def legacy_bytes(entries: list[tuple[str, int]], *, seed: int = 0, ncall: int = 11) -> bytes:
    """The legacy file's entries, without the optional trailer."""
    rng = np.random.default_rng(seed)
    data = struct.pack("<i", len(entries))
    for name, ne0 in entries:
        raw = name.encode()
        data += struct.pack("<i", len(raw)) + raw + struct.pack("<ii", ncall, ne0)
        data += (rng.gamma(0.5, 2.0, ne0) * ncall).astype("<f4").tobytes()
    return data
