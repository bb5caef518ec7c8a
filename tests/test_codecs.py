"""The one bytes→float32 decoder and the one tensor_nbytes (dflashkit.codecs), checked against gguf-py."""

from __future__ import annotations

import gguf.quants
import numpy as np
import pytest
from gguf import GGML_QUANT_SIZES
from gguf import GGMLQuantizationType as Q

from dflashkit.codecs import dequantize_into, quantize, tensor_nbytes, to_float32
from dflashkit.errors import DFlashError


def _bf16_bits(rng: np.random.Generator, n: int) -> np.ndarray:
    bits = rng.integers(0, 1 << 16, size=n, dtype=np.uint16)  # every pattern: NaN payloads, inf, subnormals
    bits[:4] = [0x7FC1, 0xFF80, 0x8000, 0x0001]
    return bits


def test_bf16_decodes_as_gguf_py_from_bits_and_from_bytes() -> None:
    bits = _bf16_bits(np.random.default_rng(0), 4096)
    expected = gguf.quants.dequantize(bits.view(np.uint8).reshape(64, 128), Q.BF16)
    for raw in (bits.reshape(64, 64), bits.view(np.uint8).reshape(64, 128)):
        got = to_float32(raw, "BF16").reshape(64, 64)
        assert got.dtype == np.float32
        assert got.view(np.uint32).tobytes() == np.asarray(expected, np.float32).view(np.uint32).tobytes()


@pytest.mark.parametrize("qtype", [Q.F16, Q.F32, Q.Q8_0, Q.Q4_K, Q.Q6_K, Q.Q5_1])
def test_ggml_types_decode_as_gguf_py(qtype: Q) -> None:
    x = np.random.default_rng(1).standard_normal((4, 256)).astype(np.float32)
    raw = quantize(x, qtype)
    expected = np.asarray(gguf.quants.dequantize(raw, qtype), np.float32)
    got = to_float32(raw, qtype)
    assert got.shape == (4, 256) and got.tobytes() == expected.tobytes()
    assert to_float32(raw, qtype.name, (2, 2, 256)).tobytes() == expected.tobytes()


@pytest.mark.parametrize("qtype", [Q.Q8_0, Q.Q4_K])
def test_dequantize_into_writes_gguf_py_values(qtype: Q) -> None:
    """Into a caller's buffer (the runtime's packed matmuls): gguf-py's floats bit for bit, for real blocks and for
    random bytes (NaN / inf / subnormal scales); Q4_K takes the generic path."""
    rng = np.random.default_rng(2)
    block, type_size = GGML_QUANT_SIZES[qtype]
    real = quantize(rng.standard_normal((8, 512)).astype(np.float32), qtype)
    noise = rng.integers(0, 256, size=(8, 512 // block * type_size), dtype=np.uint8)
    for raw in (real, noise):
        with np.errstate(all="ignore"):
            expected = np.asarray(gguf.quants.dequantize(raw, qtype), np.float32)
        out = np.full((8, 512), 7.0, np.float32)
        with np.errstate(all="ignore"):
            assert dequantize_into(raw, qtype, out) is out
        assert out.view(np.uint32).tobytes() == expected.view(np.uint32).tobytes()


def test_dequantize_into_refuses_a_buffer_of_the_wrong_size() -> None:
    raw = quantize(np.ones((2, 64), np.float32), Q.Q8_0)
    with pytest.raises(DFlashError) as e:
        dequantize_into(raw, Q.Q8_0, np.empty(100, np.float32))
    assert str(e.value) == ("cannot dequantize Q8_0 into a float32 array of 100 values: need C-contiguous float32 "
                            "of 128 values and rows of whole 34-byte blocks")


def test_safetensors_dtypes_decode_by_value() -> None:
    assert to_float32(np.array([1.5, -2.0], np.float16), "F16").tolist() == [1.5, -2.0]
    assert to_float32(np.array([-3, 7], np.int16), "I16", (2, 1)).tolist() == [[-3.0], [7.0]]
    with pytest.raises(DFlashError, match=r"^w: type U8 cannot be read as numbers$"):
        to_float32(np.zeros(2, np.uint8), "U8", where="w")


@pytest.mark.parametrize("qtype", [Q.F32, Q.BF16, Q.Q8_0, Q.Q4_K, Q.Q5_0, Q.IQ4_NL])
def test_tensor_nbytes_matches_gguf_py(qtype: Q) -> None:
    shape = (3, 5, 2 * GGML_QUANT_SIZES[qtype][0])
    assert tensor_nbytes(qtype, shape) == int(np.prod(gguf.quants.quant_shape_to_byte_shape(shape, qtype)))


def test_tensor_nbytes_refuses_a_partial_block_row() -> None:
    with pytest.raises(DFlashError, match=r"^row length 100 is not a multiple of Q4_K's block size 256$"):
        tensor_nbytes(Q.Q4_K, (2, 100))


def test_bf16_to_f16_kernel_equals_numpy_for_every_bf16_bit_pattern() -> None:
    """All 65,536 bfloat16 patterns (zeros, subnormals, overflow to inf, every NaN payload) give numpy's
    ``astype(float16)`` of the exact float32 value — what gguf-py and llama.cpp's converter write."""
    from dflashkit.codecs import bf16_bits_to_f16_bits

    bits = np.arange(1 << 16, dtype=np.uint32).astype(np.uint16)
    with np.errstate(over="ignore"):
        want = (bits.astype(np.uint32) << 16).view(np.float32).astype(np.float16).view(np.uint16)
    assert np.array_equal(bf16_bits_to_f16_bits(bits), want)
    assert np.array_equal(bf16_bits_to_f16_bits(bits.view(np.uint8)), want)  # raw bytes as stored
    out = np.empty(bits.shape, np.uint16)
    assert bf16_bits_to_f16_bits(bits, out=out) is out and np.array_equal(out, want)



def test_f16_decode_equals_numpy_for_every_half_bit_pattern() -> None:
    """The quantizer's F16 decode (numba, on every thread) gives numpy's ``astype(float32)`` bit for bit for all
    65,536 half patterns — zeros, subnormals, inf and every NaN payload — from values, bits or raw bytes, split
    across threads or not."""
    from dflashkit.codecs import f16_bits_to_f32

    bits = np.arange(1 << 16, dtype=np.uint32).astype(np.uint16)
    want = bits.view(np.float16).astype(np.float32).view(np.uint32)
    for src in (bits, bits.view(np.float16), bits.view(np.uint8)):
        assert np.array_equal(f16_bits_to_f32(src).view(np.uint32), want)
    many = np.tile(bits, 160).reshape(-1, 64)  # 10 M values: large enough to run on two threads
    assert np.array_equal(f16_bits_to_f32(many, threads=2).view(np.uint32), np.tile(want, 160).reshape(-1, 64))
