"""Golden vectors: dflashkit.quantize must write exactly ggml's bytes (ggml_quantize_chunk, no imatrix).

Files: tests/data/golden/quants/<TYPE>__<family>.npz with x (float32 [rows, n]) and q (uint8 [rows, row_bytes]),
and tests/data/golden/large/<TYPE>.npz (2,048 rows of realistic bf16 weights regenerated from a seed by
fixtures/golden_weights.py, q made by ggml), all made by llama-cpp-python 0.3.36's vendored ggml
(tools/make_golden.py; tests/data/golden/README.md). A missing folder or file is a failure, not a skip.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

import gguf
import numpy as np
import pytest
from golden_weights import realistic_weights, sha256

from dflashkit.quantize import GGMLQuantizationType, dequantize, get_quant_type, quantize

GOLDEN_DIR = Path(__file__).resolve().parent / "data" / "golden" / "quants"
LARGE_DIR = GOLDEN_DIR.parent / "large"
TYPES = ["F16", "BF16", "Q4_0", "Q5_0", "Q5_1", "Q8_0", "Q4_K", "Q5_K", "Q6_K"]
FAMILIES = ["normal", "uniform", "outliers", "positive", "constant_rows", "zeros_mixed", "bf16_weights", "extremes"]
EXPECTED = [f"{t}__{f}.npz" for t in TYPES for f in FAMILIES]


def _golden_files() -> list[str]:
    found = sorted(p.name for p in GOLDEN_DIR.glob("*__*.npz")) if GOLDEN_DIR.is_dir() else []
    # every expected file is a test case even when missing, so a missing one fails instead of vanishing
    return sorted(set(found) | set(EXPECTED))


def _load(name: str) -> tuple[GGMLQuantizationType, np.ndarray, np.ndarray]:
    path = GOLDEN_DIR / name
    assert path.is_file(), f"golden file missing: {path}"
    with np.load(path) as z:
        x, q = z["x"], z["q"]
    return GGMLQuantizationType[name.split("__")[0]], x, q


def _same_bits(a: np.ndarray, b: np.ndarray) -> bool:
    return a.shape == b.shape and a.dtype == b.dtype and bool((a.view(np.uint32) == b.view(np.uint32)).all())


def test_golden_folder_complete() -> None:
    assert GOLDEN_DIR.is_dir(), f"golden folder missing: {GOLDEN_DIR}"
    missing = [n for n in EXPECTED if not (GOLDEN_DIR / n).is_file()]
    assert not missing, f"golden files missing: {missing}"


@pytest.mark.parametrize("name", _golden_files())
def test_golden_bytes(name: str) -> None:
    qtype, x, q = _load(name)
    assert x.dtype == np.float32 and q.dtype == np.uint8
    with np.errstate(all="ignore"):  # the extremes family overflows on purpose
        out = quantize(x, qtype)
    assert out.dtype == np.uint8 and out.shape == q.shape
    bad_rows = np.flatnonzero((out != q).any(axis=1))
    assert bad_rows.size == 0, f"{name}: rows {bad_rows.tolist()} differ from ggml"


@pytest.mark.parametrize("name", _golden_files())
def test_golden_dequantize_matches_gguf(name: str) -> None:
    qtype, x, q = _load(name)
    ref = gguf.quants.dequantize(q, qtype).astype(np.float32, copy=False)
    assert _same_bits(dequantize(q, qtype), ref)
    mine = quantize(x, qtype)
    assert _same_bits(dequantize(mine, qtype), gguf.quants.dequantize(mine, qtype).astype(np.float32, copy=False))


@pytest.mark.parametrize("tname", TYPES)
def test_golden_shapes_and_threads(tname: str) -> None:
    """Leading dims, a single row and a thread split all give the same bytes as the 2-D call."""
    qtype, x, q = _load(f"{tname}__normal.npz")
    qt = get_quant_type(qtype)
    rows, n = x.shape
    assert qt.row_bytes(n) == q.shape[1]
    assert np.array_equal(quantize(x[:1], tname), q[:1])
    assert np.array_equal(quantize(x[3], tname), q[3])  # 1-D input: one row
    x3 = x[: rows - rows % 2].reshape(2, -1, n)
    assert np.array_equal(quantize(x3, tname), q[: rows - rows % 2].reshape(2, -1, q.shape[1]))
    # many rows (several lane tiles, split across threads) vs one thread
    big = np.tile(x, (12, 1))
    one = quantize(big, tname, threads=1)
    assert np.array_equal(one, np.tile(q, (12, 1)))
    assert np.array_equal(quantize(big, tname, threads=2), one)


@pytest.mark.parametrize("tname", TYPES)
def test_golden_large_realistic_weights(tname: str) -> None:
    """2,048 rows of realistic bf16 weights (outliers, near-constant rows, zeros) per type: ggml's exact bytes."""
    path = LARGE_DIR / f"{tname}.npz"
    assert path.is_file(), f"golden file missing: {path}"
    with np.load(path) as z:
        q, seed, rows, n, x_sha = z["q"], int(z["seed"]), int(z["rows"]), int(z["n"]), str(z["x_sha256"])
        assert "0.3.36" in str(z["source"]) and "ggml_quantize_chunk" in str(z["source"])
    assert rows >= 2048
    x = realistic_weights(seed, rows, n)
    assert sha256(x) == x_sha, "the input recipe no longer regenerates the inputs ggml quantized"
    out = quantize(x, tname)
    assert out.shape == q.shape
    bad_rows = np.flatnonzero((out != q).any(axis=1))
    assert bad_rows.size == 0, f"{tname}: {bad_rows.size} of {rows} rows differ from ggml, first {bad_rows[:8].tolist()}"


def test_q8_0_in_one_call_across_its_passes() -> None:
    """Q8_0 is quantized in passes of 4,096 blocks: one thread over the 16,384 blocks of the large file, and
    a prefix that ends mid-pass, give ggml's bytes."""
    with np.load(LARGE_DIR / "Q8_0.npz") as z:
        q, seed, rows, n = z["q"], int(z["seed"]), int(z["rows"]), int(z["n"])
    blocks = realistic_weights(seed, rows, n).reshape(-1, 32)
    q_blocks = q.reshape(-1, 34)
    assert blocks.shape[0] == 16384
    assert np.array_equal(quantize(blocks, "Q8_0", threads=1), q_blocks)
    assert np.array_equal(quantize(blocks[:9000], "Q8_0", threads=1), q_blocks[:9000])


_GGML_BIN = Path(os.environ.get("DFLASHKIT_LLAMA_CPP_BIN", "/nonexistent"))


@pytest.mark.skipif(
    not (_GGML_BIN / "libggml-base.so").exists(),
    reason=os.environ.get("DFLASHKIT_LLAMA_CPP_SKIP_REASON")
    or "set DFLASHKIT_LLAMA_CPP_BIN to a llama.cpp build (shared libraries) to re-derive the golden files with ggml",
)
def test_golden_files_are_ggmls_own_output() -> None:
    """Every golden file, extremes included, is what ggml_quantize_chunk of the llama.cpp build writes today
    (tools/make_golden.py's call, through ctypes)."""
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tools"))
    try:
        import make_golden
    finally:
        sys.path.pop(0)
    lib = make_golden.load_ggml(_GGML_BIN)
    files = sorted(GOLDEN_DIR.glob("*__*.npz"))
    assert len(files) == len(EXPECTED)
    differ = []
    for path in files:
        with np.load(path) as z, np.errstate(all="ignore"):
            if not np.array_equal(make_golden.ggml_quantize(lib, path.name.split("__")[0], z["x"]), z["q"]):
                differ.append(path.name)
    assert differ == []
