"""dflashkit.io.gguf_reader: round-trip against gguf.GGUFReader and every structural error id.

The builders here (``write_gguf``, ``tensor_field_offsets``, ``patch``) are reused by the
inspect tests.
"""

from __future__ import annotations

import os
import struct
import tracemalloc
from pathlib import Path

import gguf
import numpy as np
import pytest
from gguf import GGMLQuantizationType, GGUFValueType
from gguf.quants import quantize

from dflashkit.errors import DFlashError
from dflashkit.io.gguf_reader import GGUFFile, GGUFFormatError, open_gguf

# --- builders ----------------------------------------------------------------------------------

SCALAR_KVS: list[tuple[str, GGUFValueType, object]] = [
    ("test.u8", GGUFValueType.UINT8, 200),
    ("test.i8", GGUFValueType.INT8, -100),
    ("test.u16", GGUFValueType.UINT16, 60000),
    ("test.i16", GGUFValueType.INT16, -30000),
    ("test.u32", GGUFValueType.UINT32, 4_000_000_000),
    ("test.i32", GGUFValueType.INT32, -2_000_000_000),
    ("test.f32", GGUFValueType.FLOAT32, 0.5),
    ("test.bool", GGUFValueType.BOOL, True),
    ("test.str", GGUFValueType.STRING, "héllo wörld"),
    ("test.u64", GGUFValueType.UINT64, 2**63 + 5),
    ("test.i64", GGUFValueType.INT64, -(2**62)),
    ("test.f64", GGUFValueType.FLOAT64, 1e300),
]
ARRAY_KVS: list[tuple[str, GGUFValueType, list]] = [
    ("test.arr_i32", GGUFValueType.INT32, [1, -2, 3]),
    ("test.arr_f32", GGUFValueType.FLOAT32, [0.25, -1.5]),
    ("test.arr_str", GGUFValueType.STRING, ["a", "", "Ġtoken", "日本"]),
    ("test.arr_bool", GGUFValueType.BOOL, [True, False, True]),
    ("test.arr_u8", GGUFValueType.UINT8, [0, 255]),
    ("test.arr_i64", GGUFValueType.INT64, [-(2**63), 2**63 - 1]),
]


def default_tensors() -> dict[str, tuple[np.ndarray, GGMLQuantizationType | None]]:
    rng = np.random.default_rng(0)
    w = rng.standard_normal((4, 64)).astype(np.float32)
    return {
        "tensor.f32": (rng.standard_normal((3, 8)).astype(np.float32), None),
        "tensor.f16": (rng.standard_normal((2, 16)).astype(np.float16), None),
        "tensor.q8_0": (quantize(w, GGMLQuantizationType.Q8_0), GGMLQuantizationType.Q8_0),
        "tensor.i32": (np.arange(5, dtype=np.int32), None),
    }


def write_gguf(
    path: Path,
    *,
    tensors: dict[str, tuple[np.ndarray, GGMLQuantizationType | None]] | None = None,
    alignment: int | None = None,
    arch: str = "qwen3",
    extra_kvs: bool = True,
) -> Path:
    """A small valid GGUF: KVs of every value type (scalars and arrays) and a few tensors."""
    w = gguf.GGUFWriter(str(path), arch)
    if alignment is not None:
        w.add_custom_alignment(alignment)
    if extra_kvs:
        for key, vtype, value in SCALAR_KVS:
            w.add_key_value(key, value, vtype)
        for key, sub, value in ARRAY_KVS:
            w.add_key_value(key, value, GGUFValueType.ARRAY, sub_type=sub)
    for name, (arr, raw_dtype) in (default_tensors() if tensors is None else tensors).items():
        w.add_tensor(name, arr, raw_dtype=raw_dtype)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


def tensor_field_offsets(data: bytes, name: str) -> dict[str, int]:
    """File offsets of a tensor-info record's fields, found via its (unique) name."""
    enc = name.encode()
    start = data.index(struct.pack("<Q", len(enc)) + enc)
    pos = start + 8 + len(enc)
    (n_dims,) = struct.unpack_from("<I", data, pos)
    fields = {"name_length": start, "n_dims": pos, "dims": pos + 4}
    pos += 4 + 8 * n_dims
    fields["type"] = pos
    fields["offset"] = pos + 4
    return fields


def patch(src: Path, dst: Path, at: int, fmt: str, value: int) -> Path:
    data = bytearray(src.read_bytes())
    struct.pack_into(fmt, data, at, value)
    dst.write_bytes(bytes(data))
    return dst


def last_tensor_end(path: Path) -> int:
    with open_gguf(path) as f:
        return max(t.end for t in f.tensors.values())


@pytest.fixture()
def good(tmp_path: Path) -> Path:
    return write_gguf(tmp_path / "good.gguf")


def expect_error(path: Path, check_id: str, *words: str, strict: bool = True) -> GGUFFormatError:
    with pytest.raises(GGUFFormatError) as info:
        open_gguf(path, strict=strict)
    err = info.value
    msg = str(err)
    assert err.check_id == check_id, msg
    assert err.path == path
    assert str(path) in msg and "\n" not in msg
    for w in words:
        assert w in msg, msg
    return err


# --- round trip ---------------------------------------------------------------------------------


def test_roundtrip_matches_gguf_reader(good: Path) -> None:
    ref = gguf.GGUFReader(good)
    with open_gguf(good) as f:
        assert isinstance(f, GGUFFile) and f.problems == []
        assert f.version == 3 and f.alignment == 32 and f.data_start % 32 == 0
        assert f.file_size == good.stat().st_size
        assert f.get("general.architecture") == "qwen3"
        assert f.get("missing", 7) == 7
        ref_fields = {k: v for k, v in ref.fields.items() if not k.startswith("GGUF.")}
        assert list(f.kvs) == list(ref_fields)
        for key, field in ref_fields.items():
            kv = f.kvs[key]
            assert kv.type == field.types[0], key
            if kv.type is GGUFValueType.ARRAY:
                assert kv.sub_type == field.types[1]
                assert kv.value == list(field.contents()), key
            else:
                assert kv.sub_type is None
                assert kv.value == field.contents(), key
        for key, vtype, value in SCALAR_KVS:
            assert f.kvs[key].type is vtype and f.get(key) == pytest.approx(value)
        for key, sub, value in ARRAY_KVS:
            assert f.kvs[key].sub_type is sub and f.get(key) == pytest.approx(value)
        assert isinstance(f.get("test.bool"), bool)

        assert list(f.tensors) == [t.name for t in ref.tensors]
        for rt in ref.tensors:
            info = f.tensors[rt.name]
            assert info.offset == rt.data_offset and info.nbytes == rt.n_bytes
            assert info.dims == tuple(int(d) for d in rt.shape) and info.shape == info.dims[::-1]
            raw = f.raw(rt.name)
            assert raw.dtype == np.uint8 and raw.ndim == 1 and not raw.flags.writeable
            assert raw.tobytes() == np.asarray(rt.data).tobytes()


def test_typed_arrays(good: Path) -> None:
    src = default_tensors()
    with open_gguf(good) as f:
        for name in ("tensor.f32", "tensor.f16", "tensor.i32"):
            arr = f.array(name)
            np.testing.assert_array_equal(arr, src[name][0])
            assert arr.dtype == src[name][0].dtype and not arr.flags.writeable
        q = f.array("tensor.q8_0")
        assert q.dtype == np.uint8 and q.shape == (4, 2 * 34)
        np.testing.assert_array_equal(q, src["tensor.q8_0"][0])
        with pytest.raises(GGUFFormatError, match="no tensor named"):
            f.raw("nope")


def test_bf16_array_is_uint16(tmp_path: Path) -> None:
    bits = np.arange(12, dtype=np.uint16).reshape(3, 4)
    path = write_gguf(tmp_path / "bf16.gguf", tensors={"b": (bits.view(np.uint8).reshape(3, 8), GGMLQuantizationType.BF16)})
    with open_gguf(path) as f:
        arr = f.array("b")
        assert arr.dtype == np.uint16 and arr.shape == (3, 4)
        np.testing.assert_array_equal(arr, bits)


def test_custom_alignment_and_version_2(tmp_path: Path) -> None:
    path = write_gguf(tmp_path / "a64.gguf", alignment=64)
    with open_gguf(path) as f:
        assert f.alignment == 64 and all(t.offset % 64 == 0 for t in f.tensors.values())
    v2 = patch(path, tmp_path / "v2.gguf", 4, "<I", 2)
    with open_gguf(v2) as f:
        assert f.version == 2


def test_large_vocab_reads_whole(tmp_path: Path) -> None:
    n = 150_000
    w = gguf.GGUFWriter(str(tmp_path / "vocab.gguf"), "qwen3")
    w.add_token_list([f"tok{i}" for i in range(n)])
    w.add_token_merges([f"a{i} b{i}" for i in range(n)])
    w.add_token_types([1] * n)
    w.add_tensor("t", np.zeros(8, np.float32))
    w.write_header_to_file(); w.write_kv_data_to_file(); w.write_tensors_to_file(); w.close()
    with open_gguf(tmp_path / "vocab.gguf") as f:
        assert len(f.get("tokenizer.ggml.tokens")) == n and f.get("tokenizer.ggml.merges")[-1] == f"a{n-1} b{n-1}"
        assert f.get("tokenizer.ggml.tokens")[n // 2] == f"tok{n // 2}"


# --- error ids ---------------------------------------------------------------------------------


def test_bad_magic(good: Path, tmp_path: Path) -> None:
    bad = tmp_path / "bad.gguf"
    bad.write_bytes(b"GGML" + good.read_bytes()[4:])
    assert isinstance(expect_error(bad, "gguf.magic", "not a GGUF file", "GGML"), DFlashError)


@pytest.mark.parametrize(
    ("version", "words"),
    [(4, ("unsupported GGUF version 4",)), (1, ("version 1",)), (0x03000000, ("big-endian",)), (0, ("version 0",))],
)
def test_bad_version(good: Path, tmp_path: Path, version: int, words: tuple[str, ...]) -> None:
    bad = patch(good, tmp_path / "v.gguf", 4, "<I", version)
    expect_error(bad, "gguf.version", *words, strict=False)


def test_absurd_tensor_count_bounded_before_allocating(good: Path, tmp_path: Path) -> None:
    bad = patch(good, tmp_path / "n.gguf", 8, "<Q", 2**63)
    tracemalloc.start()
    try:
        expect_error(bad, "gguf.tensor_count", str(2**63), "at most", strict=False)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 1 << 20


def test_absurd_kv_count(good: Path, tmp_path: Path) -> None:
    bad = patch(good, tmp_path / "k.gguf", 16, "<Q", 2**64 - 1)
    expect_error(bad, "gguf.kv_count", "key-value pairs", strict=False)


def test_absurd_string_length(good: Path, tmp_path: Path) -> None:
    bad = patch(good, tmp_path / "s.gguf", 24, "<Q", 2**40)  # the first key's length
    expect_error(bad, "gguf.string_length", str(2**40), "key #0", strict=False)


def test_absurd_array_length(good: Path, tmp_path: Path) -> None:
    data = good.read_bytes()
    key = b"test.arr_i32"
    at = data.index(struct.pack("<Q", len(key)) + key) + 8 + len(key) + 4 + 4  # past value type + sub type
    bad = patch(good, tmp_path / "a.gguf", at, "<Q", 2**62)
    expect_error(bad, "gguf.array_length", "test.arr_i32", str(2**62), strict=False)


def test_unknown_value_type(good: Path, tmp_path: Path) -> None:
    data = good.read_bytes()
    key = b"test.u8"
    at = data.index(struct.pack("<Q", len(key)) + key) + 8 + len(key)
    bad = patch(good, tmp_path / "t.gguf", at, "<I", 77)
    expect_error(bad, "gguf.kv_type", "test.u8", "unknown value type 77", strict=False)


def test_bad_alignment(tmp_path: Path) -> None:
    path = write_gguf(tmp_path / "a.gguf", alignment=64)
    data = path.read_bytes()
    at = data.index(b"general.alignment") + len(b"general.alignment") + 4
    bad = patch(path, tmp_path / "bad.gguf", at, "<I", 48)
    expect_error(bad, "gguf.alignment", "power-of-two", "48")
    with open_gguf(bad, strict=False) as f:
        assert f.alignment == 32 and "gguf.alignment" in {p.check_id for p in f.problems}


def test_misaligned_offset(good: Path, tmp_path: Path) -> None:
    at = tensor_field_offsets(good.read_bytes(), "tensor.f16")["offset"]
    (orig,) = struct.unpack_from("<Q", good.read_bytes(), at)
    bad = patch(good, tmp_path / "m.gguf", at, "<Q", orig + 4)
    expect_error(bad, "gguf.tensor_offset", "tensor.f16", "not a multiple of the alignment 32")


def test_overlapping_tensors(good: Path, tmp_path: Path) -> None:
    at = tensor_field_offsets(good.read_bytes(), "tensor.f16")["offset"]
    bad = patch(good, tmp_path / "o.gguf", at, "<Q", 0)  # same data as tensor.f32
    err = expect_error(bad, "gguf.tensor_overlap", "tensor.f16", "tensor.f32", "overlaps")
    assert err.values["other"] in ("tensor.f16", "tensor.f32")


def test_unknown_ggml_type(good: Path, tmp_path: Path) -> None:
    at = tensor_field_offsets(good.read_bytes(), "tensor.i32")["type"]
    bad = patch(good, tmp_path / "u.gguf", at, "<I", 999)
    expect_error(bad, "gguf.tensor_type", "tensor.i32", "unknown ggml type 999")
    with open_gguf(bad, strict=False) as f:  # the rest stays usable
        assert "tensor.i32" not in f.tensors and "tensor.f32" in f.tensors and f.n_tensors == 4


def test_row_not_multiple_of_block(good: Path, tmp_path: Path) -> None:
    at = tensor_field_offsets(good.read_bytes(), "tensor.q8_0")["dims"]
    bad = patch(good, tmp_path / "b.gguf", at, "<Q", 48)
    expect_error(bad, "gguf.tensor_block", "tensor.q8_0", "48", "block size 32")


def test_too_many_dims(good: Path, tmp_path: Path) -> None:
    at = tensor_field_offsets(good.read_bytes(), "tensor.i32")["n_dims"]
    bad = patch(good, tmp_path / "d.gguf", at, "<I", 2**31)
    expect_error(bad, "gguf.tensor_dims", "tensor.i32", str(2**31), strict=False)


def test_negative_dim(good: Path, tmp_path: Path) -> None:
    at = tensor_field_offsets(good.read_bytes(), "tensor.i32")["dims"]
    bad = patch(good, tmp_path / "d.gguf", at, "<Q", 2**64 - 1)
    expect_error(bad, "gguf.tensor_dims", "tensor.i32", "impossible dimensions")


def test_duplicate_tensor_and_key(good: Path, tmp_path: Path) -> None:
    data = bytearray(good.read_bytes())
    i = data.index(b"tensor.i32")
    data[i : i + 10] = b"tensor.f32"
    k = data.index(b"test.u16")
    data[k : k + 8] = b"test.i16"  # same length, same value size: file stays parseable
    (tmp_path / "dup.gguf").write_bytes(bytes(data))
    expect_error(tmp_path / "dup.gguf", "gguf.kv_duplicate", "test.i16", "twice")
    with open_gguf(tmp_path / "dup.gguf", strict=False) as f:
        ids = {p.check_id for p in f.problems}
        assert ids == {"gguf.kv_duplicate", "gguf.tensor_duplicate"}
        assert len(f.tensors) == 3


def test_non_strict_collects_every_problem(good: Path, tmp_path: Path) -> None:
    data = good.read_bytes()
    bad = patch(good, tmp_path / "x.gguf", tensor_field_offsets(data, "tensor.f16")["offset"], "<Q", 4)
    patch(bad, bad, tensor_field_offsets(data, "tensor.i32")["type"], "<I", 999)
    with open_gguf(bad, strict=False) as f:
        ids = {p.check_id for p in f.problems}
    assert {"gguf.tensor_offset", "gguf.tensor_overlap", "gguf.tensor_type"} <= ids


def test_truncation_at_every_cut_point(good: Path, tmp_path: Path) -> None:
    data = good.read_bytes()
    end = last_tensor_end(good)
    cut = tmp_path / "cut.gguf"
    cut.write_bytes(data)
    for n in reversed(range(len(data))):  # shrinking in place: cheap even on a slow disk
        os.truncate(cut, n)
        if n >= end:  # only the last tensor's alignment padding is missing: every byte is there
            with open_gguf(cut) as f:
                assert f.problems == []
            continue
        with pytest.raises(GGUFFormatError) as info:
            open_gguf(cut)
        assert str(cut) in str(info.value)
        try:  # non-strict: either parsing stops, or the truncation is collected
            with open_gguf(cut, strict=False) as f:
                assert "gguf.truncated" in {p.check_id for p in f.problems}, n
        except GGUFFormatError:
            pass


def test_one_byte_short_of_last_tensor(good: Path, tmp_path: Path) -> None:
    end = last_tensor_end(good)
    cut = tmp_path / "short.gguf"
    cut.write_bytes(good.read_bytes()[: end - 1])
    err = expect_error(cut, "gguf.truncated", "tensor.i32", f"ends at byte {end}", "1 bytes missing")
    assert err.values["missing"] == 1
    with open_gguf(cut, strict=False) as f:
        assert [p.check_id for p in f.problems] == ["gguf.truncated"]
        with pytest.raises(GGUFFormatError, match="tensor.i32"):
            f.raw("tensor.i32")
        assert f.array("tensor.f32").shape == (3, 8)  # earlier tensors stay readable


def test_header_cut_reports_truncated(good: Path, tmp_path: Path) -> None:
    cut = tmp_path / "h.gguf"
    cut.write_bytes(good.read_bytes()[:10])
    expect_error(cut, "gguf.truncated", "24-byte GGUF header")


def test_directory(tmp_path: Path) -> None:
    expect_error(tmp_path, "gguf.not_a_file", "is a directory")


def test_empty_file(tmp_path: Path) -> None:
    (tmp_path / "e.gguf").write_bytes(b"")
    expect_error(tmp_path / "e.gguf", "gguf.empty", "empty")


def test_missing_file(tmp_path: Path) -> None:
    expect_error(tmp_path / "nope.gguf", "gguf.not_found", "no such file")


def test_fifo_is_refused_not_read(tmp_path: Path) -> None:
    if not hasattr(os, "mkfifo"):
        pytest.skip("no FIFOs on this platform")
    os.mkfifo(tmp_path / "pipe.gguf")
    expect_error(tmp_path / "pipe.gguf", "gguf.not_a_file", "not a regular file")


def test_permission_error_is_wrapped(good: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # Runs even as root: simulate the EACCES that chmod 000 gives an ordinary user.
    import dflashkit.io.gguf_reader as reader

    def denied(*args: object, **kwargs: object) -> None:
        raise PermissionError(13, "Permission denied")

    monkeypatch.setattr(reader, "open", denied, raising=False)
    expect_error(good, "gguf.unreadable", "Permission denied")
