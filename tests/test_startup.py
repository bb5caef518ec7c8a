"""Start-up behaviour of the file commands: convert / quantize / inspect / diff never import torch
(it costs seconds and gigabytes they do not need), only quantizing to a numba-kernel type imports numba (about
0.4 s with its cached kernels; Q8_0 of a file under `codecs.NUMBA_PAYS_VALUES` F16 values is numpy), and numba's
kernel cache has a writable home."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from dflashkit import _numba_cache

ROOT = Path(__file__).resolve().parents[1]

# Runs one click command in-process (standalone_mode=False: no sys.exit) and prints which heavy
# modules the command's whole code path imported.
_PROBE = """
import json, sys
from dflashkit import cli
cmd = getattr(cli, sys.argv[1])
code = 0
try:
    cmd.main(sys.argv[2:], prog_name=sys.argv[1], standalone_mode=False)
except SystemExit as exc:
    code = exc.code
print("EXIT=" + str(code))
print("MODULES=" + json.dumps(sorted(m for m in ("torch", "transformers", "numba") if m in sys.modules)))
"""


def _modules_after(command: str, *args: str, exit_code: int = 0) -> list[str]:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    proc = subprocess.run([sys.executable, "-c", _PROBE, command, *args], capture_output=True, text=True, env=env,
                          cwd=ROOT)
    lines = [line for line in proc.stdout.splitlines() if line.startswith("MODULES=")]
    assert lines, proc.stderr[-2000:]
    assert f"EXIT={exit_code}" in proc.stdout.splitlines(), proc.stdout + proc.stderr[-2000:]  # it ran through
    return json.loads(lines[-1].split("=", 1)[1])


def test_convert_quantize_inspect_diff_never_import_torch_and_only_quantize_imports_numba(drafters, targets, tmp_path):
    from conftest import target_for

    hf, target = drafters["qwen3-b16"], target_for("qwen3-b16", targets)  # target GGUF: the tokenizer
    f16, q4 = tmp_path / "d-f16.gguf", tmp_path / "d-q4.gguf"
    assert _modules_after("convert_command", str(hf), str(f16), "--outtype", "f16", "--target", str(target),
                          "-q") == []
    assert f16.exists()
    assert _modules_after("quantize_command", str(f16), str(q4), "Q4_K_M") == ["numba"]
    assert q4.exists()
    q8 = tmp_path / "d-q8.gguf"  # Q8_0 of a small file is numpy: no numba start-up
    assert _modules_after("quantize_command", str(f16), str(q8), "Q8_0") == []
    assert q8.exists()
    assert _modules_after("inspect_command", str(q4)) == []
    assert _modules_after("diff_command", str(f16), str(q4)) == []


def test_release_check_imports_neither_torch_nor_numba(tmp_path):
    # --check reads a folder's files and release.json: the release package and the serving figures' rules are all
    # it needs (the measuring side of dflash-accept is imported on first use)
    (tmp_path / "release.json").write_text(json.dumps({"format": "dflashkit-release", "version": 1}))
    assert _modules_after("release_command", "--check", str(tmp_path), exit_code=1) == []


def test_numba_cache_moves_to_the_user_cache_when_the_package_is_read_only(tmp_path, monkeypatch):
    monkeypatch.delenv("NUMBA_CACHE_DIR", raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    monkeypatch.setattr(os, "access", lambda path, mode: False)
    chosen = _numba_cache.configure(tmp_path / "pkg")
    assert chosen == str(tmp_path / "cache" / "dflashkit" / "numba")
    assert os.environ["NUMBA_CACHE_DIR"] == chosen
    assert Path(chosen).is_dir()


def test_numba_cache_stays_beside_a_writable_package_and_respects_the_user(tmp_path, monkeypatch):
    monkeypatch.delenv("NUMBA_CACHE_DIR", raising=False)
    assert _numba_cache.configure(tmp_path) is None
    assert "NUMBA_CACHE_DIR" not in os.environ
    monkeypatch.setenv("NUMBA_CACHE_DIR", str(tmp_path / "mine"))
    monkeypatch.setattr(os, "access", lambda path, mode: False)
    assert _numba_cache.configure(tmp_path) is None
    assert os.environ["NUMBA_CACHE_DIR"] == str(tmp_path / "mine")


def test_a_command_run_as_a_program_leaves_at_once_with_its_output_and_exit_code(drafters, targets, tmp_path):
    # the console-script form (no args: DFlashCommand leaves through os._exit once numba is loaded) prints what
    # the in-process form prints, exit code and published file included
    from click.testing import CliRunner
    from conftest import target_for

    from dflashkit.cli import convert_command, quantize_command

    hf, target = drafters["qwen3-b16"], target_for("qwen3-b16", targets)
    f16 = tmp_path / "d-f16.gguf"
    assert CliRunner().invoke(convert_command, [str(hf), str(f16), "--outtype", "f16", "--target", str(target),
                                                "-q"]).exit_code == 0
    program = "import sys; sys.argv[0] = 'dflash-quantize'; from dflashkit.cli import quantize_command; quantize_command()"
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    ran = subprocess.run([sys.executable, "-c", program, str(f16), str(tmp_path / "a.gguf"), "Q4_K_M"],
                         capture_output=True, text=True, env=env, cwd=ROOT)
    inside = CliRunner().invoke(quantize_command, [str(f16), str(tmp_path / "b.gguf"), "Q4_K_M"])
    assert ran.returncode == 0 == inside.exit_code
    assert ran.stdout.replace("a.gguf", "b.gguf") == inside.stdout and ran.stdout.strip()
    assert (tmp_path / "a.gguf").read_bytes() == (tmp_path / "b.gguf").read_bytes()
    again = subprocess.run([sys.executable, "-c", program, str(f16), str(tmp_path / "a.gguf"), "Q4_K_M"],
                           capture_output=True, text=True, env=env, cwd=ROOT)
    assert again.returncode == 1 and again.stderr == f"error: {tmp_path / 'a.gguf'}: already exists — pass --force " \
                                                    "to overwrite it\n"
