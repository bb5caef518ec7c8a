"""dflash-accept: prompts, statistics, the report, the trace format and the CLI on a tiny target/drafter pair."""

from __future__ import annotations

import json
import math
import sys
from pathlib import Path
from typing import Any

import pytest
import torch
from click.testing import CliRunner

from dflashkit.accept import (
    AcceptResult,
    DrafterRun,
    Prompt,
    load_prompts,
    paired_bootstrap_ci,
    run_acceptance,
)
from dflashkit.cli import accept_command
from dflashkit.converters.convert import convert
from dflashkit.errors import DFlashError, UsageError
from dflashkit.runtime import HFTarget, LoadInfo
from dflashkit.runtime.speculative import SpeculativeResult

TRACE_KEYS = {"drafter", "prompt_ids", "output_ids", "accepted", "temperature"}
# extensions beyond docs/formats.md (issue 14): the chat-template settings every prompt was rendered with
TRACE_EXTRA_KEYS = {"reasoning", "chat_template_kwargs"}


pytestmark = pytest.mark.usefixtures("one_torch_thread")


@pytest.fixture(scope="module")
def pair(drafters: dict[str, Path], targets: dict, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """The tiny 64-wide target, its qwen3-b16 drafter (HF, bf16) and that drafter as a Q8_0 GGUF."""
    out = tmp_path_factory.mktemp("accept") / "qwen3-b16-q8_0.gguf"
    convert(drafters["qwen3-b16"], out, outtype="q8_0", target=targets[64]["gguf"], progress=False, warn=lambda m: None)
    return {"target": targets[64]["hf"], "hf": str(drafters["qwen3-b16"]), "q8": str(out),
            "dflash2": str(drafters["dflash2"]), "runner": HFTarget(targets[64]["hf"])}


def _write(path: Path, lines: list[Any]) -> Path:
    path.write_text("".join((line if isinstance(line, str) else json.dumps(line)) + "\n" for line in lines))
    return path


# ---------------------------------------------------------------------------------------------
# Prompts
# ---------------------------------------------------------------------------------------------


def test_builtin_prompts_mix_chat_code_math_and_long_context() -> None:
    prompts = load_prompts()
    assert len(prompts) >= 16
    assert {p.category for p in prompts} == {"chat", "code", "math", "long-context"}
    long = [p for p in prompts if p.category == "long-context"]
    assert len(long) == 4 and all(len(p.messages[-1][1]) > 900 for p in long)  # a passage, then the question
    assert len({p.id for p in prompts}) == len(prompts)
    assert all(p.messages and p.messages[-1][0] == "user" for p in prompts)


def test_prompt_forms(tmp_path: Path) -> None:
    f = _write(tmp_path / "p.jsonl", [
        {"id": "a", "category": "chat", "messages": [{"role": "user", "content": "Hi"}]},
        {"prompt": "Hello"},
        '"bare string"',
        "",
        {"text": "raw text"},
    ])
    a, b, c, d = load_prompts(f)
    assert a == Prompt("a", "chat", messages=(("user", "Hi"),))
    assert b.messages == (("user", "Hello"),) and b.id == "p:2"
    assert c.messages == (("user", "bare string"),)
    assert d.text == "raw text" and d.messages is None and d.id == "p:5"


@pytest.mark.parametrize("line, message", [
    ("{not json", r"p\.jsonl:1: not valid JSON"),
    ('{"messages": [], "id": "x"}', "non-empty list"),
    ('{"messages": [{"role": "user"}]}', r"messages\[0\] needs string 'role' and 'content'"),
    ('{"text": "a", "prompt": "b"}', "exactly one of messages / prompt / text"),
    ('{"content": "a"}', "exactly one of"),
    ("[1, 2]", "got a JSON list"),
    ('{"text": ""}', "non-empty string"),
])
def test_bad_prompt_lines_name_the_file_and_line(tmp_path: Path, line: str, message: str) -> None:
    with pytest.raises(DFlashError, match=message):
        load_prompts(_write(tmp_path / "p.jsonl", [line]))


def test_missing_or_empty_prompts_file(tmp_path: Path) -> None:
    with pytest.raises(DFlashError, match="no such prompts file"):
        load_prompts(tmp_path / "nope.jsonl")
    with pytest.raises(DFlashError, match="no prompts"):
        load_prompts(_write(tmp_path / "e.jsonl", ["", "  "]))


def test_chat_prompts_use_the_template_and_raw_text_does_not(pair: dict[str, Any]) -> None:
    runner: HFTarget = pair["runner"]
    chat, fallback = Prompt("c", messages=(("user", "Hello there"),)).ids(runner)
    assert not fallback and chat == runner.encode("Hello there")  # same rendering as the runtime's
    raw, _ = Prompt("r", text="Hello there").ids(runner)
    assert raw == runner.tokenizer.encode("Hello there") and len(raw) < len(chat)
    template = runner.tokenizer.chat_template
    try:
        runner.tokenizer.chat_template = None  # a base model: contents go in as plain text
        assert Prompt("c", messages=(("user", "Hello there"),)).ids(runner) == (raw, True)
    finally:
        runner.tokenizer.chat_template = template


# ---------------------------------------------------------------------------------------------
# Statistics (on hand-made runs: exact numbers)
# ---------------------------------------------------------------------------------------------


def test_paired_bootstrap_ci() -> None:
    assert paired_bootstrap_ci([0.4]) is None
    assert paired_bootstrap_ci([0.5, 0.5, 0.5]) == (0.5, 0.5)
    lo, hi = paired_bootstrap_ci([-1.0, -0.5, -0.8, -1.2, -0.6], seed=3)
    assert -1.2 <= lo < -0.82 < hi <= -0.5
    assert paired_bootstrap_ci([-1.0, -0.5, -0.8], seed=3) == paired_bootstrap_ci([-1.0, -0.5, -0.8], seed=3)


def _run(accepted: list[int], drafted: list[int] | None = None) -> SpeculativeResult:
    n = 1 + sum(a + 1 for a in accepted)
    return SpeculativeResult([1, 2], list(range(n)), accepted, drafted or [3] * len(accepted), 0.0, 0.1, 1.0, False, 4)


def _drafter(path: str, runs: list[SpeculativeResult]) -> DrafterRun:
    info = LoadInfo(path, "gguf", "llama.cpp", "DFlashDraftModel", {"Q8_0": 10, "F32": 4}, "dense float32", "cpu",
                    "float32")
    return DrafterRun(path, info, 4, runs)


def _result(*drafters: DrafterRun, n_prompts: int = 3) -> AcceptResult:
    prompts = [Prompt(f"p{i}", "chat", messages=(("user", "x"),)) for i in range(n_prompts)]
    return AcceptResult("t/hf", prompts, "given", [[1, 2]] * n_prompts, list(drafters), 32, 0.0, 0, "cpu", "float32",
                        [9])


def test_tau_histogram_and_position_rates() -> None:
    d = _drafter("a.gguf", [_run([3, 1, 0]), _run([2, 2], [3, 2])])
    assert d.taus == [(4 + 2 + 1) / 3, 3.0]
    assert d.tau == pytest.approx((7 / 3 + 3) / 2)
    assert d.tau_pooled == pytest.approx(13 / 5)
    assert d.histogram() == [0.2, 0.2, 0.4, 0.2]
    # position 3 was drafted in 4 rounds (the last round drafted 2 only), accepted in one
    assert d.position_rates() == [4 / 5, 3 / 5, 1 / 4]


def test_comparison_with_the_first_drafter_and_the_max_drop_gate() -> None:
    first = _drafter("bf16", [_run([3, 3]), _run([2, 3]), _run([3, 2])])
    worse = _drafter("q4.gguf", [_run([1, 1]), _run([0, 1]), _run([1, 0])])
    result = _result(first, worse)
    comp = result.comparisons()[1]
    assert comp is not None and comp.n_prompts == 3
    assert comp.delta == pytest.approx(-2.0)
    assert comp.relative == pytest.approx(-2.0 / first.tau)
    assert comp.ci is not None and comp.ci[1] < 0 and comp.significant
    assert result.exit_code() == 0 and result.exit_code(max_drop=0.6) == 0
    assert result.exit_code(max_drop=0.05) == 1
    report = result.report(max_drop=0.05)
    assert report.level == "error" and "q4.gguf: τ" in report.status and "--max-drop" in report.status
    assert report.section("drafters").flagged == {1}
    assert result.report().level == "warning"  # significantly lower, no gate


def test_prompts_without_a_round_are_left_out_of_tau_and_reported() -> None:
    first = _drafter("a", [_run([1]), _run([])])
    second = _drafter("b", [_run([0]), _run([])])
    result = _result(first, second, n_prompts=2)
    assert first.tau == 2.0 and math.isnan(first.taus[1])
    comp = result.comparisons()[1]
    assert comp is not None and comp.n_prompts == 1 and comp.ci is None
    warnings = result.report().section("warnings").items  # type: ignore[union-attr]
    assert any("no round on prompt(s) p1" in w for w in warnings)


def test_greedy_outputs_that_differ_between_drafters_are_reported() -> None:
    first = _drafter("a", [_run([1, 1])])
    second = _drafter("b", [_run([1, 1])])
    second.runs[0].output_ids[3] = 99
    warnings = _result(first, second, n_prompts=1).divergences()
    assert len(warnings) == 1 and "at generated token 3" in warnings[0]


# ---------------------------------------------------------------------------------------------
# A real run on the tiny pair
# ---------------------------------------------------------------------------------------------


def test_run_acceptance_on_a_tiny_pair(pair: dict[str, Any], tmp_path: Path) -> None:
    runner: HFTarget = pair["runner"]
    prompts = load_prompts()[:2]
    result = run_acceptance(runner, [pair["hf"], pair["q8"]], prompts, max_new_tokens=10, warmup=False)
    assert [d.path for d in result.drafters] == [pair["hf"], pair["q8"]]
    # temperature 0: every drafter reproduces the target's greedy output exactly
    for i, ids in enumerate(result.prompt_ids):
        with torch.inference_mode():
            greedy = runner.model.generate(torch.tensor([ids]), max_new_tokens=10, do_sample=False)[0, len(ids):]
        assert result.drafters[0].runs[i].output_ids == greedy.tolist() == result.drafters[1].runs[i].output_ids
    assert result.divergences() == []

    trace = result.write_trace(tmp_path / "trace.jsonl")
    lines = [json.loads(line) for line in trace.read_text().splitlines()]
    assert len(lines) == 4 and all(set(line) == TRACE_KEYS | TRACE_EXTRA_KEYS for line in lines)
    assert all(line["reasoning"] is None and line["chat_template_kwargs"] == {} for line in lines)
    assert [line["drafter"] for line in lines] == [pair["hf"]] * 2 + [pair["q8"]] * 2
    for line, ids in zip(lines, result.prompt_ids * 2):
        assert line["prompt_ids"] == ids and line["temperature"] == 0.0
        assert len(line["output_ids"]) == 1 + sum(a + 1 for a in line["accepted"])
        assert all(isinstance(a, int) and a >= 0 for a in line["accepted"])

    report = result.report()
    for fmt in ("text", "markdown", "html"):
        assert "τ" in report.render(fmt)
    data = json.loads(report.to_json())
    assert data["summary"]["prompt_count"] == 2
    rows = data["sections"][0]["rows"]
    assert rows[1]["drafter"] == pair["q8"] and "Q8_0" in rows[1]["form"]
    assert "bootstrap" in data["summary"]["ci_method"]
    assert "this runtime" in report.to_text()


# ---------------------------------------------------------------------------------------------
# CLI
# ---------------------------------------------------------------------------------------------


def test_cli_run_with_trace_plot_and_json(pair: dict[str, Any], tmp_path: Path) -> None:
    prompts = _write(tmp_path / "p.jsonl", [{"id": "hi", "prompt": "Say hi."}, {"id": "raw", "text": "def f(x):"}])
    trace, plot = tmp_path / "t.jsonl", tmp_path / "tau.html"
    args = ["--target", str(pair["target"]), pair["hf"], pair["q8"], "--prompts", str(prompts),
            "--max-new-tokens", "6", "--trace", str(trace), "--plot", str(plot), "--json", "-q"]
    res = CliRunner().invoke(accept_command, args)
    assert res.exit_code == 0, res.output
    data = json.loads(res.stdout)
    assert data["title"].startswith("dflash-accept") and data["summary"]["prompt_count"] == 2
    assert len(trace.read_text().splitlines()) == 4
    assert plot.read_text().startswith("<!DOCTYPE html>") and "<svg" in plot.read_text()
    # outputs are never overwritten without --force, and that is found before the run
    again = CliRunner().invoke(accept_command, args)
    assert again.exit_code == 1 and "already exists — pass --force" in again.stderr
    assert len(again.stderr.strip().splitlines()) == 1


def test_cli_max_drop_gate_exits_1(pair: dict[str, Any]) -> None:
    """Sampled at T=1 the random qwen3-b16 drafter is often accepted, the DFlash 2 one (top-4 only) hardly ever."""
    args = ["--target", str(pair["target"]), pair["hf"], pair["dflash2"], "--max-prompts", "2",
            "--max-new-tokens", "12", "--temperature", "1", "--max-drop", "5%", "--markdown", "-q"]
    res = CliRunner().invoke(accept_command, args)
    assert res.exit_code == 1, res.output
    assert res.stdout.startswith("## dflash-accept") and "--max-drop 5.0%" in res.stderr


@pytest.mark.parametrize("extra, code, message", [
    (["--plot", "x.svg"], 2, "give a .html or .png file"),
    (["--max-drop", "abc"], 2, "--max-drop: expected a fraction"),
    (["--prompts", "/nonexistent/p.jsonl"], 1, "no such prompts file"),
    (["--trace", "/nonexistent/dir/t.jsonl"], 1, "does not exist"),
])
def test_cli_errors_are_one_line(pair: dict[str, Any], extra: list[str], code: int, message: str) -> None:
    res = CliRunner().invoke(accept_command, ["--target", str(pair["target"]), pair["hf"], "-q", *extra])
    assert res.exit_code == code, res.output
    assert message in res.stderr and len(res.stderr.strip().splitlines()) == 1


def test_cli_png_plot_without_matplotlib_is_a_usage_error(pair: dict[str, Any], tmp_path: Path,
                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # import fails as if not installed
    res = CliRunner().invoke(accept_command, ["--target", str(pair["target"]), pair["hf"], "--plot",
                                              str(tmp_path / "tau.png"), "-q"])
    assert res.exit_code == 2 and "needs matplotlib" in res.stderr and not (tmp_path / "tau.png").exists()


def test_cli_gguf_target_is_a_usage_error(pair: dict[str, Any], targets: dict) -> None:
    res = CliRunner().invoke(accept_command, ["--target", str(targets[64]["gguf"]), pair["hf"], "-q"])
    assert res.exit_code == 2 and "needs the target's HF model directory" in res.stderr


def test_library_usage_errors(pair: dict[str, Any]) -> None:
    with pytest.raises(UsageError, match="at least one drafter"):
        run_acceptance(pair["runner"], [])
    with pytest.raises(UsageError, match="at least 2"):
        run_acceptance(pair["runner"], [pair["hf"]], max_new_tokens=1)
