"""dflash-accept's prompts and chat templates as an attacker or a careless user writes them: bounded reads, one-line
errors, valid input accepted (issue 34's prompt and template classes; each test plants its own case)."""

from __future__ import annotations

import json
import shutil
import time
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from dflashkit.accept import prompts as prompts_module
from dflashkit.cli import accept_command
from dflashkit.errors import DFlashError, UsageError
from dflashkit.accept.prompts import load_prompts, parse_template_kwargs, reasoning_template_kwargs, render_bounded

ROOT = Path(__file__).resolve().parents[1]
TRAINED = ROOT / "fixtures" / "trained"


def test_a_json_string_may_hold_line_separators(tmp_path: Path) -> None:
    f = tmp_path / "p.jsonl"
    f.write_text(json.dumps({"id": "a", "text": "one\u2028two\x85three"}, ensure_ascii=False) + "\r\n"
                 + json.dumps({"id": "b", "text": "four"}) + "\n", encoding="utf-8")
    got = load_prompts(f)
    assert [(p.id, p.text) for p in got] == [("a", "one\u2028two\x85three"), ("b", "four")]


def test_duplicate_ids_are_an_error(tmp_path: Path) -> None:
    f = tmp_path / "p.jsonl"
    f.write_text("\n".join(json.dumps({"id": "q", "text": t}) for t in ("x", "y", "z")) + "\n")
    with pytest.raises(DFlashError) as err:
        load_prompts(f)
    assert str(err.value) == f"{f}:2: prompt id 'q' is also the id of line 1 — give each prompt its own id"


def test_prompts_are_read_bounded(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(prompts_module, "MAX_PROMPTS_FILE_BYTES", 1000)
    monkeypatch.setattr(prompts_module, "MAX_PROMPT_LINE_BYTES", 100)
    big = tmp_path / "big.jsonl"
    big.write_text(json.dumps({"text": "w " * 600}) + "\n")
    with pytest.raises(DFlashError, match=r"big\.jsonl: the prompts file is over 0 MiB"):
        load_prompts(big)
    long_line = tmp_path / "line.jsonl"
    long_line.write_text(json.dumps({"text": "ok"}) + "\n" + json.dumps({"text": "w " * 100}) + "\n")
    with pytest.raises(DFlashError, match=r"line\.jsonl:2: a prompt line over 0 KiB"):
        load_prompts(long_line)
    start = time.monotonic()
    with pytest.raises(DFlashError, match="the prompts file is over"):
        load_prompts("/dev/zero")  # endless: read up to the bound, never to the end
    assert time.monotonic() - start < 30


def test_a_lone_surrogate_is_named(tmp_path: Path) -> None:
    f = tmp_path / "p.jsonl"
    f.write_text('{"id": "s", "messages": [{"role": "user", "content": "bad \\ud800 escape"}]}\n')
    with pytest.raises(DFlashError) as err:
        load_prompts(f)
    assert str(err.value).startswith(f"{f}:1: a string holds a lone surrogate")


def test_reasoning_switch_ignores_case() -> None:
    template = "{% if enable_thinking %}think{% endif %}"
    assert reasoning_template_kwargs("ON", template) == {"enable_thinking": True}
    assert reasoning_template_kwargs(" Off ", template) == {"enable_thinking": False}


@pytest.mark.parametrize("key", ["add_generation_prompt", "tokenize", "conversation", "tools", "documents",
                                 "continue_final_message", "chat_template"])
def test_a_kwarg_of_the_template_call_itself_is_a_usage_error(key: str) -> None:
    with pytest.raises(UsageError) as err:
        parse_template_kwargs(json.dumps({key: 5}))
    assert str(err.value).startswith(f"--chat-template-kwargs: {key!r} is an argument of the chat-template call")


def test_a_template_is_rendered_under_a_time_limit() -> None:
    def endless() -> str:
        while True:
            pass

    start = time.monotonic()
    with pytest.raises(DFlashError, match=r"^prompt p: the template did not finish rendering in 0\.5 s"):
        render_bounded(endless, "prompt p: the template", timeout=0.5)
    assert time.monotonic() - start < 10


def _target_with(tmp_path: Path, template: str) -> Path:
    target = shutil.copytree(TRAINED / "target", tmp_path / "target")
    config = json.loads((target / "tokenizer_config.json").read_text())
    config["chat_template"] = template
    (target / "tokenizer_config.json").write_text(json.dumps(config))
    return target


def _accept_one(tmp_path: Path, target: Path, prompt: dict[str, str]) -> Any:
    """dflash-accept of the trained drafter on one prompt against ``target``: the CLI's result."""
    prompts = tmp_path / "p.jsonl"
    prompts.write_text(json.dumps(prompt) + "\n")
    return CliRunner().invoke(accept_command, [str(TRAINED / "drafter"), "--target", str(target), "--prompts",
                                               str(prompts), "--max-new-tokens", "4", "-q"])


@pytest.mark.parametrize("template, message", [
    ("{{ raise_exception('no system role here') }}", "failed: TemplateError: no system role here"),
    ("{{ ''.__class__.__mro__ }}", "failed: SecurityError"),
    ("{% for m in messages %}{{ m.content | nosuchfilter }}{% endfor %}", "failed: TemplateAssertionError"),
])
def test_a_failing_template_is_one_line_naming_it(tmp_path: Path, template: str, message: str) -> None:
    target = _target_with(tmp_path, template)
    res = _accept_one(tmp_path, target, {"id": "chat-1", "prompt": "hello"})
    assert res.exit_code == 1, res.output
    line = res.output.strip()
    assert line.startswith(f"error: prompt chat-1: the chat template of {target} ") and message in line, line
    assert len(line.splitlines()) == 1 and "Traceback" not in line


def test_a_prompt_longer_than_the_context_is_refused(tmp_path: Path) -> None:
    target = shutil.copytree(TRAINED / "target", tmp_path / "target")
    config = json.loads((target / "config.json").read_text())
    config["max_position_embeddings"] = 64
    (target / "config.json").write_text(json.dumps(config))
    prompts = tmp_path / "p.jsonl"
    prompts.write_text(json.dumps({"id": "long", "text": "the old king walks to the river " * 12}) + "\n")
    res = CliRunner().invoke(accept_command, [str(TRAINED / "drafter"), "--target", str(target), "--prompts",
                                              str(prompts), "--max-new-tokens", "16", "-q"])
    assert res.exit_code == 1, res.output
    assert res.output.startswith("error: prompt long: ") and res.output.strip().endswith(
        "new tokens exceed the target's context of 64 (max_position_embeddings) — shorten the prompt or lower "
        "--max-new-tokens")


def test_drafters_of_one_file_name_are_told_apart(tmp_path: Path) -> None:
    from dflashkit.accept import run_acceptance
    from dflashkit.converters.convert import convert

    paths = []
    for folder in ("good", "bad"):
        (tmp_path / folder).mkdir()
        paths.append(convert(TRAINED / "drafter", tmp_path / folder / "drafter.gguf", outtype="bf16",
                             target=TRAINED / "target", progress=False, warn=lambda m: None).out)
    result = run_acceptance(TRAINED / "target", paths, TRAINED / "prompts.jsonl", max_new_tokens=8, max_prompts=2)
    assert [d.name for d in result.drafters] == ["good/drafter.gguf", "bad/drafter.gguf"]
    report = result.report().to_text()
    assert "good/drafter.gguf" in report and "bad/drafter.gguf" in report


@pytest.mark.parametrize("pattern, problem", [
    ("^(.*.*)*!x", "a quantifier nested in a quantified group"),
    ("(blk\\.\\d+)+ffn", "a quantifier nested in a quantified group"),
    ("(ffn)\\1", "a back-reference"),
    ("a" * 300, "a pattern over 256 characters"),
    ("(ffn|ffn_)*down", "an alternation inside a quantified group"),
    (".*a.*b.*c.*d", "more than three open-ended quantifiers"),
    ("(.*)(.*)(.*)(.*)!", "more than three open-ended quantifiers"),  # each in its own group: as steep
    ("(.?){30}!", "a quantifier nested in a quantified group"),  # an optional item repeated: 2^30 ways
])
def test_a_tensor_type_pattern_that_backtracks_is_refused(tmp_path: Path, pattern: str, problem: str) -> None:
    from dflashkit.cli import quantize_command
    from dflashkit.converters.convert import convert

    src = convert(TRAINED / "drafter", tmp_path / "in.gguf", outtype="f32", target=TRAINED / "target",
                  progress=False, warn=lambda m: None).out
    before = src.read_bytes()
    start = time.monotonic()
    res = CliRunner().invoke(quantize_command, [str(src), str(tmp_path / "out.gguf"), "Q4_K_M", "--tensor-type",
                                                f"{pattern}=q8_0"])
    assert res.exit_code == 2, res.output
    assert res.output.startswith(f"error: --tensor-type '{pattern}=q8_0': {problem} — a pattern that can backtrack")
    assert time.monotonic() - start < 30 and src.read_bytes() == before and not (tmp_path / "out.gguf").exists()


def test_a_tokenizer_id_outside_the_vocabulary_is_named(tmp_path: Path) -> None:
    target = shutil.copytree(TRAINED / "target", tmp_path / "target")
    tok = json.loads((target / "tokenizer.json").read_text())
    tok["post_processor"] = {"type": "TemplateProcessing", "single": [{"SpecialToken": {"id": "<big>", "type_id": 0}},
                                                                       {"Sequence": {"id": "A", "type_id": 0}}],
                             "pair": [{"Sequence": {"id": "A", "type_id": 0}}],
                             "special_tokens": {"<big>": {"id": "<big>", "ids": [5_000_000], "tokens": ["<big>"]}}}
    (target / "tokenizer.json").write_text(json.dumps(tok))
    res = _accept_one(tmp_path, target, {"id": "raw", "text": "the old king"})
    assert res.exit_code == 1, res.output
    assert res.output.startswith(f"error: prompt raw: the tokenizer of {target} gives token id 5000000, outside the "
                                 "model's vocabulary of"), res.output


@pytest.mark.parametrize("template", [5, ["x"], [{"name": "default", "template": 7}]])
def test_a_template_that_is_no_text_is_one_line(tmp_path: Path, template: object) -> None:
    target = _target_with(tmp_path, template)  # type: ignore[arg-type]
    res = _accept_one(tmp_path, target, {"id": "c", "prompt": "hi"})
    assert res.exit_code == 1, res.output
    line = res.output.strip()
    assert len(line.splitlines()) == 1 and "internal error" not in line and "Traceback" not in line
    assert line.startswith((f"error: target {target}: its tokenizer does not load (",
                            f"error: prompt c: the chat template of {target} failed: ")), line
