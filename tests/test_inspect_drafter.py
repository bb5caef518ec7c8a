"""dflash-inspect: drafter metadata, instruct vs base, drafter ↔ target — on real converted files and
deliberately broken copies. Each check is asserted by id, severity, message and exit code."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import gguf
import numpy as np
import pytest
from click.testing import CliRunner
from gguf import GGUFValueType as V

from dflashkit.cli import inspect_command
from dflashkit.converters.convert import convert
from dflashkit.inspect import inspect_paths

import make_target
from hostile import rewrite_gguf  # noqa: F401  (other test files import it from here)

QUIET = dict(progress=False, warn=lambda m: None)


def findings(path, **kw) -> dict[str, list]:
    report = inspect_paths([str(path)], **kw)
    out: dict[str, list] = {}
    for f in report.files[0].findings:
        out.setdefault(f.id, []).append(f)
    return out


def only(fs: dict[str, list], fid: str):
    assert fid in fs, sorted(fs)
    assert len(fs[fid]) == 1, fs[fid]
    return fs[fid][0]


@pytest.fixture(scope="module")
def f32(drafters, targets, tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("insp") / "qwen3.gguf"
    convert(drafters["qwen3-b16"], out, outtype="f32", target=targets[64]["gguf"], **QUIET)
    return out


def test_clean_file_has_no_error_and_names_dialect(f32: Path, targets) -> None:
    report = inspect_paths([str(f32)], target=str(targets[64]["gguf"]))
    fs = report.files[0]
    assert [f for f in fs.findings if f.severity.value != "info"] == []
    assert report.exit_code() == 0
    assert fs.summary["dialect"] == "llama.cpp"
    assert fs.summary["tap_convention"] == "HF id + 1 (llama.cpp)"
    assert fs.summary["target_layer_ids"] == [1, 8]
    d = only(findings(f32), "drafter.dialect")
    assert "target layer ids stored as HF id + 1 (llama.cpp)" in d.message


@pytest.mark.parametrize("dialect, arch", [("luce", "qwen35-dflash-draft"), ("dflash-draft", "dflash-draft")])
def test_other_dialects_are_recognised(dialect, arch, drafters, targets, tmp_path: Path) -> None:
    out = tmp_path / "d.gguf"
    convert(drafters["qwen3-b16"], out, outtype="bf16", dialect=dialect, target=targets[64]["gguf"], **QUIET)
    report = inspect_paths([str(out)], target=str(targets[64]["gguf"]))
    assert report.files[0].summary["dialect"] == dialect
    assert report.files[0].summary["tap_convention"] == "raw HF ids"
    assert report.exit_code() == 0, report.to_text()
    assert f"arch '{arch}'" in only(findings(out), "drafter.dialect").message


def test_missing_required_key(f32: Path, tmp_path: Path) -> None:
    bad = rewrite_gguf(f32, tmp_path / "b.gguf", drop_keys={"dflash.target_layers"})
    f = only(findings(bad), "drafter.key_missing")
    assert f.severity.value == "error"
    assert "required llama.cpp key(s) missing: dflash.target_layers" in f.message


def test_wrong_value_type_for_luce_loader(drafters, targets, tmp_path: Path) -> None:
    luce = tmp_path / "l.gguf"
    convert(drafters["qwen3-b16"], luce, outtype="bf16", dialect="luce", target=targets[64]["gguf"], **QUIET)
    key = "qwen35-dflash-draft.dflash.target_layer_ids"
    bad = rewrite_gguf(luce, tmp_path / "b.gguf", set_keys={key: ([1, 8], V.ARRAY, V.UINT32)})
    f = only(findings(bad), "drafter.key_type")
    assert f"key '{key}' is ARRAY of UINT32 but the luce loader needs ARRAY of INT32" in f.message


def test_tap_count_against_fc_width(f32: Path, tmp_path: Path) -> None:
    bad = rewrite_gguf(f32, tmp_path / "b.gguf", set_keys={"dflash.target_layers": ([2, 5, 9], V.ARRAY, V.INT32)})
    f = only(findings(bad), "drafter.tap_count")
    assert "3 target layer ids but 'fc.weight' takes 128 inputs = 2 × hidden 64" in f.message


def test_unsorted_tap_ids(f32: Path, tmp_path: Path) -> None:
    bad = rewrite_gguf(f32, tmp_path / "b.gguf", set_keys={"dflash.target_layers": ([9, 2], V.ARRAY, V.INT32)})
    assert "target layer ids [8, 1] must be non-negative, sorted and unique" in only(findings(bad), "drafter.tap_ids").message


def test_swa_pattern_length(drafters, targets, tmp_path: Path) -> None:
    src = tmp_path / "s.gguf"
    convert(drafters["qwen35-swa"], src, outtype="f32", target=targets[64]["gguf"], **QUIET)
    bad = rewrite_gguf(src, tmp_path / "b.gguf", set_keys={"dflash.attention.sliding_window_pattern": ([True, False], V.ARRAY, V.BOOL)})
    assert "sliding-window pattern has 2 entries for 3 layers" in only(findings(bad), "drafter.swa_pattern").message


@pytest.mark.parametrize("block", [0, 65])
def test_block_size_range(block: int, f32: Path, tmp_path: Path) -> None:
    bad = rewrite_gguf(f32, tmp_path / "b.gguf", set_keys={"dflash.block_size": (block, V.UINT32)})
    assert f"block size {block} is outside 1..64" in only(findings(bad), "drafter.block_size").message


def test_tensor_missing_unknown_and_reshaped(f32: Path, tmp_path: Path) -> None:
    missing = rewrite_gguf(f32, tmp_path / "m.gguf", drop_tensors={"blk.1.attn_k_norm.weight"})
    assert "missing tensor(s) for this config: blk.1.attn_k_norm.weight" in only(findings(missing), "drafter.tensor_missing").message
    renamed = rewrite_gguf(f32, tmp_path / "r.gguf", rename={"blk.1.attn_k_norm.weight": "blk.1.attn_k_nrm.weight"})
    fs = findings(renamed)
    assert "1 tensor(s) with no meaning in this dialect: blk.1.attn_k_nrm.weight" in only(fs, "drafter.tensor_unknown").message
    reshaped = rewrite_gguf(f32, tmp_path / "s.gguf", replace={"blk.0.attn_k.weight": np.zeros((16, 64), np.float32)})
    msg = only(findings(reshaped), "drafter.tensor_shape").message
    assert "tensor 'blk.0.attn_k.weight' has shape [16, 64] but the config implies [32, 64]" in msg


def test_no_tokenizer_is_an_error_for_llama_cpp(drafters, tmp_path: Path) -> None:
    bare = tmp_path / "bare.gguf"
    convert(drafters["qwen3-b16"], bare, outtype="bf16", **QUIET)
    f = only(findings(bare), "drafter.tokenizer_missing")
    assert f.severity.value == "error"
    assert "llama.cpp will refuse to load it" in f.message and "--target" in f.message


def test_mask_token_outside_vocab(f32: Path, tmp_path: Path) -> None:
    bad = rewrite_gguf(f32, tmp_path / "b.gguf", set_keys={"tokenizer.ggml.mask_token_id": (600, V.UINT32)})
    assert "mask token id 600 is outside the vocabulary (512 tokens)" in only(findings(bad), "drafter.mask_token").message


def test_hf_checkpoint_checks(drafters, tmp_path: Path) -> None:
    d = tmp_path / "d"
    shutil.copytree(drafters["qwen3-b16"], d)
    cfg = json.loads((d / "config.json").read_text())
    cfg["num_key_value_heads"] = 4
    (d / "config.json").write_text(json.dumps(cfg))
    fs = findings(d)
    assert "tensor 'layers.0.self_attn.k_proj.weight' has shape [32, 64]" in fs["drafter.tensor_shape"][0].message
    assert inspect_paths([str(drafters["qwen3-b16"])]).exit_code() == 0


# ---- drafter ↔ target -----------------------------------------------------------------------


def test_target_hidden_size_mismatch(f32: Path, targets) -> None:
    f = only(findings(f32, target=str(targets[72]["gguf"])), "target.hidden_size")
    assert "drafter hidden size 64 ≠ target embedding length 72" in f.message


def test_tap_past_the_target_last_layer(f32: Path, tmp_path: Path) -> None:
    # the off-by-one: ids written raw into a llama.cpp file read as id - 1 ... and a short target
    hf = make_target.make_hf_target(tmp_path / "short", hidden_size=64, n_layers=9)
    f = only(findings(f32, target=str(hf)), "target.tap_range")
    assert "target layer id(s) [8] (stored as [9], HF id + 1 (llama.cpp)) tap past the last layer of the 9-layer target" in f.message
    assert "layer input tensor is null" in f.message


def test_mask_token_outside_target_vocab(drafters, tmp_path: Path) -> None:
    hf = make_target.make_hf_target(tmp_path / "t", hidden_size=64, n_layers=12, vocab_size=480, mask_token_id=None)
    out = tmp_path / "d.gguf"
    convert(drafters["qwen3-b16"], out, outtype="bf16", **QUIET)  # the converter would refuse with --target
    f = only(findings(out, target=str(hf)), "target.mask_token")
    assert "mask token id 500 is outside the target vocabulary (480 tokens)" in f.message


def test_tokenizer_differs_from_target(f32: Path, tmp_path: Path) -> None:
    hf = make_target.make_hf_target(tmp_path / "t", hidden_size=64, n_layers=12, vocab_size=520)
    f = only(findings(f32, target=str(hf)), "target.tokenizer")
    assert f.severity.value == "error" and "token list differs from the target's (512 vs 520 tokens)" in f.message


def test_instruct_drafter_with_base_target(drafters, targets, tmp_path: Path) -> None:
    d = tmp_path / "Qwen3-8B-it-DFlash"
    shutil.copytree(drafters["qwen3-b16"], d)
    out = tmp_path / "d.gguf"
    convert(d, out, outtype="bf16", target=targets[64]["gguf"], **QUIET)
    base = make_target.make_hf_target(tmp_path / "Qwen3-8B-Base", hidden_size=64, n_layers=12, instruct=False)
    fs = findings(out, target=str(base))
    f = only(fs, "target.instruct")
    assert f.severity.value == "error"
    assert "drafter looks instruct but target" in f.message and "looks base" in f.message


def test_expect_instruct_on_a_base_target(tmp_path: Path) -> None:
    base = make_target.make_hf_target(tmp_path / "Qwen3-8B-Base", hidden_size=64, n_layers=12, instruct=False)
    gguf_path = make_target.make_gguf_target(tmp_path / "Qwen3-8B-Base.gguf", base)
    for path in (base, gguf_path):
        fs = findings(path, expect="instruct")
        f = only(fs, "provenance.expect_mismatch")
        assert "--expect instruct but it looks base" in f.message
    assert only(findings(gguf_path, expect="base"), "provenance.verdict").values["verdict"] == "base"


def test_conflicting_evidence_is_unknown(tmp_path: Path) -> None:
    # a base-named model whose EOS is an end-of-turn token: both sides listed, no guess
    hf = make_target.make_hf_target(tmp_path / "Qwen3-8B-Base", hidden_size=64, n_layers=12, instruct=True)
    f = only(findings(hf), "provenance.verdict")
    assert f.values["verdict"] == "unknown"
    assert f.values["instruct_evidence"] and f.values["base_evidence"]


def test_expect_fails_on_conflicting_evidence(tmp_path: Path) -> None:
    """general.finetune = 'base', a '... Base' name and an end-of-turn EOS: verdict unknown, and a gate asking
    for either variant fails (exit 1) with one error listing both sides' evidence."""
    hf = make_target.make_hf_target(tmp_path / "Qwen3-8B-Base", hidden_size=64, n_layers=12, instruct=True)
    plain = make_target.make_gguf_target(tmp_path / "plain.gguf", hf)
    path = rewrite_gguf(plain, tmp_path / "Qwen3-8B-Base.gguf", set_keys={"general.finetune": ("base", V.STRING)})
    v = only(findings(path), "provenance.verdict").values
    assert v["verdict"] == "unknown"
    assert v["base_evidence"] == ["strong: general.finetune = 'base'", "strong: general.name 'Qwen3-8B-Base' has 'base'"]
    assert v["instruct_evidence"] == ["strong: EOS is the end-of-turn token <|im_end|>", "weak: has a chat template"]
    runner = CliRunner()
    assert runner.invoke(inspect_command, [str(path)]).exit_code == 0  # no gate: the verdict is reported only
    for expect in ("instruct", "base"):
        r = runner.invoke(inspect_command, [str(path), "--expect", expect])
        assert r.exit_code == 1, r.output
        line = (f"{path}: --expect {expect} but instruct/base cannot be told from the file "
                f"(instruct: {'; '.join(v['instruct_evidence'])} | base: {'; '.join(v['base_evidence'])})")
        assert line in r.output
        fs = findings(path, expect=expect)
        f = only(fs, "provenance.expect_unknown")
        assert f.severity == "error" and f.message == line


def test_cli_json_many_files_and_strict(f32: Path, drafters, targets, tmp_path: Path) -> None:
    bare = tmp_path / "bare.gguf"
    convert(drafters["qwen3-b16"], bare, outtype="bf16", dialect="luce", **QUIET)  # warning: no tokenizer
    runner = CliRunner()
    r = runner.invoke(inspect_command, [str(f32), str(bare), "--json"])
    assert r.exit_code == 0, r.output
    doc = json.loads(r.stdout)
    assert [f["path"] for f in doc["files"]] == [str(f32), str(bare)]
    ids = {(f["id"], f["severity"]) for f in doc["files"][1]["findings"]}
    assert ("drafter.tokenizer_missing", "warning") in ids
    r = runner.invoke(inspect_command, [str(f32), str(bare), "--json", "--strict"])
    assert r.exit_code == 1
    r = runner.invoke(inspect_command, [])
    assert r.exit_code == 2
