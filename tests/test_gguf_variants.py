"""llama.cpp ``dflash`` GGUF variants in circulation (files written before llama.cpp settled its keys), crafted with gguf-py's GGUFWriter from a
current file: Inspect names them with the fixing command, translation rewrites them to the current layout
(byte-identical to converting the checkpoint directly), and older nested DFlash 2 tensor names are read."""

from __future__ import annotations

from pathlib import Path

import gguf
import pytest
from click.testing import CliRunner
from gguf import GGUFValueType as V

from dflashkit.cli import convert_command, inspect_command
from dflashkit.converters.convert import convert
from dflashkit.diff import diff_drafters
from dflashkit.drafters import open_drafter
from dflashkit.io.gguf_reader import open_gguf
from test_inspect_drafter import findings, only, rewrite_gguf

import make_drafters

QUIET = dict(progress=False, warn=lambda m: None)
HF_TAPS = make_drafters.FAMILIES["qwen3-b16"]["dflash_config"]["target_layer_ids"]
MASK = make_drafters.MASK_TOKEN_ID


@pytest.fixture(scope="module")
def current(drafters, targets, tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("variants") / "current.gguf"
    convert(drafters["qwen3-b16"], out, outtype="f32", target=targets[64]["gguf"], **QUIET)
    return out


@pytest.fixture(scope="module")
def pre_merge(current: Path) -> Path:
    # what llama.cpp wrote before its DFlash support was merged: mask id and raw HF tap ids under dflash.*
    return rewrite_gguf(
        current, current.with_name("pre-merge.gguf"),
        drop_keys=("dflash.target_layers", "tokenizer.ggml.mask_token_id"),
        set_keys={"dflash.mask_token_id": (MASK, V.UINT32), "dflash.target_layer_ids": (list(HF_TAPS), V.ARRAY, V.INT32)},
    )


@pytest.fixture(scope="module")
def raw_taps(current: Path) -> Path:
    # beellama's convert-dflash-draft-to-upstream.py: raw ids renamed to dflash.target_layers, n_target_features kept
    return rewrite_gguf(
        current, current.with_name("raw-taps.gguf"),
        set_keys={"dflash.target_layers": (list(HF_TAPS), V.ARRAY, V.INT32),
                  "dflash.n_target_features": (64 * len(HF_TAPS), V.UINT32)},
    )


def _kv(path: Path) -> dict:
    g = open_gguf(path)
    try:
        return {k: kv.value for k, kv in g.kvs.items()}
    finally:
        g.close()


def test_assumed_current_taps() -> None:
    assert HF_TAPS == [1, 8]  # the messages below spell these out


# ---- pre-merge ----------------------------------------------------------------------------------


def test_inspect_errors_on_a_pre_merge_file_with_the_fixing_command(pre_merge: Path) -> None:
    fs = findings(pre_merge)
    f = only(fs, "drafter.pre_merge")
    assert f.severity.value == "error"
    assert f.message == (
        f"{pre_merge}: pre-merge llama.cpp DFlash file (dflash.mask_token_id set, no dflash.target_layers) — current "
        "llama.cpp refuses it (\"DFlash model requires 'target_layers' in GGUF metadata\"); fix: dflash-convert "
        f"{pre_merge} {pre_merge.with_suffix('.fixed.gguf')}"
    )
    assert "drafter.key_missing" not in fs  # the moved keys are the finding above, not two more
    r = CliRunner().invoke(inspect_command, [str(pre_merge)])
    assert r.exit_code == 1


def test_translate_rewrites_a_pre_merge_file_to_the_current_layout(pre_merge: Path, current: Path, tmp_path: Path) -> None:
    fixed = tmp_path / "fixed.gguf"
    r = CliRunner().invoke(convert_command, [str(pre_merge), str(fixed), "-q"])
    assert r.exit_code == 0, r.output
    kv = _kv(fixed)
    assert kv["dflash.target_layers"] == [i + 1 for i in HF_TAPS] == [2, 9]
    assert kv["tokenizer.ggml.mask_token_id"] == MASK
    assert not {"dflash.mask_token_id", "dflash.target_layer_ids"} & set(kv)
    # the same bytes as converting the HF checkpoint directly
    assert fixed.read_bytes() == current.read_bytes()
    assert findings(fixed).keys().isdisjoint({"drafter.pre_merge", "drafter.key_missing"})


# ---- raw tap ids --------------------------------------------------------------------------------


def test_inspect_warns_on_a_raw_tap_file(raw_taps: Path) -> None:
    f = only(findings(raw_taps), "drafter.raw_tap_ids")
    assert f.severity.value == "warning"
    assert f.message == (
        f"{raw_taps}: carries dflash.n_target_features, a key only tools that copy raw tap ids write (beellama's "
        "convert-dflash-draft-to-upstream.py): dflash.target_layers [1, 8] probably tap one layer early; fix: "
        f"dflash-convert {raw_taps} {raw_taps.with_suffix('.fixed.gguf')} --taps-are-raw"
    )
    runner = CliRunner()
    assert runner.invoke(inspect_command, [str(raw_taps)]).exit_code == 0
    assert runner.invoke(inspect_command, [str(raw_taps), "--strict"]).exit_code == 1


def test_translate_refuses_a_raw_tap_file_without_the_flag(raw_taps: Path, tmp_path: Path) -> None:
    out = tmp_path / "o.gguf"
    r = CliRunner().invoke(convert_command, [str(raw_taps), str(out), "-q"])
    assert r.exit_code == 1
    assert r.stderr.strip() == (
        f"error: {raw_taps}: carries dflash.n_target_features, a key only tools that copy raw tap ids write "
        "(beellama's convert-dflash-draft-to-upstream.py), so dflash.target_layers [1, 8] probably tap one layer "
        "early — pass --taps-are-raw to store them + 1"
    )
    assert not out.exists()


def test_taps_are_raw_adds_the_one(raw_taps: Path, current: Path, tmp_path: Path) -> None:
    fixed = tmp_path / "fixed.gguf"
    r = CliRunner().invoke(convert_command, [str(raw_taps), str(fixed), "--taps-are-raw", "-q"])
    assert r.exit_code == 0, r.output
    kv = _kv(fixed)
    assert kv["dflash.target_layers"] == [2, 9] and "dflash.n_target_features" not in kv
    assert fixed.read_bytes() == current.read_bytes()


def test_taps_are_raw_is_a_usage_error_where_it_does_not_apply(drafters, pre_merge: Path, tmp_path: Path) -> None:
    runner = CliRunner()
    r = runner.invoke(convert_command, [str(drafters["qwen3-b16"]), str(tmp_path / "a.gguf"), "--taps-are-raw"])
    assert r.exit_code == 2
    assert "--taps-are-raw applies to a GGUF source (an HF config's target_layer_ids are HF ids)" in r.stderr
    r = runner.invoke(convert_command, [str(pre_merge), str(tmp_path / "b.gguf"), "--taps-are-raw"])
    assert r.exit_code == 2
    assert "are read as raw HF ids already" in r.stderr


# ---- M-RoPE target --------------------------------------------------------------------------------


def test_mrope_target_without_sections_warns_and_translate_with_target_fixes_it(current: Path, targets, tmp_path: Path) -> None:
    # a target whose GGUF carries M-RoPE sections (Qwen3.5/3.6 style)
    mrope = rewrite_gguf(targets[64]["gguf"], tmp_path / "mrope-target.gguf",
                         set_keys={"qwen3.rope.dimension_sections": ([8, 4, 4, 0], V.ARRAY, V.INT32)})
    f = only(findings(current, target=str(mrope)), "target.mrope_sections")
    assert f.severity.value == "warning"
    assert f.message == (
        f"{current}: target {mrope} uses M-RoPE but the drafter has no rope.dimension_sections (llama.cpp writes "
        f"[8, 0, 0, 0]) — acceptance drops on image input; fix: dflash-convert {current} "
        f"{current.with_suffix('.fixed.gguf')} --target {mrope}"
    )
    assert "target.mrope_sections" not in findings(current, target=str(targets[64]["gguf"]))
    fixed = tmp_path / "fixed.gguf"
    r = CliRunner().invoke(convert_command, [str(current), str(fixed), "--target", str(mrope), "-q"])
    assert r.exit_code == 0, r.output
    assert _kv(fixed)["dflash.rope.dimension_sections"] == [8, 0, 0, 0]
    assert "target.mrope_sections" not in findings(fixed, target=str(mrope))


# ---- older nested DFlash 2 names -------------------------------------------------------------------

OLD_NAMES = {
    "selector_hidden.weight": "selector.hidden_proj.weight",
    "selector_predecessor.weight": "selector.pred_codebook",
    "selector_successor.weight": "selector.succ_codebook",
    **{f"blk.{i}.{new}": f"blk.{i}.{old}" for i in range(2) for new, old in (
        ("attn_conv_base", "attn_conv.base"), ("attn_conv_proj.weight", "attn_conv.proj.weight"),
        ("ffn_conv_base", "ffn_conv.base"), ("ffn_conv_proj.weight", "ffn_conv.proj.weight"))},
}


@pytest.fixture(scope="module")
def dflash2_files(drafters, targets, tmp_path_factory) -> tuple[Path, Path]:
    root = tmp_path_factory.mktemp("old-names")
    new = root / "new.gguf"
    convert(drafters["dflash2"], new, outtype="f32", target=targets[64]["gguf"], **QUIET)
    r = gguf.GGUFReader(new)
    assert set(OLD_NAMES) <= {t.name for t in r.tensors}
    return new, rewrite_gguf(new, root / "old.gguf", rename=OLD_NAMES)


def test_old_dflash2_names_are_read(dflash2_files) -> None:
    new, old = dflash2_files
    with open_drafter(old) as d:
        assert not d.unmapped and d.spec is not None and d.spec.architecture == "DFlash2DraftModel"
        assert d.tensors["candidate_selector.predecessor_codebook.weight"].name == "selector.pred_codebook"
    fs = findings(old)
    assert not [f for fl in fs.values() for f in fl if f.severity.value == "error"], fs
    result = diff_drafters(new, old)
    assert not result.only_one_side and not result.unmapped
    assert all(t.stats.max_abs_diff == 0 for t in result.tensors)


def test_translate_writes_current_names(dflash2_files, tmp_path: Path) -> None:
    new, old = dflash2_files
    out = tmp_path / "renamed.gguf"
    r = CliRunner().invoke(convert_command, [str(old), str(out), "-q"])
    assert r.exit_code == 0, r.output
    assert out.read_bytes() == new.read_bytes()


def test_runtime_loads_old_dflash2_names_into_the_same_weights(dflash2_files) -> None:
    import torch

    from dflashkit.runtime import load_drafter

    new, old = dflash2_files
    a, b = load_drafter(new).state_dict(), load_drafter(old).state_dict()
    assert a.keys() == b.keys()
    assert all(torch.equal(a[k], b[k]) for k in a)
