"""Fuzz: whatever bytes a path holds, inspect_paths returns findings and an exit code — never an
exception, never a hang, never an allocation sized by a count read from the file.

A seeded mutation loop over small valid GGUF / safetensors files (truncations, byte flips, extreme
values written exactly over the header's count, length, type, dims and offset fields, splices,
random bytes) plus a hypothesis pass over arbitrary bytes.
"""

from __future__ import annotations

import json
import os
import random
import struct
import tempfile
import tracemalloc
from collections.abc import Callable, Iterator
from pathlib import Path

import gguf
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from test_gguf_reader import write_gguf
from test_safetensors_reader import write_checkpoint

from dflashkit.inspect import InspectReport, inspect_paths

# slow: thousands of mutated and truncated files through the readers
pytestmark = pytest.mark.slow

SEED = 20240611
MUTATIONS_PER_BASE = 1000
EXTREMES = [0, 1, 3, 31, 255, 2**16 - 1, 2**31, 2**32 - 1, 2**32, 2**40, 2**62, 2**63 - 1, 2**63, 2**64 - 1]


# --- bases --------------------------------------------------------------------------------------------


def write_vocab_gguf(path: Path) -> Path:
    """A GGUF shaped like a real one: tokenizer arrays, several tensor types, custom alignment."""
    w = gguf.GGUFWriter(str(path), "qwen3")
    w.add_custom_alignment(64)
    w.add_token_list([f"tok{i}" for i in range(40)])
    w.add_token_merges([f"t{i} o{i}" for i in range(20)])
    w.add_token_types([1] * 40)
    w.add_float32("qwen3.rope.freq_base", 1e6)
    w.add_tensor("token_embd.weight", np.ones((8, 32), np.float16))
    w.add_tensor("blk.0.attn_q.weight", gguf.quants.quantize(np.ones((2, 64), np.float32), gguf.GGMLQuantizationType.Q8_0),
                 raw_dtype=gguf.GGMLQuantizationType.Q8_0)
    w.add_tensor("output_norm.weight", np.ones(32, np.float32))
    w.write_header_to_file(); w.write_kv_data_to_file(); w.write_tensors_to_file(); w.close()
    return path


def gguf_header_fields(path: Path) -> list[tuple[int, int]]:
    """(offset, size) of every u32/u64 structural header field (version, counts, string and array
    lengths, value types, tensor dims, types and offsets; not KV values), located through
    gguf.GGUFReader's memmap views."""
    reader = gguf.GGUFReader(path)
    base = reader.data.ctypes.data
    parts = []
    for name, f in reader.fields.items():
        # f.data indexes the value parts of a KV; the GGUF.* pseudo-fields are header fields.
        parts += [p for i, p in enumerate(f.parts) if name.startswith("GGUF.") or i not in f.data]
    parts += [p for t in reader.tensors for p in t.field.parts]
    out = set()
    for p in parts:
        if p.dtype.itemsize in (4, 8):
            start = p.ctypes.data - base
            out.update((start + k * p.dtype.itemsize, p.dtype.itemsize) for k in range(p.size))
    return sorted(out)


# --- mutations ----------------------------------------------------------------------------------------

Mutation = Callable[[random.Random, bytes, list[tuple[int, int]]], bytes]


def truncate(rng: random.Random, data: bytes, fields: list[tuple[int, int]]) -> bytes:
    return data[: rng.randrange(len(data))]


def flip_bytes(rng: random.Random, data: bytes, fields: list[tuple[int, int]]) -> bytes:
    buf = bytearray(data)
    for _ in range(rng.randint(1, 8)):
        buf[rng.randrange(len(buf))] = rng.randrange(256)
    return bytes(buf)


def extreme_field(rng: random.Random, data: bytes, fields: list[tuple[int, int]]) -> bytes:
    buf = bytearray(data)
    if fields:
        at, size = rng.choice(fields)
    else:  # no known fields (safetensors): the length prefix or any spot
        at, size = rng.choice([(0, 8), (rng.randrange(len(buf) - 8), 8)])
    value = rng.choice(EXTREMES) % (1 << (8 * size))
    struct.pack_into("<I" if size == 4 else "<Q", buf, at, value)
    return bytes(buf)


def extreme_anywhere(rng: random.Random, data: bytes, fields: list[tuple[int, int]]) -> bytes:
    buf = bytearray(data)
    struct.pack_into("<Q", buf, rng.randrange(len(buf) - 8), rng.choice(EXTREMES))
    return bytes(buf)


def splice(rng: random.Random, data: bytes, fields: list[tuple[int, int]]) -> bytes:
    a, b = sorted(rng.randrange(len(data)) for _ in range(2))
    if rng.random() < 0.5:
        return data[:a] + data[b:]  # delete a span
    return data[:a] + rng.randbytes(rng.randint(1, 64)) + data[a:]  # insert junk


def random_bytes(rng: random.Random, data: bytes, fields: list[tuple[int, int]]) -> bytes:
    prefix = rng.choice([b"", b"GGUF", b"GGUF\x03\x00\x00\x00", data[:24], data[:8]])
    return prefix + rng.randbytes(rng.randint(0, 512))


MUTATIONS: list[Mutation] = [truncate, flip_bytes, extreme_field, extreme_field, extreme_anywhere, splice, random_bytes]


# --- the invariant --------------------------------------------------------------------------------------


def check_invariants(path: Path, label: str) -> InspectReport:
    report = inspect_paths([str(path)])
    code = report.exit_code()
    text, doc = report.to_text(), json.loads(report.to_json(indent=None))
    assert code in (0, 1) and doc["exit_code"] == code, label
    findings = report.files[0].findings
    assert not [f for f in findings if f.id == "inspect.internal_error"], f"{label}: {text}"
    assert code == (1 if any(f.severity.value == "error" for f in findings) else 0), label
    assert all("\n" not in f.message and f.message for f in findings), label
    return report


@pytest.fixture()
def scratch(tmp_path: Path) -> Iterator[Path]:
    """Where mutated inputs are written: tmpfs when there is one, because thousands of rewrites of
    a disk-backed file cost far more than inspecting them."""
    shm = Path("/dev/shm")
    if shm.is_dir() and os.access(shm, os.W_OK):
        with tempfile.TemporaryDirectory(dir=shm, prefix="dflash-fuzz-") as d:
            yield Path(d)
    else:
        yield tmp_path


@pytest.fixture(scope="module")
def bases(tmp_path_factory: pytest.TempPathFactory) -> dict[str, tuple[bytes, list[tuple[int, int]]]]:
    root = tmp_path_factory.mktemp("bases")
    g1 = write_gguf(root / "kvs.gguf")
    g2 = write_vocab_gguf(root / "vocab.gguf")
    st_file = write_checkpoint(root / "ck") / "model.safetensors"
    return {
        "kvs.gguf": (g1.read_bytes(), gguf_header_fields(g1)),
        "vocab.gguf": (g2.read_bytes(), gguf_header_fields(g2)),
        "ck.safetensors": (st_file.read_bytes(), []),
    }


def test_mutation_loop(bases: dict[str, tuple[bytes, list[tuple[int, int]]]], scratch: Path) -> None:
    rng = random.Random(SEED)
    n = 0
    errors = 0
    for name, (data, fields) in bases.items():
        # Suffixes exercise both the by-name and the by-content routes into the readers.
        suffixes = [Path(name).suffix, ".bin"]
        for i in range(MUTATIONS_PER_BASE):
            mutation = rng.choice(MUTATIONS)
            mutated = mutation(rng, data, fields)
            path = scratch / f"in{rng.choice(suffixes)}"
            path.write_bytes(mutated)
            report = check_invariants(path, f"{name} #{i} {mutation.__name__} (seed {SEED})")
            errors += report.exit_code()
            n += 1
    assert n == 3 * MUTATIONS_PER_BASE and errors > n // 2  # most mutations must be caught, not just survived


def test_every_truncation_of_real_files(bases: dict[str, tuple[bytes, list[tuple[int, int]]]], scratch: Path) -> None:
    for name, (data, _) in bases.items():
        path = scratch / name
        path.write_bytes(data)
        for cut in reversed(range(len(data))):
            os.truncate(path, cut)
            check_invariants(path, f"{name} cut at {cut}")


def test_extreme_values_in_every_header_field(bases: dict[str, tuple[bytes, list[tuple[int, int]]]], scratch: Path) -> None:
    """Every count/length/type/dims/offset field set to every extreme: always an error finding, and
    bounded memory (nothing is sized by the claimed value)."""
    tracemalloc.start()
    try:
        for name in ("kvs.gguf", "vocab.gguf"):
            data, fields = bases[name]
            path = scratch / name
            for at, size in fields:
                for value in {v % (1 << (8 * size)) for v in EXTREMES if v % (1 << (8 * size)) >= 2**31}:
                    buf = bytearray(data)
                    struct.pack_into("<I" if size == 4 else "<Q", buf, at, value)
                    path.write_bytes(bytes(buf))
                    tracemalloc.reset_peak()
                    report = check_invariants(path, f"{name} field@{at} = {value}")
                    assert tracemalloc.get_traced_memory()[1] < 8 << 20, f"{name} field@{at} = {value}"
                    assert report.exit_code() == 1, report.to_text()
    finally:
        tracemalloc.stop()


def test_mutated_sharded_checkpoint(scratch: Path) -> None:
    rng = random.Random(SEED + 1)
    d = write_checkpoint(scratch / "ck", shards=2)
    originals = {p: p.read_bytes() for p in sorted(d.iterdir())}
    for i in range(300):
        target = rng.choice(list(originals))
        mutation = rng.choice([truncate, flip_bytes, extreme_anywhere, splice])
        target.write_bytes(mutation(rng, originals[target], []))
        check_invariants(d, f"{target.name} #{i} {mutation.__name__}")
        target.write_bytes(originals[target])


@settings(derandomize=True, max_examples=300, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    prefix=st.sampled_from([b"", b"GGUF\x03\x00\x00\x00", b"GGUF\x02\x00\x00\x00", b"\x10\x00\x00\x00\x00\x00\x00\x00{"]),
    body=st.binary(max_size=1024),
    suffix=st.sampled_from([".gguf", ".safetensors", ""]),
)
def test_arbitrary_bytes(scratch: Path, prefix: bytes, body: bytes, suffix: str) -> None:
    path = scratch / f"h{suffix}"
    path.write_bytes(prefix + body)
    check_invariants(path, repr((prefix + body)[:64]))


# --- structure-aware generators: well-formed framing around hostile values ---------------------------

_U64 = st.one_of(st.integers(0, 64), st.sampled_from(EXTREMES))
_JSON = st.recursive(
    st.none() | st.booleans() | st.integers(-(2**70), 2**70) | st.floats(allow_nan=True) | st.text(max_size=8),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4),
    max_leaves=12,
)


def _gguf_string(draw: st.DrawFn) -> bytes:
    raw = draw(st.text(max_size=12)).encode()
    n = draw(st.one_of(st.just(len(raw)), _U64))
    return struct.pack("<Q", n) + raw


@st.composite
def gguf_files(draw: st.DrawFn) -> bytes:
    out = bytearray(b"GGUF" + struct.pack("<I", draw(st.sampled_from([3, 3, 3, 2, 1, 4, 0x03000000]))))
    n_kv = draw(st.integers(0, 5))
    n_tensors = draw(st.integers(0, 4))
    out += struct.pack("<QQ", draw(st.one_of(st.just(n_tensors), _U64)), draw(st.one_of(st.just(n_kv), _U64)))
    for _ in range(n_kv):
        out += _gguf_string(draw)
        vtype = draw(st.integers(0, 14))
        out += struct.pack("<I", vtype)
        if vtype == 9:  # array: element type, count, then elements
            sub = draw(st.integers(0, 14))
            count = draw(st.integers(0, 4))
            out += struct.pack("<IQ", sub, draw(st.one_of(st.just(count), _U64)))
            for _ in range(count):
                out += _gguf_string(draw) if sub == 8 else draw(st.binary(min_size=0, max_size=8))
        elif vtype == 8:
            out += _gguf_string(draw)
        else:
            out += draw(st.binary(min_size=1, max_size=8))
    offset = 0
    for _ in range(n_tensors):
        out += _gguf_string(draw)
        dims = draw(st.lists(st.one_of(st.sampled_from([1, 2, 32, 64]), _U64), max_size=5))
        out += struct.pack("<I", draw(st.one_of(st.just(len(dims)), st.integers(0, 2**32 - 1))))
        out += b"".join(struct.pack("<Q", d % 2**64) for d in dims)
        out += struct.pack("<I", draw(st.sampled_from([0, 1, 8, 12, 30, 4, 39, 2**31])))
        out += struct.pack("<Q", draw(st.one_of(st.just(offset), _U64)))
        offset += 32 * draw(st.integers(0, 4))
    out += bytes(-len(out) % 32) + draw(st.binary(max_size=512))
    return bytes(out)


@st.composite
def safetensors_files(draw: st.DrawFn) -> bytes:
    header: dict[str, object] = {}
    if draw(st.booleans()):
        header["__metadata__"] = draw(_JSON)
    begin = 0
    for i in range(draw(st.integers(0, 4))):
        shape = draw(st.one_of(st.lists(st.integers(0, 6), max_size=3), _JSON))
        dtype = draw(st.one_of(st.sampled_from(["F32", "F16", "BF16", "I8", "BOOL", "F4", "F8_E4M3", "Q4"]), _JSON))
        size = draw(st.integers(0, 64))
        offsets = draw(st.one_of(st.just([begin, begin + size]), _JSON))
        begin += size
        entry = {"dtype": dtype, "shape": shape, "data_offsets": offsets}
        header[f"t{i}"] = entry if draw(st.integers(0, 5)) else draw(_JSON)
    body = json.dumps(header).encode()
    n = draw(st.one_of(st.just(len(body)), _U64))
    return struct.pack("<Q", n % 2**64) + body + draw(st.binary(max_size=300))


@settings(derandomize=True, max_examples=300, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(data=gguf_files())
def test_structured_gguf(scratch: Path, data: bytes) -> None:
    path = scratch / "s.gguf"
    path.write_bytes(data)
    check_invariants(path, repr(data[:64]))


@settings(derandomize=True, max_examples=300, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(data=safetensors_files(), weight_map=st.one_of(_JSON, st.dictionaries(st.text(max_size=6), st.sampled_from(["model.safetensors", "x.safetensors", "../x", ""]))))
def test_structured_safetensors(scratch: Path, data: bytes, weight_map: object) -> None:
    d = scratch / "ck"
    d.mkdir(exist_ok=True)
    (d / "model.safetensors").write_bytes(data)
    (d / "model.safetensors.index.json").write_text(json.dumps({"weight_map": weight_map}))
    check_invariants(d, f"index {str(weight_map)[:80]}")
    (d / "model.safetensors.index.json").unlink()
    check_invariants(d, repr(data[:64]))
