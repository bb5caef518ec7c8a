"""dflash-quantize --imatrix: the file read as llama-quantize reads it (GGUF and legacy, its normalisation, the
include / exclude rules, the ``quantize.imatrix.*`` keys it records), and every wrong matrix a one-line error that
names the file and the tensor, with its exit code — before anything is written."""

from __future__ import annotations

import struct
from pathlib import Path

import numpy as np
import pytest
from click.testing import CliRunner

import make_drafters
from dflashkit.cli import quantize_command
from dflashkit.converters.convert import convert
from dflashkit.io.gguf_reader import open_gguf
from dflashkit.quantize.imatrix_read import load_imatrix
from imatrix_files import weight_tensors, write_gguf_imatrix, write_legacy_imatrix

QUIET = dict(progress=False, warn=lambda m: None)


@pytest.fixture(scope="module")
def model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    folder = tmp_path_factory.mktemp("im")
    src = make_drafters.make_drafter(folder / "src", "qwen3-b16", config_overrides=dict(
        hidden_size=256, intermediate_size=512, head_dim=64, num_hidden_layers=2,
        dflash_config={"mask_token_id": 500, "target_layer_ids": [1, 5]}))
    out = folder / "bf16.gguf"
    convert(src, out, outtype="bf16", **QUIET)
    return out


def _quantize(model: Path, out: Path, *args: str):  # type: ignore[no-untyped-def]
    return CliRunner().invoke(quantize_command, [str(model), str(out), *args, "-q"])


def _one_error(res, code: int, *parts: str) -> None:  # type: ignore[no-untyped-def]
    lines = res.output.strip().splitlines()
    assert res.exit_code == code and len(lines) == 1 and lines[0].startswith("error: "), res.output
    for p in parts:
        assert p in lines[0], (p, lines[0])


def test_gguf_and_legacy_weights_are_llama_quantizes(model: Path, tmp_path: Path) -> None:
    entries = weight_tensors(model)
    g = load_imatrix(write_gguf_imatrix(tmp_path / "m.gguf", entries, count=37.0))
    with open_gguf(tmp_path / "m.gguf") as f:
        sums = np.array(f.array(f"{entries[0][0]}.in_sum2"))
    assert np.array_equal(g.weights[entries[0][0]], sums / np.float32(37.0))
    assert (g.datasets, g.chunk_count, g.legacy, sorted(g.weights)) == (["unit-test.txt"], 5, False,
                                                                        sorted(n for n, _ in entries))
    legacy = load_imatrix(write_legacy_imatrix(tmp_path / "m.dat", entries, ncall=11))
    raw = (tmp_path / "m.dat").read_bytes()
    first = np.frombuffer(raw, "<f4", count=entries[0][1], offset=4 + 4 + len(entries[0][0]) + 8)
    assert np.array_equal(legacy.weights[entries[0][0]], first / np.float32(11))
    assert (legacy.datasets, legacy.chunk_count, legacy.legacy) == (["legacy.txt"], 3, True)
    only = load_imatrix(tmp_path / "m.gguf", exclude=["ffn"], include=["attn", "ffn_up"])
    assert sorted(only.weights) == sorted(n for n, _ in entries if "attn" in n) and only.filtered


def test_the_keys_llama_quantize_records(model: Path, tmp_path: Path) -> None:
    deep = tmp_path / ("d" * 140)
    deep.mkdir()
    im = write_gguf_imatrix(deep / "m.gguf", weight_tensors(model))
    out = tmp_path / "q.gguf"
    res = _quantize(model, out, "q4_0", "--imatrix", str(im))
    assert res.exit_code == 0, res.output
    with open_gguf(out) as g:
        keys = list(g.kvs)[-6:]
        assert keys == ["general.quantization_version", "general.file_type", "quantize.imatrix.file",
                        "quantize.imatrix.dataset", "quantize.imatrix.entries_count", "quantize.imatrix.chunks_count"]
        assert g.get("quantize.imatrix.file") == str(im)[:127]  # strncpy(…, 127) in llama-quantize
        assert (g.get("quantize.imatrix.dataset"), g.get("quantize.imatrix.chunks_count")) == ("unit-test.txt", 5)
        assert g.get("quantize.imatrix.entries_count") == len(weight_tensors(model))
        assert g.get("general.file_type") == 2


def _edited(model: Path, tmp_path: Path, **kw) -> Path:  # type: ignore[no-untyped-def]
    return write_gguf_imatrix(tmp_path / "bad.gguf", kw.pop("entries", weight_tensors(model)), **kw)


@pytest.mark.parametrize("case, code, parts", [
    ("nan", 1, ["blk.0.attn_q.weight: value nan is not finite"]),
    ("negative", 1, ["blk.0.attn_k.weight: a negative sum of squares"]),
    ("wrong length", 1, ["blk.1.ffn_down.weight: 256 weights for a tensor of 512 columns"]),
    ("the target's", 1, ["has weights for blk.7.attn_q.weight, a tensor this file does not have", "the target's"]),
    ("missing entry", 1, ["no weights for blk.0.attn_v.weight (quantized to IQ4_XS)", "--exclude-weights"]),
    ("no metadata", 1, ["missing imatrix metadata"]),
])
def test_a_wrong_matrix_is_one_line_naming_the_tensor(model: Path, tmp_path: Path, case: str, code: int,
                                                      parts: list[str]) -> None:
    entries = weight_tensors(model)
    kw: dict = {}
    if case == "nan":
        kw["edit"] = lambda n, s: np.where(np.arange(s.size) == 3, np.nan, s).astype(np.float32) \
            if n == "blk.0.attn_q.weight" else s
    elif case == "negative":
        kw["edit"] = lambda n, s: -s if n == "blk.0.attn_k.weight" else s
    elif case == "wrong length":
        kw["entries"] = [(n, 256 if n == "blk.1.ffn_down.weight" else ne0) for n, ne0 in entries]
    elif case == "the target's":
        kw["entries"] = entries + [("blk.7.attn_q.weight", 256)]
    elif case == "missing entry":
        kw["entries"] = [e for e in entries if e[0] != "blk.0.attn_v.weight"]
    else:
        kw["metadata"] = False
    im = _edited(model, tmp_path, **kw)
    out = tmp_path / "q.gguf"
    _one_error(_quantize(model, out, "iq4_xs", "--imatrix", str(im)), code, str(im), *parts)
    assert not out.exists()


def test_a_missing_entry_left_out_on_purpose_is_quantized_without(model: Path, tmp_path: Path) -> None:
    entries = [e for e in weight_tensors(model) if e[0] != "blk.0.attn_v.weight"]
    im = write_gguf_imatrix(tmp_path / "m.gguf", entries)
    res = _quantize(model, tmp_path / "q.gguf", "iq4_xs", "--imatrix", str(im), "--exclude-weights", "ffn_gate")
    assert res.exit_code == 0, res.output


def test_a_truncated_or_hostile_legacy_file(model: Path, tmp_path: Path) -> None:
    good = write_legacy_imatrix(tmp_path / "m.dat", weight_tensors(model))
    cut = tmp_path / "cut.dat"
    cut.write_bytes(good.read_bytes()[:900])
    _one_error(_quantize(model, tmp_path / "q.gguf", "q4_0", "--imatrix", str(cut)), 1, str(cut), "truncated")
    huge = tmp_path / "huge.dat"
    huge.write_bytes(struct.pack("<i", 2**31 - 1) + b"\0" * 64)  # claims 2^31 entries in 68 bytes
    _one_error(_quantize(model, tmp_path / "q.gguf", "q4_0", "--imatrix", str(huge)), 1, str(huge),
               "2147483647 entries in 68 bytes")


def test_usage_errors(model: Path, tmp_path: Path) -> None:
    out = tmp_path / "q.gguf"
    _one_error(_quantize(model, out, "q2_k_s"), 2, "Q2_K_S needs an importance matrix", "dflash-imatrix")
    _one_error(_quantize(model, out, "q4_0", "--include-weights", "attn"), 2, "give --imatrix")
    _one_error(_quantize(model, out, "q4_0", "--imatrix", str(tmp_path / "none.gguf")), 1, "none.gguf: no such file")
    im = write_gguf_imatrix(tmp_path / "m.gguf", weight_tensors(model))
    _one_error(_quantize(model, im, "q4_0", "--imatrix", str(im), "--force"), 2, "is also an input")
    assert not out.exists()
