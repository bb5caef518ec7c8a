"""The Triton fused dequant-matmul kernels, run by Triton's CPU interpreter (TRITON_INTERPRET=1) on small shapes.

The interpreter is chosen when kernels are first compiled, so the cases run in one child process started with
TRITON_INTERPRET=1 (nothing leaks into this process); each parametrized test then checks its own case. Inputs
are fresh random data on every run (the seed is printed on failure); the reference is gguf-py's dequantize,
then a float64 matmul.
"""

from __future__ import annotations

import importlib.util
import json
import os
import secrets
import subprocess
import sys
from typing import Any

import pytest

TYPES = {"Q8_0": 288, "Q4_K": 512, "Q6_K": 512}  # in_features; Q8_0's 288 ends mid-way through a 256 step
OUT_FEATURES = 40  # not a multiple of any BLOCK_N: masked rows
CASES = [(t, dt, m) for t in TYPES for dt in ("float16", "bfloat16") for m in (1, 3, 16, 40, 64)]
CASES += [(t, "float32", m) for t in TYPES for m in (1, 24)]
REL_TOL = 1e-3
INSTALL_HINT = "pip install triton  (it is in the test extra: pip install -e '.[test]')"


def case_id(case: tuple[str, str, int]) -> str:
    return f"{case[0]}-{case[1]}-M{case[2]}"


def run_cases(seed: int) -> dict[str, Any]:
    """Child process body: every case, two weights each (quantized Gaussian rows and random raw blocks)."""
    import numpy as np
    import torch
    from gguf import GGMLQuantizationType
    from gguf.quants import dequantize

    from dflashkit.runtime.kernels import QuantizedWeight
    from dflashkit.runtime.kernels.testing import random_blocks
    from dflashkit.runtime.kernels.triton_kernels import interpreting, qmatmul_triton
    from dflashkit.quantize import quantize

    assert interpreting()
    rng = np.random.default_rng(seed)
    torch.manual_seed(seed)
    results: dict[str, Any] = {}
    for qtype, dtype_name, m in CASES:
        k, dtype = TYPES[qtype], getattr(torch, dtype_name)
        fin = torch.finfo(dtype)  # fin.tiny: below it fp16 / bf16 results are subnormal, spaced eps * tiny
        gauss = (rng.standard_normal((OUT_FEATURES, k)) * rng.uniform(0.01, 1.0)).astype(np.float32)
        raws = {"quantized": quantize(gauss, qtype),
                "random_blocks": random_blocks(qtype, OUT_FEATURES, k, rng, (1e-3, 0.1))}
        res: dict[str, Any] = {}
        for label, raw in raws.items():
            w = QuantizedWeight.from_numpy(raw, qtype, (OUT_FEATURES, k))
            wt = torch.from_numpy(dequantize(raw, GGMLQuantizationType[qtype])).double()
            x = (torch.randn(m, k, dtype=torch.float64) * float(rng.uniform(0.1, 2.0))).to(dtype)
            ref = x.double() @ wt.T
            y32 = qmatmul_triton(x, w, out_dtype=torch.float32)
            y = qmatmul_triton(x, w)
            err = y32.double() - ref
            res[label] = {
                "rel_fro": (err.norm() / ref.norm()).item(),
                "rel_max": (err.abs().max() / ref.abs().max()).item(),
                "ref_nonzero": bool((ref.abs().amax(dim=1) > 0).all()),
                "out_dtype": str(y.dtype).removeprefix("torch."),
                "out_shape": list(y.shape),
                # the x.dtype result is the fp32 accumulator rounded: within one ulp of it (the interpreter's
                # fp32 -> bf16 cast truncates where a GPU rounds to nearest)
                "out_within_ulp": bool(((y.double() - y32.double()).abs()
                                        <= torch.finfo(dtype).eps * (y32.double().abs() + fin.tiny)).all()),
            }
        results[case_id((qtype, dtype_name, m))] = res
    return results


@pytest.fixture(scope="module")
def interpreted() -> dict[str, Any]:
    if importlib.util.find_spec("triton") is None:
        pytest.fail(f"triton is not installed, so the Triton kernels cannot be tested: {INSTALL_HINT}")
    seed = secrets.randbits(32)
    # the interpreter runs on the CPU: hide any GPU from the child, so torch and Triton behave as on a CPU box
    # (on a CUDA machine Triton otherwise binds its active driver to the GPU)
    env = dict(os.environ, TRITON_INTERPRET="1", CUDA_VISIBLE_DEVICES="")
    code = ("import json, sys; sys.path.insert(0, sys.argv[1]); import test_kernels_triton as t; "
            "print('RESULTS' + json.dumps(t.run_cases(int(sys.argv[2]))))")
    proc = subprocess.run([sys.executable, "-c", code, os.path.dirname(__file__), str(seed)],
                          env=env, capture_output=True, text=True, timeout=600)
    out = [line for line in proc.stdout.splitlines() if line.startswith("RESULTS")]
    if proc.returncode != 0 or not out:
        pytest.fail(f"interpreter run failed (seed {seed}, exit {proc.returncode}):\n{proc.stderr[-4000:]}")
    results = json.loads(out[-1][len("RESULTS"):])
    results["seed"] = seed
    return results


@pytest.mark.parametrize("case", CASES, ids=case_id)
def test_fused_qmatmul_matches_float64(interpreted: dict[str, Any], case: tuple[str, str, int]) -> None:
    qtype, dtype_name, m = case
    for label, r in interpreted[case_id(case)].items():
        where = f"{case_id(case)} {label} (seed {interpreted['seed']})"
        assert r["ref_nonzero"], where
        assert r["rel_fro"] < REL_TOL and r["rel_max"] < REL_TOL, f"{where}: {r}"
        assert r["out_dtype"] == dtype_name and r["out_shape"] == [m, OUT_FEATURES], where
        assert r["out_within_ulp"], f"{where}: x.dtype output is not the fp32 accumulator rounded"
