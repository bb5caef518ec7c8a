"""256-value super-block K-quants: Q4_K, Q5_K, Q6_K.

Quantization is the numba kernels in ``loops`` (quantize_row_q{4,5,6}_K_ref with make_qkx2_quants /
make_qx_quants); dequantization mirrors dequantize_row_q{4,5,6}_K in float32: y = (d * sc) * q - (dmin * m)
for Q4_K / Q5_K and y = (d * sc) * q for Q6_K.
"""

from __future__ import annotations

import numpy as np
from gguf import GGMLQuantizationType

from .base import K, KernelQuantType, fp16_col, unpack_nibbles

QK_K = 256


def _q4_k_kernel(x: np.ndarray, out: np.ndarray) -> None:
    # quantize_row_q4_K_ref: make_qkx2_quants(32, 15, x, w, L, &min, Laux, -1.f, 0.1f, 20, false)
    K.qk_kernel(x, out, 15, np.float32(-1.0), np.float32(0.1), 20)


def _q5_k_kernel(x: np.ndarray, out: np.ndarray) -> None:
    # quantize_row_q5_K_ref: make_qkx2_quants(32, 31, x, w, L, &min, Laux, -0.5f, 0.1f, 15, false)
    K.qk_kernel(x, out, 31, np.float32(-0.5), np.float32(0.1), 15)


def get_scale_min_k4(scales: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Unpack the 12 bytes of eight 6-bit (scale, min) pairs (ggml-quants.c get_scale_min_k4) -> 2 x [n, 8]."""
    s = scales.reshape(-1, 3, 4)
    lo, mid, hi = s[:, 0], s[:, 1], s[:, 2]
    sc = np.concatenate([lo & 0x3F, (hi & 0x0F) | ((lo >> 6) << 4)], axis=-1)
    mn = np.concatenate([mid & 0x3F, (hi >> 4) | ((mid >> 6) << 4)], axis=-1)
    return sc, mn


def _dequant_qkx(q: np.ndarray, levels: np.ndarray) -> np.ndarray:
    """Shared Q4_K / Q5_K reconstruction: per 32-value sub-block d*sc*q - dmin*m."""
    n = q.shape[0]
    sc, mn = get_scale_min_k4(q[:, 4:16])
    d = (fp16_col(q, 0) * sc.astype(np.float32)).reshape(n, 8, 1)
    dm = (fp16_col(q, 2) * mn.astype(np.float32)).reshape(n, 8, 1)
    return (d * levels.reshape(n, 8, 32).astype(np.float32) - dm).reshape(n, QK_K)


class Q4_K(KernelQuantType, ggml_type=GGMLQuantizationType.Q4_K):
    """Layout: d, dmin (fp16), 12 bytes of 6-bit scales/mins, 128 bytes of 4-bit levels."""

    _kernel = _q4_k_kernel
    _weighted = ("q45_k_w_kernel", (15,))
    _cost = 40  # ~20 scale trials per sub-block

    def dequantize_blocks(self, q: np.ndarray) -> np.ndarray:
        return _dequant_qkx(q, unpack_nibbles(q[:, 16:], 32))


class Q5_K(KernelQuantType, ggml_type=GGMLQuantizationType.Q5_K):
    """Layout: d, dmin, 12 scale bytes, qh[32] (bit i of qh[j] = 5th bit of value 32*i + j), qs[128]."""

    _kernel = _q5_k_kernel
    _weighted = ("q45_k_w_kernel", (31,))
    _cost = 30

    def dequantize_blocks(self, q: np.ndarray) -> np.ndarray:
        n = q.shape[0]
        high = np.unpackbits(q[:, 16:48], axis=-1, bitorder="little").reshape(n, 32, 8).transpose(0, 2, 1)
        return _dequant_qkx(q, unpack_nibbles(q[:, 48:], 32) | (high.reshape(n, QK_K) << np.uint8(4)))


_Q6_SHIFT = np.array([0, 2, 4, 6], dtype=np.uint8).reshape(1, 1, 4, 1)


class Q6_K(KernelQuantType, ggml_type=GGMLQuantizationType.Q6_K):
    """Layout: ql[128] (low 4 bits), qh[64] (high 2 bits), int8 scales[16], d (fp16); levels offset 32."""

    _kernel = "q6_k_kernel"
    _weighted = ("q6_k_w_kernel", ())
    _cost = 20

    def dequantize_blocks(self, q: np.ndarray) -> np.ndarray:
        n = q.shape[0]
        low = unpack_nibbles(q[:, :128], 64)
        high = ((q[:, 128:192].reshape(n, 2, 1, 32) >> _Q6_SHIFT) & np.uint8(3)).reshape(n, QK_K)
        levels = (low | (high << np.uint8(4))).astype(np.int8) - np.int8(32)
        d = (fp16_col(q, 208) * q[:, 192:208].view(np.int8).astype(np.float32)).reshape(n, 16, 1)
        return (d * levels.reshape(n, 16, 16).astype(np.float32)).reshape(n, QK_K)
