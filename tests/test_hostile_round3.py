"""Issue 34's Done-when, one test per hostile class, each case planted here: dflash-accept and dflash-quantize run
as a user runs them (a child process, `contained.run_contained`), and every run is checked the same way
(`contained.check_contained`): its exit code, one message line, its inputs' bytes unchanged, no process of its own
left (by PID), nothing left in its temp folder, under the 2 GB cap, and — for the bounded loops — an end within a
generous bound from the start.

The llama.cpp programs are stand-ins (scripts in a bin folder) that misbehave on purpose: sleep forever, fork and
leave a grandchild, print gigabytes. Each writes its PID to ``<name>.pid`` so the check can look it up.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import sys
from pathlib import Path

import pytest

from contained import check_contained, run_contained
from test_accept_prompts_hostile import _target_with as target_with_template

# slow: every test runs a whole command as a child under hostile input
pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[1]
TRAINED = ROOT / "fixtures" / "trained"


@pytest.fixture(scope="module")
def pair(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """The trained pair as inputs a test may point outputs at: the drafter, its bf16 GGUF, a target GGUF stand-in,
    the target and a prompts file (copies: a failed test must not touch the repository's fixtures)."""
    from dflashkit.converters.convert import convert

    folder = tmp_path_factory.mktemp("pair")
    target = shutil.copytree(TRAINED / "target", folder / "target")
    gguf = folder / "drafter-bf16.gguf"
    convert(TRAINED / "drafter", gguf, outtype="bf16", target=target, progress=False, warn=lambda m: None)
    target_gguf = folder / "target.gguf"  # a GGUF with the target's metadata and no tensors: a stand-in reads it
    import gguf as gguf_py

    w = gguf_py.GGUFWriter(str(target_gguf), "qwen3")
    config = json.loads((target / "config.json").read_text())
    w.add_context_length(4096)
    w.add_embedding_length(config["hidden_size"])
    w.add_block_count(config["num_hidden_layers"])
    w.add_vocab_size(config["vocab_size"])
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    prompts = folder / "prompts.jsonl"
    prompts.write_text("".join(json.dumps({"id": f"p{i}", "text": t}) + "\n"
                               for i, t in enumerate(["the king walks to the river", "one two three four"])))
    return {"drafter": TRAINED / "drafter", "gguf": gguf, "target": target, "target_gguf": target_gguf,
            "prompts": prompts}


def stand_in(folder: Path, body: str, name: str = "llama-speculative-simple") -> Path:
    """A llama.cpp program that runs ``body`` (Python) after writing its PID to ``folder/<name>.pid``."""
    folder.mkdir(exist_ok=True)
    script = folder / name
    script.write_text(f"#!{sys.executable}\nimport os, subprocess, sys, time\nfrom pathlib import Path\n"
                      f"Path({str(folder / (name + '.pid'))!r}).write_text(str(os.getpid()))\n{body}\n")
    script.chmod(0o755)
    return folder


def accept_args(pair: dict[str, Path], *extra: object, prompts: Path | None = None, target: Path | None = None,
                drafter: Path | None = None) -> list[str]:
    return [str(drafter or pair["drafter"]), "--target", str(target or pair["target"]), "--prompts",
            str(prompts or pair["prompts"]), "--max-new-tokens", "8", "-q", *map(str, extra)]


def chat_prompts(tmp_path: Path, *ids: str) -> Path:
    f = tmp_path / "chat.jsonl"
    f.write_text("".join(json.dumps({"id": i, "prompt": "hello there"}) + "\n" for i in ids))
    return f


# --- 1. data loss: an output that is an input ---------------------------------------------------------------


@pytest.mark.parametrize("case", ["trace-through-a-link-to-the-prompts", "report-onto-a-file-of-the-target-folder",
                                  "report-onto-the-binary-by-a-dotted-path"])
def test_an_output_that_is_an_input_is_refused_even_with_force(tmp_path: Path, pair: dict, case: str) -> None:
    bin_dir = stand_in(tmp_path / "bin", "sys.exit(1)")
    inputs = [pair["prompts"], pair["target"], bin_dir, pair["target_gguf"]]
    if case == "trace-through-a-link-to-the-prompts":
        link = tmp_path / "trace.jsonl"
        link.symlink_to(pair["prompts"])
        out_args = ["--trace", link]
    elif case == "report-onto-a-file-of-the-target-folder":
        out_args = ["-o", pair["target"] / "tokenizer_config.json"]
    else:
        out_args = ["-o", bin_dir / ".." / "bin" / "llama-speculative-simple"]
    run = run_contained("accept_command", accept_args(pair, "--llama-cpp", bin_dir, "--target-gguf",
                                                      pair["target_gguf"], *out_args, "--force"),
                        inputs=inputs, tmp=tmp_path / "tmp", pid_folder=bin_dir)
    check_contained(run, 2, "is also an input")
    assert run.extra["stand_ins"] == []  # refused before anything ran


def test_quantize_onto_a_hard_link_of_its_input_is_refused(tmp_path: Path, pair: dict) -> None:
    alias = tmp_path / "alias.gguf"
    os.link(pair["gguf"], alias)
    run = run_contained("quantize_command", [pair["gguf"], alias, "q8_0", "--force"], inputs=[pair["gguf"]],
                        tmp=tmp_path / "tmp")
    check_contained(run, 2, f"{alias}: is also an input")


# --- 2. left behind: processes and temporary files -----------------------------------------------------------


def test_hup_while_llama_cpp_runs_ends_it_and_removes_the_temp_files(tmp_path: Path, pair: dict) -> None:
    bin_dir = stand_in(tmp_path / "bin", f"Path({str(tmp_path / 'busy')!r}).touch()\ntime.sleep(3600)")
    run = run_contained("accept_command", accept_args(pair, "--llama-cpp", bin_dir, "--target-gguf",
                                                      pair["target_gguf"], "--max-prompts", "1"),
                        inputs=[pair["target"], pair["prompts"], pair["target_gguf"]], tmp=tmp_path / "tmp",
                        pid_folder=bin_dir, signal_when=(tmp_path / "busy", signal.SIGHUP))
    check_contained(run, -signal.SIGHUP)
    assert len(run.extra["stand_ins"]) == 1


def test_a_grandchild_of_llama_cpp_is_ended_with_it(tmp_path: Path, pair: dict) -> None:
    grandchild = ("p = subprocess.Popen(['sleep', '3600'])\n"
                  f"Path({str(tmp_path / 'bin' / 'grandchild.pid')!r}).write_text(str(p.pid))\n"
                  "print('error: failed to load model', file=sys.stderr)\nsys.exit(1)")
    bin_dir = stand_in(tmp_path / "bin", grandchild)
    run = run_contained("accept_command", accept_args(pair, "--llama-cpp", bin_dir, "--target-gguf",
                                                      pair["target_gguf"], "--max-prompts", "1"),
                        inputs=[pair["target"], pair["prompts"]], tmp=tmp_path / "tmp", pid_folder=bin_dir)
    check_contained(run, 0)  # llama.cpp's refusal is the report's verdict, not dflash-accept's error
    assert "failed to load model" in run.stdout
    assert len(run.extra["stand_ins"]) == 2  # the stand-in and its grandchild, both looked up by PID


def test_gigabytes_of_llama_cpp_output_are_read_bounded(tmp_path: Path, pair: dict) -> None:
    flood = ("chunk = b'\\x1b[31m' + b'y' * ((16 << 20) - 5)\nfor _ in range(192):\n    os.write(2, chunk)\n"
             "sys.exit(0)")  # 3 GiB on stderr, one line, with an escape sequence: and then no counts at all
    bin_dir = stand_in(tmp_path / "bin", flood)
    run = run_contained("accept_command", accept_args(pair, "--llama-cpp", bin_dir, "--target-gguf",
                                                      pair["target_gguf"], "--max-prompts", "1"),
                        inputs=[pair["target"], pair["prompts"]], tmp=tmp_path / "tmp", pid_folder=bin_dir)
    check_contained(run, 1, "llama-speculative-simple", bounded=True)
    assert len(run.lines()[0]) < 2000


# --- 3. hangs: every loop whose length comes from input is bounded ------------------------------------------


def test_a_template_that_loops_for_hours_is_stopped(tmp_path: Path, pair: dict) -> None:
    target = target_with_template(tmp_path, "{% set ns = namespace(n=0) %}{% for i in range(99999) %}"
                                            "{% for j in range(99999) %}{% set ns.n = ns.n + i * j %}{% endfor %}"
                                            "{% endfor %}{{ messages[0].content }}")  # no output: only time
    run = run_contained("accept_command", accept_args(pair, target=target, prompts=chat_prompts(tmp_path, "c1")),
                        inputs=[target], tmp=tmp_path / "tmp")
    check_contained(run, 1, f"prompt c1: the chat template of {target} did not finish rendering in 10 s",
                    bounded=True)


@pytest.mark.parametrize("pattern", ["(blk|blk\\.0)*\\.weight$", "((a|a)*)*b", "(\\w|\\d)+[.]x$"])
def test_an_override_pattern_that_backtracks_is_refused_or_bounded(tmp_path: Path, pair: dict, pattern: str) -> None:
    run = run_contained("quantize_command", [pair["gguf"], tmp_path / "out.gguf", "q8_0", "--tensor-type",
                                             f"{pattern}=q4_0"], inputs=[pair["gguf"]], tmp=tmp_path / "tmp")
    if run.returncode == 0:  # a pattern the check lets through runs under its match bound: a correct result
        check_contained(run, 0, bounded=True)
    else:
        check_contained(run, 2, "--tensor-type", bounded=True)
        assert not (tmp_path / "out.gguf").exists()


def test_a_llama_cpp_that_never_ends_is_timed_out(tmp_path: Path, pair: dict) -> None:
    bin_dir = stand_in(tmp_path / "bin", "time.sleep(3600)")
    run = run_contained("accept_command", accept_args(pair, "--llama-cpp", bin_dir, "--target-gguf",
                                                      pair["target_gguf"], "--max-prompts", "1",
                                                      "--llama-cpp-timeout", "3"),
                        inputs=[pair["target"], pair["prompts"]], tmp=tmp_path / "tmp", pid_folder=bin_dir)
    check_contained(run, 1, "3 s", bounded=True)


def test_an_endless_prompts_file_is_read_bounded(tmp_path: Path, pair: dict) -> None:
    run = run_contained("accept_command", accept_args(pair, prompts=Path("/dev/urandom")), inputs=[pair["target"]],
                        tmp=tmp_path / "tmp")
    check_contained(run, 1, "/dev/urandom", bounded=True)


# --- 4. memory ------------------------------------------------------------------------------------------------


def test_a_template_that_multiplies_a_string_is_refused_under_the_cap(tmp_path: Path, pair: dict) -> None:
    target = target_with_template(tmp_path, "{{ messages[0].content * 3000000000 }}")
    run = run_contained("accept_command", accept_args(pair, target=target, prompts=chat_prompts(tmp_path, "m1")),
                        inputs=[target], tmp=tmp_path / "tmp")
    check_contained(run, 1, f"prompt m1: the chat template of {target} needed over 512 MiB of memory", bounded=True)


def test_long_prompts_just_under_the_line_limit_stay_under_the_cap(tmp_path: Path, pair: dict) -> None:
    f = tmp_path / "long.jsonl"
    with open(f, "w") as out:
        for i in range(20):  # 20 MB of one-word prompts, each line just under 1 MiB
            out.write(json.dumps({"id": f"w{i}", "text": "a" * 1_000_000}) + "\n")
    run = run_contained("accept_command", accept_args(pair, prompts=f), inputs=[pair["target"], f],
                        tmp=tmp_path / "tmp")
    check_contained(run, 1, "prompt w0: ", bounded=True)
    assert "context" in run.lines()[0]


# --- 5. internal errors: each failure in a template, a tokenizer or an argument is one line -----------------


def test_a_template_that_renders_nothing(tmp_path: Path, pair: dict) -> None:
    target = target_with_template(tmp_path, "{{ '' }}")
    run = run_contained("accept_command", accept_args(pair, target=target, prompts=chat_prompts(tmp_path, "e1")),
                        inputs=[target], tmp=tmp_path / "tmp")
    check_contained(run, 1, "prompt e1: ")


def test_a_prompts_line_that_is_not_utf8(tmp_path: Path, pair: dict) -> None:
    f = tmp_path / "bad.jsonl"
    f.write_bytes(b'{"id": "ok", "text": "fine"}\n{"id": "bad", "text": "caf\xe9"}\n')
    run = run_contained("accept_command", accept_args(pair, prompts=f), inputs=[f], tmp=tmp_path / "tmp")
    check_contained(run, 1, f"{f}:2: ")


@pytest.mark.parametrize("kwargs", ['[1, 2]', '{"messages": []}', '{"a": 1e999}', '{"a": '])
def test_odd_template_kwargs_are_a_usage_error(tmp_path: Path, pair: dict, kwargs: str) -> None:
    run = run_contained("accept_command", accept_args(pair, "--chat-template-kwargs", kwargs),
                        inputs=[pair["target"]], tmp=tmp_path / "tmp")
    check_contained(run, 2, "--chat-template-kwargs")


def test_a_tokenizer_that_adds_the_first_id_past_the_vocabulary(tmp_path: Path, pair: dict) -> None:
    target = shutil.copytree(TRAINED / "target", tmp_path / "target")
    vocab = json.loads((target / "config.json").read_text())["vocab_size"]
    tok = json.loads((target / "tokenizer.json").read_text())
    tok["post_processor"] = {"type": "TemplateProcessing", "single": [{"Sequence": {"id": "A", "type_id": 0}},
                                                                      {"SpecialToken": {"id": "<past>", "type_id": 0}}],
                             "pair": [{"Sequence": {"id": "A", "type_id": 0}}],
                             "special_tokens": {"<past>": {"id": "<past>", "ids": [vocab], "tokens": ["<past>"]}}}
    (target / "tokenizer.json").write_text(json.dumps(tok))
    config = json.loads((target / "tokenizer_config.json").read_text())
    config.pop("chat_template", None)  # plain text prompts: the post-processor runs
    (target / "tokenizer_config.json").write_text(json.dumps(config))
    run = run_contained("accept_command", accept_args(pair, target=target), inputs=[target], tmp=tmp_path / "tmp")
    check_contained(run, 1, f"token id {vocab}")


# --- 6. misleading results --------------------------------------------------------------------------------------


def test_new_tokens_past_the_context_are_refused_not_run(tmp_path: Path, pair: dict) -> None:
    target = shutil.copytree(TRAINED / "target", tmp_path / "target")
    config = json.loads((target / "config.json").read_text())
    config["max_position_embeddings"] = 40
    (target / "config.json").write_text(json.dumps(config))
    f = tmp_path / "p.jsonl"
    f.write_text(json.dumps({"id": "fits", "text": "the king"}) + "\n")
    run = run_contained("accept_command", [str(pair["drafter"]), "--target", str(target), "--prompts", str(f),
                                           "--max-new-tokens", "64", "-q"], inputs=[target, f], tmp=tmp_path / "tmp")
    check_contained(run, 1, "prompt fits: ")
    assert "context of 40" in run.lines()[0]


def test_an_escape_sequence_in_a_prompt_id_is_escaped(tmp_path: Path, pair: dict) -> None:
    f = tmp_path / "p.jsonl"
    f.write_text("".join(json.dumps({"id": "\x1b]0;owned\x07", "text": t}) + "\n" for t in ("a", "b")))
    run = run_contained("accept_command", accept_args(pair, prompts=f), inputs=[f], tmp=tmp_path / "tmp")
    check_contained(run, 1, "is also the id of line 1")  # check_contained: no ESC reached the terminal


def test_drafters_of_one_name_are_labelled_apart(tmp_path: Path, pair: dict) -> None:
    a = shutil.copytree(TRAINED / "drafter", tmp_path / "run-a" / "drafter")
    b = shutil.copytree(TRAINED / "drafter", tmp_path / "run-b" / "drafter")
    report = tmp_path / "out" / "report.md"
    report.parent.mkdir()
    run = run_contained("accept_command", [str(a), str(b), "--target", str(pair["target"]), "--prompts",
                                           str(pair["prompts"]), "--max-new-tokens", "8", "-q", "-o", str(report)],
                        inputs=[a, b, pair["target"], pair["prompts"]], tmp=tmp_path / "tmp")
    check_contained(run, 0)
    labels = [line.split("|")[1].strip() for line in report.read_text().splitlines() if line.startswith("| run-")]
    assert labels and set(labels) == {"run-a/drafter", "run-b/drafter"}, report.read_text()  # per-position tables
    assert sorted(p.name for p in report.parent.iterdir()) == ["report.md"]  # no temp file beside it
