"""Issue 34, the attacker review's cases (a second pass over dflash-accept and dflash-quantize after the first fixes),
each planted here and checked as `test_hostile_round3` checks its cases: exit code, one line, inputs unchanged,
nothing left running or in the temp folder, under the memory cap, and bounded in time where a loop was the defect."""

from __future__ import annotations

import json
import os
import shutil
import socket
import threading
import time
from pathlib import Path

import pytest
from click.testing import CliRunner

from contained import check_contained, run_contained
from test_hostile_round3 import TRAINED, accept_args, pair, stand_in  # noqa: F401  (pair: a fixture)

# slow: every test runs a whole command as a child under hostile input
pytestmark = pytest.mark.slow


def test_the_built_in_prompts_are_an_input_too(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from dflashkit.accept import prompts as prompts_module
    from dflashkit.cli import accept_command

    builtin = tmp_path / "prompts.jsonl"  # a copy stands in for the package's file: a failure must not touch it
    shutil.copyfile(prompts_module.builtin_prompts_path(), builtin)
    before = builtin.read_bytes()
    monkeypatch.setattr(prompts_module, "builtin_prompts_path", lambda: builtin)
    res = CliRunner().invoke(accept_command, [str(TRAINED / "drafter"), "--target", str(TRAINED / "target"),
                                              "--max-prompts", "1", "-q", "--trace", str(builtin), "--force"])
    assert res.exit_code == 2 and f"--trace {builtin}: is also an input" in res.output, res.output
    assert builtin.read_bytes() == before


def test_a_model_card_in_an_input_folder_is_an_input(tmp_path: Path, pair: dict) -> None:  # noqa: F811
    drafter = shutil.copytree(TRAINED / "drafter", tmp_path / "drafter")
    (drafter / "README.md").write_text("---\nlicense: apache-2.0\n---\n# the card\n")
    run = run_contained("accept_command", accept_args(pair, "-o", drafter / "README.md", "--force", drafter=drafter),
                        inputs=[drafter], tmp=tmp_path / "tmp")
    check_contained(run, 2, "README.md: is also an input")


def test_blank_lines_from_llama_cpp_are_parsed_in_linear_time(tmp_path: Path, pair: dict) -> None:  # noqa: F811
    bin_dir = stand_in(tmp_path / "bin", "os.write(2, b'\\n' * 300_000)\nsys.exit(0)")
    run = run_contained("accept_command", accept_args(pair, "--llama-cpp", bin_dir, "--target-gguf",
                                                      pair["target_gguf"], "--max-prompts", "1"),
                        inputs=[pair["target"]], tmp=tmp_path / "tmp", pid_folder=bin_dir)
    check_contained(run, 1, "without printing its n_predict", bounded=True)


def test_counts_of_thousands_of_digits_are_no_counts(tmp_path: Path, pair: dict) -> None:  # noqa: F811
    nines = "9" * 5000
    bin_dir = stand_in(tmp_path / "bin", f"print('n_predict = {nines}\\nn_drafted = 3\\nn_accept = 2', "
                                         "file=sys.stderr)\nsys.exit(0)")
    run = run_contained("accept_command", accept_args(pair, "--llama-cpp", bin_dir, "--target-gguf",
                                                      pair["target_gguf"], "--max-prompts", "1"),
                        inputs=[pair["target"]], tmp=tmp_path / "tmp", pid_folder=bin_dir)
    check_contained(run, 1, "without printing its n_predict", bounded=True)


def test_a_fifo_nobody_writes_is_read_as_empty_at_once(tmp_path: Path, pair: dict) -> None:  # noqa: F811
    fifo = tmp_path / "prompts.jsonl"
    os.mkfifo(fifo)
    run = run_contained("accept_command", accept_args(pair, prompts=fifo), inputs=[pair["target"]],
                        tmp=tmp_path / "tmp")
    check_contained(run, 1, f"{fifo}: no prompts", bounded=True)


@pytest.mark.parametrize("name", ["tokenizer_config.json", "generation_config.json"])
def test_a_target_file_that_is_a_fifo_is_named(tmp_path: Path, pair: dict, name: str) -> None:  # noqa: F811
    target = shutil.copytree(TRAINED / "target", tmp_path / "target")
    (target / name).unlink()
    os.mkfifo(target / name)
    run = run_contained("accept_command", accept_args(pair, target=target), inputs=[pair["prompts"]],
                        tmp=tmp_path / "tmp")
    check_contained(run, 1, f"target {target}: {name} is not a regular file", bounded=True)


@pytest.mark.parametrize("value", ['"abc"', "-1", "99999", "true", "[[498]]"])
def test_an_end_of_sequence_id_that_is_no_token(tmp_path: Path, pair: dict, value: str) -> None:  # noqa: F811
    target = shutil.copytree(TRAINED / "target", tmp_path / "target")
    config = json.loads((target / "generation_config.json").read_text()) \
        if (target / "generation_config.json").exists() else {}
    config["eos_token_id"] = json.loads(value)
    (target / "generation_config.json").write_text(json.dumps(config))
    run = run_contained("accept_command", accept_args(pair, target=target), inputs=[target], tmp=tmp_path / "tmp")
    check_contained(run, 1, "eos_token_id")
    assert "is not a token id of its vocabulary of 768" in run.lines()[0]


@pytest.mark.parametrize("args, message", [
    (["--llama-cpp-timeout", "1e12"], "Error: Invalid value for '--llama-cpp-timeout'"),  # click's
    (["--temperature", "1e-45"], "error: --temperature 1e-45: give 0 (greedy) or at least 1e-06"),
])
def test_extreme_option_values_are_usage_errors(tmp_path: Path, pair: dict, args: list[str],  # noqa: F811
                                                message: str) -> None:
    run = run_contained("accept_command", accept_args(pair, *args), inputs=[pair["prompts"]], tmp=tmp_path / "tmp")
    check_contained(run, 2)
    assert any(line.startswith(message) for line in run.lines()), run.stderr


def test_max_prompts_stops_the_parse_and_the_prompt_count_is_bounded(tmp_path: Path,
                                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    from dflashkit.accept import prompts as prompts_module
    from dflashkit.errors import DFlashError

    f = tmp_path / "p.jsonl"
    f.write_text('{"id": "a", "text": "one"}\nnot json at all\n')
    assert [p.id for p in prompts_module.load_prompts(f, limit=1)] == ["a"]  # line 2 is never parsed
    monkeypatch.setattr(prompts_module, "MAX_PROMPTS", 3)
    many = tmp_path / "many.jsonl"
    many.write_text("".join(json.dumps({"text": "x"}) + "\n" for _ in range(5)))
    with pytest.raises(DFlashError, match=r"many\.jsonl: over 3 prompts — give fewer"):
        prompts_module.load_prompts(many)


def test_the_prompts_tokens_together_are_bounded(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from dflashkit.accept import context as context_module
    from dflashkit.cli import accept_command

    monkeypatch.setattr(context_module, "MAX_PROMPT_TOKENS_TOTAL", 20)
    f = tmp_path / "p.jsonl"
    f.write_text("".join(json.dumps({"id": f"p{i}", "text": "the old king walks to the river"}) + "\n"
                         for i in range(5)))
    res = CliRunner().invoke(accept_command, [str(TRAINED / "drafter"), "--target", str(TRAINED / "target"),
                                              "--prompts", str(f), "--max-new-tokens", "4", "-q"])
    assert res.exit_code == 1 and res.output.startswith("error: prompt p") and \
        "the prompts hold over 20 tokens together" in res.output, res.output


def test_a_server_that_trickles_its_reply_is_timed_out_as_a_whole() -> None:
    from dflashkit.errors import DFlashError
    from dflashkit.llama_cpp.server import _Client

    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(1)
    stop = threading.Event()

    def trickle() -> None:
        conn, _ = listener.accept()
        conn.recv(65536)
        conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: 100000\r\n\r\n")
        while not stop.is_set():
            try:
                conn.sendall(b" ")
            except OSError:
                break
            time.sleep(0.1)
        conn.close()

    t = threading.Thread(target=trickle, daemon=True)
    t.start()
    client = _Client()
    client.url = f"http://127.0.0.1:{listener.getsockname()[1]}"
    start = time.monotonic()
    try:
        with pytest.raises(DFlashError, match=r"did not answer a completion in 1 s"):
            client.complete("hello", 4, timeout=1.0)
    finally:
        stop.set()
        listener.close()
    assert time.monotonic() - start < 30  # each byte came within the per-read timeout: only the whole is bounded
