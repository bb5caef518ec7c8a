"""llama_cpp.process: a signal that lands inside Popen's waitpid lock must not hang the stop that follows.

``Popen.wait`` / ``poll`` take ``_waitpid_lock`` with ``acquire()`` before the ``try`` that releases it; a TERM / HUP
handler that raises right after the acquire (CPython checks for signals when the call returns) leaves the lock held,
and the ``wait()`` in the unwinding ``stop`` then blocks for ever — a dflash-accept hung that way in one of eight
runs of the round-3 HUP test on a busy machine. The child below makes the race certain: Popen's lock sends the
process a HUP the moment it has been acquired, inside ``run_bounded`` waiting for a llama.cpp stand-in that sleeps.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from interrupting import DEFAULT_SIGNALS  # a nohup'd run passes HUP down ignored: start from a terminal's

ROOT = Path(__file__).resolve().parents[1]

SCRIPT = DEFAULT_SIGNALS + r"""
import subprocess, sys, threading, types
from dflashkit.files import signals_unwind
from dflashkit.llama_cpp.process import run_bounded

pidfile, acquires_before_the_signal = sys.argv[1], int(sys.argv[2])
real_lock = threading.Lock
count = [0]

class SignallingLock:
    # Popen's _waitpid_lock: once the stand-in runs, the chosen acquire succeeds and HUP arrives (handled as the call
    # returns, before Popen's try)
    def __init__(self):
        self._lock = real_lock()
    def acquire(self, *args, **kwargs):
        got = self._lock.acquire(*args, **kwargs)
        import os
        if got and os.path.exists(pidfile):
            count[0] += 1
        if got and count[0] == acquires_before_the_signal:
            import os, signal
            os.kill(os.getpid(), signal.SIGHUP)
        return got
    def release(self):
        self._lock.release()
    def locked(self):
        return self._lock.locked()
    __enter__ = acquire
    def __exit__(self, *exc):
        self.release()

subprocess.threading = types.SimpleNamespace(**{**vars(threading), "Lock": SignallingLock})
# the pid file appears whole (written aside, then renamed): the lock above signals once it exists, and a file
# created empty and written a moment later let the run end before the pid was in it
sleeper = [sys.executable, "-c", f"import os, time; open({pidfile!r} + '.part', 'w').write(str(os.getpid())); "
           f"os.replace({pidfile!r} + '.part', {pidfile!r}); time.sleep(600)"]
with signals_unwind():
    run_bounded(sleeper, timeout=300)
"""


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return Path(f"/proc/{pid}").exists() and "Z" not in Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1][:3]


def test_a_hup_inside_popens_wait_lock_ends_the_run_and_its_child(tmp_path: Path) -> None:
    for acquires in (1, 3):  # the first poll once the stand-in runs, and one a few polls later
        pidfile = tmp_path / f"sleeper-{acquires}.pid"
        proc = subprocess.Popen([sys.executable, "-c", SCRIPT, str(pidfile), str(acquires)],
                                env={**os.environ, "PYTHONPATH": str(ROOT)}, stderr=subprocess.PIPE, text=True)
        try:
            # a bound only for the test's sake: the run ends in about a second, a hang never does
            _, err = proc.communicate(timeout=120)
        except subprocess.TimeoutExpired:
            proc.kill()
            raise AssertionError(f"still running 120 s after HUP #{acquires}: the wait lock was left held")
        assert proc.returncode == -signal.SIGHUP, err
        sleeper = int(pidfile.read_text())
        deadline = time.monotonic() + 10
        while _alive(sleeper) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert not _alive(sleeper), f"the llama.cpp stand-in {sleeper} outlived the run"
