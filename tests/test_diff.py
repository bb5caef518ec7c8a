"""dflash-diff: exact zeros where nothing changed, per-type bounds for quantized forms, every kind of
missing/unmapped/reshaped tensor and metadata difference in its own section, dialects both ways,
the CLI (formats, exit codes, -o) and the HTML page (parsed always, rendered by Chromium when present)."""

from __future__ import annotations

import json
import math
import re
import shutil
import struct
import subprocess
import tempfile
from dataclasses import astuple, replace
from html.parser import HTMLParser
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from click.testing import CliRunner

from conftest import target_for
from dflashkit.cli import diff_command
from dflashkit.converters.convert import convert
from dflashkit.diff import DiffResult, SpecDifference, compare_specs, diff_drafters, tensor_stats
from dflashkit.drafters import open_drafter
from dflashkit.io.gguf_reader import open_gguf
from dflashkit.io.gguf_writer import MetadataEntry, TensorToWrite, write_gguf
from dflashkit.families import load_hf_config

import make_drafters

#: upper bounds of ‖a−b‖/‖a‖ for Gaussian-like weights, per stored type (measured ≈ half of these)
REL_RMS_BOUND = {"F32": 0.0, "BF16": 4e-3, "F16": 1e-3, "Q8_0": 8e-3, "Q6_K": 0.025, "Q5_K": 0.05,
                 "Q5_0": 0.06, "Q5_1": 0.06, "Q4_K": 0.1}


def _convert(src: Path, out: Path, **kw: Any) -> Path:
    convert(src, out, progress=False, warn=lambda m: None, **kw)
    return out


def _rewrite(src: Path, out: Path, *, drop: tuple[str, ...] = (), rename: dict[str, str] | None = None,
             reshape: dict[str, tuple[int, ...]] | None = None, scale: dict[str, float] | None = None,
             metadata: dict[str, Any] | None = None, drop_keys: tuple[str, ...] = ()) -> Path:
    """Copy a GGUF with tensors dropped / renamed / reshaped (same bytes) / scaled (F32) and keys changed."""
    rename, reshape, scale, metadata = rename or {}, reshape or {}, scale or {}, metadata or {}
    with open_gguf(src) as g:
        entries = [MetadataEntry(k, metadata.get(k, kv.value), kv.type, kv.sub_type)
                   for k, kv in g.kvs.items() if k not in drop_keys]
        tensors = []
        for name, info in g.tensors.items():
            if name in drop:
                continue
            data = np.array(g.raw(name))
            if name in scale:
                data = (data.view(np.float32) * np.float32(scale[name])).view(np.uint8)
            tensors.append(TensorToWrite(rename.get(name, name), reshape.get(name, info.shape), info.ggml_type,
                                         lambda d=data: [d]))
        write_gguf(out, str(g.get("general.architecture")), entries, tensors, progress=False)
    return out


def _rows(result: DiffResult, section: str, **kw: Any) -> list[dict[str, Any]]:
    return result.report(**kw).section(section).rows  # type: ignore[union-attr]


# --------------------------------------------------------------------------------------------
# Fixtures
# --------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def qwen(drafters, targets, tmp_path_factory) -> dict[str, Path]:
    """qwen3-b16 in every dialect: HF (bf16), llama.cpp f32, luce bf16, dflash-draft f32."""
    d = tmp_path_factory.mktemp("diff-qwen")
    hf, target = drafters["qwen3-b16"], target_for("qwen3-b16", targets)
    return {
        "hf": hf,
        "f32": _convert(hf, d / "f32.gguf", outtype="f32", target=target),
        "luce": _convert(hf, d / "luce.gguf", outtype="bf16", dialect="luce", target=target),
        "draft": _convert(hf, d / "draft.gguf", outtype="f32", dialect="dflash-draft", target=target),
    }


@pytest.fixture(scope="module")
def wide(tmp_path_factory) -> dict[str, Path]:
    """A 256-wide drafter (rows fit K-quant super-blocks) as HF, f32, Q8_0 and Q4_K_M."""
    from dflashkit.quantize.gguf_file import quantize_gguf

    d = tmp_path_factory.mktemp("diff-wide")
    hf = make_drafters.make_drafter(d / "wide-hf", "qwen3-b16",
                                    config_overrides={"hidden_size": 256, "intermediate_size": 512, "head_dim": 64})
    f32 = _convert(hf, d / "wide-f32.gguf", outtype="f32")
    q4 = d / "wide-Q4_K_M.gguf"
    quantize_gguf(f32, q4, "Q4_K_M", progress=False, warn=lambda m: None)
    return {"hf": hf, "f32": f32, "q8": _convert(hf, d / "wide-Q8_0.gguf", outtype="q8_0"), "q4": q4}


# --------------------------------------------------------------------------------------------
# Exact and bounded errors
# --------------------------------------------------------------------------------------------


def _assert_identical(result: DiffResult, n: int) -> None:
    assert len(result.tensors) == n
    for t in result.tensors:
        s = t.stats
        assert (s.rel_rms, s.max_abs_diff, s.cosine, s.snr_db) == (0.0, 0.0, 1.0, math.inf), t.canonical
        assert (s.min_a, s.max_a) == (s.min_b, s.max_b)
    assert not (result.only_one_side or result.unmapped or result.shape_mismatches or result.unreadable)
    assert result.meaning_differences == []
    assert result.exit_code() == 0 and result.exit_code(threshold=0.0) == 0


@pytest.mark.parametrize("family", ["qwen3-b16", "qwen35-swa", "gemma4", "dflash2", "optional", "sharded"])
def test_hf_vs_f32_gguf_is_exact(family, drafters, targets, tmp_path) -> None:
    hf = drafters[family]
    gguf = _convert(hf, tmp_path / "f32.gguf", outtype="f32", target=target_for(family, targets))
    result = diff_drafters(hf, gguf)
    with open_drafter(hf) as f:
        n = len(f.tensors)
    _assert_identical(result, n)
    report = result.report()
    assert report.level == "ok" and report.status == f"{n} tensors, all identical"
    rows = report.section("tensors").rows  # type: ignore[union-attr]
    assert {r["type_b"] for r in rows} == {"F32"} and all(r["bpw_b"] == 32.0 for r in rows)


def test_information_is_shown_not_failed(qwen) -> None:
    info = {r["key"]: r for r in _rows(diff_drafters(qwen["hf"], qwen["f32"]), "info")}
    assert info["file type"]["a"] == "safetensors BF16" and info["file type"]["b"] == "ALL_F32 (0)"
    assert info["quantization version"]["b"] == 2
    assert info["tokenizer"]["a"] == "no" and info["tokenizer"]["b"].startswith("yes (")
    assert (info["target layer ids as stored"]["a"], info["target layer ids as stored"]["b"]) == ([1, 8], [2, 9])
    # llama.cpp has no key for these: shown, never compared
    assert (info["num_target_layers"]["a"], info["num_target_layers"]["b"]) == (12, None)
    assert (info["torch_dtype"]["a"], info["torch_dtype"]["b"]) == ("bfloat16", None)


def test_quantized_errors_within_type_bounds(wide) -> None:
    for key, types in (("q8", {"Q8_0", "F32"}), ("q4", {"Q4_K", "Q6_K", "F32"})):
        result = diff_drafters(wide["hf"], wide[key])
        assert {t.b.type_name for t in result.tensors} == types
        assert result.exit_code() == 0 and len(result.tensors) == 25
        for t in result.tensors:
            s, bound = t.stats, REL_RMS_BOUND[t.b.type_name]
            if bound == 0.0:
                assert s.identical, t.canonical  # norms stay F32
            else:
                assert 0 < s.rel_rms < bound, (t.canonical, t.b.type_name, s.rel_rms)
                assert 1 - s.cosine < bound**2 and s.snr_db > -20 * math.log10(bound)
        rels = [t.rel_rms for t in result.tensors]
        assert rels == sorted(rels, reverse=True)  # worst first
        summary = result.report().to_dict()["summary"]
        assert summary["rel_rms_max"] == rels[0] and summary["worst_tensor"] == result.tensors[0].canonical
        assert summary["rel_rms_median"] == float(np.median(rels))
        types = {(r["type_a"], r["type_b"]): r for r in _rows(result, "types")}
        assert sum(r["tensors"] for r in types.values()) == 25
        assert types[("BF16", "F32")]["rel_rms_max"] == 0.0


def test_gguf_vs_gguf_any_types(wide) -> None:
    result = diff_drafters(wide["q8"], wide["q4"])
    assert result.exit_code() == 0 and len(result.tensors) == 25
    for t in result.tensors:
        assert (t.a.type_name, t.b.type_name) in {("Q8_0", "Q4_K"), ("Q8_0", "Q6_K"), ("F32", "F32")}
        bound = REL_RMS_BOUND[t.a.type_name] + REL_RMS_BOUND[t.b.type_name]
        assert t.rel_rms <= bound
    assert diff_drafters(wide["q4"], wide["q4"]).tensors[0].stats.identical


def test_changed_tensor_is_worst_and_fails_threshold(qwen, tmp_path) -> None:
    moved = _rewrite(qwen["f32"], tmp_path / "moved.gguf", scale={"blk.1.ffn_down.weight": 1.25})
    result = diff_drafters(qwen["f32"], moved)
    worst = result.tensors[0]
    assert worst.canonical == "layers.1.mlp.down_proj.weight"
    assert worst.rel_rms == pytest.approx(0.25, rel=1e-6) and worst.stats.cosine == pytest.approx(1.0)
    assert all(t.stats.identical for t in result.tensors[1:])
    assert result.exit_code() == 0 and result.exit_code(threshold=0.3) == 0
    assert result.exit_code(threshold=0.2) == 1
    assert result.failures(threshold=0.2) == ["1 tensor(s) over --threshold 0.2 (worst layers.1.mlp.down_proj.weight)"]
    report = result.report(threshold=0.2)
    assert report.level == "error" and report.section("tensors").flagged == {0}  # type: ignore[union-attr]


# --------------------------------------------------------------------------------------------
# Missing, unmapped, reshaped, meaning
# --------------------------------------------------------------------------------------------


def test_removed_tensor(qwen, tmp_path) -> None:
    gguf = _rewrite(qwen["f32"], tmp_path / "removed.gguf", drop=("blk.1.attn_k_norm.weight",))
    for a, b, side in ((qwen["hf"], gguf, "A"), (gguf, qwen["hf"], "B")):
        result = diff_drafters(a, b)
        assert _rows(result, "missing") == [{"tensor": "layers.1.self_attn.k_norm.weight", "side": side,
                                             "name": "layers.1.self_attn.k_norm.weight", "shape": [16], "type": "BF16"}]
        assert result.unmapped == [] and result.shape_mismatches == [] and len(result.tensors) == 24
        assert result.failures() == [f"1 tensor(s) only in {side}"]
        assert result.exit_code() == 1 and result.exit_code(allow_missing=True) == 0
        assert result.report(allow_missing=True).level == "warning"


def test_renamed_tensor(qwen, tmp_path) -> None:
    gguf = _rewrite(qwen["f32"], tmp_path / "renamed.gguf", rename={"blk.0.ffn_up.weight": "blk.0.ffn_upper.weight"})
    result = diff_drafters(qwen["hf"], gguf)
    assert _rows(result, "unmapped") == [{"side": "B", "name": "blk.0.ffn_upper.weight"}]
    assert [(r["tensor"], r["side"]) for r in _rows(result, "missing")] == [("layers.0.mlp.up_proj.weight", "A")]
    assert result.failures() == ["1 tensor(s) only in A", "1 unmapped tensor name(s)"]
    assert result.exit_code() == 1 and result.exit_code(allow_missing=True) == 0


def test_reshaped_tensor(qwen, tmp_path) -> None:
    gguf = _rewrite(qwen["f32"], tmp_path / "reshaped.gguf", reshape={"fc.weight": (128, 64)})
    result = diff_drafters(qwen["hf"], gguf)
    assert _rows(result, "shape_mismatches") == [{
        "tensor": "fc.weight", "name_a": "fc.weight", "name_b": "fc.weight", "shape_a": [64, 128],
        "shape_b": [128, 64], "type_a": "BF16", "type_b": "F32"}]
    assert "fc.weight" not in {t.canonical for t in result.tensors}
    assert result.exit_code() == 1 and result.exit_code(allow_missing=True) == 1


@pytest.mark.parametrize(
    ("key", "value", "field", "a", "b"),
    [
        ("dflash.target_layers", [1, 8], "target_layer_ids", (1, 8), (0, 7)),  # raw ids written: the classic bug
        ("tokenizer.ggml.mask_token_id", 7, "mask_token_id", 500, 7),
        ("dflash.block_size", 8, "block_size", 16, 8),
        ("dflash.embedding_length", 65, "hidden_size", 64, 65),
    ],
)
def test_meaning_differences(qwen, tmp_path, key, value, field, a, b) -> None:
    gguf = _rewrite(qwen["f32"], tmp_path / "meta.gguf", metadata={key: value})
    result = diff_drafters(qwen["hf"], gguf)
    rows = _rows(result, "meaning")
    assert [(r["field"], r["a"], r["b"]) for r in rows] == [(field, a, b)]
    assert result.exit_code() == 1 and result.exit_code(allow_missing=True) == 1
    if field == "target_layer_ids":
        assert rows[0]["note"] == ("compared in the HF convention; A stores [1, 8]: raw HF ids (config.json); "
                                   "B stores [1, 8]: HF id + 1 (llama.cpp)")


def test_swa_and_scales_compared(drafters, targets, tmp_path) -> None:
    hf = drafters["gemma4"]
    gguf = _convert(hf, tmp_path / "g.gguf", outtype="f32", target=target_for("gemma4", targets))
    edited = _rewrite(gguf, tmp_path / "g2.gguf", metadata={
        "dflash.attention.sliding_window": 32,
        "dflash.attention.sliding_window_pattern": [True, True, True, False, False],
        "dflash.embedding_scale": 8.0,
        "general.name": "renamed",  # by nature: information only
    })
    result = diff_drafters(hf, edited)
    assert [(r["field"], r["b"]) for r in _rows(result, "meaning")] == [
        ("sliding_window", 32), ("sliding_window_pattern", (True, True, True, False, False)), ("embedding_scale", 8.0)]
    info = {r["key"]: (r["a"], r["b"]) for r in _rows(result, "info")}
    assert info["name"] == ("gemma4", "renamed")


def test_unreadable_metadata_fails(qwen, tmp_path) -> None:
    gguf = _rewrite(qwen["f32"], tmp_path / "nometa.gguf", drop_keys=("dflash.block_size",))
    result = diff_drafters(qwen["hf"], gguf)
    assert [(r["field"], r["a"], r["b"]) for r in _rows(result, "meaning")] == [
        ("metadata", "decoded", "missing llama.cpp metadata key(s): dflash.block_size")]
    assert result.exit_code(allow_missing=True) == 1
    _assert_identical(replace(result, spec_differences=[]), 25)  # the tensors are still compared


# --------------------------------------------------------------------------------------------
# Dialects
# --------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("a", "b", "fc_b", "post_b"),
    [
        ("hf", "luce", "dflash.fc.weight", "blk.0.ffn_norm.weight"),
        ("f32", "draft", "dflash_fc.weight", "blk.0.post_attention_norm.weight"),
        ("luce", "draft", "dflash_fc.weight", "blk.0.post_attention_norm.weight"),
    ],
)
def test_dialects_map_both_ways(qwen, a, b, fc_b, post_b) -> None:
    forward, backward = diff_drafters(qwen[a], qwen[b]), diff_drafters(qwen[b], qwen[a])
    for result in (forward, backward):
        _assert_identical(result, 25)  # bf16 weights survive every form exactly
    names = {t.canonical: (t.a.name, t.b.name) for t in forward.tensors}
    assert names["fc.weight"][1] == fc_b
    assert names["layers.0.post_attention_layernorm.weight"][1] == post_b
    back = {t.canonical: (t.a.name, t.b.name) for t in backward.tensors}
    assert back["fc.weight"][0] == fc_b and back["layers.0.post_attention_layernorm.weight"][0] == post_b


def test_taps_compared_after_each_convention(qwen) -> None:
    result = diff_drafters(qwen["f32"], qwen["draft"])
    assert result.meaning_differences == []
    info = {r["key"]: r for r in _rows(result, "info")}
    stored = info["target layer ids as stored"]
    assert (stored["a"], stored["b"]) == ([2, 9], [1, 8])
    assert stored["note"] == "A: HF id + 1 (llama.cpp); B: raw HF ids"


def test_gemma_luce_num_target_layers(drafters, targets, tmp_path) -> None:
    hf = drafters["gemma4"]  # its config states no num_target_layers; the luce file has the target's
    luce = _convert(hf, tmp_path / "g-luce.gguf", outtype="bf16", dialect="luce", target=target_for("gemma4", targets))
    result = diff_drafters(hf, luce)
    _assert_identical(result, len(result.tensors))
    info = {r["key"]: (r["a"], r["b"]) for r in _rows(result, "info")}
    assert info["num_target_layers"] == (None, 12)
    assert "embedding_scale" not in info  # written as a dflashkit extension key, so compared (equal)
    # a file from Luce's own script has no embedding_scale key: information, not a difference
    theirs = _rewrite(luce, tmp_path / "g-theirs.gguf", drop_keys=("gemma4-dflash-draft.embedding_scale",))
    result = diff_drafters(hf, theirs)
    assert result.meaning_differences == [] and result.exit_code() == 0
    info = {r["key"]: (r["a"], r["b"]) for r in _rows(result, "info")}
    assert info["embedding_scale"] == (8.48528137423857, None)
    # ...but a different value where it is stored is one
    other = _rewrite(luce, tmp_path / "g-other.gguf", metadata={"gemma4-dflash-draft.embedding_scale": 8.0})
    assert [d.field for d in diff_drafters(hf, other).meaning_differences] == ["embedding_scale"]


def test_not_a_drafter(targets) -> None:
    from dflashkit.errors import DFlashError

    with pytest.raises(DFlashError, match=r"is not a DFlash drafter — dflash-diff compares drafters"):
        diff_drafters(targets[64]["gguf"], targets[64]["gguf"])


# --------------------------------------------------------------------------------------------
# compare_specs and tensor_stats
# --------------------------------------------------------------------------------------------


def test_compare_specs_rules(drafters) -> None:
    _, spec = load_hf_config(drafters["optional"])
    f32ish = replace(spec, rms_norm_eps=float(np.float32(spec.rms_norm_eps)), logit_scale=float(np.float32(0.5)))
    assert compare_specs(spec, f32ish) == []  # floats at float32 precision
    assert compare_specs(spec, replace(spec, block_size=4)) == [SpecDifference("block_size", 8, 4, True, "")]
    assert compare_specs(spec, replace(spec, causal=None)) == [SpecDifference("causal", True, None, True, "")]
    assert compare_specs(spec, replace(spec, name="x")) == [
        SpecDifference("name", "optional", "x", False, "differs between forms by nature")]
    assert compare_specs(spec, replace(spec, vocab_size=None)) == [
        SpecDifference("vocab_size", 512, None, False, "only A knows vocab_size")]
    assert compare_specs(spec, replace(spec, vocab_size=600))[0].meaningful
    carried = {"hidden_size", "block_size", "causal"}
    diffs = compare_specs(spec, replace(spec, causal=None, attention_value_scale=None), carried_b=carried)
    by_field = {d.field: d for d in diffs}
    assert not by_field["attention_value_scale"].meaningful and by_field["attention_value_scale"].b is None
    assert by_field["causal"].meaningful  # B stores causal, and does not set it


def test_tensor_stats() -> None:
    a = np.array([[3.0, 4.0], [0.0, 0.0]], dtype=np.float32)
    s = tensor_stats(a, a.copy())
    assert (s.rel_rms, s.cosine, s.snr_db, s.max_abs_diff) == (0.0, 1.0, math.inf, 0.0)
    s = tensor_stats(a, np.zeros_like(a))
    assert (s.rel_rms, s.cosine, s.snr_db, s.max_abs_diff) == (1.0, 0.0, 0.0, 4.0)
    s = tensor_stats(a, -a, chunk=3)  # chunking does not change the sums
    assert (s.rel_rms, s.cosine, s.max_abs_diff) == (2.0, -1.0, 8.0)
    assert (s.min_b, s.max_b) == (-4.0, 0.0)
    z = np.zeros(4, dtype=np.float32)
    s = tensor_stats(z, z + 1)
    assert (s.rel_rms, s.cosine, s.snr_db) == (math.inf, 0.0, -math.inf)
    nan = tensor_stats(a, np.where(a == 3, np.nan, a).astype(np.float32))
    assert math.isnan(nan.rel_rms) and nan.nonfinite_b == 1 and not nan.identical


# --------------------------------------------------------------------------------------------
# CLI
# --------------------------------------------------------------------------------------------


def _cli(*args: str) -> Any:
    return CliRunner().invoke(diff_command, [str(a) for a in args], catch_exceptions=False)


def test_cli_text_and_exit_codes(qwen, tmp_path) -> None:
    r = _cli(qwen["hf"], qwen["f32"], "--quiet")
    assert r.exit_code == 0 and "OK: 25 tensors, all identical" in r.output
    removed = _rewrite(qwen["f32"], tmp_path / "removed.gguf", drop=("output_norm.weight",))
    r = _cli(qwen["hf"], removed, "-q")
    assert r.exit_code == 1 and "FAIL: 1 tensor(s) only in A" in r.output
    assert _cli(qwen["hf"], removed, "-q", "--allow-missing").exit_code == 0
    r = _cli(qwen["hf"], tmp_path / "nope.gguf")
    assert r.exit_code == 1 and r.output.strip() == f"error: {tmp_path / 'nope.gguf'}: no such file or directory"
    assert _cli(qwen["hf"], qwen["f32"], "--format", "pdf").exit_code == 2
    assert _cli(qwen["hf"], qwen["f32"], "--threshold", "-1").exit_code == 2


def test_cli_threshold(wide) -> None:
    assert _cli(wide["hf"], wide["q8"], "-q", "--threshold", "0.01").exit_code == 0
    r = _cli(wide["hf"], wide["q8"], "-q", "--threshold", "0.001", "--format", "json")
    assert r.exit_code == 1
    data = json.loads(r.stdout)
    assert data["summary"]["exit_code"] == 1 and data["summary"]["threshold"] == 0.001
    rows = next(s for s in data["sections"] if s["id"] == "tensors")["rows"]
    assert sum(r["over_threshold"] for r in rows) == 15  # every Q8_0 tensor, no F32 norm


def test_cli_json_has_every_number(qwen) -> None:
    r = _cli(qwen["luce"], qwen["hf"], "--format", "json", "-q")
    assert r.exit_code == 0
    data = json.loads(r.stdout)
    sections = {s["id"]: s for s in data["sections"]}
    assert set(sections) == {"chart", "meaning", "missing", "unmapped", "shape_mismatches", "unreadable",
                             "tensors", "types", "info"}
    row = next(r for r in sections["tensors"]["rows"] if r["tensor"] == "fc.weight")
    assert row["name_a"] == "dflash.fc.weight" and row["snr_db"] == "inf" and row["cosine"] == 1.0
    assert row["shape"] == [64, 128] and row["bpw_a"] == 16.0 and len(row["range_a"]) == 2


def test_cli_output_file(qwen, tmp_path) -> None:
    out = tmp_path / "report.md"
    r = _cli(qwen["hf"], qwen["f32"], "-o", out)
    assert r.exit_code == 0 and r.output.startswith(f"wrote {out} — 25 tensors, all identical")
    md = out.read_text()
    assert md.startswith("## dflash-diff: qwen3-b16 vs f32.gguf") and "| tensor | B name |" in md
    r = _cli(qwen["hf"], qwen["f32"], "-o", out, "--format", "html")
    assert r.exit_code == 1 and "already exists — pass --force" in r.output
    assert out.read_text() == md
    assert _cli(qwen["hf"], qwen["f32"], "-o", out, "--format", "html", "--force", "-q").exit_code == 0
    assert out.read_text().startswith("<!DOCTYPE html>")
    before = qwen["f32"].read_bytes()
    r = _cli(qwen["hf"], qwen["f32"], "-o", qwen["f32"], "--force")
    assert r.exit_code == 2 and "is also an input" in r.output and qwen["f32"].read_bytes() == before


# --------------------------------------------------------------------------------------------
# HTML
# --------------------------------------------------------------------------------------------


class _Tags(HTMLParser):
    def __init__(self) -> None:
        super().__init__()
        self.tags: list[tuple[str, dict[str, str | None]]] = []

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        self.tags.append((tag, dict(attrs)))


def test_html_has_one_bar_per_tensor_and_no_urls(wide) -> None:
    result = diff_drafters(wide["hf"], wide["q4"])
    page = result.report(threshold=0.05).to_html()
    assert not re.search(r"https?://|<script|<link|@import|url\(", page)
    p = _Tags()
    p.feed(page)
    assert not any("src" in a or "href" in a for _, a in p.tags)
    assert [t for t, _ in p.tags].count("svg") == 1
    bars = [a for t, a in p.tags if t == "rect" and a.get("class") == "bar"]
    assert len(bars) == len(result.tensors) == 25
    assert sum(a.get("stroke") == "#c00000" for a in bars) == len(result.over_threshold(0.05)) == 13
    colours = {a["stroke"] if a["fill"] == "#ffffff" else a["fill"] for a in bars}  # a zero: outlined in its colour
    assert len(colours) == 14  # one colour per tensor kind, shared by the layers
    assert "<title>layers.1.mlp.down_proj.weight (BF16 → " in page
    # each bar is tagged with B's tensor type; the tensors kept exact (the F32 norms) are outlined stubs
    from collections import Counter

    tags = re.findall(r'<text class="tag"[^>]*>([^<]*)</text>', page)
    assert Counter(tags) == Counter(t.b.type_name for t in result.tensors) and len(tags) == 25
    identical = [t for t in result.tensors if t.stats.rel_rms == 0]
    assert len(identical) == sum(a["fill"] == "#ffffff" and a["height"] == "5.0" for a in bars) > 0


CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser") or shutil.which("google-chrome")


def _screenshot(page: Path, png: Path) -> None:
    with tempfile.TemporaryDirectory() as profile:
        subprocess.run(
            [CHROMIUM, "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
             "--disable-background-networking", "--disable-component-update", "--disable-sync",
             f"--user-data-dir={profile}", f"--screenshot={png}", "--window-size=1200,900", page.as_uri()],
            check=True, capture_output=True, timeout=60,
        )


@pytest.mark.skipif(CHROMIUM is None, reason="headless Chromium not installed (apt-get install -y chromium)")
def test_html_renders_in_headless_chromium(wide, tmp_path) -> None:
    """Screenshot the page as is and with the bars hidden: the pixels differ, so the chart is drawn on screen."""
    html = diff_drafters(wide["hf"], wide["q4"]).report(threshold=0.05).to_html()
    shots = []
    for name, text in (("page", html), ("nobars", html.replace("</style>", ".bar{display:none}</style>"))):
        (tmp_path / f"{name}.html").write_text(text, encoding="utf-8")
        _screenshot(tmp_path / f"{name}.html", tmp_path / f"{name}.png")
        data = (tmp_path / f"{name}.png").read_bytes()
        assert data[:8] == b"\x89PNG\r\n\x1a\n"
        assert struct.unpack(">II", data[16:24]) == (1200, 900)
        shots.append(data)
    assert shots[0] != shots[1]


def test_pieces_give_the_figures_of_the_whole_tensor(drafters: dict[str, Path], tmp_path: Path) -> None:
    """diff streams each pair in row blocks: the blocks hold exactly the tensor's values, and statistics
    accumulated over aligned blocks equal those of the whole float32 pair (NaN counts included)."""
    from dflashkit.diff.stats import StatsAccumulator

    out = tmp_path / "q4.gguf"
    convert(drafters["qwen3-b16"], out, outtype="q4_k_m", progress=False, warn=lambda m: None)
    with open_drafter(drafters["qwen3-b16"]) as hf, open_drafter(out) as q:
        name = "layers.0.mlp.down_proj.weight"
        whole = q.read_f32(name).reshape(-1)
        pieces = list(q.read_f32_pieces(name, piece_elements=1024, align=512))
        assert len(pieces) > 2 and np.array_equal(np.concatenate(pieces), whole)
        a = hf.read_f32(name).reshape(-1).copy()
        a[7], a[-3] = np.nan, np.inf
        acc = StatsAccumulator(chunk=512)
        for start in range(0, a.size, 1024):
            acc.add(a[start : start + 1024], whole[start : start + 1024])
        got, expected = astuple(acc.result()), astuple(tensor_stats(a, whole, chunk=512))
        assert np.array_equal(np.array(got, dtype=float), np.array(expected, dtype=float), equal_nan=True)
        assert acc.result().nonfinite_a == 2 and math.isnan(acc.result().rel_rms)
        b = hf.read_f32(name).reshape(-1)
        acc = StatsAccumulator(chunk=512)
        for start in range(0, b.size, 1024):
            acc.add(b[start : start + 1024], whole[start : start + 1024])
        assert acc.result() == tensor_stats(b, whole, chunk=512)
