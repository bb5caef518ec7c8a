"""dflashkit.io.safetensors_reader: round trip and every structural error id.

The builders here (``write_checkpoint``, ``write_raw``) are reused by the inspect tests.
"""

from __future__ import annotations

import json
import os
import struct
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from safetensors.numpy import save_file
from safetensors.torch import save_file as save_torch

from dflashkit.io.safetensors_reader import (
    INDEX_NAME,
    CheckpointFormatError,
    SafetensorsCheckpoint,
    open_checkpoint,
)

# --- builders ----------------------------------------------------------------------------------


def sample_tensors() -> dict[str, np.ndarray]:
    rng = np.random.default_rng(1)
    return {
        "model.embed.weight": rng.standard_normal((6, 4)).astype(np.float32),
        "model.norm.weight": rng.standard_normal(4).astype(np.float16),
        "model.ids": np.arange(3, dtype=np.int64),
        "model.mask": np.array([True, False]),
    }


def write_checkpoint(directory: Path, *, shards: int = 1) -> Path:
    """``model.safetensors``, or ``shards`` files plus ``model.safetensors.index.json``."""
    directory.mkdir(parents=True, exist_ok=True)
    tensors = sample_tensors()
    if shards == 1:
        save_file(tensors, str(directory / "model.safetensors"), metadata={"format": "pt"})
        return directory
    names = list(tensors)
    weight_map = {}
    for i in range(shards):
        shard = f"model-{i + 1:05d}-of-{shards:05d}.safetensors"
        part = {n: tensors[n] for n in names[i::shards]}
        save_file(part, str(directory / shard))
        weight_map.update(dict.fromkeys(part, shard))
    (directory / INDEX_NAME).write_text(json.dumps({"metadata": {}, "weight_map": weight_map}))
    return directory


def write_raw(path: Path, header: Any, data: bytes = b"", *, header_length: int | None = None) -> Path:
    """A safetensors file from a raw header (any JSON value or bytes) and data bytes."""
    body = header if isinstance(header, bytes) else json.dumps(header).encode()
    n = len(body) if header_length is None else header_length
    path.write_bytes(struct.pack("<Q", n) + body + data)
    return path


def entry(dtype: str, shape: list[int], begin: int, end: int) -> dict[str, Any]:
    return {"dtype": dtype, "shape": shape, "data_offsets": [begin, end]}


def expect_error(path: Path, check_id: str, *words: str, strict: bool = True, named: Path | None = None) -> CheckpointFormatError:
    with pytest.raises(CheckpointFormatError) as info:
        open_checkpoint(path, strict=strict)
    err, msg = info.value, str(info.value)
    assert err.check_id == check_id, msg
    assert str(named or path) in msg and "\n" not in msg
    for w in words:
        assert w in msg, msg
    return err


def problem_ids(path: Path) -> list[str]:
    with open_checkpoint(path, strict=False) as ck:
        return [p.check_id for p in ck.problems]


# --- round trip ---------------------------------------------------------------------------------


@pytest.mark.parametrize("shards", [1, 2])
def test_roundtrip(tmp_path: Path, shards: int) -> None:
    d = write_checkpoint(tmp_path / "ck", shards=shards)
    src = sample_tensors()
    with open_checkpoint(d) as ck:
        assert isinstance(ck, SafetensorsCheckpoint) and ck.problems == []
        assert len(ck.files) == shards and set(ck.tensors) == set(src)
        keys = [(ck.files.index(t.file), t.offset) for t in ck.tensors.values()]
        assert keys == sorted(keys)
        for name, arr in src.items():
            got = ck.array(name)
            assert not got.flags.writeable and got.dtype == arr.dtype
            np.testing.assert_array_equal(got, arr)
        assert (ck.weight_map is not None) == (shards > 1)


def test_single_file_path_and_bf16_f8(tmp_path: Path) -> None:
    torch.manual_seed(0)
    bf = torch.randn(3, 5).to(torch.bfloat16)
    f8 = torch.randn(4).to(torch.float8_e4m3fn)
    path = tmp_path / "x.safetensors"
    save_torch({"bf": bf, "f8": f8, "empty": torch.zeros(0, 3)}, str(path))
    with open_checkpoint(path) as ck:
        assert ck.files == [path] and ck.directory == tmp_path
        got = ck.array("bf")
        assert got.dtype == np.uint16 and got.shape == (3, 5)
        np.testing.assert_array_equal(got, bf.view(torch.int16).numpy().view(np.uint16))
        assert ck.array("f8").dtype == np.uint8
        np.testing.assert_array_equal(ck.array("f8"), f8.view(torch.uint8).numpy())
        assert ck.array("empty").shape == (0, 3)
        with pytest.raises(CheckpointFormatError, match="no tensor named"):
            ck.array("nope")


# --- error ids ---------------------------------------------------------------------------------


def test_header_length_past_file(tmp_path: Path) -> None:
    p = write_raw(tmp_path / "h.safetensors", {"a": entry("F32", [1], 0, 4)}, b"\0" * 4, header_length=10_000)
    expect_error(p, "safetensors.header_length", "header length 10000", "exceeds")


def test_header_length_over_limit(tmp_path: Path) -> None:
    p = write_raw(tmp_path / "h.safetensors", {}, header_length=2**62)
    expect_error(p, "safetensors.header_length", str(2**62), "100000000-byte limit")


def test_short_and_empty_files(tmp_path: Path) -> None:
    (tmp_path / "e.safetensors").write_bytes(b"")
    expect_error(tmp_path / "e.safetensors", "safetensors.empty", "empty")
    (tmp_path / "s.safetensors").write_bytes(b"\x01\x02\x03")
    expect_error(tmp_path / "s.safetensors", "safetensors.header_length", "3 bytes")


@pytest.mark.parametrize(
    ("header", "check_id", "words"),
    [
        (b"{not json", "safetensors.header_json", ("not valid JSON",)),
        (b"[1, 2]", "safetensors.header_json", ("does not start with",)),
        (b"{" + b'"a":' * 1 + b"[" * 100_000 + b"]" * 100_000 + b"}", "safetensors.header_json", ("JSON",)),
        (b'{"a": 1, "a": 2}', "safetensors.header_json", ("duplicate key",)),
        (b"{\xff}", "safetensors.header_json", ("UTF-8",)),
    ],
)
def test_bad_header_json(tmp_path: Path, header: bytes, check_id: str, words: tuple[str, ...]) -> None:
    expect_error(write_raw(tmp_path / "j.safetensors", header), check_id, *words)


def test_unknown_dtype(tmp_path: Path) -> None:
    p = write_raw(tmp_path / "d.safetensors", {"w": entry("Q4_0", [4], 0, 4)}, b"\0" * 4)
    expect_error(p, "safetensors.dtype", "'w'", "unknown dtype 'Q4_0'")


@pytest.mark.parametrize(
    ("bad", "check_id", "words"),
    [
        ({"dtype": "F32", "shape": [2]}, "safetensors.tensor_entry", ("needs dtype, shape and data_offsets",)),
        (entry("F32", [-1], 0, 8), "safetensors.shape", ("non-negative",)),
        (entry("F32", [2], 8, 0), "safetensors.data_offsets", ("begin <= end",)),
        (entry("F32", [3], 0, 8), "safetensors.data_offsets", ("span 8 bytes", "needs 12")),
    ],
)
def test_bad_entries(tmp_path: Path, bad: dict[str, Any], check_id: str, words: tuple[str, ...]) -> None:
    p = write_raw(tmp_path / "b.safetensors", {"w": bad}, b"\0" * 8)
    expect_error(p, check_id, "'w'", *words)


def test_offsets_out_of_bounds(tmp_path: Path) -> None:
    p = write_raw(tmp_path / "o.safetensors", {"w": entry("F32", [2**40], 0, 2**42)}, b"\0" * 8)
    err = expect_error(p, "safetensors.truncated", "'w'", "bytes missing")
    assert err.values["end"] > err.values["file_size"]


def test_overlap_gap_trailing(tmp_path: Path) -> None:
    p = write_raw(tmp_path / "o.safetensors", {"a": entry("F32", [2], 0, 8), "b": entry("F32", [1], 4, 8)}, b"\0" * 8)
    expect_error(p, "safetensors.tensor_overlap", "'b'", "'a'")
    p = write_raw(tmp_path / "g.safetensors", {"a": entry("F32", [1], 0, 4), "b": entry("F32", [1], 8, 12)}, b"\0" * 12)
    expect_error(p, "safetensors.tensor_gap", "4 unused bytes", "'b'")
    p = write_raw(tmp_path / "t.safetensors", {"a": entry("F32", [1], 0, 4)}, b"\0" * 6)
    expect_error(p, "safetensors.trailing_bytes", "2 bytes after")


def test_bad_metadata(tmp_path: Path) -> None:
    p = write_raw(tmp_path / "m.safetensors", {"__metadata__": {"n": 3}, "a": entry("F32", [1], 0, 4)}, b"\0" * 4)
    expect_error(p, "safetensors.metadata", "__metadata__")
    assert problem_ids(p) == ["safetensors.metadata"]


def test_truncation_at_every_cut_point(tmp_path: Path) -> None:
    d = write_checkpoint(tmp_path / "ck")
    full = (d / "model.safetensors").read_bytes()
    cut = tmp_path / "cut.safetensors"
    cut.write_bytes(full)
    for n in reversed(range(len(full))):  # shrinking in place: cheap even on a slow disk
        os.truncate(cut, n)
        with pytest.raises(CheckpointFormatError) as info:
            open_checkpoint(cut)
        assert str(cut) in str(info.value)
    cut.write_bytes(full[:-1])
    err = expect_error(cut, "safetensors.truncated", "1 bytes missing")
    assert err.values["missing"] == 1


def test_missing_shard(tmp_path: Path) -> None:
    d = write_checkpoint(tmp_path / "ck", shards=3)
    gone = d / "model-00002-of-00003.safetensors"
    gone.unlink()
    expect_error(d, "safetensors.index_missing_shard", "listed in model.safetensors.index.json but missing", "re-download", named=gone)
    with open_checkpoint(d, strict=False) as ck:  # the other shards stay usable
        assert [p.check_id for p in ck.problems] == ["safetensors.index_missing_shard"] and len(ck.files) == 2


def test_index_tensor_not_in_shard(tmp_path: Path) -> None:
    d = write_checkpoint(tmp_path / "ck", shards=2)
    index = json.loads((d / INDEX_NAME).read_text())
    index["weight_map"]["model.ghost"] = "model-00001-of-00002.safetensors"
    (d / INDEX_NAME).write_text(json.dumps(index))
    expect_error(d, "safetensors.index_missing_tensor", "'model.ghost'", named=d / "model-00001-of-00002.safetensors")


def test_index_shard_outside_directory(tmp_path: Path) -> None:
    d = write_checkpoint(tmp_path / "ck", shards=2)
    index = json.loads((d / INDEX_NAME).read_text())
    index["weight_map"]["x"] = "../../etc/passwd"
    (d / INDEX_NAME).write_text(json.dumps(index))
    expect_error(d, "safetensors.index_shard_path", "not a plain file name", named=d / INDEX_NAME)


def test_bad_index(tmp_path: Path) -> None:
    d = tmp_path / "ck"
    d.mkdir()
    (d / INDEX_NAME).write_text('{"metadata": {}}')
    expect_error(d, "safetensors.index_json", "weight_map", named=d / INDEX_NAME, strict=False)
    (d / INDEX_NAME).write_text("{")
    expect_error(d, "safetensors.index_json", "not valid JSON", named=d / INDEX_NAME, strict=False)


def test_duplicate_tensor_across_files(tmp_path: Path) -> None:
    d = tmp_path / "ck"
    d.mkdir()
    save_file({"w": np.zeros(2, np.float32)}, str(d / "a.safetensors"))
    save_file({"w": np.ones(2, np.float32)}, str(d / "b.safetensors"))
    expect_error(d, "safetensors.duplicate_tensor", "'w'", "a.safetensors", named=d / "b.safetensors")


def test_not_a_checkpoint(tmp_path: Path) -> None:
    expect_error(tmp_path, "safetensors.no_checkpoint", "point at the checkpoint directory", strict=False)
    expect_error(tmp_path / "missing", "safetensors.not_found", "no such file", strict=False)


def test_permission_error_is_wrapped(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # chmod 000 does not stop root, so simulate the EACCES an ordinary user gets.
    import dflashkit.io.safetensors_reader as reader

    d = write_checkpoint(tmp_path / "ck")

    def denied(*args: object, **kwargs: object) -> None:
        raise PermissionError(13, "Permission denied")

    monkeypatch.setattr(reader, "open", denied, raising=False)
    expect_error(d, "safetensors.unreadable", "Permission denied", named=d / "model.safetensors")


