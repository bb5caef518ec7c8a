"""The long pair (fixtures/trained-long/, made by fixtures/make_long_pair.py): a target trained on 1024-token
documents whose names are recalled from far back, and a drafter with 3 sliding layers (window 128) and a full one.

A file whose window metadata is wrong drafts exactly like the right one while the context is shorter than the
window: each planted defect here passes parity at short context and fails it past the window (`--context`), and
dflash-accept names the metadata that differs. Through both pinned builds' llama-server: the correct file keeps its
τ to its trained length, a draft context (-cd) smaller than the prompt is named as the cause, and -np 2 gives every
request the target alone's output with τ for both slots.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import gguf
import pytest

from dflashkit.accept import run_acceptance
from dflashkit.accept.options import LlamaCppOptions
from dflashkit.converters.convert import convert
from dflashkit.parity.result import breaks
from dflashkit.parity.sweep import run_parity_by_context

from hostile import plant_context_defects

ROOT = Path(__file__).resolve().parents[1]
LONG = ROOT / "fixtures" / "trained-long"
CONTEXT = LONG / "context.txt"

pytestmark = pytest.mark.usefixtures("one_torch_thread")


@pytest.fixture(scope="module")
def files(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    tmp = tmp_path_factory.mktemp("long")
    good = tmp / "drafter-bf16.gguf"
    convert(LONG / "drafter", good, outtype="bf16", target=LONG / "target", progress=False, warn=lambda m: None)
    return plant_context_defects(good, tmp)


def test_the_converted_file_carries_the_window_and_a_bidirectional_block(files: dict[str, Path]) -> None:
    r = gguf.GGUFReader(files["correct"])
    assert r.fields["dflash.attention.sliding_window"].contents() == 128
    assert r.fields["dflash.attention.sliding_window_pattern"].contents() == [True, True, True, False]
    assert r.fields["dflash.context_length"].contents() == 1024


@pytest.fixture(scope="module")
def parity(files: dict[str, Path]) -> dict[str, Any]:
    return {name: run_parity_by_context(LONG / "drafter", path, levels=(0, 512), context_file=CONTEXT,
                                        target=LONG / "target", rounds=2, weights=False)
            for name, path in files.items()}


def test_the_correct_file_agrees_at_every_level(parity: dict[str, Any]) -> None:
    r = parity["correct"]
    assert r.all_failures(threshold_top1=0.9) == [] and breaks(r) == []
    assert [x.context_tokens for x in r.by_context] == [0, 512]
    assert r.by_context[1].rounds[0].start >= 512  # the anchors lie past the level


@pytest.mark.parametrize("name", ["window removed", "window 512"])
def test_a_window_defect_passes_short_context_and_fails_past_the_window(parity: dict[str, Any], name: str) -> None:
    r = parity[name]
    short, long = r.by_context
    assert short.failures(threshold_top1=0.9) == []  # the check every short-context run makes: passed
    failures = r.all_failures(threshold_top1=0.9)
    assert failures and all(f.startswith("at --context 512: top-1 agreement") for f in failures)
    (line,) = breaks(r)
    assert line.startswith("from --context 512 the candidate drafts unlike the reference")


def test_a_rope_base_defect_is_caught_at_long_context(parity: dict[str, Any]) -> None:
    r = parity["rope base 1e4"]
    assert any(f.startswith("at --context 512: top-1 agreement") for f in r.all_failures(threshold_top1=0.9))


def test_accept_names_the_metadata_that_differs(files: dict[str, Path]) -> None:
    result = run_acceptance(LONG / "target", [files["correct"], files["window removed"]], LONG / "prompts.jsonl",
                            max_new_tokens=48, context=(0, 512), context_file=CONTEXT)
    status = result.report().status
    assert "no-window.gguf (reference) drafts like drafter-bf16.gguf at --context 0" in status
    assert "from --context 512" in status
    assert ("likely cause: its sliding window (none) is not the first drafter's (128 on layers 0, 1, 2)" in status)


# ---- both pinned builds' llama-server ---------------------------------------------------------------------------

BUILDS = {"0.3.36": "DFLASHKIT_LLAMA_CPP_BIN", "b11549": "DFLASHKIT_LLAMA_CPP_MAINLINE_BIN"}
SOURCES = {"0.3.36": "DFLASHKIT_LLAMA_CPP_SRC", "b11549": "DFLASHKIT_LLAMA_CPP_MAINLINE_SRC"}


def _build(build: str) -> Path:
    value = os.environ.get(BUILDS[build])
    if not value:
        pytest.skip(f"set {BUILDS[build]} to the bin/ folder of the llama.cpp {build} build (.ci/run builds it)")
    return Path(value)


@pytest.fixture(scope="module")
def target_gguf(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from dflashkit.llama_cpp import target_gguf_from_hf

    src = os.environ.get(SOURCES["b11549"]) or os.environ.get(SOURCES["0.3.36"])
    if not src:
        pytest.skip("set DFLASHKIT_LLAMA_CPP_MAINLINE_SRC (llama.cpp's converter makes the target GGUF)")
    return target_gguf_from_hf(LONG / "target", tmp_path_factory.mktemp("t") / "target.gguf", Path(src))


@pytest.mark.parametrize("build", list(BUILDS))
def test_served_tau_holds_to_the_trained_length(build: str, files: dict[str, Path], target_gguf: Path) -> None:
    bin_dir = _build(build)
    ok = run_acceptance(LONG / "target", [files["correct"]], LONG / "prompts.jsonl", max_new_tokens=48,
                        context=(0, 768), context_file=CONTEXT,
                        llama=LlamaCppOptions(llama_servers=(str(bin_dir),), target_ggufs=(str(target_gguf),)))
    data = json.loads(ok.report().render("json"))
    table = next(s for s in data["sections"] if s["id"] == "by_context")["rows"]
    assert [r["context"] for r in table] == [0, 768]
    assert table[1]["tau_server"] >= 0.8 * table[0]["tau_server"]  # inside its trained length: τ holds
    assert table[1]["tau"] >= 0.8 * table[0]["tau"]
    assert not [c for c in next(s for s in data["sections"] if s["id"] == "cliffs")["items"]
                if "(reference)" in c or "(llama-server τ)" in c]
    assert ok.serving.runs[0].differences(ok.serving.prompt_names) == []


@pytest.mark.parametrize("build", list(BUILDS))
def test_two_slots_give_the_targets_output_and_both_draft(build: str, files: dict[str, Path],
                                                          target_gguf: Path) -> None:
    bin_dir = _build(build)
    result = run_acceptance(LONG / "target", [files["correct"]], LONG / "prompts.jsonl", max_prompts=4,
                            max_new_tokens=32, llama=LlamaCppOptions(llama_servers=(str(bin_dir),),
                                                                     target_ggufs=(str(target_gguf),), parallel=(1, 2)))
    (lv1, lv2) = result.serving.parallel
    names = result.serving.prompt_names
    assert lv1.differences(names) == [] and lv2.differences(names) == []
    taus = lv2.slot_taus()
    assert set(taus) == {0, 1} and all(t > 2.0 for t in taus.values())
    assert lv2.slot_findings() == []
