"""Fused dequant + matmul on CUDA with Triton, for Q8_0, Q4_K and Q6_K weights.

Triton is imported lazily (``_triton_qmm`` holds the kernel source): this module imports, and ``available()``
answers, without it. Set ``TRITON_INTERPRET=1`` before the first call to run the same kernels on CPU tensors
with Triton's interpreter (how CI tests them without a GPU).
"""

from __future__ import annotations

import functools
import importlib.util
import os
from types import ModuleType
from typing import TYPE_CHECKING

import torch
from gguf import GGMLQuantizationType

from dflashkit.errors import DFlashError

if TYPE_CHECKING:
    from . import QuantizedWeight

SUPPORTED_TYPES = frozenset({GGMLQuantizationType.Q8_0, GGMLQuantizationType.Q4_K, GGMLQuantizationType.Q6_K})
ACTIVATION_DTYPES = frozenset({torch.float16, torch.bfloat16, torch.float32})

# float32 activations: one tl.dot on fp32 operands; "tf32x3" splits each into tf32 hi + lo on the tensor cores
# (~fp32 accuracy). Plain "tf32" would round the weights to 10 mantissa bits (relative error ~3e-4 per product),
# too close to the 1e-3 parity budget. fp16 / bf16 activations use the cheaper SPLIT path (see _triton_qmm).
DOT_PRECISION = "tf32x3"
# (BLOCK_N weight rows per program, num_warps, num_stages), from `benchmarks/kernels_tune.py` on an H200
# (2026-11-26, Triton 3.6; figures in benchmarks/KERNELS.md). Matrix-vector per type; the tl.dot tile by BLOCK_M.
# Keep Q4_K at BLOCK_N >= 16: compiled by Triton 3.6, BLOCK_N 4 and 8 gave wrong Q4_K results on an H200 (the
# interpreter computes them exactly), so it is a compiler matter, not yet reduced to a report.
MATVEC_CONFIG = {
    GGMLQuantizationType.Q8_0: (8, 2, 2),
    GGMLQuantizationType.Q4_K: (32, 2, 4),
    GGMLQuantizationType.Q6_K: (16, 2, 4),
}
DOT_CONFIG = {16: (64, 4, 3), 32: (32, 4, 2), 64: (32, 4, 2)}


def interpreting() -> bool:
    """Whether Triton runs its CPU interpreter (``TRITON_INTERPRET=1``)."""
    return os.environ.get("TRITON_INTERPRET", "0").strip() not in ("", "0")


@functools.lru_cache(maxsize=1)
def installed() -> bool:
    """Whether the ``triton`` package can be imported (looked up, not imported)."""
    return importlib.util.find_spec("triton") is not None


def available(device: torch.device | str) -> bool:
    """Whether the Triton path can run on ``device``: CUDA with triton installed, or any CPU under the interpreter."""
    dev = torch.device(device)
    if not installed():
        return False
    if dev.type == "cuda":
        return True
    return dev.type == "cpu" and interpreting()


@functools.lru_cache(maxsize=1)
def _src() -> ModuleType:
    from . import _triton_qmm  # imports triton

    return _triton_qmm


def block_m_for(m: int) -> int:
    """Activation rows per program: 1 (matrix-vector) or a tl.dot tile of 16, 32 or 64 rows."""
    if m == 1:
        return 1
    return 16 if m <= 16 else 32 if m <= 32 else 64


def qmatmul_triton(x: torch.Tensor, w: "QuantizedWeight", out_dtype: torch.dtype | None = None) -> torch.Tensor:
    """``x [..., K] @ W.T`` with W expanded inside the kernel; float32 accumulation, result in ``out_dtype``
    (default ``x.dtype``). ``x`` and ``w.data`` must be on the same CUDA device (CPU under the interpreter)."""
    if w.ggml_type not in SUPPORTED_TYPES:
        raise DFlashError(f"no Triton kernel for {w.ggml_type.name} weights "
                          f"(supported: {', '.join(t.name for t in sorted(SUPPORTED_TYPES))})")
    if x.dtype not in ACTIVATION_DTYPES:
        raise DFlashError(f"Triton qmatmul needs float16, bfloat16 or float32 activations, got {x.dtype}")
    n, k = w.shape
    if x.shape[-1] != k:
        raise DFlashError(f"qmatmul: activations have {x.shape[-1]} features, the weight expects {k}")
    if x.device != w.data.device:
        raise DFlashError(f"qmatmul: activations on {x.device}, weight on {w.data.device}")
    lead = x.shape[:-1]
    x2 = x.reshape(-1, k)
    if x2.stride(-1) != 1:
        x2 = x2.contiguous()
    m = x2.shape[0]
    out = torch.empty((m, n), dtype=out_dtype or x.dtype, device=x.device)
    if m == 0 or n == 0:
        return out.reshape(*lead, n)
    src = _src()
    bm = block_m_for(m)
    bn, warps, stages = MATVEC_CONFIG[w.ggml_type] if bm == 1 else DOT_CONFIG[bm]
    # Triton's interpreter multiplies bf16 tl.dot operands as raw uint16 bits, so there the bf16 tile takes
    # the fp32 dot instead; the split itself is exercised with fp16.
    split = x2.dtype == torch.float16 or (x2.dtype == torch.bfloat16 and not interpreting())
    grid = (-(-n // bn), -(-m // bm))
    data = w.data if w.data.is_contiguous() else w.data.contiguous()
    src.qmm_kernel[grid](x2, data, out, m, n, k, data.stride(0), x2.stride(0), out.stride(0),
                         QTYPE=int(w.ggml_type), BLOCK_M=bm, BLOCK_N=bn, SPLIT=split,
                         DOT_PRECISION=DOT_PRECISION, num_warps=warps, num_stages=stages)
    return out.reshape(*lead, n)
