"""32-value block types: Q8_0 and the fallback types Q4_0, Q5_0, Q5_1.

Quantization is the numba kernels in ``_kernels`` (mirroring quantize_row_*_ref); dequantization is numpy
with the same float32 operation order as ggml's dequantize_row_* (and gguf-py), so values are bit-identical.
"""

from __future__ import annotations

import numpy as np
from gguf import GGMLQuantizationType

from .base import KernelQuantType, fp16_col, unpack_nibbles


def _fifth_bits(qh: np.ndarray) -> np.ndarray:
    """The little-endian uint32 ``qh`` of Q5_0 / Q5_1: bit j is the 5th bit of value j."""
    return np.unpackbits(qh, axis=-1, bitorder="little")


class Q8_0(KernelQuantType, ggml_type=GGMLQuantizationType.Q8_0):
    """d (fp16) = absmax / 127; qs = roundf(x / d) as int8."""

    _kernel = "q8_0_kernel"

    def dequantize_blocks(self, q: np.ndarray) -> np.ndarray:
        out = np.empty((q.shape[0], self.block_size), dtype=np.float32)
        self.dequantize_blocks_into(q, out)
        return out

    def dequantize_blocks_into(self, q: np.ndarray, out: np.ndarray) -> None:
        # float(qs) * d in float32; the ufunc casts the int8 levels in small buffers: one pass, no temporary array
        np.multiply(q[:, 2:].view(np.int8), fp16_col(q, 0), out=out, dtype=np.float32)


class Q4_0(KernelQuantType, ggml_type=GGMLQuantizationType.Q4_0):
    """d (fp16) = max / -8 (max: signed value of largest magnitude); 4-bit levels with offset 8."""

    _kernel = "q4_0_kernel"

    def dequantize_blocks(self, q: np.ndarray) -> np.ndarray:
        levels = unpack_nibbles(q[:, 2:], 16).astype(np.int8) - np.int8(8)
        return fp16_col(q, 0) * levels.astype(np.float32)


class Q5_0(KernelQuantType, ggml_type=GGMLQuantizationType.Q5_0):
    """d (fp16) = max / -16; 5-bit levels with offset 16 (low nibbles in qs, 5th bits in qh)."""

    _kernel = "q5_0_kernel"

    def dequantize_blocks(self, q: np.ndarray) -> np.ndarray:
        levels = unpack_nibbles(q[:, 6:], 16) | (_fifth_bits(q[:, 2:6]) << np.uint8(4))
        return fp16_col(q, 0) * (levels.astype(np.int8) - np.int8(16)).astype(np.float32)


class Q5_1(KernelQuantType, ggml_type=GGMLQuantizationType.Q5_1):
    """d (fp16) = (max - min) / 31, m (fp16) = min; unsigned 5-bit levels; x = d * q + m."""

    _kernel = "q5_1_kernel"

    def dequantize_blocks(self, q: np.ndarray) -> np.ndarray:
        levels = unpack_nibbles(q[:, 8:], 16) | (_fifth_bits(q[:, 4:8]) << np.uint8(4))
        return fp16_col(q, 0) * levels.astype(np.float32) + fp16_col(q, 2)
