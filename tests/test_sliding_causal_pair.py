"""The drafter trained as the field trains them (issue 55): ``fixtures/trained-long/drafter-sliding-causal`` — the
long pair's recipe with one switch (``fixtures/make_long_pair.py --sliding-causal``): its three sliding layers
trained causal inside the block and its full layer bidirectional (z-lab's default rule), shipped without
``is_causal``. llama.cpp's one flag (absent) runs every layer bidirectional: the file is another model there.

What each command makes of it, as a publisher would run them; and τ of its GGUF in dflashkit's runtime (llama.cpp's
rules, llama.cpp's schedule) against llama.cpp's own, prompt by prompt, in both pinned builds and both tools."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from click.testing import CliRunner

from dflashkit.accept import run_acceptance
from dflashkit.cli import accept_command, convert_command, inspect_command, parity_command
from dflashkit.runtime import HFTarget, load_drafter
from llama_cpp_oracle import BIN_VARS, require_llama_cpp_build

ROOT = Path(__file__).resolve().parents[1]
LONG = ROOT / "fixtures" / "trained-long"
DRAFTER = LONG / "drafter-sliding-causal"
BUILDS = list(BIN_VARS)
LOST = ("per-layer causality is lost: the reference runs layers 0, 1, 2 causal and 3 bidirectional; llama.cpp reads "
        "one flag for every layer (dflash.attention.causal: absent, so false) and will run every layer bidirectional")
CAUSE = ("per-layer causality — the reference runs layers 0, 1, 2 causal and 3 bidirectional, the candidate (as "
         "llama.cpp runs the file: one flag for every layer) every layer bidirectional")

#: prompts whose replay differs from llama-speculative-simple by float rounding, both builds: index 5, its last round
#: (the 9th), the drafter's two best logits 0.0062 apart at the slot the replay rejects — llama.cpp takes the other
#: one, the target's, and accepts further (τ 6.44 there, 6.00 here)
SIMPLE_FLOAT_TIES = {5: (6.0, 6.444444444444445)}

pytestmark = pytest.mark.usefixtures("one_torch_thread")


def _build(name: str) -> tuple[Path, Path]:
    return require_llama_cpp_build(name, "llama-server")


@pytest.fixture(scope="module")
def converted(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("sliding-causal") / "drafter.gguf"
    res = CliRunner().invoke(convert_command, [str(DRAFTER), str(out), "--target", str(LONG / "target")])
    assert res.exit_code == 0, res.output
    causal, window = res.stderr.splitlines()
    assert causal == (f"warning: {DRAFTER / 'config.json'}: {LOST} — the reference's rule is recorded in "
                      "dflashkit.attention.causal_layers; choose llama.cpp's flag with --llama-cpp-causal true|false "
                      "(docs/causality.md)")
    assert window.startswith(f"warning: {DRAFTER / 'config.json'}: sliding_window: written from layer_types")
    return out


def test_it_ships_without_is_causal_and_z_lab_runs_its_sliding_layers_causal() -> None:
    from dflash import model as zl
    from transformers import Qwen3Config

    assert "is_causal" not in json.loads((DRAFTER / "config.json").read_text())
    reference = zl.DFlashDraftModel(Qwen3Config.from_pretrained(DRAFTER))
    assert [layer.self_attn.is_causal for layer in reference.layers] == [True, True, True, False]
    assert [layer.self_attn.causal for layer in load_drafter(DRAFTER).layers] == [True, True, True, False]


def test_strict_refuses_it_and_writes_nothing(tmp_path: Path) -> None:
    out = tmp_path / "strict.gguf"
    res = CliRunner().invoke(convert_command, [str(DRAFTER), str(out), "--target", str(LONG / "target"), "--strict"])
    assert res.exit_code == 1 and not out.exists()
    assert res.stderr.splitlines()[-1].startswith(f"error: {DRAFTER / 'config.json'}: per-layer causality would be "
                                                  "lost: the reference runs layers 0, 1, 2 causal")


def test_inspect_flags_the_gguf(converted: Path) -> None:
    res = CliRunner().invoke(inspect_command, [str(converted), "--format", "json"])
    findings = [f for f in json.loads(res.stdout)["files"][0]["findings"] if f["id"] == "drafter.causality"]
    assert [f["severity"] for f in findings] == ["warning"] and LOST in findings[0]["message"]


def test_parity_fails_at_the_default_gate_and_names_causality(converted: Path) -> None:
    res = CliRunner().invoke(parity_command, [str(DRAFTER), str(converted), "--target", str(LONG / "target"),
                                              "--rounds", "4", "--skip-weights", "--format", "json"])
    assert res.exit_code == 1, res.output
    report = json.loads(res.stdout)
    assert report["summary"]["top1"] < 0.99 and report["status"].endswith(f"; likely cause: {CAUSE}")
    assert report["summary"]["gate"] == "top-1 ≥ 99.00%, KL ≤ 0.01 (default for float files)"


@pytest.mark.slow
@pytest.mark.parametrize("build", list(BUILDS))
def test_the_runtime_counts_llama_cpps_tau_prompt_by_prompt_in_both_tools(build: str, converted: Path,
                                                                           tmp_path: Path) -> None:
    binary, src = _build(build)
    simple = tmp_path / "simple"  # a folder with llama-speculative-simple alone: --llama-cpp then runs it
    simple.mkdir()
    (simple / "llama-speculative-simple").symlink_to(binary.resolve() / "llama-speculative-simple")
    result = run_acceptance(HFTarget(LONG / "target"), [converted], LONG / "prompts.jsonl", max_new_tokens=48,
                            llama_cpp=simple, llama_server=binary, llama_cpp_src=src)
    d, ran = result.drafters[0], result.llama_cpp[0]
    assert d.schedule == "simple" and ran.refused is None
    for i, (ours, theirs) in enumerate(zip(d.schedule_taus, ran.taus)):  # llama-speculative-simple: every prompt
        assert (ours, theirs) == SIMPLE_FLOAT_TIES.get(i, (theirs, theirs)), i
    (served,) = result.serving.runs
    assert served.reference_taus == served.taus  # llama-server: every prompt, exactly
    assert result.llama_cpp_verdicts() == ["agrees"] and served.tau_verdict() == "agrees"


@pytest.mark.slow
def test_accept_on_the_checkpoint_fails_the_gap_and_names_causality(tmp_path: Path) -> None:
    """The publisher's check before shipping: the checkpoint itself against llama.cpp (converted on the fly as
    llama.cpp's converter would write it), with the issue's gate, ``--max-gap 5%``. The loss, 5.1 % on the long pair's 48
    held-out prompts at 64 new tokens (τ 9.25 against 9.74; 95 % CI 1.8 % – 8.6 %: benchmarks/CAUSALITY.md), is
    significant and past 5 %; the same loss passes ``--max-gap 6%``."""
    import sys

    sys.path.insert(0, str(ROOT / "fixtures"))
    import make_long_pair
    import make_trained_pair

    binary, src = _build("0.3.36")
    prompts = tmp_path / "held-out.jsonl"
    make_trained_pair.write_prompts(prompts, make_long_pair.held_out_prompts(48))
    res = CliRunner().invoke(accept_command, [
        str(DRAFTER), "--target", str(LONG / "target"), "--prompts", str(prompts), "--max-new-tokens", "64",
        "--llama-cpp", str(binary), "--llama-cpp-src", str(src), "--max-gap", "5%", "--format", "json", "-q"])
    assert res.exit_code == 1, res.output
    report = json.loads(res.stdout)
    assert "llama.cpp τ 9.25 is 5.1% below the reference runtime's 9.74 on llama-server's schedule " \
        "(> --max-gap 5.0%, and significant: 95% CI [" in report["status"]
    assert f"likely cause: {CAUSE}" in report["status"]
