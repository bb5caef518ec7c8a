"""Quantize a 4096x4096 float32 matrix to each ggml type and print MB/s (float32 bytes in).

    python benchmarks/quantize.py [--size 4096] [--threads N] [--repeat 3]

Numba compiles each kernel on first use (and caches it on disk); a warm-up call on a small slice runs before
timing, so JIT compile time is excluded. Each figure is the best of --repeat runs.

Reference: ggml's reference quantizer, single-threaded, measured in this run through ``ggml_quantize_chunk``
from llama-cpp-python's bundled libggml (or the library named by $DFLASHKIT_GGML_LIB) when one loads;
otherwise the figures last measured on this machine are printed, labelled as such.
"""

from __future__ import annotations

import argparse
import ctypes
import os
import time
from typing import Callable

import numpy as np

from dflashkit.quantize import GGMLQuantizationType, get_num_threads, get_quant_type, quantize

TYPES = ["Q8_0", "Q4_K", "Q5_K", "Q6_K", "Q4_0", "Q5_0", "Q5_1", "F16", "BF16"]
REF_TYPES = ["Q8_0", "Q4_K", "Q6_K"]
# ggml reference quantizer, one thread, last measured on this machine (not this run)
LAST_MEASURED_REF = {"Q8_0": 460.0, "Q6_K": 133.0, "Q4_K": 62.0}


def best_rate(fn: Callable[[], object], nbytes: int, repeat: int) -> float:
    best = float("inf")
    for _ in range(repeat):
        t0 = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - t0)
    return nbytes / best / 1e6


def _ggml_quantize_chunk() -> Callable[..., int] | None:
    """ggml_quantize_chunk from $DFLASHKIT_GGML_LIB (a libggml-base / libggml path) or llama-cpp-python's libggml."""
    try:
        path = os.environ.get("DFLASHKIT_GGML_LIB")
        if path:
            lib = ctypes.CDLL(path)
        else:
            from llama_cpp import _ggml  # type: ignore[import-not-found]

            lib = _ggml.libggml
        fn = lib.ggml_quantize_chunk
    except Exception:
        return None
    # size_t ggml_quantize_chunk(enum ggml_type, const float * src, void * dst, int64_t start,
    #                            int64_t nrows, int64_t n_per_row, const float * imatrix)
    fn.argtypes = [ctypes.c_int, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int64, ctypes.c_int64,
                   ctypes.c_int64, ctypes.c_void_p]
    fn.restype = ctypes.c_size_t
    return fn


def measure_ggml_reference(x: np.ndarray, repeat: int) -> dict[str, float] | None:
    """ggml's reference quantizer on one thread (ggml_quantize_chunk), or None if no ggml library loads."""
    fn = _ggml_quantize_chunk()
    if fn is None:
        return None
    rows, n = x.shape
    out: dict[str, float] = {}
    for name in REF_TYPES:
        dst = np.empty((rows, get_quant_type(name).row_bytes(n)), dtype=np.uint8)
        args = (int(GGMLQuantizationType[name]), x.ctypes.data, dst.ctypes.data, 0, rows, n, None)
        try:
            fn(*args)
            if not np.array_equal(dst[:4], quantize(x[:4], name)):
                print(f"warning: ggml library output differs from dflashkit for {name}")
        except Exception:
            return None
        out[name] = best_rate(lambda: fn(*args), x.nbytes, repeat)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--size", type=int, default=4096, help="matrix is size x size float32 (multiple of 256)")
    ap.add_argument("--threads", type=int, default=None, help="threads (default: all usable cores)")
    ap.add_argument("--repeat", type=int, default=3, help="best of this many runs per type")
    args = ap.parse_args()

    threads = args.threads or get_num_threads()
    x = (np.random.default_rng(0).standard_normal((args.size, args.size), dtype=np.float32) * 0.02)
    print(f"matrix {args.size}x{args.size} float32 ({x.nbytes / 1e6:.1f} MB in), threads used: {threads}, "
          f"best of {args.repeat}; JIT compile excluded (warm-up call first)")

    rates: dict[str, float] = {}
    for name in TYPES:
        quantize(x[:2], name, threads=1)  # warm-up: compile or load the numba cache
        rates[name] = best_rate(lambda: quantize(x, name, threads=threads), x.nbytes, args.repeat)

    ref = measure_ggml_reference(x, args.repeat)
    if ref is not None:
        ref_label = "ggml reference, 1 thread, measured in this run"
    else:
        ref = LAST_MEASURED_REF
        ref_label = "ggml reference, 1 thread: last measured on this machine, not this run"

    print(f"\n{'type':6} {'MB/s':>9} {'MB/s/thread':>12}   {'ref MB/s':>9} {'ratio':>7} {'ratio/thread':>13}")
    for name in TYPES:
        r = rates[name]
        line = f"{name:6} {r:9.0f} {r / threads:12.0f}"
        if name in ref:
            line += f"   {ref[name]:9.0f} {r / ref[name]:6.2f}x {r / threads / ref[name]:12.2f}x"
        print(line)
    print(f"\nref = {ref_label}.")
    print("ratio = our MB/s over the reference; ratio/thread = per thread used (target >= 1.0).")


if __name__ == "__main__":
    main()
