"""dflashkit.runtime.kernels.reference: torch dequantize, bit-identical to gguf.quants.dequantize (float32)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch
from gguf import GGMLQuantizationType
from gguf.quants import dequantize as gguf_dequantize

from dflashkit.errors import DFlashError
from dflashkit.runtime.kernels import TORCH_DEQUANT, QuantizedWeight, dequantize_torch
from dflashkit.runtime.kernels import reference
from dflashkit.runtime.kernels.testing import random_blocks

GOLDEN = Path(__file__).resolve().parent / "data" / "golden" / "quants"
QUANT_TYPES = ["Q8_0", "Q4_K", "Q5_K", "Q6_K", "Q4_0", "Q5_0", "Q5_1", "Q4_1", "Q2_K", "Q3_K", "IQ4_NL", "IQ4_XS"]
GOLDEN_TYPES = ["Q8_0", "Q4_K", "Q5_K", "Q6_K", "Q4_0", "Q5_0", "Q5_1", "F16", "BF16"]
FAMILIES = ["normal", "uniform", "outliers", "positive", "constant_rows", "zeros_mixed", "bf16_weights"]


def assert_bit_identical(got: torch.Tensor, want: np.ndarray) -> None:
    assert got.dtype == torch.float32
    g = got.numpy()
    assert g.shape == want.shape
    diff = np.flatnonzero(g.view(np.uint32) != want.astype(np.float32).view(np.uint32))
    assert diff.size == 0, (f"{diff.size} values differ, first at flat index {diff[0]}: "
                            f"{g.reshape(-1)[diff[0]]!r} != {want.reshape(-1)[diff[0]]!r}")


def load_golden(type_name: str, family: str) -> np.ndarray:
    path = GOLDEN / f"{type_name}__{family}.npz"
    if not path.is_file():
        pytest.fail(f"golden file missing: {path} (tools/make_golden.py, tests/data/golden/README.md)")
    with np.load(path) as f:
        return f["q"]


def test_registry_covers_issue_types() -> None:
    for name in QUANT_TYPES + ["F32", "F16", "BF16"]:
        assert GGMLQuantizationType[name] in TORCH_DEQUANT


@pytest.mark.parametrize("family", FAMILIES)
@pytest.mark.parametrize("type_name", GOLDEN_TYPES)
def test_golden_bit_identical(type_name: str, family: str) -> None:
    q = load_golden(type_name, family)
    qtype = GGMLQuantizationType[type_name]
    dq = TORCH_DEQUANT[qtype]
    rows, row_bytes = q.shape
    n = row_bytes // dq.type_size * dq.block_size
    got = dequantize_torch(torch.from_numpy(q), qtype, (rows, n))
    assert_bit_identical(got, gguf_dequantize(q, qtype))


@pytest.mark.parametrize("seed", [0, 1, 2])
@pytest.mark.parametrize("type_name", QUANT_TYPES)
def test_random_bytes_bit_identical(type_name: str, seed: int) -> None:
    """Every byte pattern (levels, 6-bit scale packing, high bits), with any finite fp16 scale incl. subnormals."""
    rng = np.random.default_rng(seed)
    dq = TORCH_DEQUANT[GGMLQuantizationType[type_name]]
    cols = dq.block_size * int(rng.integers(1, 9))
    q = random_blocks(type_name, 37, cols, rng)
    got = dequantize_torch(torch.from_numpy(q), type_name, (37, cols))
    assert_bit_identical(got, gguf_dequantize(q, GGMLQuantizationType[type_name]))


@pytest.mark.parametrize("type_name", ["Q8_0", "Q4_K", "Q6_K", "Q5_0"])
def test_chunked_cpu_path(type_name: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """CPU dequantize works in chunks of blocks: small chunks with a partial last one give the same bits."""
    monkeypatch.setattr(reference, "CPU_CHUNK_VALUES", 3 * 256)
    rng = np.random.default_rng(7)
    q = random_blocks(type_name, 11, 768, rng)
    got = dequantize_torch(torch.from_numpy(q), type_name, (11, 768))
    assert_bit_identical(got, gguf_dequantize(q, GGMLQuantizationType[type_name]))


def test_shapes_and_strided_input() -> None:
    rng = np.random.default_rng(3)
    q = random_blocks("Q4_K", 6, 512, rng)
    want = gguf_dequantize(q, GGMLQuantizationType.Q4_K)
    # a 3-D target shape, flat input bytes, and a non-contiguous input view all give the same values
    assert_bit_identical(dequantize_torch(torch.from_numpy(q.reshape(-1)), "Q4_K", (2, 3, 512)),
                         want.reshape(2, 3, 512))
    wide = torch.zeros((6, q.shape[1] * 2), dtype=torch.uint8)
    wide[:, ::2] = torch.from_numpy(q)
    assert_bit_identical(dequantize_torch(wide[:, ::2], GGMLQuantizationType.Q4_K, (6, 512)), want)
    assert dequantize_torch(torch.empty((0, 144), dtype=torch.uint8), "Q4_K", (0, 256)).shape == (0, 256)


def test_type_given_as_int_and_name() -> None:
    q = random_blocks("Q8_0", 2, 64, np.random.default_rng(4))
    a = dequantize_torch(torch.from_numpy(q), int(GGMLQuantizationType.Q8_0), (2, 64))
    b = dequantize_torch(torch.from_numpy(q), "q8_0", (2, 64))
    assert torch.equal(a, b)


@pytest.mark.parametrize("args, match", [
    ((torch.zeros(144, dtype=torch.uint8), "Q4_K", (1, 128)), "not a positive multiple of 256"),
    ((torch.zeros(143, dtype=torch.uint8), "Q4_K", (1, 256)), "needs 144"),
    ((torch.zeros(144, dtype=torch.int16), "Q4_K", (1, 256)), "uint8"),
    ((torch.zeros(144, dtype=torch.uint8), "Q4_K", ()), "scalar"),
    ((torch.zeros(144, dtype=torch.uint8), "Q9_X", (1, 256)), "unknown ggml type"),
    ((torch.zeros(144, dtype=torch.uint8), "IQ2_XXS", (1, 256)), "no torch dequantizer for IQ2_XXS"),
])
def test_bad_input_is_a_dflash_error(args: tuple, match: str) -> None:
    with pytest.raises(DFlashError, match=match):
        dequantize_torch(*args)


def test_quantized_weight_from_numpy() -> None:
    rng = np.random.default_rng(5)
    q = random_blocks("Q6_K", 4, 512, rng)
    ro = q.copy()
    ro.flags.writeable = False  # like a GGUF memory map: copied, no warning
    w = QuantizedWeight.from_numpy(ro, "Q6_K", (4, 512))
    assert w.ggml_type is GGMLQuantizationType.Q6_K and w.shape == (4, 512)
    assert w.data.dtype == torch.uint8 and tuple(w.data.shape) == (4, 420) and w.row_bytes == 420
    assert (w.out_features, w.in_features) == (4, 512)
    assert_bit_identical(w.dequantize(), gguf_dequantize(q, GGMLQuantizationType.Q6_K))
    # gguf-py hands F16 tensors over as float16 arrays: the bytes are what count
    f16 = rng.standard_normal((3, 64)).astype(np.float16)
    wf = QuantizedWeight.from_numpy(f16, GGMLQuantizationType.F16, [3, 64])
    assert torch.equal(wf.dequantize(), torch.from_numpy(f16.astype(np.float32)))
    assert wf.to("cpu").shape == (3, 64)


@pytest.mark.parametrize("kwargs, match", [
    (dict(raw=np.zeros(400, np.uint8), ggml_type="Q6_K", shape=(2, 256)), "needs 420 bytes, got 400"),
    (dict(raw=np.zeros(420, np.uint8), ggml_type="Q6_K", shape=(420,)), "out_features, in_features"),
    (dict(raw=np.zeros(420, np.uint8), ggml_type="Q6_K", shape=(1, 100)), "multiple of 256"),
])
def test_quantized_weight_errors(kwargs: dict, match: str) -> None:
    with pytest.raises(DFlashError, match=match):
        QuantizedWeight.from_numpy(**kwargs)


def test_quantized_weight_checks_data_layout() -> None:
    with pytest.raises(DFlashError, match=r"uint8 \[2, 210\]"):
        QuantizedWeight(torch.zeros(420, dtype=torch.uint8), GGMLQuantizationType.Q6_K, (2, 256))
