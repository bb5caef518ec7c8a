"""Non-finite weights: every float tensor of a GGUF or a checkpoint is read and its NaN / ±inf values counted.

A NaN weight loads without a word in llama.cpp and turns every draft into nothing (τ = 1: the trained pair's
planted-NaN file accepts zero tokens there); one finding names each tensor and its count. Read with ``pread`` into
one bounded buffer (the resident set stays one chunk, whatever the file's size), counted on the exponent bits
(no float conversion). Block-quantized GGUF tensors are not dequantized here (their scales would be the place to
look); `dflash-diff` and `dflash-parity` see their values.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Iterator
from pathlib import Path

import numpy as np

from dflashkit.inspect.checks import InspectContext, register_check
from dflashkit.inspect.findings import Finding, error

#: element type → (its bits as a numpy dtype, the exponent mask: all ones = NaN or ±inf)
_FLOAT_BITS: dict[str, tuple[type, int]] = {
    "F32": (np.uint32, 0x7F800000), "F16": (np.uint16, 0x7C00), "BF16": (np.uint16, 0x7F80),
    "F64": (np.uint64, 0x7FF0000000000000),
}
CHUNK_BYTES = 32 << 20
MAX_NAMED = 8


def nonfinite_count(path: Path, offset: int, nbytes: int, type_name: str, buffer: bytearray) -> int:
    """NaN / ±inf values of one float tensor stored at ``path[offset : offset + nbytes]``."""
    dtype, mask = _FLOAT_BITS[type_name]
    exponent = dtype(mask)
    step = len(buffer) - len(buffer) % np.dtype(dtype).itemsize
    count = 0
    with open(path, "rb", buffering=0) as f:
        done = 0
        while done < nbytes:
            n = os.preadv(f.fileno(), [memoryview(buffer)[: min(step, nbytes - done)]], offset + done)
            if n <= 0:
                break  # truncated: the structure checks say so
            bits = np.frombuffer(buffer, dtype=dtype, count=n // np.dtype(dtype).itemsize)
            count += int(np.count_nonzero((bits & exponent) == exponent))
            done += n
    return count


def _buffer(sizes: Iterable[int]) -> bytearray:
    """One read buffer for a file's tensors: the largest of them, at most `CHUNK_BYTES` (small files stay small)."""
    return bytearray(max(8, min(CHUNK_BYTES, max(sizes, default=0))))


def _report(ctx: InspectContext, counts: dict[str, int]) -> Iterator[Finding]:
    bad = {name: n for name, n in counts.items() if n}
    if not bad:
        return
    named = ", ".join(f"{name} ({n})" for name, n in list(bad.items())[:MAX_NAMED])
    more = f" and {len(bad) - MAX_NAMED} more" if len(bad) > MAX_NAMED else ""
    yield error("tensor.nonfinite", f"{ctx.path}: {sum(bad.values())} NaN or infinite weight value(s) in "
                f"{len(bad)} tensor(s): {named}{more} — every draft through them is NaN; re-convert from a good "
                "checkpoint", tensors=bad)


@register_check("tensor.values", kinds=("gguf",), order=150)
def check_gguf_values(ctx: InspectContext) -> Iterator[Finding]:
    g = ctx.gguf
    assert g is not None
    if g.problems or ctx.has_errors("gguf."):
        return  # offsets or sizes already reported as broken
    floats = [t for t in g.tensors.values() if t.ggml_type.name in _FLOAT_BITS]
    buffer = _buffer(t.nbytes for t in floats)
    yield from _report(ctx, {t.name: nonfinite_count(g.path, t.offset, t.nbytes, t.ggml_type.name, buffer)
                             for t in floats})


@register_check("tensor.values_checkpoint", kinds=("safetensors",), order=150)
def check_checkpoint_values(ctx: InspectContext) -> Iterator[Finding]:
    ck = ctx.checkpoint
    assert ck is not None
    if ck.problems or ctx.has_errors("safetensors."):
        return
    floats = [t for t in ck.tensors.values() if t.dtype in _FLOAT_BITS]
    buffer = _buffer(t.nbytes for t in floats)
    yield from _report(ctx, {t.name: nonfinite_count(Path(t.file), t.offset, t.nbytes, t.dtype, buffer)
                             for t in floats})
