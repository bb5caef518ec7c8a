"""Codecs: per-ggml-type quantize/dequantize, bit-exact (ggml's reference ``quantize_row_*_ref``, no importance
matrix). Layer L1: below ``io`` (which decodes with it); the file-level command and the llama-quantize policy
live in ``dflashkit.quantize``, which re-exports this API.

``quantize(x, "Q4_K")`` returns exactly the bytes ggml's ``ggml_quantize_chunk`` writes for the same float32
rows; ``dequantize`` matches ``gguf.quants.dequantize`` bit for bit. Types: Q8_0, Q4_K, Q5_K, Q6_K, Q4_0,
Q5_0, Q5_1, F16, BF16 and F32 (identity). Large inputs are split by rows across ``get_num_threads()`` threads
(``$DFLASHKIT_THREADS`` or ``set_num_threads`` to change); the numba kernels are compiled on first use and
cached on disk.
"""

from __future__ import annotations

import numpy as np
from gguf import GGMLQuantizationType

from dflashkit.errors import DFlashError

from .base import QUANT_TYPES, QuantType, get_num_threads, set_num_threads
from .float16 import BF16, F16, F32, f32_to_bf16_bits, f32_to_f16_bits
from .kquants import Q4_K, Q5_K, Q6_K
from .legacy import Q4_0, Q5_0, Q5_1, Q8_0

__all__ = [
    "GGMLQuantizationType", "QUANT_TYPES", "QuantType", "get_quant_type", "quantize", "dequantize",
    "f32_to_f16_bits", "f32_to_bf16_bits", "get_num_threads", "set_num_threads",
    "F32", "F16", "BF16", "Q8_0", "Q4_0", "Q5_0", "Q5_1", "Q4_K", "Q5_K", "Q6_K",
]


def _supported() -> str:
    return ", ".join(t.name for t in QUANT_TYPES)


def get_quant_type(t: GGMLQuantizationType | int | str | QuantType) -> QuantType:
    """The registered QuantType for a ggml type given as the enum, its int value or its name ("Q4_K", "q4_k")."""
    if isinstance(t, QuantType):
        return t
    try:
        if isinstance(t, GGMLQuantizationType):
            key = t
        elif isinstance(t, str):
            key = GGMLQuantizationType[t.strip().upper()]
        elif isinstance(t, (int, np.integer)) and not isinstance(t, bool):
            key = GGMLQuantizationType(int(t))
        else:
            raise DFlashError(f"quantization type must be a GGMLQuantizationType, int or name, got {t!r}")
    except (KeyError, ValueError):
        raise DFlashError(f"unknown ggml quantization type {t!r} (supported: {_supported()})") from None
    qt = QUANT_TYPES.get(key)
    if qt is None:
        raise DFlashError(f"quantization to {key.name} is not supported (supported: {_supported()})")
    return qt


def quantize(x: np.ndarray, qtype: GGMLQuantizationType | int | str, *, threads: int | None = None) -> np.ndarray:
    """float32 (..., n) -> uint8 (..., n // block_size * type_size), the bytes ggml's reference quantizer writes.

    n must be a multiple of the type's block size (DFlashError otherwise). Other float dtypes (and torch
    tensors) are converted to float32 first. ``threads`` overrides ``get_num_threads()`` for this call.
    """
    return get_quant_type(qtype).quantize(x, threads=threads)


def dequantize(q: np.ndarray, qtype: GGMLQuantizationType | int | str) -> np.ndarray:
    """uint8 (..., row_bytes) -> float32 (..., n), bit-identical to ``gguf.quants.dequantize``."""
    return get_quant_type(qtype).dequantize(q)
