"""EAGLE-3 files through the other commands (issue 57): dflash-quantize byte-identical to llama-quantize (both pinned
builds), dflash-inspect naming what llama.cpp needs and catching what it refuses, dflash-diff comparing ``d2t``
exactly, and the files loading and drafting in llama-speculative-simple (``--spec-type draft-eagle3``)."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from gguf import GGUFValueType as V

from dflashkit.converters.convert import convert
from dflashkit.diff import diff_drafters
from dflashkit.llama_cpp import run_prompt, target_gguf_from_hf
from dflashkit.quantize.gguf_file import quantize_gguf
from hostile import rewrite_gguf
from llama_cpp_oracle import BUILDS, require_llama_cpp_build, run_oracle
from test_inspect_drafter import findings

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "fixtures"))
import make_eagle3  # noqa: E402

pytest.importorskip("speculators.models.eagle3")
QUIET = {"progress": False, "warn": lambda _: None}
TYPES = ("Q8_0", "Q6_K", "Q4_K_M", "Q4_0", "IQ4_XS", "Q2_K")


@pytest.fixture(scope="module")
def made(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict[str, Path]]:
    return make_eagle3.make(tmp_path_factory.mktemp("eagle3"), [*make_eagle3.ACCEPTED, "refused-four-taps"])


@pytest.fixture(scope="module")
def f16(made: tuple[Path, dict[str, Path]], tmp_path_factory: pytest.TempPathFactory) -> Path:
    target, fixtures = made
    out = tmp_path_factory.mktemp("e3") / "drafter-f16.gguf"
    convert(fixtures["speculators-llama"], out, outtype="f16", target=target, **QUIET)
    return out


def _ids(found: dict[str, list]) -> set[str]:
    return {i for i, fs in found.items() if any(f.severity.value != "info" for f in fs)}


@pytest.mark.parametrize("build", list(BUILDS))
def test_quantize_is_byte_identical_to_llama_quantize(build: str, f16: Path, tmp_path: Path) -> None:
    binary, _ = require_llama_cpp_build(build, "llama-quantize")
    for qtype in TYPES:
        theirs = tmp_path / f"theirs-{qtype}.gguf"
        subprocess.run([str(binary / "llama-quantize"), str(f16), str(theirs), qtype], check=True, capture_output=True)
        ours = tmp_path / f"ours-{qtype}.gguf"
        quantize_gguf(f16, ours, qtype, progress=False, warn=lambda _: None)
        assert ours.read_bytes() == theirs.read_bytes(), qtype


def test_inspect_names_the_drafter_and_how_llama_cpp_runs_it(f16: Path, made: tuple[Path, dict[str, Path]]) -> None:
    target, _ = made
    found = findings(f16, target=str(target))
    assert _ids(found) == set()
    (family,) = found["eagle3.family"]
    assert family.message == (
        f"{f16}: EAGLE-3 drafter: target layers [2, 6, 9] (layer inputs; HF ids [1, 5, 8]), target hidden size 64, "
        "draft vocabulary 256 of 512, norm_before_residual True, norm_before_fc False — llama.cpp runs it with "
        "--spec-type draft-eagle3 (it does not infer the type from the file) and drafts --spec-draft-n-max tokens a "
        "round (default 3)")


def test_inspect_against_another_target(f16: Path) -> None:
    other = Path(__file__).resolve().parents[1] / "fixtures" / "trained" / "target"  # hidden 256, 4 layers, 768 tokens
    found = findings(f16, target=str(other))
    assert _ids(found) == {"target.hidden_size", "target.tap_range", "target.tokenizer"}
    assert found["target.hidden_size"][0].message == (
        f"{f16}: drafter hidden size 64 ≠ target embedding length 256 ({other}) — this drafter belongs to another target")


def test_inspect_refuses_what_llama_cpps_converter_wrote_for_four_taps(made: tuple[Path, dict[str, Path]],
                                                                       tmp_path: Path) -> None:
    """llama.cpp's converter writes a four-tap file without a word; its draft-eagle3 then refuses it."""
    target, fixtures = made
    theirs = run_oracle(fixtures["refused-four-taps"], tmp_path / "four.gguf", outtype="f16", target_dir=target)
    found = findings(theirs)
    assert "eagle3.taps" in _ids(found)
    assert found["eagle3.taps"][0].message == (
        f"{theirs}: eagle3.target_layers lists 4 layers [2, 4, 6, 9] but llama.cpp's draft-eagle3 fuses exactly 3 (it "
        "refuses the drafter: 'expected 3 extract layers, got 4')")


def test_inspect_catches_a_dropped_input_norm_and_a_flag_that_lies(made: tuple[Path, dict[str, Path]],
                                                                   tmp_path: Path) -> None:
    target, fixtures = made
    good = convert(fixtures["speculators-norm-before-fc"], tmp_path / "nbf.gguf", outtype="f32", target=target,
                   **QUIET).out
    assert _ids(findings(good)) == set()
    dropped = rewrite_gguf(good, tmp_path / "dropped.gguf", drop_tensors=("enc.output_norm.weight",))
    found = findings(dropped)
    assert "eagle3.norm_before_fc" in _ids(found)
    assert found["eagle3.norm_before_fc"][0].message == (
        f"{dropped}: eagle3.norm_before_fc is true but the file has no enc.output_norm.weight — llama.cpp normalises "
        "the fused taps only with the flag (and needs the tensor then); re-convert with dflash-convert")
    lying = rewrite_gguf(good, tmp_path / "lying.gguf", set_keys={"eagle3.target_hidden_size": (32, V.UINT32)})
    assert "eagle3.fc_width" in _ids(findings(lying))


def test_inspect_checks_d2t_as_llama_cpp_reads_it(f16: Path, tmp_path: Path) -> None:
    import gguf

    d2t = next(t for t in gguf.GGUFReader(f16).tensors if t.name == "d2t").data.copy()
    d2t[1] = d2t[0]
    bad = rewrite_gguf(f16, tmp_path / "dup.gguf", replace={"d2t": d2t})
    found = findings(bad)
    assert _ids(found) == {"dspark.d2t_duplicate"}
    assert f"target id {int(d2t[0])} at rows [0, 1]" in found["dspark.d2t_duplicate"][0].message


def test_diff_compares_d2t_exactly(made: tuple[Path, dict[str, Path]], f16: Path, tmp_path: Path) -> None:
    import gguf

    _, fixtures = made
    same = diff_drafters(str(fixtures["speculators-llama"]), str(f16))
    assert same.exit_code() == 0
    d2t = next(t for t in gguf.GGUFReader(f16).tensors if t.name == "d2t").data.copy()
    free = int(np.setdiff1d(np.arange(512), d2t)[-1])  # a target id no row maps to
    d2t[-1] = free
    off = rewrite_gguf(f16, tmp_path / "off.gguf", replace={"d2t": d2t})
    report = diff_drafters(str(fixtures["speculators-llama"]), str(off))
    assert report.exit_code() == 1
    assert re.search(r"d2t\s+d2t\s+d2t\s+256\s+1\s", report.report().to_text()), report.report().to_text()


@pytest.mark.parametrize("build", list(BUILDS))
def test_llama_cpp_loads_and_drafts_every_layout(build: str, made: tuple[Path, dict[str, Path]], f16: Path,
                                              tmp_path: Path) -> None:
    binary, src = require_llama_cpp_build(build, "llama-speculative-simple")
    target, _ = made
    target_gguf = target_gguf_from_hf(target, tmp_path / "target.gguf", src)
    q4 = tmp_path / "drafter-Q4_K_M.gguf"
    quantize_gguf(f16, q4, "Q4_K_M", progress=False, warn=lambda _: None)
    layouts = [convert(made[1][name], tmp_path / f"{name}.gguf", outtype="bf16", target=target, **QUIET).out
               for name in make_eagle3.ACCEPTED]  # every layout, as llama.cpp's converter writes it
    for drafter in (f16, q4, *layouts):  # dflashkit's runner: --spec-type from the file, counts read robustly
        # (llama.cpp never flushes its logger at exit: a bare run may lose the final counts)
        ran = run_prompt(binary / "llama-speculative-simple", target_gguf, drafter, "the cat sat on the",
                         n_predict=24, draft_max=3, extra_args=("--no-repack",))
        assert ran.n_drafted > 0 and ran.n_predict > 0, drafter


@pytest.mark.slow
@pytest.mark.parametrize("build", list(BUILDS))
def test_llama_server_serves_every_layout(build: str, made: tuple[Path, dict[str, Path]], tmp_path: Path) -> None:
    """Every layout's file through llama-server (--spec-type draft-eagle3, from the family): it loads, drafts, and
    the output is the target's own; at -np 2 too (by concurrent requests)."""
    import json

    from dflashkit.accept import run_acceptance

    binary, src = require_llama_cpp_build(build, "llama-server")
    target, fixtures = made
    target_gguf = target_gguf_from_hf(target, tmp_path / "target.gguf", src)
    ggufs = [convert(fixtures[name], tmp_path / f"{name}.gguf", outtype="bf16", target=target, **QUIET).out
             for name in make_eagle3.ACCEPTED]
    prompts = tmp_path / "prompts.jsonl"
    prompts.write_text(json.dumps({"id": "p", "text": "the cat sat on the mat and"}) + "\n")
    result = run_acceptance(target, ggufs, prompts, max_new_tokens=12, llama_server=binary, target_gguf=target_gguf,
                            parallel=(2,))
    report = json.loads(result.report().to_json())
    rows = next(s["rows"] for s in report["sections"] if s.get("id") == "serving")
    assert len(rows) == len(ggufs)
    for row in rows:
        assert row["refused"] is None and row["identical_output"] == "yes", row
        assert row["drafted"] > 0 and row["draft_n_max"] == 3, row
    by_np = next(s["rows"] for s in report["sections"] if s.get("id") == "by_parallel")
    assert {r["np"] for r in by_np} == {2}
