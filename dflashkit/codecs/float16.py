"""The float32 <-> half-bits conversions the F16 / BF16 types (``types/f16.py``, ``types/bf16.py``) and the
converter use.

F16 follows ggml_fp32_to_fp16_row (ggml_compute_fp32_to_fp16: round-to-nearest-even, overflow -> inf,
NaN -> 0x7E00 | sign). BF16 follows ggml_fp32_to_bf16_row_ref (ggml_compute_fp32_to_bf16: NaN -> (u >> 16) | 64,
else round-to-nearest-even on the upper 16 bits). Both run as numba loops that LLVM vectorises (many GB/s per
thread), write straight into the output (optionally caller-provided), and allocate nothing else.
"""

from __future__ import annotations

from typing import Any

import numpy as np
from dflashkit.errors import DFlashError

from .base import K, as_float32, run_chunked

# Element-wise work: only split across threads for big arrays (memory bound beyond ~2 threads anyway).
_ELEMS_PER_TASK = 1 << 22


def _convert(kernel: Any, src: np.ndarray, out: np.ndarray | None, threads: int | None, what: str) -> np.ndarray:
    if out is None:
        out = np.empty(src.shape, dtype=np.uint16)
    elif out.shape != src.shape or out.dtype != np.uint16 or not out.flags.c_contiguous:
        raise DFlashError(f"{what}: out must be a C-contiguous uint16 array of shape {src.shape}, "
                          f"got {out.dtype} {out.shape}")
    # flat views; large arrays are split into contiguous ranges across threads
    run_chunked(kernel, src.reshape(-1), out.reshape(-1), threads, min_elems_per_thread=_ELEMS_PER_TASK)
    return out


def _contig_f32(x: Any) -> np.ndarray:
    return np.ascontiguousarray(as_float32(x))


def bf16_bits_to_f32(bits: np.ndarray) -> np.ndarray:
    """bfloat16 data (uint16 bits, or their raw bytes) -> float32, exactly as ggml_compute_bf16_to_fp32:
    the bits shifted into the upper half (NaN payloads kept)."""
    wide = np.ascontiguousarray(bits).view(np.uint16).astype(np.uint32)
    wide <<= 16  # in place: one temporary, not two
    return wide.view(np.float32)


def f16_bits_to_f32(bits: np.ndarray, threads: int | None = None) -> np.ndarray:
    """IEEE half data (float16, uint16 bits or their raw bytes) -> float32, exactly numpy's ``astype(float32)``
    (ggml_compute_fp16_to_fp32), on every thread: numpy's own conversion, single-threaded and not vectorised here,
    was a quarter of a quantize run of an F16 file. Loads numba (an F16 file's quantizer uses
    `codecs.quantize_f16_rows`, which decodes beside each type's kernel)."""
    src = np.ascontiguousarray(bits).view(np.uint16)
    out = np.empty(src.shape, dtype=np.float32)
    run_chunked(K.f16_to_f32_kernel, src.reshape(-1), out.reshape(-1), threads,
                min_elems_per_thread=_ELEMS_PER_TASK)
    return out


def f32_to_f16_bits(x: np.ndarray, out: np.ndarray | None = None, threads: int | None = None) -> np.ndarray:
    """float32 array -> uint16 IEEE half bits, same shape, exactly as ggml_fp32_to_fp16_row."""
    return _convert(K.f32_to_f16_kernel, _contig_f32(x), out, threads, "f32_to_f16_bits")


def bf16_bits_to_f16_bits(bits: np.ndarray, out: np.ndarray | None = None, threads: int | None = None) -> np.ndarray:
    """bfloat16 bits (uint16, or their raw bytes) -> IEEE half bits, exactly numpy's ``astype(float16)`` of the
    float32 values (what gguf-py and llama.cpp's converter write), in one pass without a float32 temporary."""
    src = np.ascontiguousarray(bits).view(np.uint16)
    return _convert(K.bf16_to_f16_kernel, src, out, threads, "bf16_bits_to_f16_bits")


def f32_to_bf16_bits(x: np.ndarray, out: np.ndarray | None = None, threads: int | None = None) -> np.ndarray:
    """float32 array -> uint16 bfloat16 bits, same shape, exactly as ggml_fp32_to_bf16_row_ref."""
    return _convert(K.f32_to_bf16_kernel, _contig_f32(x).view(np.uint32), out, threads, "f32_to_bf16_bits")
