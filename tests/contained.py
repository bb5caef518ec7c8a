"""A command run the way issue 34 judges it: whatever the input, it ends with an exit code and at most one line,
leaves its inputs' bytes as they were, no process of its own running (by PID) and no file in its temp folder, and
stays under the memory cap.

`run_contained` runs ``dflashkit.cli.<command>`` in a child (``hostile.cli``: it reports its own peak RSS) with
``TMPDIR`` set to a fresh folder and in a new session, so every process it starts — and anything those start —
carries the child's PID as its session id; after the exit, every process still in that session and every PID a
stand-in wrote to a ``*.pid`` file under ``pid_folder`` is looked up in /proc (a zombie counts as ended). A
The peak RSS is the child's own VmHWM, reported at exit; a child that dies of a signal reports none, and its
peak is then the largest VmRSS the watchdog sampled (every 50 ms). A ``signal_when`` file makes the run send a signal once that file appears (a stand-in writes it when it is busy),
so the signal lands in the offending step on any machine.

`check_contained` asserts all of it; the elapsed time is only compared with a generous bound meant to catch a hang
(the figure itself is no target).
"""

from __future__ import annotations

import hashlib
import os
import subprocess
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Iterable

import hostile
from interrupting import DEFAULT_SIGNALS
from standin_server import alive

#: a bounded loop (template, pattern, llama.cpp timeout) that has not ended by then is a hang: counted from the
#: command's start, so it also covers start-up on a busy machine; the bounds themselves are seconds
HANG_BOUND_S = 150.0


def fingerprint(paths: Iterable[Path]) -> dict[str, str]:
    """sha256 of every file under ``paths`` (a folder stands for its files; links followed, as a reader would)."""
    out: dict[str, str] = {}
    for p in paths:
        files = sorted(f for f in Path(p).rglob("*") if f.is_file()) if Path(p).is_dir() else [Path(p)]
        for f in files:
            h = hashlib.sha256()
            with open(f, "rb") as fh:
                while chunk := fh.read(1 << 20):
                    h.update(chunk)
            out[str(f)] = h.hexdigest()
    return out


def _session_members(sid: int) -> list[int]:
    pids = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[3]) == sid and fields[0] != "Z":  # fields after "comm)": state ppid pgrp session ...
            pids.append(int(entry.name))
    return pids


@dataclass
class Contained:
    argv: list[str]
    returncode: int
    stdout: str
    stderr: str
    peak_rss: int
    killed_over_cap: bool
    elapsed_s: float
    changed_inputs: list[str]
    left_running: list[int]
    left_in_tmp: list[str]
    extra: dict = field(default_factory=dict)

    def lines(self) -> list[str]:
        return [line for line in self.stderr.splitlines() if line.strip()]


def run_contained(command: str, args: list[str], *, inputs: Iterable[Path], tmp: Path,
                  pid_folder: Path | None = None,
                  signal_when: tuple[Path | Callable[[], bool], int] | None = None, group: bool = False,
                  env: dict[str, str] | None = None) -> Contained:
    """Run ``dflashkit.cli.<command> args`` contained (module doc); ``tmp`` must not exist yet. ``signal_when``:
    (a file that appears, or a condition, and the signal) — sent to the child, or with ``group`` to its whole
    process group, as a terminal's Ctrl-C is; ``extra["signalled_at"]`` is when, on the run's clock."""
    inputs = list(inputs)
    before = fingerprint(inputs)
    tmp.mkdir()
    env = {**os.environ, "TMPDIR": str(tmp), **(env or {})}
    argv = hostile.cli(command) + [str(a) for a in args]
    if signal_when is not None:  # from a terminal's dispositions, not the ignored ones a nohup'd run passes down
        argv[2] = DEFAULT_SIGNALS + argv[2]
    start = time.monotonic()
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env, start_new_session=True)
    killed = False
    sampled = [0]
    signalled: list[float | None] = [None]
    done = threading.Event()

    def watch() -> None:  # the memory cap's watchdog and the signal at the busy step
        nonlocal killed
        sent = signal_when is None
        while not done.wait(0.05):
            if not sent:
                when = signal_when[0]
                if when() if callable(when) else when.exists():
                    if group:
                        os.killpg(proc.pid, signal_when[1])
                    else:
                        proc.send_signal(signal_when[1])
                    signalled[0] = time.monotonic() - start
                    sent = True
            try:
                rss = next(int(line.split()[1]) * 1024 for line in Path(f"/proc/{proc.pid}/status").read_text()
                           .splitlines() if line.startswith("VmRSS:"))
            except (OSError, StopIteration):
                continue
            sampled[0] = max(sampled[0], rss)
            if rss > hostile.KILL_RSS:
                killed = True
                proc.kill()
            if time.monotonic() - start > 2 * HANG_BOUND_S:
                proc.kill()

    chunks: dict[str, list[bytes]] = {"out": [], "err": []}
    readers = [threading.Thread(target=lambda s=s, k=k: chunks[k].append(s.read()), daemon=True)
               for s, k in ((proc.stdout, "out"), (proc.stderr, "err"))]
    watcher = threading.Thread(target=watch, daemon=True)
    for t in (*readers, watcher):
        t.start()
    _, status, _usage = os.wait4(proc.pid, 0)
    elapsed = time.monotonic() - start
    proc.returncode = os.waitstatus_to_exitcode(status)
    done.set()
    for t in (*readers, watcher):
        t.join(timeout=30)
    stderr = b"".join(chunks["err"]).decode(errors="replace")
    hwm = [int(line[len(hostile.HWM_PREFIX):]) * 1024 for line in stderr.splitlines()
           if line.startswith(hostile.HWM_PREFIX)]
    stderr = "".join(line for line in stderr.splitlines(keepends=True) if not line.startswith(hostile.HWM_PREFIX))
    # what the command started ends with it: give the kernel a moment to deliver the last KILLs
    deadline = time.monotonic() + 10
    stand_ins = sorted(int(f.read_text()) for f in pid_folder.glob("*.pid")) if pid_folder else []
    while True:
        left = sorted({*_session_members(proc.pid), *(p for p in stand_ins if alive(p))})
        if not left or time.monotonic() > deadline:
            break
        time.sleep(0.1)
    after = fingerprint(inputs)
    # torch's own cache folder ($TMPDIR/torchinductor_$USER, made when transformers imports torch._dynamo and
    # reused by every torch program) is not a file of this run
    left_in_tmp = sorted(str(p.relative_to(tmp)) for p in tmp.rglob("*")
                         if not p.relative_to(tmp).parts[0].startswith("torchinductor_"))
    changed = sorted(k for k in before.keys() | after.keys() if before.get(k) != after.get(k))
    return Contained(argv, proc.returncode, b"".join(chunks["out"]).decode(errors="replace"), stderr,
                     hwm[-1] if hwm else sampled[0], killed, elapsed, changed, left,
                     left_in_tmp, {"stand_ins": stand_ins, "signalled_at": signalled[0], "pid": proc.pid})


def check_contained(run: Contained, code: int, message: str | None = None, *, bounded: bool = False) -> None:
    """Exit ``code``; for an error, one line starting ``error:`` that holds ``message``; inputs unchanged, nothing
    left running or in the temp folder, under the memory cap, and (``bounded``) ended within `HANG_BOUND_S`."""
    shown = run.stderr[-3000:]
    assert run.returncode == code, f"exit {run.returncode}, expected {code}: {shown}"
    assert "Traceback" not in run.stderr and "internal error" not in run.stderr, shown
    if message is not None:
        lines = run.lines()
        assert len(lines) == 1 and lines[0].startswith("error: ") and message in lines[0], shown
        assert "\x1b" not in lines[0], "an escape sequence reached the terminal"
    assert run.changed_inputs == [], f"inputs modified: {run.changed_inputs}"
    assert run.left_running == [], f"processes left running: {run.left_running}"
    assert run.left_in_tmp == [], f"left in the temp folder: {run.left_in_tmp}"
    assert not run.killed_over_cap and run.peak_rss < hostile.CAP_BYTES, f"peak RSS {run.peak_rss / 2**20:.0f} MiB"
    if bounded:
        assert run.elapsed_s < HANG_BOUND_S, f"ran {run.elapsed_s:.0f} s"
