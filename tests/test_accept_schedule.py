"""τ of the reference runtime and of llama.cpp on one accounting (`dflashkit.runtime.schedules`, `dflashkit.accept.gap`).

Against the real binaries of both pinned builds (DFLASHKIT_LLAMA_CPP_BIN / _MAINLINE_BIN with their sources): the
trained pair's bf16 GGUF replayed on llama-speculative-simple's and llama-server's schedules counts, prompt by prompt,
what llama.cpp counts; a planted gap (a checkpoint whose per-layer causality its GGUF loses) fails the two-sided
``--max-gap`` with the cause named.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from dflashkit.accept import VERDICT_AGREES, run_acceptance
from dflashkit.accept.prompts import load_prompts
from dflashkit.accept.run import encode_prompts
from dflashkit.converters.convert import convert
from dflashkit.errors import UsageError
from dflashkit.llama_cpp import find_binary, run_prompt, target_gguf_from_hf
from dflashkit.llama_cpp.speculative_simple import context_size
from dflashkit.runtime import HFTarget, load_drafter
from dflashkit.runtime.schedules import replay_llama_cpp
from dflashkit.runtime.speculative import default_stop_ids
from llama_cpp_oracle import BIN_VARS, llama_cpp_src, require_llama_cpp_build

ROOT = Path(__file__).resolve().parents[1]
TRAINED, LONG = ROOT / "fixtures" / "trained", ROOT / "fixtures" / "trained-long"
BUILDS = list(BIN_VARS)
N_PREDICT, N_MAX = 48, 15
# Every prompt is asserted equal. Prompt 6 differed once by a float tie (round 4, draft slot 11, the drafter's two
# best logits 0.0007 apart) until the runtime rounded the BF16 file's activations to BF16 as ggml does: now it
# drafts llama.cpp's token 404.

pytestmark = [pytest.mark.usefixtures("one_torch_thread"), pytest.mark.slow]


def _build(name: str) -> tuple[Path, Path]:
    return require_llama_cpp_build(name, "llama-speculative-simple")


@pytest.fixture(scope="module")
def ggufs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("schedule")
    out = {"drafter": root / "drafter-bf16.gguf"}
    convert(TRAINED / "drafter", out["drafter"], outtype="bf16", target=TRAINED / "target", progress=False,
            warn=lambda m: None)
    for name in BUILDS:
        src = llama_cpp_src(name)
        if src is not None:  # each build's own converter
            out[name] = target_gguf_from_hf(TRAINED / "target", root / f"target-{name}.gguf", src)
    return out


@pytest.fixture(scope="module")
def target() -> HFTarget:
    return HFTarget(TRAINED / "target")


@pytest.mark.parametrize("build", list(BUILDS))
def test_the_replay_counts_what_speculative_simple_counts(build: str, ggufs: dict[str, Path],
                                                          target: HFTarget) -> None:
    binary, _ = _build(build)
    prompts = load_prompts(str(TRAINED / "prompts.jsonl"))
    ids, texts, _ = encode_prompts(target, prompts, N_PREDICT, {})
    model, stops = load_drafter(ggufs["drafter"]), default_stop_ids(target)
    for i, (p, text) in enumerate(zip(ids, texts)):
        ran = run_prompt(find_binary(binary), ggufs[build], ggufs["drafter"], text, n_predict=N_PREDICT,
                         draft_max=N_MAX, prompt_tokens=len(p))
        rep = replay_llama_cpp(model, target, p, schedule="simple", n_predict=N_PREDICT, n_max=N_MAX,
                               n_ctx=context_size(len(p), N_PREDICT, N_MAX), stop_token_ids=stops)
        assert ran.n_prompt_tokens == len(p) and ran.accepted is not None, i
        assert len(rep.output_ids) == sum(a + 1 for a in rep.accepted) > N_PREDICT  # past -n, as llama.cpp
        assert (ran.n_predict, ran.n_accept) == (len(rep.output_ids), sum(rep.accepted)), i
        assert ran.accepted == rep.accepted and ran.tau == rep.tau, i


@pytest.mark.parametrize("build", list(BUILDS))
def test_dflash_accept_agrees_prompt_by_prompt_on_the_servers_schedule(build: str, ggufs: dict[str, Path],
                                                                        target: HFTarget) -> None:
    binary, _ = _build(build)
    result = run_acceptance(target, [ggufs["drafter"]], TRAINED / "prompts.jsonl", max_new_tokens=N_PREDICT,
                            llama_cpp=binary, target_gguf=ggufs[build])
    d, ran = result.drafters[0], result.llama_cpp[0]
    assert d.schedule == "server" and ran.refused is None  # both builds have llama-server: --llama-cpp uses it
    assert d.schedule_taus == ran.taus  # every prompt, exactly
    assert result.llama_cpp_verdicts() == [VERDICT_AGREES] and result.failures(max_gap=0.0) == []
    assert d.gap_causes == []
    row = next(s["rows"] for s in json.loads(result.report().to_json())["sections"] if s.get("id") == "drafters")[0]
    assert row["tau_llama_cpp_schedule"] == row["tau_llama_cpp"] and row["llama_cpp_schedule"] == "server"


@pytest.fixture(scope="module")
def lost_causality(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The long pair's drafter without ``is_causal``: its reference runs the sliding layers causal, the GGUF
    llama.cpp runs has one flag, absent, so every layer bidirectional."""
    out = tmp_path_factory.mktemp("planted") / "drafter-no-is-causal"
    shutil.copytree(LONG / "drafter", out)
    config = json.loads((out / "config.json").read_text())
    del config["is_causal"]
    (out / "config.json").write_text(json.dumps(config))
    return out


@pytest.mark.parametrize("build", list(BUILDS))
def test_llama_cpp_above_the_reference_fails_the_gap_with_its_cause(build: str, lost_causality: Path) -> None:
    binary, src = _build(build)
    result = run_acceptance(HFTarget(LONG / "target"), [lost_causality], LONG / "prompts.jsonl",
                            max_new_tokens=N_PREDICT, max_prompts=6, llama_cpp=binary, llama_cpp_src=src)
    d, ran = result.drafters[0], result.llama_cpp[0]
    assert ran.tau > d.schedule_tau + 1.0, (ran.tau, d.schedule_tau)
    assert result.llama_cpp_verdicts() == ["above reference"]
    (failure,) = result.failures(max_gap=0.1)
    assert " above the reference runtime's " in failure and "(> --max-gap 10.0%, and significant: 95% CI [" in failure
    assert "likely cause: per-layer causality — the reference runs layers 0, 1, 2 causal and 3 bidirectional" in failure


def test_llama_cpp_below_the_reference_fails_the_gap_with_its_cause(tmp_path: Path, lost_causality: Path) -> None:
    # a stand-in llama-speculative-simple that accepts nothing: llama.cpp's τ 1.0 below the replay's
    from test_accept_llama_cpp import fake_binary

    binary, src = _build("0.3.36")
    stand_in = fake_binary(tmp_path / "bin", "sys.stderr.write(TAIL.replace('n_accept  = 14', 'n_accept  = 0'))")
    target_gguf = target_gguf_from_hf(LONG / "target", tmp_path / "target.gguf", src)
    result = run_acceptance(HFTarget(LONG / "target"), [lost_causality], LONG / "prompts.jsonl", max_new_tokens=16,
                            max_prompts=3, llama_cpp=stand_in.parent, target_gguf=target_gguf)
    assert result.drafters[0].schedule == "simple"
    (failure,) = result.failures(max_gap=0.1)
    assert " below the reference runtime's " in failure and "(> --max-gap 10.0%, and significant: 95% CI [" in failure
    assert "on llama-speculative-simple's schedule" in failure and "likely cause: per-layer causality" in failure


def _serving_rows(result) -> list[dict]:  # type: ignore[no-untyped-def]
    return next(s["rows"] for s in json.loads(result.report().to_json())["sections"] if s.get("id") == "serving")


@pytest.mark.parametrize("build", list(BUILDS))
def test_llama_server_rows_agree_prompt_by_prompt_and_pass_the_gap(build: str, ggufs: dict[str, Path],
                                                                   target: HFTarget) -> None:
    binary, _ = _build(build)
    result = run_acceptance(target, [ggufs["drafter"]], TRAINED / "prompts.jsonl", max_new_tokens=N_PREDICT,
                            max_prompts=6, llama_server=binary, target_gguf=ggufs[build], draft_n_max=(None, 4))
    rows = _serving_rows(result)
    assert [r["draft_n_max"] for r in rows] == [15, 4]  # None: the block's n-max, 15
    for row in rows:  # the server's τ against the reference on its schedule, at each n-max: every prompt, exactly
        assert row["refused"] is None and row["tau_per_prompt"] == row["reference_tau_per_prompt"], row
        assert row["tau_verdict"] == VERDICT_AGREES and row["gap_causes"] == []
    assert rows[1]["tau"] < rows[0]["tau"]  # n-max 4 drafts less: its own reference, not the block's
    assert result.failures(max_gap=0.0) == []
    assert "τ reference (server schedule)" in result.report().to_text()


@pytest.mark.parametrize("build", list(BUILDS))
def test_llama_server_rows_carry_the_gap_gate_and_its_cause(build: str, lost_causality: Path) -> None:
    binary, src = _build(build)
    result = run_acceptance(HFTarget(LONG / "target"), [lost_causality], LONG / "prompts.jsonl",
                            max_new_tokens=N_PREDICT, max_prompts=6, llama_server=binary, llama_cpp_src=src)
    (row,) = _serving_rows(result)
    assert row["tau"] > row["reference_tau"] + 1.0 and row["tau_verdict"] == "above reference", row
    assert any("per-layer causality" in c for c in row["gap_causes"])
    (failure,) = result.failures(max_gap=0.1)
    assert failure.startswith("drafter-no-is-causal on ") and "llama-server τ" in failure
    assert " above the reference runtime's " in failure and "(> --max-gap 10.0%, and significant: 95% CI [" in failure
    assert "on llama-server's schedule" in failure and "likely cause: per-layer causality" in failure
    text = result.report().to_text()
    assert "llama-server: τ against the reference" in text and "above reference" in text


def test_a_schedule_is_one_llama_cpp_runs(target: HFTarget) -> None:
    model = load_drafter(TRAINED / "drafter")
    with pytest.raises(UsageError, match="schedule 'vllm': expected one of simple, server"):
        replay_llama_cpp(model, target, [1, 2, 3], schedule="vllm", n_predict=4, n_max=3)  # type: ignore[arg-type]
    with pytest.raises(UsageError, match="holds the last prompt token back"):
        replay_llama_cpp(model, target, [5], schedule="simple", n_predict=4, n_max=3)


@pytest.mark.parametrize("delta, ci, max_gap, side", [
    (-0.49, (-0.84, -0.18), 0.05, "below"),  # the sliding-causal pair's loss: 5.03 % of 9.74, CI excludes 0
    (-0.49, (-0.84, -0.18), 0.06, None),     # the same loss within a 6 % gap
    (-0.60, (-1.30, +0.05), 0.05, None),     # past 5 % but the CI holds 0: not significant
    (+0.60, (+0.20, +1.00), 0.05, "above"),  # two-sided
    (+0.02, (+0.01, +0.03), 0.00, "above"),  # --max-gap 0: any significant difference
    (0.0, (0.0, 0.0), 0.00, None),           # identical prompt by prompt
])
def test_the_gap_gate_is_significance_and_size(delta: float, ci: tuple[float, float], max_gap: float,
                                                side: str | None) -> None:
    from dflashkit.accept.tau_gap import gap_message, gap_side
    from dflashkit.stats import Comparison

    c = Comparison(delta, delta / 9.74, ci, 48)
    assert gap_side(c, 9.74, max_gap) == side
    lines = gap_message("d", "llama.cpp", 9.74 + delta, 9.74, c, max_gap, ["per-layer causality"], "llama-server")
    assert bool(lines) == (side is not None)
    if side == "below" and max_gap == 0.05:
        assert lines == ["d: llama.cpp τ 9.25 is 5.03% below the reference runtime's 9.74 on llama-server's schedule "
                         "(> --max-gap 5.0%, and significant: 95% CI [-0.84, -0.18]); likely cause: per-layer causality"]


@pytest.mark.parametrize("ref,llama,verdict", [
    # 4 of 48 prompts a float tie lower (as Q3_K_L's once in benchmarks/ACCEPTANCE.md): the CI excludes 0, p = 1/8
    ([14.0] * 48, [14.0] * 44 + [12.0] * 4, "agrees"),
    ([14.0] * 48, [14.0] * 40 + [12.0] * 8, "below reference"),   # 8 of 8 lower: p = 2 / 256
    ([14.0] * 48, [14.0] * 40 + [12.0] * 6 + [16.0] * 2, "agrees"),  # 6 lower, 2 higher: p = 0.29
    ([9.0] * 6, [11.0] * 6, "above reference"),                   # every prompt differs: the CI decides
    ([9.0] * 6, [11.0] * 5 + [9.0], "above reference"),           # 5 of 6 differ (the sign test alone: p = 1 / 16)
    ([9.0] * 6, [11.0] * 3 + [9.0] * 3, "agrees"),                # half equal: ties, 3 of 3 is p = 1 / 4
])
def test_a_few_ties_one_way_are_not_a_gap(ref: list[float], llama: list[float], verdict: str) -> None:
    """Where at least half the prompts are equal, the verdict asks the prompts that differ to lean one way beyond
    chance (an exact two-sided sign test at 5 %) besides the bootstrap CI, so a correct file whose few float ties
    happen to fall one way agrees; where most prompts differ, the CI decides."""
    from dflashkit.accept.tau_gap import gap_verdict
    from dflashkit.stats import paired_comparison

    c = paired_comparison(ref, llama)
    if verdict == "agrees" and llama.count(12.0) == 4:
        assert c.significant  # the interval alone would call it a gap
    assert gap_verdict(c) == verdict
