"""Every quantizer against ggml itself, live: hypothesis draws rows (random, constant, zero, sparse, outliers,
tiny, subnormal, ±FLT_MAX, mixes with inf and NaN) and importance matrices (none, random, flat, with zeros, wide
dynamic range), and ``dflashkit.codecs.quantize`` must give exactly the bytes of ``ggml_quantize_chunk`` — the
call llama-quantize makes — from ``libggml-base.so`` of each pinned llama.cpp build (.ci/run builds both; the
variables are those of the llama.cpp tests). Every type llama-quantize writes for a drafter, with and without an
importance matrix; F16 / BF16 / Q8_0 take the weights and ignore them, as ggml does.
"""

from __future__ import annotations

import ctypes
import os

import numpy as np
import pytest
from gguf import GGML_QUANT_SIZES, GGMLQuantizationType
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from dflashkit.codecs import quantize
from llama_cpp_oracle import BIN_VARS, ggml_library
from test_quantize_properties import EXTREME_FAMILIES, FAMILIES, _make

Q = GGMLQuantizationType
TYPES = [Q.Q4_0, Q.Q4_1, Q.Q5_0, Q.Q5_1, Q.Q8_0, Q.Q2_K, Q.Q3_K, Q.Q4_K, Q.Q5_K, Q.Q6_K, Q.IQ4_NL, Q.IQ4_XS]
BUILDS = list(BIN_VARS)
_SCALE = int(os.environ.get("DFLASHKIT_HYPOTHESIS_SCALE", "1"))
LIVE = settings(max_examples=25 * _SCALE, deadline=None, suppress_health_check=[HealthCheck.too_slow])


def ggml(build: str) -> ctypes.CDLL:
    cdll = ggml_library(build, "libggml-base.so")
    cdll.ggml_quantize_chunk.restype = ctypes.c_size_t
    cdll.ggml_quantize_chunk.argtypes = [ctypes.c_int, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int64,
                                         ctypes.c_int64, ctypes.c_int64, ctypes.c_void_p]
    return cdll


def ggml_quantize(lib: ctypes.CDLL, t: Q, x: np.ndarray, qw: np.ndarray | None) -> np.ndarray:
    block, type_size = GGML_QUANT_SIZES[t]
    rows, n = x.shape
    out = np.zeros((rows, n // block * type_size), np.uint8)
    written = lib.ggml_quantize_chunk(int(t), x.ctypes.data, out.ctypes.data, 0, rows, n,
                                      None if qw is None else qw.ctypes.data)
    assert written == out.nbytes
    return out


def _imatrix(kind: str, seed: int, n: int) -> np.ndarray | None:
    rng = np.random.default_rng(seed)
    if kind == "none":
        return None
    if kind == "flat":
        w = np.ones(n)
    elif kind == "random":
        w = rng.gamma(0.5, 2.0, n)
    elif kind == "with_zeros":
        w = rng.gamma(0.5, 2.0, n) * (rng.random(n) < 0.7)
    else:  # wide dynamic range: what a real activation statistic looks like (a few channels dominate)
        w = 10.0 ** rng.uniform(-6, 4, n)
    return np.ascontiguousarray(w, dtype=np.float32)


def _rows(t: Q, families: list[str]) -> st.SearchStrategy[np.ndarray]:
    block = GGML_QUANT_SIZES[t][0]
    return st.builds(_make, st.sampled_from(families), st.integers(0, 2**32 - 1), st.integers(1, 3),
                     st.integers(1, 3).map(lambda k: k * max(block, 256)), st.floats(-4.0, 4.0))


@pytest.mark.parametrize("build", BUILDS)
@pytest.mark.parametrize("qtype", TYPES, ids=lambda t: t.name)
@LIVE
@given(data=st.data())
def test_bytes_equal_ggml(build: str, qtype: Q, data: st.DataObject) -> None:
    lib = ggml(build)
    x = np.ascontiguousarray(data.draw(_rows(qtype, FAMILIES + EXTREME_FAMILIES), label="x"))
    kind = data.draw(st.sampled_from(["none", "flat", "random", "with_zeros", "wide"]), label="imatrix")
    qw = _imatrix(kind, data.draw(st.integers(0, 2**32 - 1)), x.shape[1])
    with np.errstate(all="ignore"):
        mine = quantize(x, qtype, imatrix=qw)
        theirs = ggml_quantize(lib, qtype, x, qw)
    bad = np.flatnonzero((mine != theirs).any(axis=1))
    assert bad.size == 0, f"{qtype.name} ({kind} imatrix): rows {bad.tolist()} differ from ggml {build}"


@pytest.mark.parametrize("build", BUILDS)
@pytest.mark.parametrize("qtype", TYPES, ids=lambda t: t.name)
def test_non_finite_rows_equal_ggml(build: str, qtype: Q) -> None:
    """inf and NaN among ordinary values, with and without weights: the inputs where C's behaviour is least
    obvious (nearest_int of garbage, comparisons with NaN) — still the same bytes."""
    lib = ggml(build)
    rng = np.random.default_rng(7)
    x = rng.standard_normal((6, 512)).astype(np.float32)
    x[0, 5], x[1, 300], x[2, :] = np.inf, np.nan, -np.inf
    x[3, ::7] = np.nan
    x[4] = 0.0
    x[5] = -0.0
    for qw in (None, np.abs(rng.standard_normal(512)).astype(np.float32)):
        with np.errstate(all="ignore"):
            assert np.array_equal(quantize(x, qtype, imatrix=qw), ggml_quantize(lib, qtype, x, qw)), qtype.name
