"""Dequantize and fused dequant-matmul throughput, in GB/s, per ggml type and path.

    python benchmarks/kernels.py [--size 4096] [--repeat 7] [--gpu-size 16384] [--types Q8_0,Q4_K,...]

CPU (always): dequantize a --size x --size matrix of random raw blocks (finite fp16 scales) to float32 with
gguf-py's numpy ``gguf.quants.dequantize`` and with ``dflashkit.runtime.kernels.dequantize_torch``, in the same run;
GB/s counts float32 bytes written (the issue's "f32 out" convention) and the ratio is torch / numpy (target >= 2x).
torch runs with its default intra-op threads and again with one thread. Each figure is the best of --repeat.

CUDA (when available): the Triton fused kernel on a --gpu-size square weight, matrix-vector (1 row) and
small-batch (16 and 64 rows) with bf16 activations, timed with CUDA events (median of --repeat x 20 calls after
warm-up); GB/s counts the quantized weight bytes read. The device copy bandwidth is measured in the same run
(a 1 GiB device-to-device copy, bytes read + written) and the mat-vec figure is given as a percentage of it
(target >= 70 %). The reference path on the GPU (dequantize, then matmul) is timed for comparison.
"""

from __future__ import annotations

import argparse
import datetime
import os
import platform
import statistics
import time
from typing import Callable

import numpy as np
import torch
from gguf import GGMLQuantizationType
from gguf.quants import dequantize as gguf_dequantize

from dflashkit.runtime.kernels import QuantizedWeight, dequantize_torch, qmatmul_path
from dflashkit.runtime.kernels.dispatch import reference_qmatmul
from dflashkit.runtime.kernels.testing import random_blocks

CPU_TYPES = ["Q8_0", "Q4_K", "Q5_K", "Q6_K", "Q4_0", "Q5_0", "Q5_1"]
GPU_TYPES = ["Q8_0", "Q4_K", "Q6_K"]


def best_seconds(fn: Callable[[], object], repeat: int) -> float:
    fn()  # warm-up
    best = float("inf")
    for _ in range(repeat):
        t0 = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - t0)
    return best


def cpu_dequantize(size: int, types: list[str], repeat: int) -> None:
    rng = np.random.default_rng(0)
    out_bytes = size * size * 4
    threads = torch.get_num_threads()
    print(f"## CPU dequantize, {size}x{size} -> float32 ({out_bytes / 1e6:.0f} MB out); GB/s of float32 written")
    print(f"{'type':6s} {'numpy':>8s} {f'torch {threads}t':>9s} {'torch 1t':>9s} {'ratio':>6s} {'ratio 1t':>8s}")
    for name in types:
        q = random_blocks(name, size, size, rng, (1e-3, 0.1))
        qt = torch.from_numpy(q)
        qtype = GGMLQuantizationType[name]
        numpy_s = best_seconds(lambda: gguf_dequantize(q, qtype), repeat)
        torch_s = best_seconds(lambda: dequantize_torch(qt, qtype, (size, size)), repeat)
        torch.set_num_threads(1)
        try:
            one_s = best_seconds(lambda: dequantize_torch(qt, qtype, (size, size)), repeat)
        finally:
            torch.set_num_threads(threads)
        gbs = [out_bytes / s / 1e9 for s in (numpy_s, torch_s, one_s)]
        print(f"{name:6s} {gbs[0]:8.2f} {gbs[1]:9.2f} {gbs[2]:9.2f} {numpy_s / torch_s:5.2f}x {numpy_s / one_s:7.2f}x")


def cuda_time(fn: Callable[[], object], repeat: int, inner: int = 20) -> float:
    """Median seconds per call, from CUDA events around ``inner`` back-to-back calls."""
    for _ in range(3):
        fn()
    torch.cuda.synchronize()
    times = []
    for _ in range(repeat):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        for _ in range(inner):
            fn()
        end.record()
        torch.cuda.synchronize()
        times.append(start.elapsed_time(end) / 1e3 / inner)
    return statistics.median(times)


def copy_bandwidth(dev: torch.device, repeat: int, nbytes: int = 1 << 30) -> float:
    """Device-to-device copy GB/s, counting bytes read + written."""
    src = torch.empty(nbytes, dtype=torch.uint8, device=dev)
    dst = torch.empty_like(src)
    return 2 * nbytes / cuda_time(lambda: dst.copy_(src), repeat, inner=5) / 1e9


def cuda_bench(size: int, types: list[str], repeat: int) -> None:
    from dflashkit.runtime.kernels.triton_kernels import qmatmul_triton

    dev = torch.device("cuda")
    copy_gbs = copy_bandwidth(dev, repeat)
    torch.cuda.empty_cache()
    print(f"\n## CUDA: {torch.cuda.get_device_name(dev)}, weight {size}x{size}, bf16 activations")
    print(f"device copy bandwidth (1 GiB device-to-device, read + write): {copy_gbs:.0f} GB/s")
    print(f"{'type':6s} {'rows':>4s} {'path':>9s} {'us':>9s} {'GB/s':>8s} {'% copy':>7s}")
    rng = np.random.default_rng(0)
    for name in types:
        w = QuantizedWeight.from_numpy(random_blocks(name, size, size, rng, (1e-3, 0.1)), name, (size, size),
                                       device=dev)
        assert qmatmul_path(dev, w) == "triton"
        for m in (1, 16, 64):
            x = torch.randn(m, size, device=dev, dtype=torch.bfloat16)
            paths = {"triton": qmatmul_triton, "reference": reference_qmatmul} if m == 1 else {"triton": qmatmul_triton}
            for label, fn in paths.items():
                s = cuda_time(lambda: fn(x, w), repeat)
                gbs = w.data.numel() / s / 1e9
                print(f"{name:6s} {m:4d} {label:>9s} {s * 1e6:9.1f} {gbs:8.0f} {100 * gbs / copy_gbs:6.1f}%")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--size", type=int, default=4096, help="CPU matrix side (multiple of 256)")
    ap.add_argument("--gpu-size", type=int, default=16384, help="GPU weight side (multiple of 256)")
    ap.add_argument("--repeat", type=int, default=7)
    ap.add_argument("--types", default=",".join(CPU_TYPES))
    ap.add_argument("--no-cpu", action="store_true", help="skip the CPU dequantize comparison")
    args = ap.parse_args()
    types = [t.strip().upper() for t in args.types.split(",") if t.strip()]
    load = os.getloadavg()[0] if hasattr(os, "getloadavg") else float("nan")
    print(f"# dflashkit kernels benchmark, {datetime.date.today()}, {platform.processor() or platform.machine()}, "
          f"{os.cpu_count()} CPUs (load average {load:.1f}), torch {torch.__version__}, numpy {np.__version__}")
    if not args.no_cpu:
        cpu_dequantize(args.size, types, args.repeat)
    if torch.cuda.is_available():
        cuda_bench(args.gpu_size, [t for t in types if t in GPU_TYPES], args.repeat)
    else:
        print("\n## CUDA: no CUDA device here; Triton figures not measured")


if __name__ == "__main__":
    main()
