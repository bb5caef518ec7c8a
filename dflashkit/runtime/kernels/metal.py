"""Fused dequant + matrix-vector on Apple GPUs (MPS) through ``torch.mps.compile_shader``.

The Metal Shading Language source lives in ``metal/*.metal`` (shipped as package data) and mirrors the Triton
kernel's structure; it is compiled once per process on first use. It cannot run on Linux: ``available()``
says why, and the dispatcher then falls back to the reference path with a one-line notice.
"""

from __future__ import annotations

import functools
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch
from gguf import GGMLQuantizationType

from dflashkit.errors import DFlashError

if TYPE_CHECKING:
    from . import QuantizedWeight

SHADER_DIR = Path(__file__).with_name("metal")
KERNELS = {
    GGMLQuantizationType.Q8_0: "qmv_q8_0",
    GGMLQuantizationType.Q4_K: "qmv_q4_k",
    GGMLQuantizationType.Q6_K: "qmv_q6_k",
}
SUPPORTED_TYPES = frozenset(KERNELS)
SIMD_WIDTH = 32  # one simdgroup per output element


def source() -> str:
    """The Metal source compiled for the kernels: every ``metal/*.metal`` file, in name order."""
    files = sorted(SHADER_DIR.glob("*.metal"))
    if not files:
        raise DFlashError(f"no Metal shader sources in {SHADER_DIR} (package data missing from the install?)")
    return "\n".join(f.read_text(encoding="utf-8") for f in files)


@functools.lru_cache(maxsize=1)
def _library() -> Any:
    return torch.mps.compile_shader(source())


def available() -> tuple[bool, str]:
    """(True, "") when the Metal kernels can run here, else (False, why) in a few words."""
    if not torch.backends.mps.is_available():
        return False, "MPS is not available on this machine"
    if not hasattr(torch.mps, "compile_shader"):
        return False, f"torch {torch.__version__} has no torch.mps.compile_shader (needs torch >= 2.6)"
    try:
        _library()
    except Exception as e:  # compile errors are multi-line: keep the first
        first = (str(e).strip().splitlines() or [type(e).__name__])[0]
        return False, f"the Metal shader failed to compile ({first})"
    return True, ""


def qmatmul_metal(x: torch.Tensor, w: "QuantizedWeight") -> torch.Tensor:
    """``x [..., K] @ W.T`` on MPS: one matrix-vector dispatch over all rows of ``x``; result in ``x.dtype``."""
    name = KERNELS.get(w.ggml_type)
    if name is None:
        raise DFlashError(f"no Metal kernel for {w.ggml_type.name} weights")
    n, k = w.shape
    lead = x.shape[:-1]
    # Activations are small next to the weight: widen them to float32 here so the shader needs no bfloat
    # (Metal 3.1) variant.
    x2 = x.reshape(-1, k).to(torch.float32).contiguous()
    m = x2.shape[0]
    out = torch.empty((m, n), dtype=torch.float32, device=x.device)
    if m and n:
        dims = torch.tensor([m, n, k, w.row_bytes], dtype=torch.int32, device=x.device)
        getattr(_library(), name)(out, w.data.contiguous(), x2, dims,
                                  threads=[SIMD_WIDTH * n, m, 1], group_size=[SIMD_WIDTH, 1, 1])
    return out.to(x.dtype).reshape(*lead, n)
