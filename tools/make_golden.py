#!/usr/bin/env python3
"""Regenerate the golden quantization data in tests/data/golden/ with ggml itself.

Source of truth: ggml as vendored by llama-cpp-python 0.3.36 (llama.cpp's ggml, ``ggml/src/ggml.c``), function
``ggml_quantize_chunk(type, src, dst, start=0, nrows, n_per_row, imatrix=NULL)`` — no importance matrix, the path
``llama-quantize`` takes without ``--imatrix``. It is called through ctypes from ``libggml-base.so`` of a llama.cpp
build (``cmake -DBUILD_SHARED_LIBS=ON``; the build ``.ci/run`` makes puts it in ``<build>/bin``).

Outputs:
- ``tests/data/golden/large/<TYPE>.npz``: ``q`` (uint8 [rows, row_bytes], ggml's bytes) for ``rows`` x ``n`` inputs
  regenerated from ``seed`` by ``fixtures/golden_weights.realistic_weights`` (``x_sha256`` pins the input bits).
- ``tests/data/golden/quants/<TYPE>__extremes.npz`` (with ``--extremes``): ``x`` from `extreme_rows` (zeros,
  -0.0, subnormals, values whose block scale is subnormal, near-overflow magnitudes, inf and NaN) and ``q``
  from ggml — the inputs where C's results depend on IEEE corner cases and x86's float -> int conversion.
- With ``--check DIR``: every ``DIR/<TYPE>__<family>.npz`` (``x``, ``q``; the small families copied into
  ``tests/data/golden/quants``) is re-quantized by ggml and must give exactly ``q`` — proof that this script calls
  ggml the way those files were made.

Usage: python tools/make_golden.py --lib-dir ~/.cache/dflashkit/llama-build-0.3.36/bin [--check tests/data/golden/quants]
[--extremes tests/data/golden/quants]
"""

from __future__ import annotations

import argparse
import ctypes
import sys
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "fixtures"))
from golden_weights import realistic_weights, sha256  # noqa: E402

LLAMA_CPP_VERSION = "llama-cpp-python 0.3.36 (vendored llama.cpp/ggml)"
# enum ggml_type values (ggml/include/ggml.h) and bytes per block / values per block
GGML_TYPES = {"F16": (1, 2, 1), "Q4_0": (2, 18, 32), "Q5_0": (6, 22, 32), "Q5_1": (7, 24, 32),
              "Q8_0": (8, 34, 32), "Q4_K": (12, 144, 256), "Q5_K": (13, 176, 256), "Q6_K": (14, 210, 256),
              "BF16": (30, 2, 1)}
LARGE_ROWS, LARGE_N = 2048, 256
LARGE_SEEDS = {name: 1000 + i for i, name in enumerate(GGML_TYPES)}


def load_ggml(lib_dir: Path) -> ctypes.CDLL:
    lib = ctypes.CDLL(str(lib_dir / "libggml-base.so"))
    lib.ggml_quantize_chunk.restype = ctypes.c_size_t
    lib.ggml_quantize_chunk.argtypes = [ctypes.c_int, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int64,
                                        ctypes.c_int64, ctypes.c_int64, ctypes.c_void_p]
    return lib


def ggml_quantize(lib: ctypes.CDLL, type_name: str, x: np.ndarray) -> np.ndarray:
    code, type_size, block = GGML_TYPES[type_name]
    x = np.ascontiguousarray(x, dtype=np.float32)
    rows, n = x.shape
    out = np.zeros((rows, n // block * type_size), dtype=np.uint8)
    written = lib.ggml_quantize_chunk(code, x.ctypes.data, out.ctypes.data, 0, rows, n, None)
    assert written == out.nbytes, (type_name, written, out.nbytes)
    return out


def extreme_rows(seed: int = 7, n: int = 256) -> np.ndarray:
    """24 rows of ``n`` float32 values at IEEE corners, 8 kinds x 3 rows (deterministic from ``seed``)."""
    rng = np.random.default_rng(seed)
    normal = lambda scale: rng.standard_normal(n) * scale  # noqa: E731
    kinds = [
        lambda: np.zeros(n),
        lambda: np.where(rng.random(n) < 0.5, -0.0, 0.0),
        lambda: normal(1e-40),  # subnormal inputs
        lambda: normal(3e-38),  # normal inputs whose 32-value scale (amax / 127) is subnormal
        lambda: normal(1e-30),
        lambda: rng.choice([3.4e38, -3.4e38, 1e38, 0.0, 1.0], n),  # near float32's maximum
        lambda: np.where(rng.random(n) < 0.05, rng.choice([np.inf, -np.inf]), normal(1.0)),
        lambda: np.where(rng.random(n) < 0.05, np.nan, normal(1.0)),
    ]
    with np.errstate(over="ignore"):
        return np.array([kind() for kind in kinds for _ in range(3)], dtype=np.float32)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--lib-dir", type=Path, required=True, help="folder holding libggml-base.so")
    ap.add_argument("--out", type=Path, default=ROOT / "tests" / "data" / "golden" / "large")
    ap.add_argument("--check", type=Path, help="folder of <TYPE>__<family>.npz files ggml must reproduce")
    ap.add_argument("--extremes", type=Path, help="folder to write <TYPE>__extremes.npz into (x and ggml's q)")
    args = ap.parse_args()
    lib = load_ggml(args.lib_dir)
    if args.extremes:
        x = extreme_rows()
        for type_name in GGML_TYPES:
            np.savez_compressed(args.extremes / f"{type_name}__extremes.npz", x=x, q=ggml_quantize(lib, type_name, x))
        print(f"wrote {len(GGML_TYPES)} extremes files to {args.extremes}")
    if args.check:
        files = sorted(args.check.glob("*__*.npz"))
        bad = []
        for path in files:
            with np.load(path) as z:
                if not np.array_equal(ggml_quantize(lib, path.name.split("__")[0], z["x"]), z["q"]):
                    bad.append(path.name)
        print(f"checked {len(files)} files against ggml: {len(bad)} differ {bad}")
        if bad or not files:
            return 1
    args.out.mkdir(parents=True, exist_ok=True)
    for type_name, seed in LARGE_SEEDS.items():
        x = realistic_weights(seed, LARGE_ROWS, LARGE_N)
        q = ggml_quantize(lib, type_name, x)
        np.savez_compressed(args.out / f"{type_name}.npz", q=q, seed=np.int64(seed), rows=np.int64(LARGE_ROWS),
                            n=np.int64(LARGE_N), x_sha256=np.array(sha256(x)), source=np.array(
                                f"{LLAMA_CPP_VERSION}, ggml_quantize_chunk, no imatrix"))
        print(f"{type_name}: {q.shape} from seed {seed}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
