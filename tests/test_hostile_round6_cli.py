"""Issue 56 (hostile round 6), the command lines, run as a user runs them (the installed console scripts, as children):

- nothing is lost on a stdout that cannot take it — closed (``>&-``), ``/dev/full``, a pipe whose reader is gone: one
  ``error:`` line and exit 1, never an internal error, never exit 0 with the report gone; a result that is a file is
  complete and kept, and the line says so; a run that prints nothing on stdout (-q, a report in -o FILE) exits 0;
- a path option naming the wrong kind of thing is one ``error:`` line, exit 2, not click's four-line usage block;
- numbers are ASCII digits (int() and float() take '١٢٨' and '1_000'); ``--context 1M`` is the 1 Mi tokens the docs
  allow.
Each error line is checked whole; the inputs are byte-identical afterwards."""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from dflashkit.errors import UsageError
from dflashkit.sweeps import level_label, parse_context_levels, parse_parallel_levels

pytestmark = pytest.mark.slow  # every test runs console scripts as children

ROOT = Path(__file__).resolve().parents[1]
BIN = Path(sys.executable).parent
STDOUTS = ("closed", "full", "pipe")
#: why a summary could not be printed, per kind of stdout
WHY = {"closed": "stdout is closed", "full": "No space left on device on stdout",
       "pipe": "broken pipe: the reader of stdout stopped"}
#: the line for a report on stdout, per kind of stdout
REPORT_LOST = {
    "closed": "error: stdout is closed: the report has nowhere to go; write it with -o FILE",
    "full": "error: cannot write the output (No space left on device): is stdout a full device or closed? write it "
            "with -o FILE",
    "pipe": "error: stdout was closed before the output was written (broken pipe); write it with -o FILE",
}
SMALL_RUN = ["--max-prompts", "1", "--max-new-tokens", "8"]


def run(name: str, *args: object, stdout: str = "read") -> subprocess.CompletedProcess[str]:
    """The console script ``name`` with ``args``; its stdout: ``closed`` (the shell's ``>&-``), ``full``
    (/dev/full), ``pipe`` (a pipe whose read end is closed before the child starts: EPIPE on its first write, no
    race), or ``read`` (captured here)."""
    argv = [str(BIN / name), *map(str, args)]
    assert Path(argv[0]).is_file(), f"pip install the package: {name} is missing"
    kw: dict = {"stderr": subprocess.PIPE, "text": True, "timeout": 300}
    if stdout == "closed":
        return subprocess.run(["bash", "-c", 'exec "$@" >&-', "bash", *argv], stdout=subprocess.DEVNULL, **kw)
    if stdout == "full":
        with open("/dev/full", "w") as full:
            return subprocess.run(argv, stdout=full, **kw)
    if stdout == "pipe":
        read_end, write_end = os.pipe()
        os.close(read_end)
        try:
            return subprocess.run(argv, stdout=write_end, **kw)
        finally:
            os.close(write_end)
    return subprocess.run(argv, stdout=subprocess.PIPE, **kw)


def the_error(r: subprocess.CompletedProcess[str]) -> str:
    """The one ``error:`` line of a run (and no traceback, no internal error)."""
    assert "Traceback" not in r.stderr and "internal error" not in r.stderr, r.stderr
    assert "Exception ignored" not in r.stderr and "Usage:" not in r.stderr, r.stderr
    errors = [line for line in r.stderr.splitlines() if line.startswith("error:")]
    assert len(errors) == 1, r.stderr
    return errors[0]


def no_error(r: subprocess.CompletedProcess[str]) -> None:
    assert r.returncode == 0 and "error" not in r.stderr.lower() and "Traceback" not in r.stderr, r.stderr


def digest(*paths: Path) -> dict[str, str]:
    """Every file under ``paths``, by its bytes' SHA-256."""
    files = [f for p in paths for f in ([p] if p.is_file() else sorted(p.rglob("*"))) if f.is_file()]
    return {str(f): hashlib.sha256(f.read_bytes()).hexdigest() for f in files}


@pytest.fixture(scope="module")
def inputs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """Copies of the fixtures (a failing command must not touch the repository's), a GGUF made from the example
    drafter and a finished release — built with -q and stdout closed: a run that needs no stdout exits 0."""
    folder = tmp_path_factory.mktemp("inputs")
    made = {"example": Path(shutil.copytree(ROOT / "fixtures/example/drafter", folder / "example")),
            "drafter": Path(shutil.copytree(ROOT / "fixtures/trained/drafter", folder / "drafter")),
            "target": Path(shutil.copytree(ROOT / "fixtures/trained/target", folder / "target")),
            "gguf": folder / "example.gguf", "release": folder / "release"}
    no_error(run("dflash-convert", made["example"], made["gguf"], "-q"))
    no_error(run("dflash-release", made["drafter"], made["release"], "--target", made["target"], "--types", "bf16",
                 "--jobs", "1", *SMALL_RUN, "--parity-rounds", "1", "-q", stdout="closed"))
    assert (made["release"] / "release.json").is_file()
    return made


@pytest.fixture()
def untouched(inputs: dict[str, Path]):  # type: ignore[no-untyped-def]
    before = digest(*inputs.values())
    yield
    assert digest(*inputs.values()) == before


# ---- a result that is a file: complete, kept, and said so ------------------------------------------------------


@pytest.mark.parametrize("stdout", STDOUTS)
@pytest.mark.parametrize("command", ["dflash-convert", "dflash-quantize"])
def test_a_written_file_is_kept_and_the_line_says_so(inputs: dict[str, Path], untouched: None, tmp_path: Path,
                                                      command: str, stdout: str) -> None:
    args = [inputs["example"]] if command == "dflash-convert" else [inputs["gguf"]]
    kind = [] if command == "dflash-convert" else ["q8_0"]
    reference, out = tmp_path / "reference.gguf", tmp_path / "out.gguf"
    no_error(run(command, *args, reference, *kind, "-q"))
    r = run(command, *args, out, *kind, stdout=stdout)
    assert r.returncode == 1
    assert the_error(r) == (f"error: {out} is written and complete (kept), but its summary could not be printed "
                            f"({WHY[stdout]}) — redirect stdout to a file, or use -q")
    assert out.read_bytes() == reference.read_bytes()


@pytest.mark.parametrize("command", ["dflash-convert", "dflash-quantize"])
def test_quiet_needs_no_stdout_but_json_does(inputs: dict[str, Path], untouched: None, tmp_path: Path,
                                             command: str) -> None:
    args = [inputs["example"]] if command == "dflash-convert" else [inputs["gguf"]]
    kind = [] if command == "dflash-convert" else ["q8_0"]
    quiet, as_json = tmp_path / "quiet.gguf", tmp_path / "json.gguf"
    no_error(run(command, *args, quiet, *kind, "-q", stdout="closed"))
    r = run(command, *args, as_json, *kind, "-q", "--format", "json", stdout="closed")  # the JSON is what was asked
    assert r.returncode == 1 and the_error(r) == (f"error: {as_json} is written and complete (kept), but its summary "
                                                  "could not be printed (stdout is closed) — redirect stdout to a file")
    assert as_json.read_bytes() == quiet.read_bytes() and quiet.stat().st_size > 0


def test_imatrix_keeps_its_file_and_needs_no_stdout_with_q(inputs: dict[str, Path], untouched: None,
                                                          tmp_path: Path) -> None:
    args = [inputs["drafter"], "--target", inputs["target"], *SMALL_RUN]
    said, quiet = tmp_path / "said.imatrix.gguf", tmp_path / "quiet.imatrix.gguf"
    r = run("dflash-imatrix", *args, "-o", said, stdout="closed")
    assert r.returncode == 1 and the_error(r) == (f"error: {said} is written and complete (kept), but its summary "
                                                  "could not be printed (stdout is closed) — redirect stdout to a "
                                                  "file, or use -q")
    no_error(run("dflash-imatrix", *args, "-o", quiet, "-q", stdout="closed"))
    assert said.read_bytes() == quiet.read_bytes() and said.stat().st_size > 0


# ---- a report on stdout: write it with -o FILE; in -o FILE it needs no stdout ------------------------------------


@pytest.mark.parametrize("stdout", STDOUTS)
@pytest.mark.parametrize("command, extra", [
    ("dflash-inspect", []), ("dflash-diff", []), ("dflash-diff", ["--format", "json"]), ("dflash-parity", ["-q"]),
])
def test_a_report_on_stdout_is_never_lost(inputs: dict[str, Path], untouched: None, command: str, extra: list[str],
                                          stdout: str) -> None:
    args = {"dflash-inspect": [inputs["example"]], "dflash-diff": [inputs["example"], inputs["gguf"]],
            "dflash-parity": [inputs["example"], inputs["example"], "--skip-weights"]}[command]
    assert run(command, *args, *extra).returncode == 0  # it passes: only stdout fails it
    r = run(command, *args, *extra, stdout=stdout)
    assert r.returncode == 1 and the_error(r) == REPORT_LOST[stdout]


@pytest.mark.parametrize("command", ["dflash-inspect", "dflash-parity"])
def test_a_report_in_a_file_needs_no_stdout(inputs: dict[str, Path], untouched: None, tmp_path: Path,
                                            command: str) -> None:
    args = {"dflash-inspect": [inputs["example"]],
            "dflash-parity": [inputs["example"], inputs["example"], "--skip-weights"]}[command]
    read = run(command, *args, "--format", "json")
    r = run(command, *args, "-o", tmp_path / "report.json", stdout="closed")
    assert r.returncode == 0 and r.stderr.startswith(f"{command}: wrote {tmp_path / 'report.json'} — "), r.stderr
    text = (tmp_path / "report.json").read_text()  # (stdout ends the report with a newline)
    assert text.startswith("{") and text.rstrip("\n") == read.stdout.rstrip("\n")


def test_diff_keeps_its_report_file_and_says_so(inputs: dict[str, Path], untouched: None, tmp_path: Path) -> None:
    # diff's 'wrote' line goes to stdout (as convert's summary): without -q it is what a closed stdout loses
    args = [inputs["example"], inputs["gguf"]]
    said, quiet = tmp_path / "said.md", tmp_path / "quiet.md"
    r = run("dflash-diff", *args, "-o", said, stdout="pipe")
    assert r.returncode == 1 and the_error(r) == (
        f"error: {said} is written and complete (kept), but its summary could not be printed (broken pipe: the "
        "reader of stdout stopped) — redirect stdout to a file, or use -q")
    no_error(run("dflash-diff", *args, "-o", quiet, "-q", stdout="closed"))
    assert said.read_text() == quiet.read_text() and said.read_text().startswith("## dflash-diff")


def test_accept_report_on_a_closed_stdout(inputs: dict[str, Path], untouched: None, tmp_path: Path) -> None:
    args = [inputs["drafter"], "--target", inputs["target"], *SMALL_RUN]
    r = run("dflash-accept", *args, "-q", stdout="closed")
    assert r.returncode == 1 and the_error(r) == REPORT_LOST["closed"]
    no_error(run("dflash-accept", *args, "-q", "-o", tmp_path / "accept.json", stdout="closed"))
    assert (tmp_path / "accept.json").read_text().startswith("{")


# ---- release: OUTDIR is the result; --check's verdict ------------------------------------------------------------


def test_release_keeps_its_folder_and_names_no_option_it_lacks(inputs: dict[str, Path], untouched: None,
                                                                tmp_path: Path) -> None:
    out = tmp_path / "release"
    r = run("dflash-release", inputs["drafter"], out, "--target", inputs["target"], "--types", "bf16", "--jobs", "1",
            *SMALL_RUN, "--parity-rounds", "1", stdout="full")
    assert r.returncode == 1 and the_error(r) == (f"error: {out} is written and complete (kept), but its summary "
                                                  "could not be printed (No space left on device on stdout) — "
                                                  "redirect stdout to a file, or use -q")
    checked = run("dflash-release", "--check", out)
    assert checked.returncode == 0 and checked.stdout == f"OK: {out} is the release its release.json records\n"


@pytest.mark.parametrize("stdout", STDOUTS)
def test_release_check_verdict_is_never_lost(inputs: dict[str, Path], untouched: None, stdout: str) -> None:
    out = inputs["release"]
    r = run("dflash-release", "--check", out, stdout=stdout)
    assert r.returncode == 1 and the_error(r) == (f"error: {out} is the release its release.json records, but its "
                                                  f"summary could not be printed ({WHY[stdout]}) — redirect stdout "
                                                  "to a file, or use -q")
    quiet = run("dflash-release", "--check", out, "-q", stdout=stdout)  # the exit code alone tells
    assert quiet.returncode == 0 and quiet.stderr == ""


@pytest.mark.parametrize("stdout", STDOUTS)
@pytest.mark.parametrize("flag", ["--help", "--version"])
def test_help_and_version_on_a_stdout_that_cannot_take_them(stdout: str, flag: str) -> None:
    r = run("dflash-release", flag, stdout=stdout)
    want = {"closed": "error: stdout is closed: the output has nowhere to go; redirect stdout to a file",
            "full": "error: cannot write the output (No space left on device): is stdout a full device or closed? "
                    "redirect stdout to a file",
            # (click ends an EPIPE in its own output with exit 1 and nothing said: the line is ours)
            "pipe": "error: stdout was closed before the output was written (broken pipe); redirect stdout to a "
                    "file"}[stdout]
    assert r.returncode == 1 and the_error(r) == want


def test_a_closed_stdout_is_held_on_dev_null(tmp_path: Path) -> None:
    # started with descriptor 1 closed, the next file opened would get it — and a child process (llama-server)
    # would write its output into that file. The command holds 1 on /dev/null before anything opens a file.
    code = ("import os, sys\nfrom dflashkit.cli.stdout import guard_closed_stdout\nguard_closed_stdout()\n"
            f"fd = os.open({str(tmp_path / 'f')!r}, os.O_WRONLY | os.O_CREAT)\n"
            "sys.stderr.write(f'{fd} {os.fstat(1).st_rdev == os.stat(os.devnull).st_rdev}')\n")
    r = subprocess.run(["bash", "-c", 'exec "$@" >&-', "bash", sys.executable, "-c", code], capture_output=True,
                       text=True, timeout=60)
    fd, on_null = r.stderr.split()
    assert fd != "1" and on_null == "True", r.stderr


# ---- a bad path option: one line, exit 2 --------------------------------------------------------------------------


def test_bad_path_options_are_one_line(inputs: dict[str, Path], untouched: None, tmp_path: Path) -> None:
    folder, file = tmp_path / "a folder", inputs["gguf"]
    folder.mkdir()
    ex, tgt, drafter = inputs["example"], inputs["target"], inputs["drafter"]
    accept, parity, release = [ex, "--target", tgt], [ex, ex], [drafter, tmp_path / "r", "--target", tgt]
    options = [  # command, its other arguments, the option, what it is given, what it wants
        ("dflash-accept", [*accept, "--context", "1"], "--context-file", folder, "a UTF-8 text file"),
        ("dflash-parity", [*parity, "--context", "1"], "--context-file", folder, "a UTF-8 text file"),
        ("dflash-accept", accept, "--prompts", folder, "a JSONL file"),
        ("dflash-release", release, "--prompts", folder, "a JSONL file"),
        ("dflash-accept", accept, "--trace", folder, "the trace's file name"),
        ("dflash-accept", accept, "--plot", folder, "the plot's file name"),
        ("dflash-accept", accept, "--target-gguf", folder, "a GGUF file"),
        ("dflash-accept", accept, "--llama-cpp", file, "llama.cpp's bin folder"),
        ("dflash-release", release, "--llama-server", file, "llama.cpp's bin folder"),
        ("dflash-accept", accept, "--llama-cpp-src", file, "llama.cpp's source folder"),
        ("dflash-parity", parity, "--dump", folder, "the dump's file name"),
        ("dflash-diff", parity, "-o", folder, "the report's file name"),
        ("dflash-inspect", [ex], "--output", folder, "the report's file name"),
    ]
    cases = [(name, [*args, option, path], f"{'-o' if option == '--output' else option} {path}: "
              f"{'is a directory' if path == folder else 'is not a folder'}; give {expect}")
             for name, args, option, path, expect in options]
    cases += [  # an argument, and imatrix's -o (checked by the command: the same line)
        ("dflash-convert", [ex, folder], f"{folder}: is a directory; give the output file name"),
        ("dflash-quantize", [file, folder, "q8_0"], f"{folder}: is a directory; give the output file name"),
        ("dflash-imatrix", [*accept, "-o", folder], f"{folder}: is a directory; give the output file name"),
    ]
    for name, args, message in cases:
        r = run(name, *args)
        assert (r.returncode, r.stdout, r.stderr) == (2, "", f"error: {message}\n"), (name, r.stderr)


# ---- numbers: ASCII digits; 1M ------------------------------------------------------------------------------------


def test_context_levels_take_1m_and_only_ascii_digits() -> None:
    assert parse_context_levels("1M") == parse_context_levels("1m") == (1 << 20,)
    assert parse_context_levels("0,4k,1M") == (0, 4096, 1 << 20) and level_label(1 << 20) == "1M"
    assert level_label(4096) == "4k" and level_label(1536) == "1536"
    for text, message in [("2M", "--context 2M: must be 0..1,048,576"), ("1025k", "--context 1025k: must be 0..1,048,576"),
                          ("١٢٨", "--context '١٢٨': not a count — give whole numbers (4k = 4096) separated by commas"),
                          ("1_000", "--context '1_000': not a count — give whole numbers (4k = 4096) separated by commas"),
                          ("1M,1024k", "--context 1024k: given twice")]:
        with pytest.raises(UsageError) as exc:
            parse_context_levels(text)
        assert str(exc.value) == message
    for text in ("٢", "1M", "1k"):
        with pytest.raises(UsageError, match="not a count"):
            parse_parallel_levels(text)


def test_numbers_in_other_digits_are_refused(inputs: dict[str, Path], untouched: None, tmp_path: Path) -> None:
    ex, tgt, out = inputs["example"], inputs["target"], tmp_path / "out"  # (nothing is written: refused first)
    one_line = [  # the options our code parses: one line, exit 2
        ("dflash-accept", [ex, "--target", tgt, "--context", "١٢٨"],
         "--context '١٢٨': not a count — give whole numbers (4k = 4096) separated by commas"),
        ("dflash-accept", [ex, "--target", tgt, "--llama-server", ex, "--parallel", "٢"],
         "--parallel '٢': not a count — give whole numbers separated by commas"),
        ("dflash-accept", [ex, "--target", tgt, "--llama-server", ex, "--draft-n-max", "4,٤"],
         "--draft-n-max '4,٤': '٤' is not a whole number written with the digits 0-9"),
        ("dflash-accept", [ex, "--target", tgt, "--max-drop", "٥%"],
         "--max-drop: expected a fraction like 0.99 or a percentage like 99%, got '٥%'"),
        ("dflash-convert", [ex, out, "--target-layer-ids", "١,٩"],
         "--target-layer-ids: expected integers separated by commas (e.g. 1,9,17,25,33), got '١,٩'"),
        ("dflash-parity", [ex, ex, "--target", tgt, "--prompt-ids", "١٢"],
         "--prompt-ids: expected integers separated by commas or spaces, got '١٢'"),
    ]
    for name, args, message in one_line:
        r = run(name, *args)
        assert (r.returncode, r.stderr) == (2, f"error: {message}\n"), (name, r.stderr)
    click_types = [  # click's own value errors (its usage block, as for any bad value of a typed option)
        ("dflash-accept", [ex, "--target", tgt, "--max-prompts", "١"], "--max-prompts", "'١' is not a whole number"),
        ("dflash-accept", [ex, "--target", tgt, "--seed", "1_000"], "--seed", "'1_000' is not a whole number"),
        ("dflash-accept", [ex, "--target", tgt, "--threads", "٤"], "--threads", "'٤' is not a whole number"),
        ("dflash-accept", [ex, "--target", tgt, "--temperature", "٠.5"], "--temperature", "'٠.5' is not a number"),
        ("dflash-parity", [ex, ex, "--rounds", "٢"], "--rounds", "'٢' is not a whole number"),
        ("dflash-convert", [ex, out, "--num-target-layers", "٣٦"], "--num-target-layers",
         "'٣٦' is not a whole number"),
        ("dflash-release", [ex, out, "--parity-rounds", "١"], "--parity-rounds", "'١' is not a whole number"),
        ("dflash-release", [ex, out, "--min-tau", "nan"], "--min-tau", "'nan' is not a finite number"),
    ]
    for name, args, option, message in click_types:
        r = run(name, *args)
        assert r.returncode == 2, (name, r.stderr)
        want = f"Error: Invalid value for '{option}': {message}"
        assert r.stderr.strip().splitlines()[-1].startswith(want), (name, r.stderr)
        assert message.endswith("finite number") or "written with the digits 0-9." in r.stderr


@pytest.mark.parametrize("unbuffered", ["1", ""], ids=["PYTHONUNBUFFERED=1", "buffered"])
def test_a_report_larger_than_the_pipe_whose_reader_leaves_is_not_lost(inputs: dict[str, Path], untouched: None,
                                                                       tmp_path: Path, unbuffered: str) -> None:
    """A report past the pipe's 64 KiB whose reader leaves after 100 bytes: the rest cannot be written — one line, exit
    1. Unbuffered (a container's PYTHONUNBUFFERED=1), Python's text layer ignored the short write: exit 0."""
    for n in range(120):  # 120 names of one file: a report of ~170 KB in HTML
        os.link(inputs["gguf"], tmp_path / f"d{n}.gguf")
    argv = [str(BIN / "dflash-inspect"), *sorted(map(str, tmp_path.glob("d*.gguf"))), "--format", "html"]
    env = {**os.environ, "PYTHONUNBUFFERED": unbuffered}
    with subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env) as proc:
        assert proc.stdout is not None and proc.stderr is not None
        head = proc.stdout.read(100)
        proc.stdout.close()  # the reader leaves with the writer blocked on a full pipe
        err = proc.stderr.read().decode()
        code = proc.wait(timeout=300)
    assert head.startswith(b"<!DOCTYPE html>")
    r = subprocess.CompletedProcess(argv, code, "", err)
    assert code == 1 and the_error(r) == REPORT_LOST["pipe"]


def test_a_stderr_that_cannot_take_a_line_does_not_end_the_run(inputs: dict[str, Path], untouched: None,
                                                               tmp_path: Path) -> None:
    """``2>/dev/full``: progress and warnings are dropped, the run goes on, the exit code tells (it stopped at the
    first progress line)."""
    out = tmp_path / "accept.json"
    argv = [str(BIN / "dflash-accept"), inputs["drafter"], "--target", inputs["target"], *SMALL_RUN, "-o", out]
    with open("/dev/full", "w") as full:
        ok = subprocess.run(argv, stdout=subprocess.DEVNULL, stderr=full, timeout=300)
        bad = subprocess.run([*argv[:4], "--prompts", tmp_path / "none.jsonl"], stdout=subprocess.DEVNULL,
                             stderr=full, timeout=300)
    assert ok.returncode == 0 and out.stat().st_size > 0
    assert bad.returncode == 1
