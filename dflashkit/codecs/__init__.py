"""Codecs: per-ggml-type quantize/dequantize, bit-exact (ggml's reference ``quantize_row_*_ref``, no importance
matrix). Layer L1: below ``io`` (which decodes with it); the file-level command and the llama-quantize policy
live in ``dflashkit.quantize``, which re-exports this API.

``quantize(x, "Q4_K")`` returns exactly the bytes ggml's ``ggml_quantize_chunk`` writes for the same float32
rows, with an importance matrix too; ``dequantize`` matches ``gguf.quants.dequantize`` bit for bit. The types are
one module each in ``codecs/types`` (`QUANT_TYPES`, filled as they are imported). Large inputs are split by rows
across ``get_num_threads()`` threads
(``$DFLASHKIT_THREADS`` or ``set_num_threads`` to change); the numba kernels are compiled on first use and
cached on disk.
"""

from __future__ import annotations

import functools
import threading
from typing import Any, Callable, Iterable

import numpy as np
from gguf import GGMLQuantizationType

from dflashkit.errors import DFlashError

from . import types as _type_modules  # noqa: F401  (one module per type: importing them fills QUANT_TYPES)
from .base import QUANT_TYPES, K, QuantType, get_num_threads, run_chunked, set_num_threads, tensor_nbytes
from .blocks import FloatType
from .float16 import (bf16_bits_to_f16_bits, bf16_bits_to_f32, f16_bits_to_f32, f32_to_bf16_bits,
                      f32_to_f16_bits)

# the registry in the order a user reads the types in (`QuantType.rank`: larger first)
_registered = sorted(QUANT_TYPES.items(), key=lambda item: -item[1].rank)
QUANT_TYPES.clear()
QUANT_TYPES.update(_registered)

__all__ = [
    "GGMLQuantizationType", "QUANT_TYPES", "QuantType", "get_quant_type", "quantize", "dequantize",
    "f32_to_f16_bits", "f32_to_bf16_bits", "bf16_bits_to_f32", "bf16_bits_to_f16_bits", "f16_bits_to_f32",
    "get_num_threads",
    "set_num_threads", "preload_bf16_to_f16", "preload_quantizers",
    "tensor_nbytes", "to_float32", "dequantize_into", "quantize_f16_rows", "f16_path_types",
]


#: element types a file stores as floats: quantized from F16 by `to_float32`, not `quantize_f16_rows`
_FLOAT_TYPES = frozenset(t for t, qt in QUANT_TYPES.items() if isinstance(qt, FloatType))


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


def quantize(x: np.ndarray, qtype: GGMLQuantizationType | int | str, *, threads: int | None = None,
             imatrix: np.ndarray | None = None) -> np.ndarray:
    """float32 (..., n) -> uint8 (..., n // block_size * type_size), the bytes ggml's ``ggml_quantize_chunk`` writes.

    n must be a multiple of the type's block size (DFlashError otherwise). Other float dtypes (and torch
    tensors) are converted to float32 first. ``threads`` overrides ``get_num_threads()`` for this call.
    ``imatrix``: one importance weight per column (float32 [n]), as llama-quantize passes it.
    """
    return get_quant_type(qtype).quantize(x, threads=threads, imatrix=imatrix)


#: F16 values from which Q8_0 goes through numba (`f16_path_types`): numpy's conversion and quantizer take ~6 ns a
#: value on two threads, numba's start-up ~0.4 s and its vector kernel ~0.3 ns a value — even at 64 M values
NUMBA_PAYS_VALUES = 1 << 26

#: values one thread decodes and quantizes at a time in `quantize_f16_rows`: their float32 (256 KB) stays in the
#: CPU's L2 cache from the decode to the quantizer
FUSED_VALUES = 1 << 16


@functools.lru_cache(maxsize=1)
def half_vectors() -> bool:
    """Whether this CPU converts vectors of halves in hardware (x86: F16C; every 64-bit ARM does): the vector
    kernels of `loops.legacy_f16` widen and narrow halves, which LLVM otherwise turns into calls to runtime
    functions llvmlite does not provide."""
    import platform

    if platform.machine().lower() not in ("x86_64", "amd64", "i386", "i686"):
        return True
    from llvmlite import binding  # numba's: loaded with the kernels

    return "+f16c" in binding.get_host_cpu_features().flatten().split(",")


def _f16_decode() -> Callable[[np.ndarray, np.ndarray], int]:
    """The F16 decode ahead of a quantizer: 32 halves at a time as one vector conversion where the CPU has it
    (`half_vectors`), else the exact scalar decode; either returns the NaN / ±inf count."""
    return K.f16_to_f32_blocks if half_vectors() else K.f16_to_f32_count


def quantize_f16_rows(bits: np.ndarray, qtype: GGMLQuantizationType | int | str, *,
                      imatrix: np.ndarray | None = None, threads: int | None = None) -> tuple[np.ndarray, int]:
    """F16 rows (uint16 bits, or their raw bytes, ``[rows, …]``) → (the type's bytes ``[rows, row_bytes]``, how many
    values are NaN / ±inf): the bytes of ``quantize(to_float32(bits), qtype)``. Each thread decodes a cache-sized
    run of rows and quantizes it at once, so the float32 values never make a chunk-sized array nor leave the cache,
    and the decode runs on every thread — an F16 file's path through `dflash-quantize`."""
    qt = get_quant_type(qtype)
    src = np.ascontiguousarray(bits)
    if src.ndim == 0:
        raise DFlashError(f"cannot quantize a scalar to {qt.name}: need F16 rows")
    src = src.view(np.uint16)
    src = src.reshape(-1, src.shape[-1])  # leading dimensions are rows; bytes viewed as uint16 halve the last
    n = src.shape[1]
    out = np.empty((src.shape[0], qt.row_bytes(n)), dtype=np.uint8)
    qw = None
    if imatrix is not None:
        qw = np.ascontiguousarray(imatrix, dtype=np.float32)
        if qw.shape != (n,):
            raise DFlashError(f"cannot quantize to {qt.name} with an importance matrix of shape {qw.shape}: need "
                              f"one weight per column ({n})")
    step = max(1, FUSED_VALUES // n)
    counts: list[int] = []
    # a kernel straight from the bits where the type has one and quantizes without weights (Q8_0 ignores them),
    # unless this is an x86 CPU without F16C (no vector conversion of halves: the exact scalar decode)
    direct = getattr(qt, "from_f16", None) if (qw is None or not qt.uses_weights) and half_vectors() else None
    decode = _f16_decode()

    def rows(xs: np.ndarray, os: np.ndarray) -> None:
        if direct is not None:
            counts.append(int(getattr(K, direct[0])(xs.reshape(-1), os.reshape(-1), *direct[1])))
            return
        scratch = np.empty((min(step, xs.shape[0]), n), np.float32)
        bad = 0
        for a in range(0, xs.shape[0], step):
            b = min(xs.shape[0], a + step)
            x = scratch[: b - a]
            bad += int(decode(xs[a:b].reshape(-1), x.reshape(-1)))
            qt.quantize_rows_into(x, os[a:b], qw)
        counts.append(bad)  # list.append is atomic: one entry per chunk of rows

    run_chunked(rows, src, out, threads, elems_per_row=n * max(2, getattr(qt, "_cost", 1)))
    return out, sum(counts)


def dequantize(q: np.ndarray, qtype: GGMLQuantizationType | int | str) -> np.ndarray:
    """uint8 (..., row_bytes) -> float32 (..., n), bit-identical to ``gguf.quants.dequantize``."""
    return get_quant_type(qtype).dequantize(q)


def dequantize_into(q: np.ndarray, qtype: GGMLQuantizationType | int | str, out: np.ndarray) -> np.ndarray:
    """uint8 (..., row_bytes) -> float32 written into ``out`` (C-contiguous, as many values as ``q`` encodes), the
    values of `dequantize` (Q8_0 without any temporary)."""
    return get_quant_type(qtype).dequantize_into(q, out)


#: Plain element types (safetensors dtype tags and ggml names): converted by value.
_PLAIN_DTYPES = {
    "F64": np.float64, "F32": np.float32, "F16": np.float16,
    "I8": np.int8, "I16": np.int16, "I32": np.int32, "I64": np.int64,
}


def to_float32(
    raw: np.ndarray,
    dtype: str | GGMLQuantizationType,
    shape: tuple[int, ...] | None = None,
    *,
    where: str = "tensor",
    copy: bool = True,
) -> np.ndarray:
    """The one bytes -> float32 decoder: stored data of a safetensors dtype tag (``"BF16"``, ``"F16"``, ...) or a
    ggml type (enum or name) -> float32, reshaped to ``shape`` when given.

    ``raw`` holds the elements (uint16 bits for BF16, float16 for F16 ...) or their raw bytes (uint8); quantized
    types take rows of blocks ``(..., row_bytes)`` and give ``(..., n)``. BF16 widens as ggml does (bits shifted
    up), F16 exactly; quantized types through this package's bit-exact dequantizers, else gguf-py's.
    ``copy=False`` may return ``raw`` itself for F32 data (no copy of a large chunk).
    """
    name = dtype.name if isinstance(dtype, GGMLQuantizationType) else str(dtype)
    a = np.asarray(raw)
    if name == "BF16":
        out = bf16_bits_to_f32(a)
    elif name in _PLAIN_DTYPES:
        plain = np.dtype(_PLAIN_DTYPES[name])
        if a.dtype == np.uint8 and plain.itemsize > 1:  # raw bytes of the elements
            a = np.ascontiguousarray(a).view(plain)
        out = a.astype(np.float32, copy=copy)
    else:
        try:
            qtype = GGMLQuantizationType[name]
        except KeyError:
            raise DFlashError(f"{where}: type {name} cannot be read as numbers") from None
        if qtype in QUANT_TYPES:
            out = dequantize(np.asarray(a, dtype=np.uint8), qtype)
        else:
            import gguf.quants

            try:
                out = gguf.quants.dequantize(np.asarray(a, dtype=np.uint8), qtype).astype(np.float32, copy=False)
            except NotImplementedError:
                raise DFlashError(f"{where}: dequantizing {name} is not supported") from None
    return out.reshape(shape) if shape is not None else out


def _load_kernels(calls: list[Callable[[], Any]]) -> None:
    for call in calls:
        try:
            call()
        except Exception:  # noqa: BLE001 - the first real call reports any problem on the caller's thread
            pass


def _start(calls: list[Callable[[], Any]]) -> None:
    if calls:
        threading.Thread(target=_load_kernels, args=(calls,), name="dflashkit-numba-preload", daemon=True).start()


def preload_quantizers(types: Iterable[GGMLQuantizationType], *, weighted: Iterable[GGMLQuantizationType] = (),
                       from_f16: Iterable[GGMLQuantizationType] = ()) -> None:
    """Import numba and load the cached kernels of ``types`` on a daemon thread (one block each), so a caller
    that will quantize pays numba's start-up (~0.4 s) while it does other work. ``weighted``: the types some
    tensor quantizes with an importance matrix (their weighted kernels); ``from_f16``: the types F16 tensors are
    quantized to through `quantize_f16_rows` (the decode beside them, Q8_0's vector kernel). Types that run no
    numba code (F32, Q8_0 from float32) and types without a codec are left out (the real call names the latter)."""
    def block(qt: QuantType) -> np.ndarray:
        return np.zeros((1, qt.block_size), np.float32)

    calls: list[Callable[[], Any]] = [lambda qt=qt: quantize_f16_rows(np.zeros((1, qt.block_size), np.uint16), qt,
                                                                      threads=1)
                                      for t in from_f16 if (qt := QUANT_TYPES.get(t)) is not None]
    if calls:  # the decode of a weighted type's rows (the unweighted calls above may take a direct kernel)
        calls.append(lambda: _f16_decode()(np.zeros(32, np.uint16), np.zeros(32, np.float32)))
    calls += [lambda qt=qt: qt.quantize(block(qt), threads=1)
              for t in types if (qt := QUANT_TYPES.get(t)) is not None and qt.needs_numba]
    calls += [lambda qt=qt: qt.quantize(block(qt), threads=1, imatrix=np.ones(qt.block_size, np.float32))
              for t in weighted if (qt := QUANT_TYPES.get(t)) is not None and qt.needs_numba]
    _start(calls)


def f16_path_types(f16_values: int, types: Iterable[GGMLQuantizationType]) -> frozenset[GGMLQuantizationType]:
    """Which of ``types`` (those F16 tensors are quantized to) go through `quantize_f16_rows`: every type that runs
    numba code anyway, and the rest (Q8_0) once the file's ``f16_values`` make numba's start-up pay for itself."""
    return frozenset(t for t in types if (qt := QUANT_TYPES.get(t)) is not None and t not in _FLOAT_TYPES
                     and (qt.needs_numba or f16_values >= NUMBA_PAYS_VALUES))


def preload_bf16_to_f16() -> None:
    """`preload_quantizers` for the bf16 → f16 kernel (a conversion reads the target's tokenizer meanwhile)."""
    _start([lambda: K.bf16_to_f16_kernel(np.zeros(1, np.uint16), np.zeros(1, np.uint16))])
