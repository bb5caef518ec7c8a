"""Non-finite weights: every float tensor of a GGUF or a checkpoint is read and its NaN / ±inf values counted.

A NaN weight loads without a word in llama.cpp and turns every draft into nothing (τ = 1: the trained pair's
planted-NaN file accepts zero tokens there); one finding names each tensor and its count. Read with ``pread`` into
one bounded buffer (the resident set stays one chunk, whatever the file's size), counted on the exponent bits
(no float conversion).

Block-quantized GGUF tensors are not dequantized: a block's values are its float scales times small integers, so
they are non-finite exactly when a scale is, and then every value of that block is (``0 × inf`` is NaN). The
scales' places in each block are ggml-common.h's ``block_*`` structs, which gguf-py does not expose; a test checks
every entry against gguf-py's own dequantizer. Not scanned: IQ1_M, MXFP4 and NVFP4 pack their scales into other
fields (and MXFP4's largest scales overflow on their own), Q8_K is no file type; `dflash-diff` and
`dflash-parity` see their values.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Iterator
from pathlib import Path

import numpy as np
from gguf import GGMLQuantizationType

from dflashkit.inspect.checks import InspectContext, register_check
from dflashkit.inspect.findings import Finding, error
from dflashkit.quant_types import sizes

#: element type → (its bits as a numpy dtype, the exponent mask: all ones = NaN or ±inf)
_FLOAT_BITS: dict[str, tuple[type, int]] = {
    "F32": (np.uint32, 0x7F800000), "F16": (np.uint16, 0x7C00), "BF16": (np.uint16, 0x7F80),
    "F64": (np.uint64, 0x7FF0000000000000),
}
_D, _DM = ((0, "F16"),), ((0, "F16"), (2, "F16"))
#: block-quantized type → (byte offset in the block, width) of each float scale: `d`, and `m` / `dmin` where present
_BLOCK_SCALES: dict[str, tuple[tuple[int, str], ...]] = {
    "Q4_0": _D, "Q4_1": _DM, "Q5_0": _D, "Q5_1": _DM, "Q8_0": _D,
    "Q2_K": ((80, "F16"), (82, "F16")), "Q3_K": ((108, "F16"),), "Q4_K": _DM, "Q5_K": _DM, "Q6_K": ((208, "F16"),),
    "IQ2_XXS": _D, "IQ2_XS": _D, "IQ2_S": _D, "IQ3_XXS": _D, "IQ3_S": _D, "IQ1_S": _D, "IQ4_NL": _D, "IQ4_XS": _D,
    "TQ1_0": ((52, "F16"),), "TQ2_0": ((64, "F16"),),
}
SCANNED_TYPES = frozenset(_FLOAT_BITS) | frozenset(_BLOCK_SCALES)
CHUNK_BYTES = 32 << 20
MAX_NAMED = 8


def nonfinite_count(path: Path, offset: int, nbytes: int, type_name: str, buffer: bytearray) -> int:
    """NaN / ±inf values of one tensor of ``type_name`` (a `SCANNED_TYPES` member) at ``path[offset : offset +
    nbytes]``."""
    if type_name in _BLOCK_SCALES:
        values, unit = sizes(GGMLQuantizationType[type_name])
    else:
        values, unit = 1, np.dtype(_FLOAT_BITS[type_name][0]).itemsize
    step = len(buffer) - len(buffer) % unit
    count = 0
    with open(path, "rb", buffering=0) as f:
        done = 0
        while done < nbytes:
            n = os.preadv(f.fileno(), [memoryview(buffer)[: min(step, nbytes - done)]], offset + done)
            if n < unit:
                break  # truncated: the structure checks say so
            n -= n % unit
            count += values * _nonfinite_units(np.frombuffer(buffer, np.uint8, count=n), type_name, unit)
            done += n
    return count


def _nonfinite_units(data: np.ndarray, type_name: str, unit: int) -> int:
    """Non-finite values (a plain float type) or blocks with a non-finite scale (a block type) in ``data``."""
    if type_name in _FLOAT_BITS:
        dtype, mask = _FLOAT_BITS[type_name]
        return int(np.count_nonzero((data.view(dtype) & dtype(mask)) == mask))
    blocks = data.reshape(-1, unit)
    bad = np.zeros(len(blocks), dtype=bool)
    for start, kind in _BLOCK_SCALES[type_name]:
        dtype, mask = _FLOAT_BITS[kind]
        width = np.dtype(dtype).itemsize
        bits = np.ascontiguousarray(blocks[:, start : start + width]).view(dtype).reshape(-1)
        bad |= (bits & dtype(mask)) == mask
    return int(np.count_nonzero(bad))


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
    scanned = [t for t in g.tensors.values() if t.ggml_type.name in SCANNED_TYPES]
    buffer = _buffer(t.nbytes for t in scanned)
    yield from _report(ctx, {t.name: nonfinite_count(g.path, t.offset, t.nbytes, t.ggml_type.name, buffer)
                             for t in scanned})


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
