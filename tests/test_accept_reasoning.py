"""dflash-accept --reasoning / --chat-template-kwargs: mapped to the chat template as z-lab's
`dflash benchmark --reasoning` maps it, recorded in the report and in every trace line."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from dflashkit.accept import Prompt, parse_template_kwargs, reasoning_template_kwargs, run_acceptance
from dflashkit.cli import accept_command
from dflashkit.errors import UsageError
from dflashkit.runtime import HFTarget

# A Qwen3-style template that branches on enable_thinking (Qwen3's empty think block when off) and on
# reasoning_effort (gpt-oss style), written for this test.
THINKING_TEMPLATE = (
    "{%- for message in messages %}"
    "{{- '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n' }}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}"
    "{%- if reasoning_effort is defined %}{{- 'Reasoning: ' + reasoning_effort + '\\n' }}{%- endif %}"
    "{%- if enable_thinking is defined and enable_thinking is false %}{{- '<think>\\n\\n</think>\\n\\n' }}{%- endif %}"
    "{%- endif %}"
)
HEAD = "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n"


pytestmark = pytest.mark.usefixtures("one_torch_thread")


@pytest.fixture(scope="module")
def thinking_target(targets: dict, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The 64-wide fixture target with THINKING_TEMPLATE as its chat template."""
    out = tmp_path_factory.mktemp("thinking") / "target"
    shutil.copytree(targets[64]["hf"], out)
    cfg_path = out / "tokenizer_config.json"
    cfg = json.loads(cfg_path.read_text())
    cfg["chat_template"] = THINKING_TEMPLATE
    cfg_path.write_text(json.dumps(cfg))
    return out


@pytest.fixture(scope="module")
def runner(thinking_target: Path) -> HFTarget:
    return HFTarget(thinking_target)


def _encode(runner: HFTarget, text: str) -> list[int]:
    return list(runner.tokenizer.encode(text, add_special_tokens=False))


def test_reasoning_maps_as_zlab_benchmark() -> None:
    with_both = "{% if enable_thinking %}{% endif %}{{ reasoning_effort }}"
    assert reasoning_template_kwargs(None, with_both) == {}
    assert reasoning_template_kwargs("on", with_both) == {"enable_thinking": True}
    assert reasoning_template_kwargs("off", with_both) == {"enable_thinking": False}
    assert reasoning_template_kwargs("high", with_both) == {"reasoning_effort": "high"}
    # reasoning_strength wins when the template mentions both (z-lab checks it first)
    assert reasoning_template_kwargs("low", "{{ reasoning_strength }}{{ reasoning_effort }}") == {"reasoning_strength": "low"}
    with pytest.raises(UsageError, match="^--reasoning on: the target's chat template has no enable_thinking switch"):
        reasoning_template_kwargs("on", "{{ reasoning_effort }}")
    with pytest.raises(UsageError, match="^--reasoning high: the target's chat template takes no reasoning level"):
        reasoning_template_kwargs("high", "{% if enable_thinking %}{% endif %}")
    with pytest.raises(UsageError, match="no enable_thinking switch"):
        reasoning_template_kwargs("off", None)  # a base model: no template at all


def test_parse_template_kwargs() -> None:
    assert parse_template_kwargs(None) == {}
    assert parse_template_kwargs('{"enable_thinking": false, "x": 1}') == {"enable_thinking": False, "x": 1}
    with pytest.raises(UsageError, match=r"^--chat-template-kwargs: not valid JSON \("):
        parse_template_kwargs("{enable_thinking: false}")
    with pytest.raises(UsageError, match="^--chat-template-kwargs: expected a JSON object, got a JSON list$"):
        parse_template_kwargs("[1]")


def test_prompt_ids_follow_the_template(runner: HFTarget) -> None:
    prompt = Prompt("p", messages=(("user", "Hi"),))
    default, _ = prompt.ids(runner)
    off, _ = prompt.ids(runner, {"enable_thinking": False})
    on, _ = prompt.ids(runner, {"enable_thinking": True})
    high, _ = prompt.ids(runner, {"reasoning_effort": "high"})
    assert default == on == _encode(runner, HEAD)
    assert off == _encode(runner, HEAD + "<think>\n\n</think>\n\n")
    assert high == _encode(runner, HEAD + "Reasoning: high\n")
    assert len({tuple(default), tuple(off), tuple(high)}) == 3


@pytest.mark.parametrize("reasoning, kwargs, suffix, recorded", [
    ("off", None, "<think>\n\n</think>\n\n", {"enable_thinking": False}),
    ("on", None, "", {"enable_thinking": True}),
    ("high", None, "Reasoning: high\n", {"reasoning_effort": "high"}),
    # the JSON is merged over --reasoning: its enable_thinking wins
    ("on", '{"enable_thinking": false, "reasoning_effort": "low"}', "Reasoning: low\n<think>\n\n</think>\n\n",
     {"enable_thinking": False, "reasoning_effort": "low"}),
    (None, {"reasoning_effort": "medium"}, "Reasoning: medium\n", {"reasoning_effort": "medium"}),
])
def test_run_acceptance_records_reasoning(runner: HFTarget, drafters: dict[str, Path], reasoning: str | None,
                                          kwargs: Any, suffix: str, recorded: dict[str, Any]) -> None:
    r = run_acceptance(runner, [drafters["qwen3-b16"]], [Prompt("p", messages=(("user", "Hi"),))],
                       max_new_tokens=3, warmup=False, reasoning=reasoning, chat_template_kwargs=kwargs)
    assert r.prompt_ids == [_encode(runner, HEAD + suffix)]
    assert r.reasoning == reasoning and r.chat_template_kwargs == recorded
    for line in r.trace_lines():
        assert line["reasoning"] == reasoning and line["chat_template_kwargs"] == recorded
        assert line["prompt_ids"] == r.prompt_ids[0]  # the existing fields are unchanged
    summary = json.loads(r.report().to_json())["summary"]
    assert summary["reasoning"] == (reasoning if reasoning is not None else "not set (the template's default)")
    assert json.loads(summary["chat_template_kwargs"]) == recorded
    assert summary["verification"].startswith("chain verify")


def test_cli_reasoning_and_kwargs_reach_report_and_trace(thinking_target: Path, drafters: dict[str, Path],
                                                          tmp_path: Path) -> None:
    trace = tmp_path / "t.jsonl"
    prompts = tmp_path / "p.jsonl"
    prompts.write_text(json.dumps({"id": "hi", "prompt": "Hi"}) + "\n")
    res = CliRunner().invoke(accept_command, [
        "--target", str(thinking_target), str(drafters["qwen3-b16"]), "--prompts", str(prompts),
        "--max-new-tokens", "3", "--reasoning", "off", "--chat-template-kwargs", '{"reasoning_effort": "low"}',
        "--trace", str(trace), "--json", "-q"])
    assert res.exit_code == 0, res.output
    data = json.loads(res.stdout)
    assert data["summary"]["reasoning"] == "off"
    assert json.loads(data["summary"]["chat_template_kwargs"]) == {"enable_thinking": False, "reasoning_effort": "low"}
    assert data["sections"][0]["rows"][0]["family"] == "z-lab DFlash"
    (line,) = [json.loads(x) for x in trace.read_text().splitlines()]
    assert line["reasoning"] == "off"
    assert line["chat_template_kwargs"] == {"enable_thinking": False, "reasoning_effort": "low"}
    assert {"drafter", "prompt_ids", "output_ids", "accepted", "temperature"} <= set(line)


@pytest.mark.parametrize("extra, message", [
    (["--chat-template-kwargs", "{bad"], "--chat-template-kwargs: not valid JSON"),
    (["--chat-template-kwargs", '"text"'], "--chat-template-kwargs: expected a JSON object, got a JSON str"),
    (["--reasoning", "high"], "--reasoning high: the target's chat template takes no reasoning level"),
])
def test_cli_usage_errors(targets: dict, drafters: dict[str, Path], extra: list[str], message: str) -> None:
    """The stock fixture template has neither switch: --reasoning is refused; bad JSON before any loading."""
    res = CliRunner().invoke(accept_command, ["--target", str(targets[64]["hf"]), str(drafters["qwen3-b16"]),
                                              "--max-new-tokens", "2", "-q", *extra])
    assert res.exit_code == 2, res.output
    assert message in res.stderr and len(res.stderr.strip().splitlines()) == 1
