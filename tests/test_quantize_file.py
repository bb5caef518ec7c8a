"""dflash-quantize end to end: types in the written file, fallbacks, overrides, --pure, requantize refusal,
metadata copy, a re-read with gguf-py (GGUFReader + gguf.quants.dequantize) within per-type error bounds,
streaming, and the CLI's exit codes and one-line errors. Input GGUFs come from the project's converter."""

from __future__ import annotations

import json
from pathlib import Path

import gguf
import numpy as np
import pytest
from click.testing import CliRunner
from gguf import GGMLQuantizationType as Q

import make_drafters  # on sys.path via conftest
from conftest import target_for
from dflashkit.cli import quantize_command
from dflashkit.converters.convert import convert
from dflashkit.errors import DFlashError
from dflashkit.quantize import gguf_file
from dflashkit.quantize.gguf_file import quantize_gguf
from test_quantize_policy import FIVE_LAYER_MIX, WIDE, _expected

K4, K5, K6 = Q.Q4_K, Q.Q5_K, Q.Q6_K
NOWARN = dict(progress=False, warn=lambda m: None)

# Relative RMS error bounds of gguf.quants.dequantize(output) vs the input (Gaussian weights). Measured on
# the 5-layer drafter: Q8_0 ~0.5 %, Q6_K ~1.8 %, Q5_K ~3.6 %, Q4_K ~7 %, Q5_0 ~4.3 %, Q5_1 ~3.8 %.
REL_RMS_BOUND = {Q.Q8_0: 0.01, Q.Q6_K: 0.03, Q.Q5_K: 0.05, Q.Q4_K: 0.10, Q.Q5_0: 0.06, Q.Q5_1: 0.05,
                 Q.F16: 1e-3, Q.BF16: 0.0, Q.F32: 0.0}


@pytest.fixture(scope="module")
def wide(tmp_path_factory) -> Path:
    """5-layer qwen3-b16 drafter with 256-multiple rows, bf16 GGUF (no fallbacks anywhere)."""
    tmp = tmp_path_factory.mktemp("wide")
    src = make_drafters.make_drafter(tmp / "hf", "qwen3-b16", config_overrides={
        **WIDE, "num_hidden_layers": 5, "dflash_config": {"mask_token_id": 500, "target_layer_ids": [1, 3, 5, 7, 9]}})
    convert(src, tmp / "in.gguf", **NOWARN)
    return tmp / "in.gguf"


@pytest.fixture(scope="module")
def small(drafters, targets, tmp_path_factory) -> Path:
    """Default 64-wide qwen3-b16 fixture with the target's tokenizer (string arrays in the metadata)."""
    out = tmp_path_factory.mktemp("small") / "in.gguf"
    convert(drafters["qwen3-b16"], out, target=target_for("qwen3-b16", targets), **NOWARN)
    return out


@pytest.fixture(scope="module")
def gemma(drafters, tmp_path_factory) -> Path:
    """gemma4 fixture: 72-wide rows (not a multiple of 32)."""
    out = tmp_path_factory.mktemp("gemma") / "in.gguf"
    convert(drafters["gemma4"], out, **NOWARN)
    return out


def _loader_order(name: str) -> tuple[int, str]:
    """llama.cpp's weight_name_comparer: blk.N.* by layer number (global tensors first), then name."""
    parts = name.split(".")
    return (int(parts[1]) if parts[0] == "blk" else -1, name)


def _read(path: Path) -> dict[str, gguf.ReaderTensor]:
    return {t.name: t for t in gguf.GGUFReader(path).tensors}


def _floats(t: gguf.ReaderTensor) -> np.ndarray:
    return gguf.quants.dequantize(t.data, t.tensor_type).astype(np.float64)


def _types(path: Path) -> dict[str, Q]:
    return {n: Q(t.tensor_type) for n, t in _read(path).items()}


def _cli(*args: str):
    return CliRunner().invoke(quantize_command, [str(a) for a in args])


def _assert_one_line_error(r, code: int, *needles: str) -> None:
    assert r.exit_code == code, r.output
    assert r.stderr.startswith("error: ") and r.stderr.strip().count("\n") == 0, r.stderr
    for n in needles:
        assert n in r.stderr, r.stderr


def _only_input_left(directory: Path, input_name: str = "in.gguf") -> None:
    assert sorted(p.name for p in directory.iterdir()) == [input_name]


# ------------------------------------------------------------------------------------------- the written file
@pytest.mark.parametrize("ftype", ["Q8_0", "Q6_K", "Q5_K_M", "Q4_K_M", "Q4_K_S", "F16"])
def test_reread_types_and_error_bounds(wide, tmp_path, ftype):
    out = tmp_path / "out.gguf"
    result = quantize_gguf(wide, out, ftype, **NOWARN)
    src, dst = _read(wide), _read(out)
    # every tensor, in llama-quantize's order: its loader's weight_name_comparer (layer number, then
    # name) — the converter's input order is not kept (issue 13: the converter now writes llama.cpp's)
    assert list(dst) == sorted(src, key=_loader_order)
    assert _types(out) == _expected(list(src), ftype, FIVE_LAYER_MIX[ftype])
    for name, t in dst.items():
        assert list(t.shape) == list(src[name].shape)
        ref, got = _floats(src[name]), _floats(t)
        assert got.shape == ref.shape
        rel = np.sqrt(np.mean((got - ref) ** 2) / np.mean(ref ** 2))
        assert rel <= REL_RMS_BOUND[Q(t.tensor_type)], (name, Q(t.tensor_type).name, rel)
        if t.tensor_type == src[name].tensor_type:  # kept types are copied byte for byte
            assert np.array_equal(t.data.view(np.uint8), src[name].data.view(np.uint8))
    j = result.to_json()
    assert j["file_type"] == ftype and j["fallbacks"] == [] and j["bytes"] == out.stat().st_size
    assert sum(x["bytes"] for x in j["tensors"]) == j["totals"]["tensor_bytes_out"]
    assert {x["name"]: x["bytes"] for x in j["tensors"]} == {n: int(t.n_bytes) for n, t in dst.items()}


def test_streaming_in_small_chunks_gives_the_same_file(wide, tmp_path, monkeypatch):
    quantize_gguf(wide, tmp_path / "a.gguf", "Q4_K_M", **NOWARN)
    real = gguf_file.iter_row_chunks
    monkeypatch.setattr(gguf_file, "iter_row_chunks", lambda n, rb, target=0: real(n, rb, target_bytes=3 * rb))
    quantize_gguf(wide, tmp_path / "b.gguf", "Q4_K_M", **NOWARN)
    assert (tmp_path / "a.gguf").read_bytes() == (tmp_path / "b.gguf").read_bytes()


def test_metadata_copied_exactly(small, tmp_path):
    out = tmp_path / "out.gguf"
    quantize_gguf(small, out, "Q4_K_M", **NOWARN)
    src, dst = gguf.GGUFReader(small).fields, gguf.GGUFReader(out).fields

    def view(fields):
        return {k: (f.types, f.contents()) for k, f in fields.items() if not k.startswith("GGUF.")}

    a, b = view(src), view(dst)
    assert any(k == "tokenizer.ggml.tokens" for k in a)  # string arrays are part of the copy
    # same keys, same order, except the two llama-quantize re-sets (gguf_set_val_u32 removes the key
    # and appends it): general.quantization_version and general.file_type come last
    moved = ("general.quantization_version", "general.file_type")
    assert [k for k in a if k not in moved] == [k for k in b if k not in moved]
    assert list(b)[-2:] == list(moved)
    assert b.pop("general.file_type") == ([gguf.GGUFValueType.UINT32], 15)
    assert a.pop("general.file_type") == ([gguf.GGUFValueType.UINT32], 32)  # converter: bf16
    assert b["general.quantization_version"] == ([gguf.GGUFValueType.UINT32], 2)
    assert a == b
    assert b["general.architecture"][1] == "dflash"


# ------------------------------------------------------------------------------------------- fallbacks
def test_fallbacks_64_wide(small, tmp_path):
    # 2 layers, rows of 64 (ffn_down, fc: 128): K-quants never fit 256.
    # Q4_K_M: Q4_K -> Q5_0 everywhere; blk.1 attn_v / ffn_down want Q6_K (use_more_bits(1, 2)) -> Q8_0.
    out = tmp_path / "q4km.gguf"
    result = quantize_gguf(small, out, "Q4_K_M", **NOWARN)
    types = _types(out)
    matrices = {n for n, t in _read(small).items() if len(t.shape) == 2}
    expected = {n: (Q.Q8_0 if n in ("blk.1.attn_v.weight", "blk.1.ffn_down.weight") else Q.Q5_0) for n in matrices}
    assert {n: types[n] for n in matrices} == expected
    assert {n for n, t in types.items() if n not in matrices} == {n for n, t in types.items() if t == Q.F32}
    fb = {f["name"]: (f["wanted"], f["new_type"]) for f in result.to_json()["fallbacks"]}
    assert set(fb) == matrices
    assert fb["blk.1.attn_v.weight"] == ("Q6_K", "Q8_0") and fb["fc.weight"] == ("Q4_K", "Q5_0")
    # Q5_K_S: Q5_K -> Q5_1; Q6_K: Q6_K -> Q8_0
    quantize_gguf(small, tmp_path / "q5ks.gguf", "Q5_K_S", **NOWARN)
    assert {_types(tmp_path / "q5ks.gguf")[n] for n in matrices} == {Q.Q5_1}
    quantize_gguf(small, tmp_path / "q6k.gguf", "Q6_K", **NOWARN)
    assert {_types(tmp_path / "q6k.gguf")[n] for n in matrices} == {Q.Q8_0}


def test_fallbacks_72_wide_to_f16(gemma, tmp_path):
    # gemma4: rows of 72 (not a multiple of 32) -> F16; ffn_down rows are 96 (3 x 32) and fc rows 360 -> F16.
    out = tmp_path / "q8.gguf"
    quantize_gguf(gemma, out, "Q8_0", **NOWARN)
    t = _types(out)
    assert t["blk.0.attn_q.weight"] == Q.F16 and t["blk.0.ffn_up.weight"] == Q.F16 and t["fc.weight"] == Q.F16
    assert t["blk.0.ffn_down.weight"] == Q.Q8_0
    quantize_gguf(gemma, tmp_path / "q4.gguf", "Q4_K_M", **NOWARN)
    t = _types(tmp_path / "q4.gguf")
    # 5 layers: ffn_down layers 2 and 4 want Q6_K -> Q8_0, the others Q4_K -> Q5_0
    assert [t[f"blk.{i}.ffn_down.weight"] for i in range(5)] == [Q.Q5_0, Q.Q5_0, Q.Q8_0, Q.Q5_0, Q.Q8_0]
    assert {t[f"blk.{i}.attn_v.weight"] for i in range(5)} == {Q.F16}


def test_dflash2_conv_and_selectors(drafters, tmp_path):
    src = tmp_path / "in.gguf"
    convert(drafters["dflash2"], src, **NOWARN)
    quantize_gguf(src, tmp_path / "out.gguf", "Q4_K_M", **NOWARN)
    src_t, dst_t = _read(src), _read(tmp_path / "out.gguf")
    base = dst_t["blk.0.attn_conv_base"]  # 3-D, no ".weight": kept F32, bytes unchanged
    assert Q(base.tensor_type) == Q.F32 and len(base.shape) == 3
    assert np.array_equal(base.data, src_t["blk.0.attn_conv_base"].data)
    assert Q(dst_t["selector_predecessor.weight"].tensor_type) == Q.F16  # rows of 8: no 32-block fits
    assert Q(dst_t["blk.0.attn_conv_proj.weight"].tensor_type) == Q.Q5_0


# ------------------------------------------------------------------------------------------- options
def test_overrides_and_pure(wide, tmp_path):
    r = _cli(wide, tmp_path / "o.gguf", "Q4_K_M", "--tensor-type", "attn_v=q8_0",
             "--tensor-type", r"blk\.1\.ffn_down=F16", "-q")
    assert r.exit_code == 0, r.output
    t = _types(tmp_path / "o.gguf")
    assert {t[f"blk.{i}.attn_v.weight"] for i in range(5)} == {Q.Q8_0}
    assert t["blk.1.ffn_down.weight"] == Q.F16
    # the overridden blk.1 ffn_down skips llama.cpp's ffn_down counter, so blk.2/3/4 count as layers 1/2/3 of 5:
    # use_more_bits(2, 5) now lands on blk.3 (llama-quantize does the same)
    assert [t[f"blk.{i}.ffn_down.weight"] for i in (0, 2, 3, 4)] == [K4, K4, K6, K4]
    r = _cli(wide, tmp_path / "p.gguf", "Q4_K_M", "--pure", "-q")
    assert r.exit_code == 0, r.output
    assert {q for n, q in _types(tmp_path / "p.gguf").items() if not n.endswith("norm.weight")} == {K4}


@pytest.mark.parametrize("spec", ["attn_v", "attn_v=", "attn_v=iq2_xxs", "([=q8_0"])
def test_bad_tensor_type_is_usage_error(small, tmp_path, spec):
    out = tmp_path / "o.gguf"
    _assert_one_line_error(_cli(small, out, "Q8_0", "--tensor-type", spec), 2, "--tensor-type")
    assert not out.exists()


def test_no_fallback(small, tmp_path):
    out = tmp_path / "o.gguf"
    _assert_one_line_error(_cli(small, out, "Q4_K_M", "--no-fallback"), 1, "row length 128", "Q4_K", "--no-fallback")
    assert not out.exists() and list(tmp_path.iterdir()) == []
    # Q8_0 fits 64-wide rows: no fallback, so --no-fallback succeeds
    assert _cli(small, out, "Q8_0", "--no-fallback", "-q").exit_code == 0


def test_requantize(wide, tmp_path):
    q8 = tmp_path / "q8.gguf"
    quantize_gguf(wide, q8, "Q8_0", **NOWARN)
    out = tmp_path / "q4.gguf"
    _assert_one_line_error(_cli(q8, out, "Q4_K_M"), 1, "already Q8_0", "--allow-requantize")
    assert not out.exists()
    # same type: nothing to requantize, the tensors are copied
    assert _cli(q8, tmp_path / "same.gguf", "Q8_0", "-q").exit_code == 0
    assert (tmp_path / "same.gguf").read_bytes()[-4096:] == q8.read_bytes()[-4096:]
    r = _cli(q8, out, "Q4_K_M", "--allow-requantize")
    assert r.exit_code == 0, r.output
    assert "requantizing" in r.stderr
    ref, got = _read(wide)["blk.2.attn_q.weight"], _read(out)["blk.2.attn_q.weight"]
    assert Q(got.tensor_type) == K4
    a, b = _floats(ref), _floats(got)
    assert np.sqrt(np.mean((a - b) ** 2) / np.mean(a ** 2)) < 0.11


# ------------------------------------------------------------------------------------------- CLI
def test_cli_summary_and_json(small, tmp_path):
    r = _cli(small, tmp_path / "a.gguf", "q4_k_m")
    assert r.exit_code == 0, r.output
    lines = r.stdout.splitlines()
    assert lines[0].startswith(f"wrote {tmp_path / 'a.gguf'}") and "Q4_K_M" in lines[0]
    assert "fell back" in lines[1] and any("blk.1.attn_v.weight: row length 64" in x for x in lines[2:])
    r = _cli(small, tmp_path / "b.gguf", "Q6_K", "--json", "-q")
    assert r.exit_code == 0, r.output
    j = json.loads(r.stdout)
    assert j["file_type"] == "Q6_K" and j["file_type_id"] == 18 and j["tensor_types"]["Q8_0"] == len(j["fallbacks"])
    assert set(j["tensors"][0]) >= {"name", "shape", "old_type", "new_type", "bytes"}


def test_cli_errors(small, tmp_path):
    out = tmp_path / "o.gguf"
    _assert_one_line_error(_cli(small, out, "IQ2_XXS"), 2, "unknown TYPE 'IQ2_XXS'", "Q4_K_M")
    _assert_one_line_error(_cli(tmp_path / "missing.gguf", out, "Q8_0"), 1, "missing.gguf", "no such file")
    junk = tmp_path / "junk.gguf"
    junk.write_bytes(b"not a gguf file at all, just text" * 4)
    _assert_one_line_error(_cli(junk, out, "Q8_0"), 1, "junk.gguf", "not a GGUF")
    assert not out.exists()
    assert _cli(small, out, "Q8_0", "-q").exit_code == 0
    _assert_one_line_error(_cli(small, out, "Q8_0"), 1, "already exists", "--force")
    assert _cli(small, out, "Q6_K", "--force", "-q").exit_code == 0
    assert _types(out)["fc.weight"] == Q.Q8_0  # Q6_K with rows of 128 -> Q8_0
    _assert_one_line_error(_cli(small, small, "Q8_0", "--force"), 2, "also an input")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["junk.gguf", "o.gguf"]


def test_library_error_is_dflash_error(small, tmp_path):
    with pytest.raises(DFlashError):
        quantize_gguf(small, tmp_path / "o.gguf", "Q4_K_M", allow_fallback=False, **NOWARN)
    assert list(tmp_path.iterdir()) == []


def test_foreign_gguf(tmp_path):
    # another converter's file: gguf-py writer, F32 + F16 matrices, alignment 64, no general.file_type (a plain
    # llama-architecture model: a "dflash" file without a drafter's metadata is refused, see the next test)
    rng = np.random.default_rng(1)
    w = gguf.GGUFWriter(tmp_path / "in.gguf", "llama")
    w.add_custom_alignment(64)
    w.add_block_count(1)
    w.add_tensor("blk.0.attn_q.weight", rng.standard_normal((8, 256)).astype(np.float32))
    w.add_tensor("blk.0.attn_v.weight", rng.standard_normal((8, 256)).astype(np.float16))
    w.add_tensor("blk.0.attn_norm.weight", np.ones(256, np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    quantize_gguf(tmp_path / "in.gguf", tmp_path / "out.gguf", "Q4_K_M", **NOWARN)
    r = gguf.GGUFReader(tmp_path / "out.gguf")
    assert r.alignment == 64
    fields = [(k, f.contents()) for k, f in r.fields.items() if not k.startswith("GGUF.")]
    assert fields == [("general.architecture", "llama"), ("general.alignment", 64), ("llama.block_count", 1),
                      ("general.quantization_version", 2), ("general.file_type", 15)]
    # 1 attn_v tensor in 1 layer: use_more_bits(0, 1) (0 >= 7/8 = 0) -> Q6_K
    assert {t.name: Q(t.tensor_type) for t in r.tensors} == {
        "blk.0.attn_q.weight": K4, "blk.0.attn_v.weight": K6, "blk.0.attn_norm.weight": Q.F32}



def _one_tensor_gguf(path: Path, weight: np.ndarray) -> None:
    """A one-layer llama GGUF (gguf-py's writer) holding ``weight`` as blk.0.attn_q.weight."""
    w = gguf.GGUFWriter(str(path), "llama")
    w.add_block_count(1)
    w.add_tensor("blk.0.attn_q.weight", weight)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()

def test_a_source_that_shrinks_between_chunks_is_one_line_and_writes_nothing(tmp_path, monkeypatch):
    """The chunks are read from a map of the source; its size is checked before each one, so a file cut
    short by another process mid-run gives the one-line error (not SIGBUS) and no output."""
    src, out = tmp_path / "one.gguf", tmp_path / "out.gguf"
    _one_tensor_gguf(src, np.ones((2048, 4096), np.float32))  # 32 MB: two 16 MB chunks
    real, calls = gguf_file.quantize, []

    def cut_after_first_chunk(*args, **kwargs):  # the source loses its second half while chunk 1 is quantized
        if not calls:
            with open(src, "r+b") as f:
                f.truncate(src.stat().st_size // 2)
        calls.append(1)
        return real(*args, **kwargs)

    monkeypatch.setattr(gguf_file, "quantize", cut_after_first_chunk)
    r = CliRunner().invoke(quantize_command, [str(src), str(out), "Q8_0", "--pure", "-q"])
    assert r.exit_code == 1 and len(calls) == 1
    assert r.output.strip() == f"error: {src}: tensor 'blk.0.attn_q.weight' is truncated (file shrank while reading it)"
    assert not out.exists()


def test_chunks_reach_the_quantizers_as_writable_arrays(tmp_path, monkeypatch):
    """numba compiles one specialization per array type, and a read-only array is another type than the
    writable one `preload_quantizers` compiles and caches: F32 chunks read from the map (no copy) must
    arrive writable, or every run compiles a second kernel (seconds) on first use."""
    src, out = tmp_path / "one.gguf", tmp_path / "out.gguf"
    _one_tensor_gguf(src, np.ones((64, 256), np.float32))
    real, seen = gguf_file.quantize, []

    def spy(x, qtype, **kwargs):
        seen.append(x.flags.writeable)
        return real(x, qtype, **kwargs)

    monkeypatch.setattr(gguf_file, "quantize", spy)
    quantize_gguf(src, out, "Q6_K", pure=True, progress=False)
    assert seen == [True]
