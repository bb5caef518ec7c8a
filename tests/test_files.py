"""Output files (dflashkit.files): no input destroyed, no overwrite without --force (race-free), nothing
left behind after a failure or a signal, a failed --force run keeps the old file, ordinary file modes,
one-line OS errors naming OUT. Hostile cases from issue 16, run through the real CLI commands."""

from __future__ import annotations

import errno
import json
import hashlib
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
from click.testing import CliRunner
from conftest import ROOT, target_for
from interrupting import DEFAULT_SIGNALS, start_interrupted, wait_or_kill, write_big_f32_gguf
from gguf import GGMLQuantizationType as Q

from dflashkit import files
from dflashkit.cli import accept_command, convert_command, diff_command, parity_command, quantize_command
from dflashkit.converters.convert import convert
from dflashkit.errors import DFlashError, UsageError
from dflashkit.io.gguf_writer import TensorToWrite, write_gguf
from dflashkit.files import atomic_output, check_output, read_json

NOWARN = {"progress": False, "warn": lambda m: None}


def digest(path: Path) -> str:
    h = hashlib.sha256()
    for f in sorted(path.rglob("*")) if path.is_dir() else [path]:
        if f.is_file():
            h.update(f.name.encode() + f.read_bytes())
    return h.hexdigest()


def names(folder: Path) -> list[str]:
    return sorted(p.name for p in folder.iterdir())


def one_line(result, code: int, *needles: str) -> str:
    out = "\n".join(ln for ln in result.output.strip().splitlines() if not ln.startswith("warning: "))
    assert result.exit_code == code, out
    assert "\n" not in out and "Traceback" not in out, out
    for n in needles:
        assert n in out, out
    return out


@pytest.fixture
def hf(drafters, tmp_path: Path) -> Path:
    """A private copy of an HF drafter checkpoint (a test that fails must not harm the session fixture)."""
    return Path(shutil.copytree(drafters["qwen3-b16"], tmp_path / "hf"))


@pytest.fixture(scope="module")
def small_gguf(drafters, targets, tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("files_small") / "in.gguf"
    convert(drafters["qwen3-b16"], out, target=target_for("qwen3-b16", targets), outtype="f32", **NOWARN)
    return out


@pytest.fixture
def gguf_copy(small_gguf: Path, tmp_path: Path) -> Path:
    return Path(shutil.copy(small_gguf, tmp_path / "in.gguf"))


# ----------------------------------------------------------------------------------------------
# 1. Never destroy an input: every file a command reads is refused as OUT (exit 2), by path and inode
# ----------------------------------------------------------------------------------------------


def test_parity_dump_onto_the_candidate_is_refused(hf: Path, gguf_copy: Path) -> None:
    before = digest(gguf_copy)
    r = CliRunner().invoke(parity_command, [str(hf), str(gguf_copy), "--dump", str(gguf_copy), "--force"])
    one_line(r, 2, f"--dump {gguf_copy}: is also an input", "inputs are never modified")
    assert digest(gguf_copy) == before


def test_parity_dump_onto_a_file_inside_the_reference_dir_is_refused(hf: Path, gguf_copy: Path) -> None:
    before = digest(hf)
    for victim in ("config.json", "model.safetensors"):
        r = CliRunner().invoke(parity_command, [str(hf), str(gguf_copy), "--dump", str(hf / victim), "--force"])
        one_line(r, 2, f"{hf / victim}: is also an input")
    assert digest(hf) == before


def test_parity_dump_onto_the_target_is_refused(hf: Path, gguf_copy: Path, targets, tmp_path: Path) -> None:
    target = Path(shutil.copy(targets[64]["gguf"], tmp_path / "target.gguf"))
    before = digest(target)
    r = CliRunner().invoke(parity_command, [str(hf), str(gguf_copy), "--target", str(target),
                                            "--dump", str(target), "--force"])
    one_line(r, 2, "is also an input")
    assert digest(target) == before


def test_diff_report_onto_the_checkpoint_weights_is_refused(hf: Path, gguf_copy: Path) -> None:
    before = digest(hf)
    r = CliRunner().invoke(diff_command, [str(hf), str(gguf_copy), "-o", str(hf / "model.safetensors"), "--force"])
    one_line(r, 2, f"{hf / 'model.safetensors'}: is also an input")
    assert digest(hf) == before


def test_accept_trace_onto_the_targets_config_is_refused(hf: Path, targets, tmp_path: Path) -> None:
    target = Path(shutil.copytree(targets[64]["hf"], tmp_path / "target"))
    before = digest(target)
    for victim in sorted(p.name for p in target.iterdir()):  # config, weights, tokenizer files
        r = CliRunner().invoke(accept_command, [str(hf), "--target", str(target),
                                                "--trace", str(target / victim), "--force"])
        one_line(r, 2, f"--trace {target / victim}: is also an input")
    assert digest(target) == before


def test_convert_output_that_is_a_link_to_an_input_file_is_refused(hf: Path, tmp_path: Path) -> None:
    before = digest(hf)
    hard = tmp_path / "hard.gguf"
    os.link(hf / "model.safetensors", hard)  # same inode, different path
    sym = tmp_path / "sym.gguf"
    sym.symlink_to(hf / "config.json")  # resolves to an input
    for out in (hard, sym):
        r = CliRunner().invoke(convert_command, [str(hf), str(out), "--force"])
        one_line(r, 2, f"{out}: is also an input")
    assert digest(hf) == before


def test_convert_output_onto_the_target_gguf_is_refused(hf: Path, targets, tmp_path: Path) -> None:
    target = Path(shutil.copy(targets[64]["gguf"], tmp_path / "target.gguf"))
    before = digest(target)
    r = CliRunner().invoke(convert_command, [str(hf), str(target), "--target", str(target), "--force"])
    one_line(r, 2, f"{target}: is also an input")
    assert digest(target) == before


def test_quantize_and_translate_output_onto_their_input_is_refused(gguf_copy: Path, tmp_path: Path) -> None:
    before = digest(gguf_copy)
    link = tmp_path / "link.gguf"
    os.link(gguf_copy, link)
    for out in (gguf_copy, link):
        one_line(CliRunner().invoke(quantize_command, [str(gguf_copy), str(out), "Q8_0", "--force"]), 2,
                 f"{out}: is also an input")
        one_line(CliRunner().invoke(convert_command, [str(gguf_copy), str(out), "--force"]), 2,
                 f"{out}: is also an input")
    assert digest(gguf_copy) == before


def test_check_output_allows_a_new_file_inside_an_input_dir(hf: Path) -> None:
    assert check_output(hf / "report.txt", inputs=[hf], force=False) == hf / "report.txt"
    (hf / "sub").mkdir()
    with pytest.raises(UsageError, match="is also an input"):
        check_output(hf / "sub" / ".." / "config.json", inputs=[hf], force=True)


def test_convert_into_the_checkpoint_dir_can_be_rerun_with_force(hf: Path) -> None:
    out = hf / "d.gguf"
    for args in ([], ["--force"]):  # the GGUF is an output kind, not something the HF reader reads
        r = CliRunner().invoke(convert_command, [str(hf), str(out), "--outtype", "f32", *args])
        assert r.exit_code == 0, r.output
    before = digest(out)
    r = CliRunner().invoke(quantize_command, [str(out), str(out), "Q8_0", "--force"])  # a GGUF given as input
    one_line(r, 2, f"{out}: is also an input")
    assert digest(out) == before


def test_accept_trace_onto_the_prompts_file_is_refused(hf: Path, targets, tmp_path: Path) -> None:
    prompts = tmp_path / "p.jsonl"
    prompts.write_text('{"prompt": "hi"}\n')
    r = CliRunner().invoke(accept_command, [str(hf), "--target", str(targets[64]["hf"]), "--prompts", str(prompts),
                                            "--trace", str(prompts), "--force"])
    one_line(r, 2, f"--trace {prompts}: is also an input")
    assert prompts.read_text() == '{"prompt": "hi"}\n'


# ----------------------------------------------------------------------------------------------
# 2. No overwrite without --force, race-free
# ----------------------------------------------------------------------------------------------


def test_file_created_at_out_during_the_run_is_not_clobbered(tmp_path: Path) -> None:
    out = tmp_path / "o.bin"
    with pytest.raises(DFlashError) as info:
        with atomic_output(out) as f:
            f.write(b"ours")
            out.write_bytes(b"someone else's")  # appears after the up-front check
    assert str(info.value) == f"{out}: already exists — pass --force to overwrite it"
    assert out.read_bytes() == b"someone else's"
    assert names(tmp_path) == ["o.bin"]


def test_named_temp_fallback_publishes_without_replacing(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setattr(files, "_open_tmpfile", lambda d: None)  # as on a file system without O_TMPFILE
    out = tmp_path / "o.bin"
    with pytest.raises(DFlashError, match="already exists — pass --force"):
        with atomic_output(out) as f:
            f.write(b"ours")
            out.write_bytes(b"theirs")
    assert out.read_bytes() == b"theirs" and names(tmp_path) == ["o.bin"]
    with atomic_output(out, force=True) as f:
        f.write(b"ours")
    assert out.read_bytes() == b"ours" and names(tmp_path) == ["o.bin"]


def test_without_hard_links_publication_uses_rename_noreplace(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setattr(files, "_open_tmpfile", lambda d: None)

    def no_links(*a, **k):
        raise PermissionError(errno.EPERM, os.strerror(errno.EPERM))

    monkeypatch.setattr(files.os, "link", no_links)
    renames = []
    real = files._renameat2_noreplace
    monkeypatch.setattr(files, "_renameat2_noreplace", lambda s, d: renames.append(d) or real(s, d))
    out = tmp_path / "o.bin"
    with pytest.raises(DFlashError, match="already exists — pass --force"):
        with atomic_output(out) as f:
            f.write(b"ours")
            out.write_bytes(b"theirs")
    assert out.read_bytes() == b"theirs" and names(tmp_path) == ["o.bin"]
    out.unlink()
    with atomic_output(out) as f:
        f.write(b"ours")
    assert out.read_bytes() == b"ours" and names(tmp_path) == ["o.bin"]
    assert renames == [str(out), str(out)]


def _cli_env(marker: Path) -> dict[str, str]:
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    env[files.PAUSE_ENV] = str(marker)
    return env


def _start(command: str, args: list[str], marker: Path) -> subprocess.Popen:
    code = DEFAULT_SIGNALS + f"import sys; from dflashkit.cli import {command}; sys.argv[0] = 'dflash'; {command}()"
    return subprocess.Popen([sys.executable, "-c", code, *args], env=_cli_env(marker),
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def _wait_for(marker: Path, proc: subprocess.Popen) -> None:
    deadline = time.monotonic() + 60
    while not marker.exists():
        if proc.poll() is not None:
            raise AssertionError(f"exited {proc.returncode} before writing: {proc.stderr.read()}")
        assert time.monotonic() < deadline, "the writer never paused"
        time.sleep(0.02)


def test_two_concurrent_runs_to_one_new_out_exactly_one_wins(gguf_copy: Path, tmp_path: Path) -> None:
    out_dir = tmp_path / "out"
    out_dir.mkdir()
    out = out_dir / "q.gguf"
    marks = [tmp_path / "a.marker", tmp_path / "b.marker"]
    procs = [_start("quantize_command", [str(gguf_copy), str(out), "Q8_0"], m) for m in marks]
    try:
        for m, p in zip(marks, procs):
            _wait_for(m, p)  # both have passed the up-front check and are writing
        marks[0].unlink()
        assert procs[0].wait(60) == 0, procs[0].stderr.read()
        first = out.read_bytes()
        marks[1].unlink()
        assert procs[1].wait(60) == 1
        err = procs[1].stderr.read().strip()
        assert err == f"error: {out}: already exists — pass --force to overwrite it", err
    finally:
        for p in procs:
            p.kill() if p.poll() is None else None
            p.wait()
    assert out.read_bytes() == first
    assert names(out_dir) == ["q.gguf"]


def test_parity_dump_does_not_touch_a_file_named_like_the_old_temp(hf: Path, gguf_copy: Path, tmp_path: Path) -> None:
    dump = tmp_path / "d.npz"
    bystander = tmp_path / "d.npz.tmp.npz"
    bystander.write_bytes(b"keep me")
    r = CliRunner().invoke(parity_command, [str(hf), str(gguf_copy), "--dump", str(dump)])
    assert r.exit_code == 0, r.output
    assert bystander.read_bytes() == b"keep me"
    assert sorted(np.load(dump).files)[:1] == ["block_ids"]


# ----------------------------------------------------------------------------------------------
# 3. Nothing left behind: exceptions, TERM/HUP/INT, and KILL where O_TMPFILE exists
# ----------------------------------------------------------------------------------------------


@pytest.mark.parametrize("anonymous", [True, False], ids=["o_tmpfile", "named_temp"])
def test_exception_mid_write_leaves_nothing(tmp_path: Path, monkeypatch, anonymous: bool) -> None:
    if not anonymous:
        monkeypatch.setattr(files, "_open_tmpfile", lambda d: None)
    out = tmp_path / "o.bin"
    with pytest.raises(RuntimeError, match="boom"):
        with atomic_output(out) as f:
            f.write(b"x" * 100_000)
            raise RuntimeError("boom")
    assert names(tmp_path) == []


def _supports_o_tmpfile(directory: Path) -> bool:
    fd = files._open_tmpfile(directory)
    if fd is None:
        return False
    os.close(fd)
    return True


@pytest.mark.parametrize("sig", ["SIGTERM", "SIGHUP", "SIGINT", "SIGKILL"])
def test_signal_mid_write_leaves_nothing_and_keeps_old_out(gguf_copy: Path, tmp_path: Path, sig: str) -> None:
    signum = getattr(signal, sig)
    out_dir = tmp_path / "out"
    out_dir.mkdir()
    out = out_dir / "q.gguf"
    out.write_bytes(b"previous output")
    if signum == signal.SIGKILL and not _supports_o_tmpfile(out_dir):
        pytest.skip("no O_TMPFILE here: a SIGKILL leaves the named temporary file")
    marker = tmp_path / "marker"
    proc = _start("quantize_command", [str(gguf_copy), str(out), "Q8_0", "--force"], marker)
    try:
        _wait_for(marker, proc)
        proc.send_signal(signum)
        rc = proc.wait(60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    # TERM/HUP/KILL: the process dies of the signal as usual; INT: the CLI's "interrupted" exit 130.
    assert rc == (130 if signum == signal.SIGINT else -signum), (rc, proc.stderr.read())
    assert names(out_dir) == ["q.gguf"]
    assert out.read_bytes() == b"previous output"


@pytest.mark.parametrize("sig", ["SIGTERM", "SIGHUP"])
def test_signal_with_named_temp_fallback_leaves_nothing(tmp_path: Path, sig: str) -> None:
    out = tmp_path / "o.bin"
    code = DEFAULT_SIGNALS + (
        "import os, signal, time\n"
        "from dflashkit import files\n"
        "files._open_tmpfile = lambda d: None\n"
        f"with files.atomic_output({str(out)!r}) as f:\n"
        "    f.write(b'x' * 1000); f.flush()\n"
        f"    os.kill(os.getpid(), signal.{sig})\n"
        "    time.sleep(30)\n"
    )
    proc = subprocess.run([sys.executable, "-c", code], env=dict(os.environ, PYTHONPATH=str(ROOT)), timeout=60)
    assert proc.returncode == -getattr(signal, sig)
    assert names(tmp_path) == []


# ----------------------------------------------------------------------------------------------
# 4. A failed --force run leaves the old file intact
# ----------------------------------------------------------------------------------------------


def _failing_tensor() -> TensorToWrite:
    def chunks():
        yield np.zeros(64, np.float32)  # some bytes reach the file, then the producer fails
        raise DFlashError("tensor 'w': simulated failure")

    return TensorToWrite("w", (2, 64), Q.F32, chunks)


@pytest.mark.parametrize("anonymous", [True, False], ids=["o_tmpfile", "named_temp"])
def test_failed_force_run_keeps_previous_file(tmp_path: Path, monkeypatch, anonymous: bool) -> None:
    if not anonymous:
        monkeypatch.setattr(files, "_open_tmpfile", lambda d: None)
    out = tmp_path / "d.gguf"
    out.write_bytes(b"previous output")
    with pytest.raises(DFlashError, match="simulated failure"):
        write_gguf(out, "qwen3", [], [_failing_tensor()], force=True, progress=False)
    assert out.read_bytes() == b"previous output"
    assert names(tmp_path) == ["d.gguf"]


def test_failed_force_quantize_keeps_previous_file(gguf_copy: Path, tmp_path: Path, monkeypatch) -> None:
    out = tmp_path / "q.gguf"
    out.write_bytes(b"previous output")
    monkeypatch.setattr(files, "_open_fd", _full_disk_after(4096))
    r = CliRunner().invoke(quantize_command, [str(gguf_copy), str(out), "Q8_0", "--force"])
    one_line(r, 1, f"{out}: cannot write (No space left on device)")
    assert out.read_bytes() == b"previous output"
    assert names(tmp_path) == ["in.gguf", "q.gguf"]


# ----------------------------------------------------------------------------------------------
# 5. Ordinary modes; read-only folder and full disk name OUT
# ----------------------------------------------------------------------------------------------


def test_gguf_and_report_outputs_get_the_umask_mode(hf: Path, tmp_path: Path) -> None:
    old = os.umask(0o022)
    try:
        convert(hf, tmp_path / "d.gguf", outtype="f32", **NOWARN)
        r = CliRunner().invoke(diff_command, [str(hf), str(tmp_path / "d.gguf"), "-o", str(tmp_path / "r.json")])
        assert r.exit_code == 0, r.output
    finally:
        os.umask(old)
    assert (tmp_path / "d.gguf").stat().st_mode & 0o777 == 0o644  # not mkstemp's 0600
    assert (tmp_path / "r.json").stat().st_mode & 0o777 == 0o644


def test_read_only_folder_error_names_out(hf: Path, tmp_path: Path, monkeypatch) -> None:
    ro = tmp_path / "ro"
    ro.mkdir()
    if os.geteuid() == 0:  # root writes anyway: make the OS refuse the way it refuses a user
        def refuse(*a, **k):
            raise PermissionError(errno.EACCES, os.strerror(errno.EACCES), str(ro / "d.gguf.tmp-xyz"))

        monkeypatch.setattr(files, "_open_tmpfile", refuse)
    ro.chmod(0o555)
    try:
        r = CliRunner().invoke(convert_command, [str(hf), str(ro / "d.gguf")])
    finally:
        ro.chmod(0o755)
    msg = one_line(r, 1, f"error: {ro / 'd.gguf'}: cannot write (Permission denied); choose a writable folder")
    assert ".tmp-" not in msg
    assert names(ro) == []


class _FullDisk:
    def __init__(self, f, room: int) -> None:
        self._f, self._room = f, room

    def write(self, data) -> int:
        n = memoryview(data).nbytes
        if n > self._room:
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        self._room -= n
        return self._f.write(data)

    def __getattr__(self, name):
        return getattr(self._f, name)


def _full_disk_after(room: int):
    real = files._open_fd
    return lambda fd: _FullDisk(real(fd), room)


def test_disk_full_error_names_out(hf: Path, tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setattr(files, "_open_fd", _full_disk_after(1000))
    out = tmp_path / "d.gguf"
    r = CliRunner().invoke(convert_command, [str(hf), str(out)])
    one_line(r, 1, f"error: {out}: cannot write (No space left on device)")
    assert names(tmp_path) == ["hf"]


# ----------------------------------------------------------------------------------------------
# JSON reading: one line naming the file
# ----------------------------------------------------------------------------------------------


@pytest.mark.parametrize("content, reason", [
    (b"{", "cannot read JSON (Expecting property name enclosed in double quotes: line 1 column 2 (char 1))"),
    (b"\xff{}", "cannot read JSON ('utf-8' codec can't decode byte 0xff in position 0: invalid start byte)"),
    (b"[" * 100_000 + b"]" * 100_000, "cannot read JSON (nested too deeply)"),
    (b"1" * 10_000, "cannot read JSON (Exceeds the limit (4300 digits) for integer string conversion"),
])
def test_read_json_errors_are_one_line_naming_the_file(tmp_path: Path, content: bytes, reason: str) -> None:
    p = tmp_path / "config.json"
    p.write_bytes(content)
    with pytest.raises(DFlashError) as info:
        read_json(p, hint="; re-download the file")
    msg = str(info.value)
    assert msg.startswith(f"{p}: {reason}") and msg.endswith("; re-download the file") and "\n" not in msg
    with pytest.raises(DFlashError, match=rf"over {len(content) - 1}\)"):
        read_json(p, max_bytes=len(content) - 1)


# ----------------------------------------------------------------------------------------------
# --force replaces regular files only: a device node, FIFO, socket or a link to one is refused (exit 2)
# ----------------------------------------------------------------------------------------------


def _special_node(tmp_path: Path) -> tuple[Path, str]:
    """A character device made with os.mknod where this process may (root), else a FIFO."""
    import stat as st

    node = tmp_path / "node.gguf"
    try:
        os.mknod(node, 0o666 | st.S_IFCHR, os.makedev(1, 3))  # /dev/null's numbers
        return node, "a character device"
    except (PermissionError, OSError):
        os.mkfifo(node)
        return node, "a FIFO"


def _mode(path: Path) -> tuple[int, int]:
    s = os.lstat(path)
    return s.st_mode, s.st_rdev


def test_check_output_refuses_a_non_regular_out_even_with_force(tmp_path: Path) -> None:
    node, kind = _special_node(tmp_path)
    with pytest.raises(UsageError, match=rf"{node}: exists and is {kind} — outputs are written to regular files only"):
        check_output(node, force=True)
    link = tmp_path / "link.gguf"
    link.symlink_to(node)
    with pytest.raises(UsageError, match=rf"exists and is {kind} \(through a symbolic link\)"):
        check_output(link, force=True)
    with pytest.raises(UsageError, match="exists and is"):
        with atomic_output(node, force=True) as fh:
            fh.write(b"x")


@pytest.mark.parametrize("command", ["diff", "parity", "convert", "quantize"])
def test_force_onto_a_device_node_leaves_it_a_device(command: str, hf: Path, gguf_copy: Path, tmp_path: Path) -> None:
    node, kind = _special_node(tmp_path)
    before = _mode(node)
    args = {
        "diff": (diff_command, [str(hf), str(gguf_copy), "-o", str(node), "--force"]),
        "parity": (parity_command, [str(hf), str(gguf_copy), "--dump", str(node), "--force"]),
        "convert": (convert_command, [str(hf), str(node), "--force"]),
        "quantize": (quantize_command, [str(gguf_copy), str(node), "Q8_0", "--force"]),
    }[command]
    res = CliRunner().invoke(args[0], args[1])
    one_line(res, 2, f"{node}: exists and is {kind}")
    assert _mode(node) == before
    assert names(tmp_path) == sorted(["hf", "in.gguf", "node.gguf"])


@pytest.mark.parametrize("name", ["-", "/dev/stdout"])
def test_dash_and_dev_stdout_are_the_report_stream(name: str, hf: Path, gguf_copy: Path, tmp_path: Path) -> None:
    # the standard output as -o: the report goes there as a stream (never a file replacing /dev/stdout)
    res = CliRunner().invoke(diff_command, [str(hf), str(gguf_copy), "-o", name, "--format", "json", "--force"])
    assert res.exit_code == 0, res.output
    assert json.loads(res.stdout)["title"] == f"dflash-diff: {hf.name} vs {gguf_copy.name}"
    assert names(tmp_path) == sorted(["hf", "in.gguf"])
    assert Path("/dev/stdout").is_symlink() or not Path("/dev/stdout").is_file()


def test_a_long_out_name_leaves_room_for_the_temp_suffix(gguf_copy: Path, tmp_path: Path) -> None:
    out = tmp_path / ("x" * 250 + ".gguf")  # 255 characters: OUT.tmp-* would be too long for the file system
    for _ in range(2):  # the second run replaces the first (--force), through a temporary name
        res = CliRunner().invoke(quantize_command, [str(gguf_copy), str(out), "Q8_0", "--force", "-q"])
        assert res.exit_code == 0, res.output
    assert names(tmp_path) == sorted(["in.gguf", out.name])

# ----------------------------------------------------------------------------------------------
# Ctrl-C: exit 130, one line, nothing left behind (or the complete file when it was already published).
# How fast a command stops is a figure, printed by benchmarks/interrupt.py; here a stop is only bounded to catch a
# hang (interrupting.HANG_SECONDS).
# ----------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def big_f32_gguf(tmp_path_factory) -> Path:
    return write_big_f32_gguf(tmp_path_factory.mktemp("sigint") / "big.gguf")


def _interrupt_mid_write(command: str, args: list[str], marker: Path, delay: float) -> tuple[int, str]:
    """Start ``command``, let it write its header (the writer pauses at ``marker``), let go, send INT ``delay`` s
    later: (exit status, stderr)."""
    proc = _start(command, args, marker)
    try:
        _wait_for(marker, proc)  # the header is written; the tensor data comes next
        marker.unlink()  # let it go on writing
        time.sleep(delay)
        proc.send_signal(signal.SIGINT)
        rc, _, err = wait_or_kill(proc)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    return rc, err


def _delays(seed: int, trials: int, longest: float) -> list[float]:
    """Trial 0 signals the moment the writer lets go (mid-write on any machine); the others at random points up to
    ``longest`` s later, which on a fast machine may be after the file was published."""
    return [0.0] + [float(x) for x in np.random.default_rng(seed).uniform(0.0, longest, trials - 1)]


@pytest.mark.slow
def test_sigint_at_random_points_of_a_quantize_write(big_f32_gguf: Path, tmp_path: Path) -> None:
    complete_path = tmp_path / "complete.gguf"
    assert CliRunner().invoke(quantize_command, [str(big_f32_gguf), str(complete_path), "Q6_K", "-q"]).exit_code == 0
    complete = complete_path.read_bytes()
    complete_path.unlink()
    outcomes = []
    for trial, delay in enumerate(_delays(26, 20, 1.0)):
        out_dir = tmp_path / f"t{trial}"
        out_dir.mkdir()
        marker = tmp_path / f"m{trial}"
        rc, err = _interrupt_mid_write("quantize_command", [str(big_f32_gguf), str(out_dir / "q.gguf"), "Q6_K", "-q"],
                                       marker, delay)
        if names(out_dir):  # published before the signal (then exit 0, or INT's own status once past the CLI)
            assert names(out_dir) == ["q.gguf"] and (out_dir / "q.gguf").read_bytes() == complete, trial
            assert rc in (0, 130, -signal.SIGINT), (trial, rc)
        else:
            assert rc == 130 and err.strip().splitlines()[-1] == "interrupted (no output written)", (trial, rc, err)
        outcomes.append(rc)
    assert outcomes[0] == 130, outcomes
    assert names(tmp_path) == sorted(f"t{i}" for i in range(20))  # no marker, no temp file anywhere


def test_sigint_during_a_convert_write(tmp_path: Path) -> None:
    # convert streams through the same atomic writer: INT after its header is written (and at random points after
    # it lets go) gives 130 and leaves nothing, or the complete file if it was already published
    trained = ROOT / "fixtures" / "trained"
    outcomes = []
    for trial, delay in enumerate(_delays(25, 6, 0.05)):
        out_dir = tmp_path / f"t{trial}"
        out_dir.mkdir()
        marker = tmp_path / f"m{trial}"
        rc, err = _interrupt_mid_write("convert_command", [str(trained / "drafter"), str(out_dir / "d.gguf"),
                                                           "--outtype", "f32", "--target", str(trained / "target"),
                                                           "-q"], marker, delay)
        if names(out_dir):
            assert names(out_dir) == ["d.gguf"] and rc in (0, 130, -signal.SIGINT), (trial, rc)
        else:
            assert rc == 130 and err.strip().splitlines()[-1] == "interrupted (no output written)", (trial, rc, err)
        outcomes.append(rc)
    assert outcomes[0] == 130, outcomes
    assert names(tmp_path) == sorted(f"t{i}" for i in range(6))


@pytest.fixture(scope="module")
def trained_f32_gguf(tmp_path_factory) -> Path:
    trained = ROOT / "fixtures" / "trained"
    out = tmp_path_factory.mktemp("trained") / "drafter-f32.gguf"
    convert(trained / "drafter", out, outtype="f32", target=trained / "target")
    return out


# command, the function whose k-th call is interrupted, its fewest calls in the run, the arguments, trials
_WORK = {
    "inspect": ("inspect_command", "dflashkit.inspect.values:nonfinite_count", 20,
                ["{gguf}", "--target", "{trained}/target", "-o", "{out}"], 4),
    "diff": ("diff_command", "dflashkit.diff.stats:StatsAccumulator.add", 20,
             ["{trained}/drafter", "{gguf}", "-o", "{out}"], 4),
    "parity": ("parity_command", "dflashkit.runtime.dflash:DFlashDraftModel.draft", 100,
               ["{trained}/drafter", "{gguf}", "--target", "{trained}/target", "--rounds", "50", "-o", "{out}"], 2),
    "accept": ("accept_command", "dflashkit.accept.run:speculative_generate", 24,
               ["{gguf}", "--target", "{trained}/target", "--prompts", "{trained}/prompts.jsonl", "-o", "{out}"], 2),
}


@pytest.mark.slow
@pytest.mark.parametrize("name", list(_WORK))
def test_sigint_in_the_middle_of_the_work(name: str, trained_f32_gguf: Path, tmp_path: Path) -> None:
    # INT at a random point of the command's work (a tensor's values, a draft round, a prompt's generation):
    # exit 130, one line, no report, no temp file
    command, unit, calls, args, trials = _WORK[name]
    rng = np.random.default_rng(sum(map(ord, name)))
    out_dir = tmp_path / "out"
    out_dir.mkdir()
    args = [a.format(gguf=trained_f32_gguf, trained=ROOT / "fixtures" / "trained", out=out_dir / "report.json")
            for a in args]
    for trial in range(trials):
        k, delay = int(rng.integers(1, calls + 1)), float(rng.uniform(0.0, 0.05))
        rc, out, err = wait_or_kill(start_interrupted(command, [*args, "-q"], unit, k, delay))
        assert rc == 130, (trial, k, rc, err)
        assert err.strip().splitlines()[-1] == "interrupted (no output written)" and "Traceback" not in err, err
        assert out == "" and names(out_dir) == [], (trial, out)


def test_ctrl_c_inside_an_import_is_delivered_after_it(monkeypatch: pytest.MonkeyPatch) -> None:
    """A KeyboardInterrupt raised inside importlib's bootstrap can be ignored by CPython with the import lock held
    (every later import hangs): the handler sends the signal again a moment later instead; elsewhere it raises."""
    import threading as _threading
    from types import SimpleNamespace

    from dflashkit.files import signals

    sent: list[int] = []
    done = _threading.Event()
    monkeypatch.setattr(signals.os, "kill", lambda pid, sig: (sent.append(sig), done.set()))
    code = SimpleNamespace
    importing = code(f_code=code(co_filename="x.py"),
                     f_back=code(f_code=code(co_filename="<frozen importlib._bootstrap>"), f_back=None))
    signals._interrupt_outside_imports(signal.SIGINT, importing)  # no KeyboardInterrupt inside the import
    assert done.wait(5) and sent == [signal.SIGINT]
    with pytest.raises(KeyboardInterrupt):
        signals._interrupt_outside_imports(signal.SIGINT, code(f_code=code(co_filename="work.py"), f_back=None))
    with pytest.raises(KeyboardInterrupt):  # signals_deferred replays it without a frame
        signals._interrupt_outside_imports(signal.SIGINT, None)
