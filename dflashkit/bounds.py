"""Bounded readers for numbers that come from files, and safe rendering of what goes into messages.

Nothing a header or config claims is trusted to size work: every count passes through one of these
readers, which check its type (a GGUF value can be a string, an array or a float where an integer
belongs; Python's json accepts ``NaN`` and ``Infinity``) and its range (what the GGUF field that
carries it can hold, and a sane cap) before anything is built from it. Each failure is a one-line
`DFlashError` naming the file and the key.

The caps are far above any published drafter (2-8 layers, hidden size <= 8192, vocabularies
<= 262k) and far below what would exhaust memory through per-layer or per-token structures.
"""

from __future__ import annotations

import json
import math
from typing import Any

from .errors import DFlashError

U32_MAX = 2**32 - 1
I32_MAX = 2**31 - 1
F32_MAX = 3.4028234663852886e38

#: Caps on counts that size per-item structures (names, modules, token lists) before any tensor is read.
MAX_LAYERS = 4096
MAX_VOCAB = 16 * 1024 * 1024  # token-list padding and mask ids; real vocabularies are <= 262,144
MAX_WIDTH = 1 << 20  # hidden / intermediate size, heads, head_dim
MAX_BLOCK_SIZE = 4096
MAX_VOCAB_PADDING = 1 << 16  # ids past the tokenizer's last one padded as [PAD{id}] (real models: < 2,000)
#: How much of a value an error message quotes.
MAX_QUOTE = 120


def quote(value: Any, limit: int = MAX_QUOTE) -> str:
    """``repr(value)`` on one line, cut to ``limit`` characters (a 3 MB shape must not become a 3 MB message)."""
    text = _one_line(repr(value))
    return text if len(text) <= limit else text[: limit - 15] + f"... ({len(text)} chars)"


def escape_name(name: str, limit: int = 200) -> str:
    """A tensor / key / file name made safe for a one-line message: control characters escaped, length cut."""
    text = _one_line(name)
    return text if len(text) <= limit else text[: limit - 15] + f"... ({len(text)} chars)"


def _kind(value: Any) -> str:
    """What a value is, in the words of a file format: string, array, bool, number."""
    if isinstance(value, (str, bytes)):
        return "string"
    if isinstance(value, bool):
        return "bool"
    if isinstance(value, (int, float)):
        return "number"
    if isinstance(value, dict):
        return "object"
    if hasattr(value, "__len__"):
        return "array"
    return type(value).__name__


def one_line(text: str) -> str:
    """``text`` on one line, every non-printable character (newline, ESC, OSC's BEL, ...) written as its escape:
    a string from a file must not move the cursor, retitle the terminal or start a new report line."""
    if text.isprintable():
        return text
    return "".join(c if c.isprintable() else c.encode("unicode_escape").decode("ascii") for c in text)


_one_line = one_line


def int_value(value: Any, key: str, where: str, *, lo: int = 0, hi: int = U32_MAX) -> int:
    """``value`` as an integer in [lo, hi]; a bool, string, array, NaN or non-integral float names ``key``."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise DFlashError(f"{where}: '{key}' must be an integer, got {_kind(value)} {quote(value)}")
    if isinstance(value, float):
        if not math.isfinite(value) or value != int(value):
            raise DFlashError(f"{where}: '{key}' must be an integer, got {quote(value)}")
        value = int(value)
    if not lo <= value <= hi:
        raise DFlashError(f"{where}: '{key}' = {quote(value)} is out of range (expected {lo} .. {hi})")
    return int(value)


def float_value(value: Any, key: str, where: str, *, lo: float = -F32_MAX, hi: float = F32_MAX,
                positive: bool = False) -> float:
    """``value`` as a finite float in [lo, hi] (default: what a GGUF f32 field holds)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise DFlashError(f"{where}: '{key}' must be a number, got {_kind(value)} {quote(value)}")
    try:
        number = float(value)
    except OverflowError:  # an integer with hundreds of digits
        number = math.inf
    if not math.isfinite(number) or not lo <= number <= hi or (positive and number <= 0):
        bound = f"expected a finite number > 0 and <= {hi:g}" if positive else f"expected a finite number in {lo:g} .. {hi:g}"
        raise DFlashError(f"{where}: '{key}' = {quote(value)} is out of range ({bound})")
    return number


def int_list(value: Any, key: str, where: str, *, lo: int = 0, hi: int = U32_MAX, max_len: int = MAX_LAYERS) -> tuple[int, ...]:
    """A non-empty list of integers, each in [lo, hi], at most ``max_len`` long."""
    if isinstance(value, (str, bytes)) or not hasattr(value, "__len__") or not hasattr(value, "__iter__"):
        raise DFlashError(f"{where}: '{key}' must be a list of integers, got {_kind(value)} {quote(value)}")
    if not 0 < len(value) <= max_len:
        raise DFlashError(f"{where}: '{key}' must list 1 .. {max_len} integers, got {len(value)}")
    return tuple(int_value(v, key, where, lo=lo, hi=hi) for v in value)


def json_safe(obj: Any) -> Any:
    """``obj`` with every non-finite float replaced by the string ``"nan"``, ``"inf"`` or ``"-inf"``, as
    the reports render them (``json.dumps`` would print bare ``NaN`` / ``Infinity``, which strict JSON
    parsers reject). Containers are copied, not changed."""
    if isinstance(obj, float):
        return obj if math.isfinite(obj) else "nan" if math.isnan(obj) else "inf" if obj > 0 else "-inf"
    if isinstance(obj, dict):
        return {k: json_safe(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [json_safe(v) for v in obj]
    if hasattr(obj, "tolist") and callable(obj.tolist):  # numpy values, GGUF numeric arrays
        return json_safe(obj.tolist())
    return obj


def dumps(obj: Any, **kwargs: Any) -> str:
    """``json.dumps`` that always yields strict JSON (non-finite numbers become strings, see `json_safe`)."""
    return json.dumps(json_safe(obj), allow_nan=False, **kwargs)


#: Spec field → (lowest, highest) integer a GGUF drafter may claim for it. Counts that size
#: per-layer / per-head / per-token work are capped; the rest are bounded by their GGUF field.
#: A zero size decodes: `dflashkit.spec_checks` names it ("n_layers must be >= 1, got 0"), in the
#: same words for a translation, a run and an inspection.
FIELD_RANGES: dict[str, tuple[int, int]] = {
    "hidden_size": (0, MAX_WIDTH),
    "n_layers": (0, MAX_LAYERS),
    "n_heads": (0, MAX_WIDTH),
    "n_kv_heads": (0, MAX_WIDTH),
    "head_dim": (0, MAX_WIDTH),
    "intermediate_size": (0, MAX_WIDTH),
    "context_length": (0, U32_MAX),
    "block_size": (0, MAX_BLOCK_SIZE),
    "mask_token_id": (0, U32_MAX),
    "vocab_size": (1, MAX_VOCAB),
    "num_target_layers": (1, MAX_LAYERS),
    "luce_n_target_layers": (1, MAX_LAYERS),
    "n_target_features": (1, MAX_WIDTH * MAX_LAYERS),
    "sliding_window": (0, U32_MAX),
    "rope_dimension_count": (0, MAX_WIDTH),
    "conv_kernel_size": (1, MAX_WIDTH),
    "conv_group_size": (1, MAX_WIDTH),
    "selector_rank": (1, MAX_WIDTH),
    "selector_top_k": (1, MAX_WIDTH),
}
_INT_TYPES = {"UINT8", "INT8", "UINT16", "INT16", "UINT32", "INT32", "UINT64", "INT64"}


def metadata_value(value: Any, key: str, field: str, type_name: str, sub_type_name: str | None,
                   where: str = "metadata") -> Any:
    """A GGUF metadata value checked against what the dialect table says it is (its GGUF type by name,
    ``UINT32`` / ``FLOAT32`` / ``ARRAY`` of ``INT32`` ...) and the range of its spec field: a string
    or an array where a number belongs, NaN, or a count past `FIELD_RANGES` is a one-line error."""
    if type_name in _INT_TYPES:
        lo, hi = FIELD_RANGES.get(field, (0, U32_MAX))
        return int_value(value, key, where, lo=lo, hi=hi)
    if type_name in ("FLOAT32", "FLOAT64"):
        return float_value(value, key, where)
    if type_name == "BOOL":
        if not isinstance(value, bool):
            raise DFlashError(f"{where}: '{key}' must be true or false, got {_kind(value)} {quote(value)}")
        return value
    if type_name == "ARRAY":
        if sub_type_name == "BOOL":
            if isinstance(value, (str, bytes)) or not hasattr(value, "__len__") or not 0 < len(value) <= MAX_LAYERS:
                raise DFlashError(f"{where}: '{key}' must be a list of 1 .. {MAX_LAYERS} booleans, got {quote(value)}")
            if not all(isinstance(v, (bool, int)) and not isinstance(v, float) for v in value):
                raise DFlashError(f"{where}: '{key}' must be a list of booleans, got {quote(value)}")
            return value
        return int_list(value, key, where, lo=-(2**31), hi=I32_MAX)
    if type_name == "STRING" and not isinstance(value, str):
        raise DFlashError(f"{where}: '{key}' must be a string, got {_kind(value)} {quote(value)}")
    return value
