"""One CLI grammar: every command has the same options for the same things, --version, and a --help that ends with
two examples and the exit codes; the old spellings (--json, --markdown) still work, hidden."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest
from click.testing import CliRunner

from dflashkit import cli

COMMANDS = {
    "dflash-convert": cli.convert_command,
    "dflash-quantize": cli.quantize_command,
    "dflash-inspect": cli.inspect_command,
    "dflash-diff": cli.diff_command,
    "dflash-parity": cli.parity_command,
    "dflash-accept": cli.accept_command,
}
REPORTS = ("dflash-inspect", "dflash-diff", "dflash-parity", "dflash-accept")
#: every console script (release and imatrix too): each built by `cli.common.dflash_command`
EVERY_COMMAND = {**COMMANDS, "dflash-release": cli.release_command, "dflash-imatrix": cli.imatrix_command}


def _flags(command) -> set[str]:  # type: ignore[no-untyped-def]
    import click

    # the command's own context settings (-h): click ≥ 8.2 builds and caches the help option from the first context
    ctx = click.Context(command, **command.context_settings)
    return {o for p in command.get_params(ctx) for o in (*p.opts, *p.secondary_opts)}


@pytest.mark.parametrize("name", list(EVERY_COMMAND))
def test_version(name: str) -> None:
    from importlib.metadata import version

    from dflashkit.cli.common import DFlashCommand

    assert isinstance(EVERY_COMMAND[name], DFlashCommand)
    r = CliRunner().invoke(EVERY_COMMAND[name], ["--version"], prog_name=name)
    assert r.exit_code == 0 and r.output == f"{name} (dflashkit) {version('dflashkit')}\n"


@pytest.mark.parametrize("name", list(COMMANDS))
def test_help_ends_with_two_examples_and_the_exit_codes(name: str) -> None:
    r = CliRunner().invoke(COMMANDS[name], ["--help"], prog_name=name, terminal_width=200)
    assert r.exit_code == 0
    tail = r.output[r.output.index("Examples:"):]
    examples = [line.strip() for line in tail.splitlines()[1:] if line.strip().startswith(name)]
    assert len(examples) == 2, tail
    assert "Exit codes: 0 success; 1 bad input, or a check / gate failed; 2 usage error; 130 interrupted" in tail
    # the old spellings are accepted but not advertised
    assert "--json " not in r.output.replace("--format json", "") and "--markdown" not in r.output


@pytest.mark.parametrize("name", list(COMMANDS))
def test_shared_options(name: str) -> None:
    flags = _flags(COMMANDS[name])
    assert {"-h", "--help", "--version", "--debug", "-q", "--quiet", "--format", "--force"} <= flags, name
    if name in REPORTS:
        assert {"-o", "--output", "--json", "--markdown"} <= flags, name
        fmt = next(p for p in COMMANDS[name].params if p.name == "fmt")
        assert list(fmt.type.choices) == ["text", "json", "markdown", "html"]
    else:
        assert "--json" in flags


def test_format_is_case_insensitive_and_the_old_spelling_agrees(tmp_path: Path) -> None:
    fixture = Path(__file__).resolve().parents[1] / "fixtures" / "example" / "drafter"
    upper = CliRunner().invoke(cli.inspect_command, [str(fixture), "--format", "JSON"])
    old = CliRunner().invoke(cli.inspect_command, [str(fixture), "--json"])
    assert upper.exit_code == old.exit_code and upper.stdout == old.stdout and upper.stdout.startswith("{")
    clash = CliRunner().invoke(cli.inspect_command, [str(fixture), "--markdown", "--format", "json"])
    assert clash.exit_code == 2 and "--markdown and --format json contradict each other" in clash.output


def test_inspect_writes_its_report_with_o(tmp_path: Path) -> None:
    fixture = Path(__file__).resolve().parents[1] / "fixtures" / "example" / "drafter"
    out = tmp_path / "inspect.md"
    r = CliRunner().invoke(cli.inspect_command, [str(fixture), "-o", str(out)])
    assert r.stdout == "" and out.read_text().startswith("## dflash-inspect")
    assert f"dflash-inspect: wrote {out} — " in r.stderr
    again = CliRunner().invoke(cli.inspect_command, [str(fixture), "-o", str(out)])
    assert again.exit_code == 1 and "already exists — pass --force to overwrite it" in again.output


# ---------------------------------------------------------------------------------------------
# stdout that cannot take the report: a full device, a closed pipe, a closed descriptor — one line, exit 1
# ---------------------------------------------------------------------------------------------

EXAMPLE = Path(__file__).resolve().parents[1] / "fixtures" / "example" / "drafter"


def _bash(line: str) -> "subprocess.CompletedProcess[str]":
    import os
    import subprocess
    import sys

    env = {**os.environ, "PYTHONPATH": str(EXAMPLE.parents[2])}
    cli_call = f"{sys.executable} -c 'from dflashkit.cli import inspect_command; inspect_command()' {EXAMPLE}"
    return subprocess.run(["bash", "-c", line.format(cli=cli_call)], capture_output=True, text=True, env=env,
                          timeout=120)


@pytest.mark.parametrize("line, message", [
    ("{cli} > /dev/full; echo rc=$?", "error: cannot write the output (No space left on device)"),
    ("{cli} | head -c 0; echo rc=${{PIPESTATUS[0]}}", "error: stdout was closed before the output was written"),
    ("{cli} --format json | head -c 0; echo rc=${{PIPESTATUS[0]}}", "error: stdout was closed before the output"),
    ("{cli} >&-; echo rc=$? >&2", "error: stdout is closed: the report has nowhere to go; write it with -o FILE"),
])
def test_stdout_that_cannot_take_the_report(line: str, message: str) -> None:
    if "/dev/full" in line and not Path("/dev/full").exists():
        pytest.skip("no /dev/full on this system")
    r = _bash(line)
    assert "rc=1" in r.stdout + r.stderr, (r.stdout, r.stderr)
    errors = [ln for ln in r.stderr.splitlines() if ln.startswith("error:")]
    assert len(errors) == 1 and errors[0].startswith(message), r.stderr
    assert "Traceback" not in r.stderr and "Exception ignored" not in r.stderr and "internal error" not in r.stderr


@pytest.mark.parametrize("command", ["convert", "quantize"])
@pytest.mark.parametrize("redirect", ["--format json > /dev/full", "| head -c 0"])
def test_a_written_file_is_kept_when_its_summary_cannot_be_printed(tmp_path: Path, command: str, redirect: str) -> None:
    # OUT is complete before the summary prints: it is kept, and the one error line says so (exit 1)
    import os
    import subprocess
    import sys

    if "/dev/full" in redirect and not Path("/dev/full").exists():
        pytest.skip("no /dev/full on this system")
    base = tmp_path / "base.gguf"
    assert CliRunner().invoke(cli.convert_command, [str(EXAMPLE), str(base), "-q"]).exit_code == 0
    out = tmp_path / "out.gguf"
    argv = f"{EXAMPLE} {out}" if command == "convert" else f"{base} {out} Q8_0"
    code = f"from dflashkit.cli import {command}_command as c; c()"
    env = {**os.environ, "PYTHONPATH": str(EXAMPLE.parents[2])}
    r = subprocess.run(["bash", "-c", f"{sys.executable} -c '{code}' {argv} {redirect}; echo rc=${{PIPESTATUS[0]}} >&2"],
                       capture_output=True, text=True, env=env, timeout=300)
    assert "rc=1" in r.stderr, r.stderr
    errors = [ln for ln in r.stderr.splitlines() if ln.startswith("error:")]
    assert len(errors) == 1 and errors[0].startswith(f"error: {out} is written and complete (kept), but its summary "
                                                     "could not be printed"), r.stderr
    assert out.is_file() and out.stat().st_size > 0
    assert "Traceback" not in r.stderr and "Exception ignored" not in r.stderr


@pytest.mark.parametrize("args, message", [
    (["--rounds", "100000000"], "'--rounds': 100000000 is not in the range 1<=x<=10000"),
    (["--seed", str(2**70)], f"'--seed': {2**70} is not in the range 0<=x<=9223372036854775807"),
])
def test_parity_bounds_its_numbers(args: list[str], message: str) -> None:
    r = CliRunner().invoke(cli.parity_command, [str(EXAMPLE), str(EXAMPLE), "--skip-weights", *args])
    assert r.exit_code == 2 and message in r.output


@pytest.mark.parametrize("revision, ok", [("main", True), ("v1.0", True), ("0123abcd" * 5, True), ("refs/pr/1", True),
                                          ("a b", False), ("x\x1b]0;t\x07", False), ("../etc", False),
                                          ("a..b", False), ("/abs", False), ("trail/", False)])
def test_source_revision_is_validated_before_it_reaches_the_url(tmp_path: Path, revision: str, ok: bool) -> None:
    trained = EXAMPLE.parents[1] / "trained"
    out = tmp_path / "d.gguf"
    r = CliRunner().invoke(cli.convert_command, [str(trained / "drafter"), str(out), "--target", str(trained / "target"),
                                                 "--source-repo", "a/b", "--source-revision", revision, "-q"])
    if ok:
        import gguf

        assert r.exit_code == 0, r.output
        url = gguf.GGUFReader(out).fields["general.source.url"].contents()
        assert url == f"https://huggingface.co/a/b/tree/{revision}"
    else:
        assert r.exit_code == 1 and "is not a git revision" in r.output and "\x1b" not in r.output
        assert not out.exists()


@pytest.mark.parametrize("kind", ["fifo", "directory"])
def test_a_config_json_that_is_not_a_file_is_named_for_what_it_is(tmp_path: Path, kind: str) -> None:
    import os
    import shutil

    d = Path(shutil.copytree(EXAMPLE, tmp_path / "drafter"))
    (d / "config.json").unlink()
    if kind == "fifo":
        os.mkfifo(d / "config.json")  # opening it would block forever
    else:
        (d / "config.json").mkdir()
    want = "is a FIFO, not a file" if kind == "fifo" else "is a directory, not a file"
    r = CliRunner().invoke(cli.convert_command, [str(d), str(tmp_path / "d.gguf"), "-q"])
    assert r.exit_code == 1 and f"{d / 'config.json'}: {want} — config.json must be a JSON file" in r.output


def test_convert_says_how_many_tensors_fell_back(tmp_path: Path) -> None:
    # the example drafter's rows (64 / 128 wide) are too short for 256-value K-quant blocks: every quantized
    # tensor falls back (Q5_0 / Q8_0), and the summary line says so beside the per-tensor warnings
    out = tmp_path / "ex.gguf"
    r = CliRunner().invoke(cli.convert_command, [str(EXAMPLE), str(out), "--outtype", "Q4_K_M"])
    assert r.exit_code == 0, r.output
    lines = r.output.strip().splitlines()
    assert sum(ln.startswith("warning: ") and ln.endswith(" instead") for ln in lines) == 15
    assert lines[-1] == (f"wrote {out} (0.1 MB, 25 tensors: 10 F32, 13 Q5_0, 2 Q8_0; dialect llama.cpp, arch dflash); "
                         "15 tensor(s) fell back to another type (rows too short for the requested type's blocks: see "
                         "the warnings)")
