"""One way to run a llama.cpp program: its extra arguments checked, its crash named, never left behind.

Every llama.cpp process dflashkit starts (``llama-speculative-simple``, ``llama-server``) goes through here:

- ``--llama-cpp-arg ARG`` (`check_extra_args`) adds arguments the user needs on their machine (``--no-repack``,
  ``-fa on``…); an argument that would replace one dflashkit sets (the models, the port, the prompt, the
  speculative settings it measures) is a usage error, never silently overridden or doubled.
- A child that dies by a signal is a crash, not a refusal (`describe_exit`): "crashed (SIGSEGV) while loading",
  with its last lines, and on an x86 CPU with AMX the hint to pass ``--no-repack`` (ggml's AMX repack of K-quant
  weights is the known crash there: ggml-org/llama.cpp#20824).
- The child leads its own process group; `stop` signals the group, so what a child starts (a build that forks, a
  hostile script's grandchild) ends with it, whether the child is stopped or has ended by itself.
- On Linux the child gets ``PR_SET_PDEATHSIG`` (SIGKILL): if dflashkit itself is killed — even by SIGKILL, where no
  handler runs — the kernel ends the child, so no server is left bound to a port. TERM and HUP unwind
  (`dflashkit.files.signals_unwind`), so the ``finally`` that stops the child runs before the process dies of the
  signal.
"""

from __future__ import annotations

import collections
import ctypes
import ctypes.util
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any, Sequence

from ..errors import DFlashError, UsageError
from ..files import signals_deferred
from ..drafters import open_drafter
from ..families.base import DrafterFamily

#: the arguments dflashkit sets itself on a llama.cpp command line: the measurement depends on them
RESERVED_ARGS = frozenset({
    "-m", "--model", "-md", "--model-draft", "--spec-draft-model", "--port", "--host", "-p", "--prompt", "-f",
    "--file", "-n", "--n-predict", "--predict", "--spec-type", "--spec-draft-n-max", "--spec-draft-n-min",
    "--spec-draft-p-min", "--draft-p-min", "--draft-max", "--draft", "--draft-n", "--draft-min", "-ctkd", "-ctvd",
    "--cache-type-k-draft", "--cache-type-v-draft", "--spec-draft-type-k", "--spec-draft-type-v", "-c",
    "--ctx-size", "-np", "--parallel", "-t", "--threads", "-b", "--batch-size", "-ub", "--ubatch-size", "--temp",
    "--temperature", "--top-k", "--seed", "-s", "--ignore-eos", "--no-escape", "-e", "--escape", "-hf", "-hfr",
    "--hf-repo", "-hfd", "-hfrd", "--hf-repo-draft", "--spec-draft-hf", "-mu", "--model-url", "--api-key",
    "--api-key-file", "--path", "--api-prefix", "--spec-synth-len", "--spec-synth-rates", "--spec-default",
    "--verbose", "-v", "-lv", "--verbosity", "--log-disable", "--log-file",
})
#: the longest tail of a crashed process's output quoted in its message
CRASH_TAIL_LINES = 3


def check_extra_args(args: Sequence[str]) -> list[str]:
    """``--llama-cpp-arg`` values as a list, or a usage error naming the one that would replace dflashkit's own."""
    out = []
    for arg in args:
        if not isinstance(arg, str) or not arg or "\x00" in arg:
            raise UsageError(f"--llama-cpp-arg {arg!r}: give a non-empty argument")
        flag = arg.split("=", 1)[0]
        if flag.startswith("--"):  # llama.cpp reads --a_b as --a-b
            flag = flag.replace("_", "-")
        if flag in RESERVED_ARGS:
            raise UsageError(f"--llama-cpp-arg {arg}: dflashkit sets {flag} itself (the models, port, prompt and "
                             "speculative settings it measures); use its own options instead")
        out.append(arg)
    return out


def cpu_has_amx() -> bool:
    """An x86 CPU with AMX tiles (ggml repacks K-quant weights for it, the known crash: module doc)."""
    try:
        with open("/proc/cpuinfo", encoding="ascii", errors="replace") as f:
            return any(line.startswith("flags") and " amx_tile" in line for line in f)
    except OSError:
        return False


def signal_name(returncode: int) -> str | None:
    """SIGSEGV for a child that died of signal 11 (``returncode`` −11), None for a normal exit."""
    if returncode >= 0:
        return None
    try:
        return signal.Signals(-returncode).name
    except ValueError:
        return f"signal {-returncode}"


def last_lines(output: str, n: int = CRASH_TAIL_LINES, width: int = 300) -> str:
    """The last ``n`` non-empty lines joined on one line, each cut to ``width`` characters (a build's one line can
    be megabytes)."""
    lines = [line.strip() for line in output.splitlines() if line.strip()]
    cut = [line if len(line) <= width else line[:width] + "…" for line in lines[-n:]]
    return " | ".join(cut) if cut else "no output"


class LlamaCppCrashed(DFlashError):
    """A llama.cpp process died by a signal (a crash in llama.cpp, not a verdict on the file)."""


def crash_message(program: str, returncode: int, output: str, phase: str, extra_args: Sequence[str] = ()) -> str:
    """``llama-server crashed (SIGSEGV) while loading: <last lines>`` (+ the AMX hint where it applies)."""
    name = signal_name(returncode) or f"exit {returncode}"
    message = f"{program} crashed ({name}) while {phase}: {last_lines(output)}"
    if cpu_has_amx() and "--no-repack" not in extra_args:
        message += (" — this CPU has AMX, where ggml's weight repacking is known to crash on K-quants: "
                    "try --llama-cpp-arg --no-repack")
    return message


def _load_prctl() -> Any:
    """libc's prctl, loaded once here: the child only calls it (no library search between fork and exec)."""
    if not sys.platform.startswith("linux"):
        return None
    try:
        return ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True).prctl
    except (OSError, AttributeError):
        return None


_PRCTL = _load_prctl()


def child_setup() -> None:  # runs in the child between fork and exec
    os.setpgid(0, 0)  # its own process group: stop() ends its descendants with it
    if _PRCTL is not None:
        _PRCTL(1, signal.SIGKILL)  # PR_SET_PDEATHSIG: the kernel ends the child if dflashkit dies


def popen(cmd: Sequence[str], **kwargs: object) -> subprocess.Popen:
    """``subprocess.Popen`` for a llama.cpp program: no stdin, its own process group (so `stop` ends whatever it
    starts too), and killed with us on Linux (module doc)."""
    if os.name == "posix":
        kwargs.setdefault("preexec_fn", child_setup)
    try:
        return subprocess.Popen(list(cmd), stdin=subprocess.DEVNULL, **kwargs)  # type: ignore[call-overload]
    except OSError as exc:
        raise DFlashError(f"{cmd[0]}: cannot run it ({exc.strerror or exc}) — is it a llama.cpp build for this "
                          "machine?") from None


def spec_type_of(drafter_gguf: str | os.PathLike) -> str:
    """llama.cpp's ``--spec-type`` for a drafter file, as its family declares it (a Markov head: the DSpark type,
    the rule llama.cpp itself detects the type by, ``common_speculative_types_from_gguf``)."""
    try:
        with open_drafter(drafter_gguf) as drafter:
            family = drafter.family
    except (OSError, DFlashError):
        family = None  # llama.cpp reports what is wrong with the file
    return family.llama_cpp_spec_type if family is not None else DrafterFamily.llama_cpp_spec_type


def poll_child(proc: subprocess.Popen) -> int | None:
    """``proc.poll()`` that a signal cannot split. Popen's poll and wait take their waitpid lock with ``acquire()``
    before the ``try`` that releases it (CPython bpo-29988): a TERM / HUP / Ctrl-C raised in between leaves the lock
    held, and the next wait — `stop`'s own — blocks for ever (seen: a HUP while llama.cpp ran hung dflash-accept in
    one of eight runs of its test on a busy machine). The signal is held back for the poll and raised right after it."""
    with signals_deferred():
        return proc.poll()


def wait_child(proc: subprocess.Popen, timeout: float | None) -> int | None:
    """``proc.wait(timeout)`` built on `poll_child`: the exit status, or None when ``timeout`` seconds passed."""
    deadline = None if timeout is None else time.monotonic() + timeout
    delay = 0.001
    while (code := poll_child(proc)) is None:
        if deadline is not None and time.monotonic() >= deadline:
            return None
        time.sleep(delay)  # a signal lands here (or in the poll's deferral), never inside Popen's lock
        delay = min(delay * 2, 0.05)
    return code


def _signal_group(proc: subprocess.Popen, signum: int) -> None:
    """``signum`` to the child's process group (`child_setup` made it the leader); nothing left there is fine."""
    if os.name != "posix":
        if poll_child(proc) is None:
            proc.kill()
        return
    try:
        os.killpg(proc.pid, signum)
    except (ProcessLookupError, PermissionError):
        pass


def stop(proc: subprocess.Popen, grace_s: float = 5.0) -> None:
    """TERM to the child's process group, then KILL after ``grace_s``; always reaped. Whatever the child started
    and left running in its group (a build that forks a helper, a hostile script) is killed too, also when the
    child itself has already ended. The group outlives its leader only while a member lives, so its id cannot
    name another process's group here."""
    if poll_child(proc) is None:
        _signal_group(proc, signal.SIGTERM)
        if wait_child(proc, grace_s) is None:
            _signal_group(proc, signal.SIGKILL)
            wait_child(proc, None)
    _signal_group(proc, signal.SIGKILL)


def executable(bin_dir: str | os.PathLike, name: str, option: str, target: str) -> Path:
    """``BIN_DIR/name``, or a usage error saying what to pass."""
    path = Path(bin_dir) / name
    if not path.is_file() or not os.access(path, os.X_OK):
        raise UsageError(f"{option} {bin_dir}: no executable {name} there — give the bin/ folder of a llama.cpp "
                         f"build (cmake --build BUILD --target {target})")
    return path


#: what is kept of a llama.cpp program's stderr: its first and its last bytes (load errors come first, the counts
#: and the last lines last); whatever a chatty or hostile build prints in between is read and dropped
HEAD_BYTES = 1 << 20
TAIL_BYTES = 4 << 20


def run_bounded(cmd: Sequence[str], *, timeout: float, env: dict[str, str] | None = None) -> tuple[int, str]:
    """Run ``cmd`` (in ``env``) to its end: (exit status, its stderr kept bounded — head and tail). stdout is not
    kept. On a timeout, an error or a signal the child is stopped before the exception goes on."""
    proc = popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, env=env)
    head = bytearray()
    tail: collections.deque[bytes] = collections.deque()
    state = {"tail": 0, "dropped": False}

    def read() -> None:
        assert proc.stderr is not None
        while chunk := proc.stderr.read1(1 << 16):
            if len(head) < HEAD_BYTES:
                take = HEAD_BYTES - len(head)
                head.extend(chunk[:take])
                chunk = chunk[take:]
            if chunk:
                tail.append(chunk)
                state["tail"] += len(chunk)
                while state["tail"] - len(tail[0]) >= TAIL_BYTES:
                    state["tail"] -= len(tail.popleft())
                    state["dropped"] = True

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    try:
        if wait_child(proc, timeout) is None:
            raise subprocess.TimeoutExpired(list(cmd), timeout)
    finally:  # on a timeout, an error or a signal, and after a normal end (what it left running in its group)
        stop(proc)
        reader.join(timeout=5)
        if proc.stderr is not None and not reader.is_alive():
            proc.stderr.close()
    text = bytes(head) + (b"\n[...]\n" if state["dropped"] else b"") + b"".join(tail)
    return proc.returncode, text.decode("utf-8", "replace")
