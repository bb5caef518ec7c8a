"""Non-finite weights: every float tensor of a GGUF or a checkpoint is read and its NaN / ±inf values counted.

A NaN weight loads without a word in llama.cpp and turns every draft into nothing (τ = 1: the trained pair's
planted-NaN file accepts zero tokens there); one finding names each tensor and its count. The counting
(`codecs.values.nonfinite_count`: stored bits read through one bounded buffer; block-quantized tensors through their
scales) is shared with convert and quantize, which scan the tensors they copy byte for byte.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

from dflashkit.codecs.values import SCANNED_TYPES, nonfinite_count, scan_buffer as _buffer
from dflashkit.inspect.checks import InspectContext, register_check
from dflashkit.inspect.findings import Finding, error

MAX_NAMED = 8


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
    floats = [t for t in ck.tensors.values() if t.dtype in SCANNED_TYPES]
    buffer = _buffer(t.nbytes for t in floats)
    yield from _report(ctx, {t.name: nonfinite_count(Path(t.file), t.offset, t.nbytes, t.dtype, buffer)
                             for t in floats})
