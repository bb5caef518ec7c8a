"""dflashkit.runtime.kernels dispatch on CPU: path choice, reference results, and the Metal / Triton fallbacks (simulated)."""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
import warnings
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from gguf import GGMLQuantizationType

from dflashkit.errors import DFlashError
from dflashkit.runtime.kernels import QuantizedWeight, dequantize_torch, qmatmul, qmatmul_path
from dflashkit.runtime.kernels import dispatch, metal, triton_kernels
from dflashkit.runtime.kernels.testing import random_blocks
from dflashkit.quantize import quantize

TYPES = ["Q8_0", "Q4_K", "Q5_K", "Q6_K", "Q4_0", "Q5_0", "Q5_1", "F16", "BF16", "F32"]
FUSED = ["Q8_0", "Q4_K", "Q6_K"]


def make_weight(type_name: str, out_f: int = 24, in_f: int = 512, seed: int = 0) -> QuantizedWeight:
    rng = np.random.default_rng(seed)
    w = rng.standard_normal((out_f, in_f)).astype(np.float32) * 0.05
    return QuantizedWeight.from_numpy(quantize(w, type_name), type_name, (out_f, in_f))


@pytest.fixture(autouse=True)
def fresh_notices() -> Any:
    torch.manual_seed(0)  # every torch.randn below is seeded
    dispatch.reset_notices()
    metal._library.cache_clear()
    yield
    dispatch.reset_notices()
    metal._library.cache_clear()
    triton_kernels.installed.cache_clear()


@pytest.mark.parametrize("type_name", TYPES)
def test_cpu_picks_reference_and_matches_dequantize_then_matmul(type_name: str) -> None:
    w = make_weight(type_name)
    x = torch.randn(5, 512)
    assert qmatmul_path(x.device, w) == "reference"
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # the CPU path is not a fallback: no notice
        y = qmatmul(x, w)
    want = x @ dequantize_torch(w.data, w.ggml_type, w.shape).T
    assert torch.equal(y, want)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float32, torch.float64])
@pytest.mark.parametrize("lead", [(), (3,), (2, 4)])
def test_shapes_and_dtypes(dtype: torch.dtype, lead: tuple[int, ...]) -> None:
    w = make_weight("Q4_K")
    x = torch.randn(*lead, 512).to(dtype)
    y = qmatmul(x, w)
    assert y.shape == (*lead, 24) and y.dtype == dtype
    ref = x.double() @ dequantize_torch(w.data, w.ggml_type, w.shape).double().T
    tol = {torch.float16: 2e-3, torch.bfloat16: 1e-2}.get(dtype, 1e-5)
    assert torch.allclose(y.double(), ref, rtol=tol, atol=tol * ref.abs().max().item())


@pytest.mark.parametrize("x, match", [
    (torch.randn(3, 256), r"need \[\.\.\., 512\]"),
    (torch.randn(()), "do not match"),
    (torch.ones(3, 512, dtype=torch.int32), "floating-point"),
    (torch.randn(3, 512, device="meta"), "QuantizedWeight.to"),
])
def test_bad_activations(x: torch.Tensor, match: str) -> None:
    with pytest.raises(DFlashError, match=match):
        qmatmul(x, make_weight("Q8_0"))


def test_needs_a_quantized_weight() -> None:
    with pytest.raises(DFlashError, match="QuantizedWeight"):
        qmatmul(torch.randn(2, 4), torch.randn(4, 4))  # type: ignore[arg-type]


def one_notice(caught: list[warnings.WarningMessage]) -> str:
    notices = [str(c.message) for c in caught if issubclass(c.category, RuntimeWarning)]
    assert len(notices) == 1, notices
    assert "\n" not in notices[0]
    return notices[0]


@pytest.mark.parametrize("type_name", FUSED)
def test_mps_unavailable_falls_back_with_one_notice(type_name: str) -> None:
    """On this Linux machine MPS is absent: an "mps" device takes the reference path, noticed once per process."""
    assert not torch.backends.mps.is_available()
    w = make_weight(type_name)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        assert qmatmul_path("mps", w) == "reference"
        assert qmatmul_path(torch.device("mps"), w) == "reference"
    msg = one_notice(caught)
    assert "Metal" in msg and "MPS is not available" in msg and "reference" in msg


def test_metal_shader_failure_falls_back(monkeypatch: pytest.MonkeyPatch) -> None:
    """MPS present but the shader does not compile (e.g. an old macOS): reference path, first error line shown."""
    def broken(source: str) -> None:
        raise RuntimeError("program_source:12:5: error: use of undeclared identifier 'simd_sum'\nmore detail")

    monkeypatch.setattr(torch.backends.mps, "is_available", lambda: True)
    monkeypatch.setattr(torch.mps, "compile_shader", broken, raising=False)
    w = make_weight("Q6_K")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        assert qmatmul_path("mps", w) == "reference"
        assert qmatmul_path("mps", w) == "reference"
    msg = one_notice(caught)
    assert "failed to compile" in msg and "simd_sum" in msg and "more detail" not in msg


class FakeShaderLibrary:
    """Stands in for torch.mps.compile_shader's library: records the call and computes what the shader would."""

    def __init__(self) -> None:
        self.calls: list[dict[str, Any]] = []

    def __getattr__(self, name: str) -> Any:
        if not name.startswith("qmv_"):
            raise AttributeError(name)
        ggml_type = {v: k for k, v in metal.KERNELS.items()}[name]

        def kernel(out: torch.Tensor, w: torch.Tensor, x: torch.Tensor, dims: torch.Tensor,
                   threads: list[int], group_size: list[int]) -> None:
            m, n, k, rb = dims.tolist()
            self.calls.append(dict(name=name, dims=(m, n, k, rb), threads=threads, group_size=group_size,
                                   x_dtype=x.dtype, out_dtype=out.dtype))
            out.copy_(x @ dequantize_torch(w, ggml_type, (n, k)).T)

        return kernel


@pytest.mark.parametrize("type_name", FUSED)
def test_metal_path_when_the_shader_compiles(type_name: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """Simulated MPS: the dispatcher picks Metal, and the wrapper launches one simdgroup per output element."""
    lib = FakeShaderLibrary()
    sources: list[str] = []
    monkeypatch.setattr(torch.backends.mps, "is_available", lambda: True)
    monkeypatch.setattr(torch.mps, "compile_shader", lambda src: sources.append(src) or lib, raising=False)
    w = make_weight(type_name)
    assert qmatmul_path("mps", w) == "metal"
    x = torch.randn(3, 512, dtype=torch.float16)
    y = metal.qmatmul_metal(x, w)
    assert y.dtype == torch.float16 and y.shape == (3, 24)
    call = lib.calls[0]
    assert call["name"] == metal.KERNELS[w.ggml_type] and call["dims"] == (3, 24, 512, w.row_bytes)
    assert call["threads"] == [32 * 24, 3, 1] and call["group_size"] == [32, 1, 1]
    assert call["x_dtype"] == torch.float32 and call["out_dtype"] == torch.float32
    want = (x.float() @ dequantize_torch(w.data, w.ggml_type, w.shape).T).half()
    assert torch.equal(y, want)
    assert sources == [metal.source()]


def test_metal_sources_are_package_data() -> None:
    files = sorted(metal.SHADER_DIR.glob("*.metal"))
    assert files, f"no .metal files in {metal.SHADER_DIR}"
    pyproject = (Path(__file__).resolve().parents[1] / "pyproject.toml").read_text()
    assert '"**/*.metal"' in pyproject
    src = metal.source()
    for name in metal.KERNELS.values():
        assert f"QMV_KERNEL({name}," in src


def test_cuda_without_triton_falls_back(monkeypatch: pytest.MonkeyPatch) -> None:
    """Triton absent (simulated by hiding the module): CUDA devices take the reference path, with one notice."""
    monkeypatch.setitem(sys.modules, "triton", None)
    triton_kernels.installed.cache_clear()
    assert not triton_kernels.installed()
    w = make_weight("Q4_K")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        assert qmatmul_path("cuda", w) == "reference"
        assert qmatmul_path("cuda:0", w) == "reference"
    assert "pip install 'dflashkit[triton]'" in one_notice(caught)
    assert not triton_kernels.available("cuda")


def test_cuda_path_choice(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(triton_kernels, "installed", lambda: True)
    for name in FUSED:
        assert qmatmul_path("cuda", make_weight(name)) == "triton"
    dispatch.reset_notices()
    for name in ["Q5_K", "Q4_0", "IQ4_XS"]:  # no fused kernel: the reference path on the GPU, said once per type
        with pytest.warns(RuntimeWarning, match=f"no Triton kernel for {name}, so its matmuls on CUDA dequantize, "
                                                "then multiply"):
            assert qmatmul_path("cuda", make_weight(name)) == "reference"
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            assert qmatmul_path("cuda", make_weight(name)) == "reference"  # once per process
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert qmatmul_path("cuda", make_weight("F16")) == "reference"  # a plain float weight: nothing to say
    assert qmatmul_path("cpu", make_weight("Q4_K")) == "reference"
    assert qmatmul_path("meta", make_weight("Q4_K")) == "reference"


def test_triton_module_imports_without_triton(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "triton", None)
    triton_kernels.installed.cache_clear()
    assert triton_kernels.block_m_for(1) == 1 and triton_kernels.block_m_for(40) == 64
    w = make_weight("Q8_0")
    assert torch.equal(qmatmul(torch.ones(2, 512), w), dispatch.reference_qmatmul(torch.ones(2, 512), w))


def test_random_block_weights() -> None:
    """Weights straight from random bytes (not from the quantizer) also go through the reference path."""
    q = random_blocks("Q5_1", 8, 96, np.random.default_rng(1), (1e-3, 1e-1))
    w = QuantizedWeight.from_numpy(q, GGMLQuantizationType.Q5_1, (8, 96))
    x = torch.randn(4, 96)
    assert torch.equal(qmatmul(x, w), x @ w.dequantize().T)


# ------------------------------------------------------------------ the Metal shader's arithmetic, on the host
# Metal cannot run here, but the shader is plain C++-like code: with a few macros for the address-space
# keywords and a sequential stand-in for simd_sum, g++ compiles it and runs every (row, lane) on the CPU.
HOST_SHIM = r"""
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <vector>
#define kernel extern "C"
#define device
#define constant const
#define thread
typedef unsigned char uchar; typedef unsigned int uint; typedef unsigned long ulong; typedef _Float16 half;
struct uint2 { uint x, y; };
static float g_simd;  // lanes run 31 .. 0 in turn; lane 0, last, gets the full sum as from simd_sum
namespace metal { inline float simd_sum(float v) { g_simd += v; return g_simd; } }
"""
HOST_MAIN = r"""
typedef void (*qmv_fn)(float*, const uchar*, const float*, const int*, uint2, uint);
int main(int argc, char** argv) {
    qmv_fn fn = !strcmp(argv[1], "qmv_q8_0") ? qmv_q8_0 : !strcmp(argv[1], "qmv_q4_k") ? qmv_q4_k : qmv_q6_k;
    int dims[4]; for (int i = 0; i < 4; ++i) dims[i] = atoi(argv[2 + i]);
    int M = dims[0], N = dims[1], K = dims[2], rb = dims[3];
    std::vector<uchar> w((size_t)N * rb); std::vector<float> x((size_t)M * K), out((size_t)M * N);
    FILE* f = fopen(argv[6], "rb"); if (fread(w.data(), 1, w.size(), f) != w.size()) return 2; fclose(f);
    f = fopen(argv[7], "rb"); if (fread(x.data(), 4, x.size(), f) != x.size()) return 2; fclose(f);
    for (int m = 0; m < M; ++m) for (int n = 0; n < N; ++n) {
        g_simd = 0.0f;
        for (int lane = 31; lane >= 0; --lane) fn(out.data(), w.data(), x.data(), dims, uint2{(uint)n, (uint)m}, lane);
    }
    f = fopen(argv[8], "wb"); fwrite(out.data(), 4, out.size(), f); fclose(f);
    return 0;
}
"""


@pytest.fixture(scope="module")
def metal_on_host(tmp_path_factory: pytest.TempPathFactory) -> Path:
    gxx = shutil.which("g++")
    if gxx is None:
        pytest.skip("g++ not found: cannot emulate the Metal shader on the host")
    src = re.sub(r"\[\[[a-z_]+(\(\d+\))?\]\]", "", metal.source())  # drop [[buffer(0)]]-style attributes
    src = src.replace("#include <metal_stdlib>", HOST_SHIM)
    d = tmp_path_factory.mktemp("metal_host")
    (d / "qmv.cpp").write_text(src + HOST_MAIN)
    proc = subprocess.run([gxx, "-std=c++17", "-O1", "-o", str(d / "qmv"), str(d / "qmv.cpp")],
                          capture_output=True, text=True)
    assert proc.returncode == 0, f"the Metal source does not compile as host C++:\n{proc.stderr[-3000:]}"
    return d / "qmv"


@pytest.mark.parametrize("type_name, in_f", [("Q8_0", 288), ("Q4_K", 512), ("Q6_K", 512)])
def test_metal_shader_arithmetic_on_host(metal_on_host: Path, type_name: str, in_f: int, tmp_path: Path) -> None:
    rng = np.random.default_rng(11)
    q = random_blocks(type_name, 9, in_f, rng, (1e-3, 0.1))
    w = QuantizedWeight.from_numpy(q, type_name, (9, in_f))
    x = rng.standard_normal((3, in_f)).astype(np.float32)
    q.tofile(tmp_path / "w.bin")
    x.tofile(tmp_path / "x.bin")
    args = [str(metal_on_host), metal.KERNELS[w.ggml_type], "3", "9", str(in_f), str(w.row_bytes),
            str(tmp_path / "w.bin"), str(tmp_path / "x.bin"), str(tmp_path / "out.bin")]
    subprocess.run(args, check=True, timeout=60)
    got = np.fromfile(tmp_path / "out.bin", dtype=np.float32).reshape(3, 9)
    ref = x.astype(np.float64) @ w.dequantize().double().numpy().T
    rel = np.linalg.norm(got - ref) / np.linalg.norm(ref)
    assert rel < 1e-5, rel
