"""Sweep the Triton kernel's launch configuration (weight rows per program, warps, pipeline stages) on a GPU.

    python benchmarks/kernels_tune.py [--gpu-size 16384] [--repeat 5] [--budget-s 240]

For each type (Q8_0, Q4_K, Q6_K) and activation row count (1: matrix-vector; 16 and 64: the tl.dot tile), every
configuration in the grid below is launched on the same random weight with bf16 activations and timed with CUDA
events (median of --repeat x 20 calls after warm-up); its output is checked against the float64 product first
(``tests/test_kernels_cuda.py``'s criterion), so a fast wrong one cannot win. Printed: GB/s of
quantized weight read and % of the device copy bandwidth measured in the same run, the current configuration
marked. The sweep stops at --budget-s and prints what it has (a lent GPU's time is short).
"""

from __future__ import annotations

import argparse
import itertools
import time

import numpy as np
import torch

from dflashkit.runtime.kernels import QuantizedWeight
from dflashkit.runtime.kernels import triton_kernels as tk
from dflashkit.runtime.kernels.testing import random_blocks
from kernels import copy_bandwidth, cuda_time

MATVEC_GRID = {"BLOCK_N": (4, 8, 16, 32), "num_warps": (1, 2, 4), "num_stages": (2, 4)}
DOT_GRID = {"BLOCK_N": (16, 32, 64), "num_warps": (4, 8), "num_stages": (2, 3)}


def launch(x: torch.Tensor, w: QuantizedWeight, bn: int, warps: int, stages: int | None) -> torch.Tensor:
    """One call of the kernel with an explicit configuration (the same arguments qmatmul_triton passes)."""
    n, k = w.shape
    m = x.shape[0]
    out = torch.empty((m, n), dtype=torch.float32, device=x.device)  # fp32: compare without bf16 rounding
    bm = tk.block_m_for(m)
    extra = {} if stages is None else {"num_stages": stages}
    tk._src().qmm_kernel[(-(-n // bn), -(-m // bm))](
        x, w.data, out, m, n, k, w.data.stride(0), x.stride(0), out.stride(0), QTYPE=int(w.ggml_type),
        BLOCK_M=bm, BLOCK_N=bn, SPLIT=True, DOT_PRECISION=tk.DOT_PRECISION, num_warps=warps, **extra)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--gpu-size", type=int, default=16384)
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--types", default="Q8_0,Q4_K,Q6_K")
    ap.add_argument("--rows", default="1,16,64")
    ap.add_argument("--budget-s", type=float, default=240.0)
    args = ap.parse_args()
    t_end = time.monotonic() + args.budget_s
    dev = torch.device("cuda")
    size = args.gpu_size
    copy_gbs = copy_bandwidth(dev, args.repeat)
    torch.cuda.empty_cache()
    print(f"# {torch.cuda.get_device_name(dev)}: copy {copy_gbs:.0f} GB/s; weight {size}x{size}, bf16 activations")
    rng = np.random.default_rng(0)
    for name in args.types.split(","):
        w = QuantizedWeight.from_numpy(random_blocks(name, size, size, rng, (1e-3, 0.1)), name, (size, size),
                                       device=dev)
        ref_w = w.dequantize().double()  # bit-identical to gguf-py's dequantize (tests/test_kernels_cuda.py)
        for m in (int(r) for r in args.rows.split(",")):
            x = torch.randn(m, size, device=dev, dtype=torch.bfloat16)
            ref = x.double() @ ref_w.T
            current = tk.MATVEC_CONFIG[w.ggml_type] if m == 1 else tk.DOT_CONFIG[tk.block_m_for(m)]
            grid = MATVEC_GRID if m == 1 else DOT_GRID
            results = []
            for bn, warps, stages in itertools.product(*grid.values()):
                if time.monotonic() > t_end:
                    print("budget spent; stopping")
                    break
                try:
                    got = launch(x, w, bn, warps, stages)
                except Exception as e:  # a configuration that does not compile (registers, shared memory)
                    print(f"{name} m={m} BN={bn} warps={warps} stages={stages}: {type(e).__name__}")
                    continue
                # tests/test_kernels_cuda.py's criterion against the float64 product
                if float((got.double() - ref).abs().max() / ref.abs().max()) >= 1e-3:
                    print(f"{name} m={m} BN={bn} warps={warps} stages={stages}: WRONG OUTPUT")
                    continue
                s = cuda_time(lambda: launch(x, w, bn, warps, stages), args.repeat)
                results.append((w.data.numel() / s / 1e9, bn, warps, stages))
            results.sort(reverse=True)
            base_s = cuda_time(lambda: tk.qmatmul_triton(x, w), args.repeat)
            base = w.data.numel() / base_s / 1e9
            print(f"{name} m={m}: in use {current} {base:.0f} GB/s ({100 * base / copy_gbs:.1f}%); best:")
            for gbs, bn, warps, stages in results[:4]:
                print(f"    BN={bn:3d} warps={warps} stages={stages}  {gbs:6.0f} GB/s  {100 * gbs / copy_gbs:5.1f}%")
            if time.monotonic() > t_end:
                return


if __name__ == "__main__":
    main()
