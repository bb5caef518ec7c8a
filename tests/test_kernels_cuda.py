"""The compiled kernels on a CUDA GPU, against gguf-py: the Triton fused dequant-matmul (every supported type,
matrix-vector and tl.dot tiles, fp16 / bf16 / fp32 activations) and the torch dequantizers on the device (bit for
bit). Skipped, with one reason, where no CUDA device or no Triton is present; the same kernels run under Triton's
interpreter on every machine in tests/test_kernels_triton.py.
"""

from __future__ import annotations

import importlib.util

import numpy as np
import pytest
import torch
from gguf import GGMLQuantizationType
from gguf.quants import dequantize

pytestmark = [
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU (the compiled kernels)"),
    pytest.mark.skipif(importlib.util.find_spec("triton") is None, reason="needs triton (pip install -e '.[test]')"),
]

TYPES = {"Q8_0": 4096 + 32, "Q4_K": 4096, "Q6_K": 4096 + 256}  # in_features: a partial last 256-step too
OUT_FEATURES = 1000  # not a multiple of any BLOCK_N: masked rows
REL_TOL = 1e-3


@pytest.fixture(scope="module")
def weights() -> dict[str, tuple[object, torch.Tensor, np.ndarray]]:
    """Per type: the weight on the GPU, its float64 dequantization (gguf-py) on the GPU, the raw blocks."""
    from dflashkit.runtime.kernels import QuantizedWeight
    from dflashkit.quantize import quantize

    rng = np.random.default_rng(2026)
    out = {}
    for qtype, k in TYPES.items():
        raw = quantize((rng.standard_normal((OUT_FEATURES, k)) * 0.05).astype(np.float32), qtype)
        w = QuantizedWeight.from_numpy(raw, qtype, (OUT_FEATURES, k), device="cuda")
        ref = torch.from_numpy(dequantize(raw, GGMLQuantizationType[qtype])).double().cuda()
        out[qtype] = (w, ref, raw)
    return out


@pytest.mark.parametrize("qtype", list(TYPES))
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float32], ids=str)
@pytest.mark.parametrize("m", [1, 7, 16, 64, 200])
def test_compiled_qmatmul_matches_float64(weights: dict, qtype: str, dtype: torch.dtype, m: int) -> None:
    from dflashkit.runtime.kernels.triton_kernels import interpreting, qmatmul_triton

    assert not interpreting(), "unset TRITON_INTERPRET to test the compiled kernels"
    w, ref_w, _ = weights[qtype]
    x = (torch.randn(m, TYPES[qtype], dtype=torch.float64, device="cuda", generator=torch.Generator("cuda").manual_seed(m))
         ).to(dtype)
    ref = x.double() @ ref_w.T
    y32 = qmatmul_triton(x, w, out_dtype=torch.float32)
    y = qmatmul_triton(x, w)
    torch.cuda.synchronize()
    err = y32.double() - ref
    assert (err.norm() / ref.norm()).item() < REL_TOL
    assert (err.abs().max() / ref.abs().max()).item() < REL_TOL
    assert y.dtype == dtype and tuple(y.shape) == (m, OUT_FEATURES)
    # the x.dtype result is the fp32 accumulator rounded: within one ulp of it (plus the subnormal spacing)
    fin = torch.finfo(dtype)
    assert ((y.double() - y32.double()).abs() <= fin.eps * (y32.double().abs() + fin.tiny)).all()


@pytest.mark.parametrize("qtype", list(TYPES))
def test_device_dequantize_is_bit_identical_to_gguf_py(weights: dict, qtype: str) -> None:
    w, _, raw = weights[qtype]
    got = w.dequantize().cpu().numpy()
    want = dequantize(raw, GGMLQuantizationType[qtype]).astype(np.float32)
    assert got.dtype == np.float32 and np.array_equal(got.view(np.uint32), want.view(np.uint32))
