"""An F16 file's path through the quantizer (`codecs.quantize_f16_rows`: the decode and each type's kernel on one
thread, a cache-sized run at a time; Q8_0 straight from the bits as LLVM vectors) gives the bytes and the NaN / ±inf
count of the float32 path — which the golden files and llama-quantize check — for every type, with and without an
importance matrix, on every F16 bit pattern."""

from __future__ import annotations

import numpy as np
import pytest

from dflashkit.codecs import QUANT_TYPES, get_quant_type, quantize, quantize_f16_rows
from dflashkit.codecs import loops as K

BLOCK_TYPES = [t.name for t in QUANT_TYPES if t.name not in ("F32", "F16", "BF16")]
EVERY_HALF = np.arange(65536, dtype=np.uint16)


def _rows(seed: int, n_rows: int, n: int, scale: float) -> np.ndarray:
    rng = np.random.default_rng(seed)
    with np.errstate(over="ignore"):
        x = (rng.standard_normal((n_rows, n)) * scale).astype(np.float16)
    x[1, 3], x[2, 0], x[2, 1] = np.inf, np.nan, -np.inf
    x[3] = 0  # a row of zero blocks: d = 0, id = 0
    return x


@pytest.mark.parametrize("type_name", BLOCK_TYPES)
def test_f16_rows_give_the_float32_paths_bytes(type_name: str) -> None:
    x = _rows(0, 40, 512, 0.05)
    out, nonfinite = quantize_f16_rows(x.view(np.uint16), type_name, threads=2)
    assert nonfinite == 3
    assert np.array_equal(out, quantize(x.astype(np.float32), type_name))
    weights = np.random.default_rng(1).random(512).astype(np.float32)
    out_w, _ = quantize_f16_rows(x.view(np.uint8), type_name, imatrix=weights, threads=2)  # raw bytes too
    assert np.array_equal(out_w, quantize(x.astype(np.float32), type_name, imatrix=weights))


@pytest.mark.parametrize("kind, size", [("q8_0", 34), ("q4_0", 18), ("q4_1", 20), ("q5_0", 22), ("q5_1", 24)])
def test_32_value_types_from_f16_bits_are_the_c_mirror_on_every_half(kind: str, size: int) -> None:
    # every F16 pattern in blocks of 32, in order and shuffled (NaN / inf blocks take the mirror's path), values
    # across F16's whole range (small scales: subnormal halves, a d that rounds to 0 in F16), and blocks of signed
    # zeros, ±1 and ties, where which element C keeps as the max / min decides a sign bit
    rng = np.random.default_rng(2)
    parts = [EVERY_HALF, rng.permutation(EVERY_HALF)]
    with np.errstate(over="ignore"):
        parts += [(rng.standard_normal(4096) * 10.0 ** e).astype(np.float16).view(np.uint16) for e in range(-9, 6)]
    ties = np.zeros(32 * 6, np.uint16)
    ties[32:64], ties[64:96:2] = 0x8000, 0x8000
    ties[96:128] = rng.choice([0, 0x8000, 0x0001, 0x8001], 32)
    ties[128:160], ties[160:192] = rng.choice([0x3C00, 0xBC00], 32), 0x3C00
    bits = np.concatenate([*parts, ties])
    expected = np.empty((bits.size // 32, size), np.uint8)
    qt = get_quant_type(kind.upper())
    K.legacy_kernel(bits.view(np.float16).astype(np.float32).reshape(-1, 32), expected, qt.kind)  # C's mirror
    got = np.empty_like(expected)
    name, extra = qt.from_f16  # the kernel and kind the codec runs from F16 bits
    nonfinite = getattr(K, name)(bits, got.reshape(-1), *extra)
    assert np.array_equal(got, expected)
    assert nonfinite == int(np.count_nonzero(~np.isfinite(bits.view(np.float16))))


@pytest.mark.parametrize("decode", ["f16_to_f32_count", "f16_to_f32_blocks"])
def test_f16_decode_is_numpys_conversion_of_every_half(decode: str) -> None:
    # in order, shuffled (runs of 32 with and without NaN / inf) and with a tail shorter than a run
    bits = np.concatenate([EVERY_HALF, np.random.default_rng(4).permutation(EVERY_HALF), EVERY_HALF[15360:15377]])
    out = np.empty(bits.size, np.float32)
    assert getattr(K, decode)(bits, out) == 4 * 1024  # ±inf and the NaNs, twice
    assert np.array_equal(out.view(np.uint32), bits.view(np.float16).astype(np.float32).view(np.uint32))


def test_a_row_wider_than_a_run_and_a_bad_importance_matrix() -> None:
    x = _rows(3, 6, 70_000 // 256 * 256, 0.02)  # one row is more than a thread's run of values
    out, _ = quantize_f16_rows(x.view(np.uint16), "Q4_K", threads=2)
    assert np.array_equal(out, quantize(x.astype(np.float32), "Q4_K"))
    from dflashkit.errors import DFlashError

    with pytest.raises(DFlashError, match=r"cannot quantize to Q4_K with an importance matrix of shape \(3,\): need "
                                          r"one weight per column \(69888\)"):
        quantize_f16_rows(x.view(np.uint16), "Q4_K", imatrix=np.ones(3, np.float32))


def test_which_types_take_the_f16_path() -> None:
    from gguf import GGMLQuantizationType as T

    from dflashkit.codecs import NUMBA_PAYS_VALUES, f16_path_types

    types = {T.Q8_0, T.Q4_K, T.F16, T.BF16}
    assert f16_path_types(1000, types) == {T.Q4_K}  # Q8_0 of a small file stays numpy (no numba start-up)
    assert f16_path_types(NUMBA_PAYS_VALUES, types) == {T.Q8_0, T.Q4_K}


def test_leading_dimensions_are_rows_and_a_cpu_without_f16c_takes_the_exact_decode(monkeypatch) -> None:
    import dflashkit.codecs as codecs

    x = _rows(5, 6, 256, 0.05).reshape(2, 3, 256)
    out, nonfinite = quantize_f16_rows(x.view(np.uint16), "Q4_0")
    assert out.shape == (6, 144) and nonfinite == 3
    assert np.array_equal(out, quantize(x.astype(np.float32), "Q4_0").reshape(6, 144))
    codecs.half_vectors.cache_clear()
    monkeypatch.setattr("llvmlite.binding.get_host_cpu_features", lambda: type("F", (), {"flatten": lambda s: "+avx2"})())
    monkeypatch.setattr("platform.machine", lambda: "x86_64")
    try:
        assert not codecs.half_vectors()
        for name in ("Q8_0", "Q4_K"):
            got, bad = quantize_f16_rows(x.view(np.uint16), name)
            assert bad == 3 and np.array_equal(got, quantize(x.astype(np.float32), name).reshape(6, -1))
    finally:
        codecs.half_vectors.cache_clear()
