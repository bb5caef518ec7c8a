"""Fuzz over GGUF metadata *values* (issue 16): every key the readers use, given values of every wrong type
and range — strings, arrays (empty too), bools, negative, zero, huge, NaN, infinities — one to three keys
at a time. The file stays a well-formed GGUF, so the values reach the decoders, the spec checks, the
model builder and the writers.

Invariants, for inspect, the runtime loader (parity / accept) and translation (convert of a GGUF):
only `DFlashError` escapes (one line, naming the file), inspect never reports an internal error, and
the peak Python allocation (tracemalloc) stays under `PEAK_LIMIT` whatever the metadata claims.
Seeded and bounded: hypothesis runs derandomized with a fixed number of examples.
"""

from __future__ import annotations

import tracemalloc
from pathlib import Path

import pytest
from gguf import GGUFValueType as V
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import hostile
from dflashkit.converters.convert import convert
from dflashkit.dialects import get_dialect
from dflashkit.errors import DFlashError
from dflashkit.inspect import inspect_paths
from dflashkit.runtime import load_drafter

# slow: hypothesis fuzzing of the metadata through the loader, each example a file
pytestmark = pytest.mark.slow

PEAK_LIMIT = 64 * 2**20
EXAMPLES = 60

_DIALECT_KEYS = sorted({get_dialect("llama.cpp").key(ks, "dflash") for ks in get_dialect("llama.cpp").keys})
KEYS = _DIALECT_KEYS + [
    "general.architecture",
    "general.file_type",
    "general.quantization_version",
    "general.alignment",
    "general.name",
    "tokenizer.ggml.model",
    "tokenizer.ggml.tokens",
    "tokenizer.ggml.token_type",
    "tokenizer.ggml.merges",
    "tokenizer.ggml.eos_token_id",
    "tokenizer.ggml.bos_token_id",
]

_INT_TYPES = [V.UINT8, V.INT8, V.UINT16, V.INT16, V.UINT32, V.INT32, V.UINT64, V.INT64]
_RANGES = {V.UINT8: (0, 255), V.INT8: (-128, 127), V.UINT16: (0, 2**16 - 1), V.INT16: (-(2**15), 2**15 - 1),
           V.UINT32: (0, 2**32 - 1), V.INT32: (-(2**31), 2**31 - 1), V.UINT64: (0, 2**64 - 1),
           V.INT64: (-(2**63), 2**63 - 1)}
_EDGE_INTS = [0, 1, 2, 3, -1, 16, 64, 500, 2**16, 2**31 - 1, 2**31, 2**32 - 1, 2**40, 2**63 - 1, -(2**63)]
_EDGE_FLOATS = [0.0, -0.0, 1e-6, -1.0, 1e38, 3.5e38, 1e308, float("nan"), float("inf"), float("-inf"), 5e-324]


@st.composite
def int_values(draw: st.DrawFn) -> tuple:
    vtype = draw(st.sampled_from(_INT_TYPES))
    lo, hi = _RANGES[vtype]
    value = draw(st.one_of(st.sampled_from([v for v in _EDGE_INTS if lo <= v <= hi]), st.integers(lo, hi)))
    return (value, vtype)


@st.composite
def arrays(draw: st.DrawFn) -> tuple:
    sub = draw(st.sampled_from([V.INT32, V.UINT32, V.INT64, V.FLOAT32, V.BOOL, V.STRING, V.UINT8]))
    n = draw(st.integers(0, 6))
    if sub == V.STRING:
        items = draw(st.lists(st.text(max_size=6), min_size=n, max_size=n))
    elif sub == V.FLOAT32:
        items = draw(st.lists(st.sampled_from(_EDGE_FLOATS[:7] + [float("nan"), float("inf")]), min_size=n, max_size=n))
    elif sub == V.BOOL:
        items = draw(st.lists(st.booleans(), min_size=n, max_size=n))
    else:
        lo, hi = _RANGES.get(sub, (0, 255))
        items = draw(st.lists(st.one_of(st.sampled_from([v for v in _EDGE_INTS if lo <= v <= hi]), st.integers(lo, hi)),
                              min_size=n, max_size=n))
    return (items, V.ARRAY, sub)


values = st.one_of(
    int_values(),
    st.tuples(st.sampled_from(_EDGE_FLOATS), st.sampled_from([V.FLOAT32, V.FLOAT64])).map(
        lambda t: (t[0] if t[1] == V.FLOAT64 or abs(t[0]) <= 3.4e38 or t[0] != t[0] else float("inf"), t[1])
    ),
    st.tuples(st.booleans(), st.just(V.BOOL)),
    st.tuples(st.sampled_from(["", "16", "dflash", "nan", "x" * 300, "a\nb", "\x00"]), st.just(V.STRING)),
    arrays(),
)
edits = st.dictionaries(st.sampled_from(KEYS), values, min_size=1, max_size=3)


@pytest.fixture(scope="module")
def base(drafters, tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("fuzzbase") / "base.gguf"
    convert(drafters["qwen3-b16"], out, outtype="f32", progress=False, warn=lambda m: None)
    return out


def _exercise(path: Path, out: Path) -> None:
    report = inspect_paths([str(path)])
    internal = [f.message for f in report.files[0].findings if f.id == "inspect.internal_error"]
    assert not internal, internal
    for action in (lambda: load_drafter(path), lambda: convert(path, out, force=True, progress=False, warn=lambda m: None)):
        try:
            action()
        except DFlashError as exc:
            message = str(exc)
            assert "\n" not in message and str(path.name) in message or str(out.name) in message, message


@settings(max_examples=EXAMPLES, derandomize=True, deadline=None, database=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(edit=edits)
def test_metadata_values(base: Path, tmp_path: Path, edit: dict) -> None:
    path = tmp_path / "fuzz.gguf"
    if "general.architecture" in edit and edit["general.architecture"][1] != V.STRING:
        edit["general.architecture"] = ("dflash", V.STRING)  # gguf-py writes the architecture as a string only
    try:
        hostile.rewrite_gguf(base, path, edit)
    except (ValueError, TypeError, OverflowError, KeyError):
        return  # gguf-py cannot encode that value with that type: not a file anyone can hand us
    tracemalloc.start()
    try:
        _exercise(path, tmp_path / "out.gguf")
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < PEAK_LIMIT, (edit, peak)
