"""Values a conversion cannot carry over, counted per tensor: NaN / ±inf inputs, and finite values an F16 output
turns into ±inf (|x| ≥ 65520 rounds past 65504, F16's largest finite value).

`dflash-convert` and `dflash-quantize` count them on the rows they convert, and count NaN / ±inf in the tensors they
copy byte for byte (`StoredScan`: from the stored bits, on a thread beside the kernel copy). `dflash-convert` warns
with the tensor names, and under ``--strict`` refuses at the first; `dflash-quantize` refuses, as llama-quantize does,
naming the first such tensor in the file's order (`ValueCounts.first_problem`) — before the output file is published.
`dflash-inspect` counts every tensor of a file with the same `nonfinite_count`.

Stored float bits are counted in windows that stay in the CPU cache (`SCAN_BYTES`): the magnitude (sign bit
cleared) of a NaN or ±inf is at least its exponent mask, so one ``bitwise_and`` and one ``max`` per window clear a
clean window — ~3 GB/s on one core, faster than numpy's masked compare (0.6 GB/s) and with no numba import (0.4 s
and ~100 MB of LLVM beside a copy that takes half a second); only a window holding one is counted exactly.

Block-quantized tensors are not dequantized: a block's values are its float scales times small integers, so they
are non-finite exactly when a scale is, and then every value of that block is (``0 × inf`` is NaN). The scales'
places in each block are ggml-common.h's ``block_*`` structs, which gguf-py does not expose; a test checks every
entry against gguf-py's own dequantizer. Not scanned: IQ1_M, MXFP4 and NVFP4 pack their scales into other fields
(and MXFP4's largest scales overflow on their own), Q8_K is no file type; `dflash-diff` and `dflash-parity` see
their values.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

import numpy as np
from gguf import GGMLQuantizationType

from dflashkit.errors import DFlashError
from dflashkit.quant_types import sizes

from .base import QUANT_TYPES

#: element type → (its bits as a numpy dtype, the exponent mask: all ones = NaN or ±inf)
_FLOAT_BITS: dict[str, tuple[type, int]] = {
    "F32": (np.uint32, 0x7F800000), "F16": (np.uint16, 0x7C00), "BF16": (np.uint16, 0x7F80),
    "F64": (np.uint64, 0x7FF0000000000000),
}
#: element type → its bits with the sign cleared (the magnitude)
_MAGNITUDE: dict[str, int] = {"F32": 0x7FFFFFFF, "F16": 0x7FFF, "BF16": 0x7FFF, "F64": 0x7FFFFFFFFFFFFFFF}
_D = ((0, "F16"),)
#: block-quantized type → (byte offset in the block, width) of each float scale: `d`, and `m` / `dmin` where present.
#: The types dflashkit writes name theirs in their modules (`QuantType.fp16_fields`); the rest a file may hold:
_BLOCK_SCALES: dict[str, tuple[tuple[int, str], ...]] = {
    "IQ2_XXS": _D, "IQ2_XS": _D, "IQ2_S": _D, "IQ3_XXS": _D, "IQ3_S": _D, "IQ1_S": _D,
    "TQ1_0": ((52, "F16"),), "TQ2_0": ((64, "F16"),),
}
_BLOCK_SCALES.update((qt.name, tuple((at, "F16") for at in qt.fp16_fields))
                     for qt in QUANT_TYPES.values() if qt.block_size > 1)
assert all(_BLOCK_SCALES[qt.name] for qt in QUANT_TYPES.values() if qt.block_size > 1), \
    "a block type's module names its fp16 scales (fp16_fields): the values scan reads them"
assert all(kind == "F16" for scales in _BLOCK_SCALES.values() for _, kind in scales)  # `_nonfinite_units` reads them so
SCANNED_TYPES = frozenset(_FLOAT_BITS) | frozenset(_BLOCK_SCALES)
CHUNK_BYTES = 32 << 20
#: the read window of a scan beside a copy: read and counted while it is still in the CPU's L2 cache
SCAN_BYTES = 512 << 10


def scan_buffer(tensor_bytes: Iterable[int], limit: int = CHUNK_BYTES) -> bytearray:
    """One read buffer for a file's tensors: the largest of them, at most ``limit`` (small files stay small)."""
    return bytearray(max(8, min(limit, max(tensor_bytes, default=0))))


def nonfinite_count(path: str | os.PathLike, offset: int, nbytes: int, type_name: str, buffer: bytearray,
                    stop: threading.Event | None = None) -> int:
    """NaN / ±inf values of one tensor of ``type_name`` (a `SCANNED_TYPES` member; GGUF or safetensors spelling)
    at ``path[offset : offset + nbytes]``, read through ``buffer``; ``stop`` set: the count so far."""
    values, unit = stored_unit(type_name)
    step = len(buffer) - len(buffer) % unit
    count = 0
    with open(path, "rb", buffering=0) as f:
        done = 0
        while done < nbytes and not (stop is not None and stop.is_set()):
            n = os.preadv(f.fileno(), [memoryview(buffer)[: min(step, nbytes - done)]], offset + done)
            if n < unit:
                break  # truncated: the structure checks say so
            n -= n % unit
            count += values * _nonfinite_units(np.frombuffer(buffer, np.uint8, count=n), type_name, unit)
            done += n
    return count


def stored_unit(type_name: str) -> tuple[int, int]:
    """(values, bytes) of the unit a stored ``type_name`` tensor is counted in: one value, or one block."""
    if type_name in _BLOCK_SCALES:
        return sizes(GGMLQuantizationType[type_name])
    return 1, np.dtype(_FLOAT_BITS[type_name][0]).itemsize


def _nonfinite_units(data: np.ndarray, type_name: str, unit: int) -> int:
    """Non-finite values (a plain float type) or blocks with a non-finite scale (a block type) in ``data``."""
    if type_name in _FLOAT_BITS:
        dtype, mask = _FLOAT_BITS[type_name]
        count = 0
        step = SCAN_BYTES // np.dtype(dtype).itemsize
        bits = data.view(dtype)
        magnitude = np.empty(min(step, len(bits)), dtype)
        for start in range(0, len(bits), step):
            window = bits[start : start + step]
            m = magnitude[: len(window)]
            np.bitwise_and(window, dtype(_MAGNITUDE[type_name]), out=m)
            if m.max() >= mask:  # rare: count exactly
                count += int(np.count_nonzero(m >= mask))
        return count
    blocks = data.reshape(-1, unit)
    scales = _BLOCK_SCALES[type_name]
    if unit % 2 == 0 and data.ctypes.data % 2 == 0 and all(start % 2 == 0 for start, _ in scales):
        # every block is whole uint16s and each scale one of them: a strided view of the scales, no copy
        halves = data.view(np.uint16).reshape(-1, unit // 2)
        columns = [halves[:, start // 2] for start, _ in scales]
    else:
        columns = [np.ascontiguousarray(blocks[:, start : start + 2]).view(np.uint16).reshape(-1)
                   for start, _ in scales]
    mask = np.uint16(_FLOAT_BITS["F16"][1])  # every block scale is an F16
    if not any((np.bitwise_and(c, mask) == mask).any() for c in columns):  # the common case: one pass, nothing bad
        return 0
    bad = np.zeros(len(blocks), dtype=bool)
    for c in columns:
        bad |= (c & mask) == mask
    return int(np.count_nonzero(bad))


#: the smallest magnitude that rounds to ±inf in F16 (round to nearest even: 65504 + half an F16 step)
F16_OVERFLOW = np.float32(65520.0)


#: the smallest magnitude that rounds to ±inf in BF16 (round to nearest even, as ggml's fp32→bf16: the float32 bits
#: 0x7F7F8000, half a BF16 step past its largest finite value 0x7F7F)
BF16_OVERFLOW = np.array([0x7F7F8000], np.uint32).view(np.float32)[0]


def _count(x: np.ndarray, to_f16: bool, to_bf16: bool = False) -> tuple[int, int]:
    """(non-finite values, finite values beyond F16 — or BF16 with ``to_bf16``) of float32 ``x``."""
    nonfinite = x.size - int(np.count_nonzero(np.isfinite(x)))
    if not (to_f16 or to_bf16):
        return nonfinite, 0
    beyond = int(np.count_nonzero(np.abs(x) >= (F16_OVERFLOW if to_f16 else BF16_OVERFLOW)))  # ±inf counted too
    return nonfinite, beyond - int(np.count_nonzero(np.isinf(x)))


def _problem(kind: str, n: int, type_name: str = "") -> str:
    """What a count of ``kind`` (a `ValueCounts` field) says of its tensor, after ``tensor 'NAME'``."""
    return {"nonfinite": f" has {n} NaN or infinite value(s)",
            "f16_overflow": f" has {n} value(s) beyond ±65504",
            "bf16_overflow": f" has {n} value(s) beyond BF16's ±3.39e38 (they become ±inf)",
            "scale_overflow": f": {n} {type_name} block(s) whose scale overflows F16 (±inf: its values are too large "
                              "for the type)"}[kind]


@dataclass
class ValueCounts:
    """Per-tensor counts, shared by the threads that convert a file's chunks."""

    source: str
    strict: bool = False
    nonfinite: dict[str, int] = field(default_factory=dict)
    f16_overflow: dict[str, int] = field(default_factory=dict)
    scale_overflow: dict[str, int] = field(default_factory=dict)  # quantized blocks whose F16 scale became ±inf
    scale_type: dict[str, str] = field(default_factory=dict)  # the type of those blocks
    bf16_overflow: dict[str, int] = field(default_factory=dict)  # finite values a BF16 output turned into ±inf
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    def add(self, name: str, x: np.ndarray, *, to_f16: bool = False, to_bf16: bool = False) -> int:
        """Count a float32 chunk of tensor ``name`` (``to_f16`` / ``to_bf16``: the output is F16 / BF16, whose
        largest values round to ±inf); returns its non-finite count."""
        nonfinite, overflow = _count(x, to_f16, to_bf16)
        if to_bf16 and overflow:  # past ±3.39e38: rare enough to be named on its own
            self.record(name, nonfinite, 0)
            self.record_bf16(name, overflow)
        else:
            self.record(name, nonfinite, overflow)
        return nonfinite

    def record_bf16(self, name: str, overflow: int) -> None:
        if self.strict:
            raise DFlashError(f"{self.source}: tensor '{name}'{_problem('bf16_overflow', overflow)} — refusing under "
                              "--strict (without it: written, with a warning)")
        with self._lock:
            self.bf16_overflow[name] = self.bf16_overflow.get(name, 0) + overflow

    def add_blocks(self, name: str, blocks: np.ndarray, type_name: str) -> None:
        """Count the blocks of a quantized chunk (from finite values) whose F16 scale overflowed to ±inf: a block of
        values near ±1e6 in Q4_0 (scale max/8 past 65504) dequantizes to inf and NaN. Under --strict: refused."""
        if type_name not in _BLOCK_SCALES:
            return
        bad = _nonfinite_units(np.ascontiguousarray(blocks).view(np.uint8).reshape(-1), type_name,
                               stored_unit(type_name)[1])
        if not bad:
            return
        if self.strict:
            raise DFlashError(f"{self.source}: tensor '{name}'{_problem('scale_overflow', bad, type_name)} — refusing "
                              "under --strict; keep this tensor in bf16 or f32 (--tensor-type)")
        with self._lock:
            self.scale_overflow[name] = self.scale_overflow.get(name, 0) + bad
            self.scale_type[name] = type_name

    def add_bf16_to_f16(self, name: str, bits: np.ndarray) -> None:
        """Count a BF16 chunk (uint16 bits) bound for F16 from its bits alone, in one pass over half the bytes of
        a float32 count: a magnitude's bits at or above 0x7F80 are NaN / inf; a finite one at or above 0x4780
        (65536; the BF16 value below it is 65280) rounds past F16's 65504."""
        from .loops import bf16_f16_specials  # numba: only the path that already runs the numba kernel

        nonfinite, overflow = bf16_f16_specials(np.ascontiguousarray(bits).view(np.uint16).reshape(-1))
        self.record(name, int(nonfinite), int(overflow))

    def record(self, name: str, nonfinite: int, overflow: int) -> None:
        """Add counts for tensor ``name`` (under --strict: raise if there are any)."""
        if not (nonfinite or overflow):
            return
        if self.strict:
            what = _problem("nonfinite", nonfinite) if nonfinite else _problem("f16_overflow", overflow)
            raise DFlashError(f"{self.source}: tensor '{name}'{what} — refusing under --strict (without it: "
                              "written, with a warning)")
        with self._lock:
            if nonfinite:
                self.nonfinite[name] = self.nonfinite.get(name, 0) + nonfinite
            if overflow:
                self.f16_overflow[name] = self.f16_overflow.get(name, 0) + overflow

    def first_problem(self, order: Sequence[str]) -> tuple[str, str, str] | None:
        """The first tensor of ``order`` (the order the file is processed in) with a count, as (its `ValueCounts`
        field, its name, ``"SOURCE: tensor 'NAME' has …"`` with how many other tensors have one); None if none.
        Its NaN / ±inf inputs come first: they are read (and refused by llama-quantize) before they are converted."""
        kinds = ("nonfinite", "f16_overflow", "bf16_overflow", "scale_overflow")
        named = {name for kind in kinds for name in getattr(self, kind)}
        first = next((name for name in order if name in named), None)
        if first is None:
            return None
        kind = next(k for k in kinds if first in getattr(self, k))
        more = f" (and {len(named) - 1} more tensor(s))" if len(named) > 1 else ""
        return kind, first, (f"{self.source}: tensor '{first}'"
                      f"{_problem(kind, getattr(self, kind)[first], self.scale_type.get(first, ''))}{more}")

    def warnings(self, order: Sequence[str] = ()) -> list[str]:
        """One line per tensor with a count; tensors named in ``order`` (the file's order) first, in that order."""
        rank = {name: i for i, name in enumerate(order)}

        def ranked(counts: dict[str, int]) -> list[tuple[str, int]]:
            return sorted(counts.items(), key=lambda item: rank.get(item[0], len(rank)))

        out = [f"{name}: {n} NaN or infinite value(s), written as they are (a runtime computes NaN from them)"
               for name, n in ranked(self.nonfinite)]
        out += [f"{name}: {n} value(s) beyond ±65504 became ±inf in F16 (use bf16 or f32 for this tensor)"
                for name, n in ranked(self.f16_overflow)]
        out += [f"{name}: {n} value(s) beyond ±3.39e38 became ±inf in BF16 (use f32 for this tensor)"
                for name, n in ranked(self.bf16_overflow)]
        out += [f"{name}: {n} quantized block(s) whose scale overflowed F16 to ±inf (a runtime computes inf / NaN "
                "from them; keep this tensor in bf16 or f32)" for name, n in ranked(self.scale_overflow)]
        return out


class StoredScan:
    """NaN / ±inf in the tensors a command writes byte for byte (kernel copies), counted from the source's stored
    bits on one thread beside the writer — the copy runs in the kernel, so on two cores the scan costs little wall
    time — and recorded in ``counts`` by `finish`, in the order given (warnings come out in that order)."""

    def __init__(self, counts: ValueCounts, tensors: Sequence[tuple[str, str | os.PathLike, int, int, str]]) -> None:
        """``tensors``: (name, file, offset, bytes, type) of each copied tensor; types not scanned are skipped."""
        self._counts = counts
        self._tensors = [t for t in tensors if t[4] in SCANNED_TYPES and t[3]]
        self._found: dict[str, int] = {}
        self._error: BaseException | None = None
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="dflashkit-values", daemon=True)
        if self._tensors:
            self._thread.start()

    def _run(self) -> None:
        try:
            # one cache-sized window: read and counted before it leaves the L2 cache, and nothing added to the peak
            buffer = scan_buffer((t[3] for t in self._tensors), SCAN_BYTES)
            for name, path, offset, nbytes, type_name in self._tensors:
                if self._stop.is_set():
                    return
                self._found[name] = nonfinite_count(path, offset, nbytes, type_name, buffer, self._stop)
        except BaseException as exc:  # reported by finish(), on the writer's thread
            self._error = exc

    def finish(self) -> None:
        """Wait for the scan; record its counts (under --strict: raise at the first tensor with any)."""
        if not self._tensors:
            return
        self._thread.join()
        if self._error is not None:
            raise self._error
        for name, *_ in self._tensors:
            if self._found.get(name):
                self._counts.record(name, self._found[name], 0)

    def cancel(self) -> None:
        """Stop the scan at its next chunk (an interrupted or failed write)."""
        self._stop.set()
