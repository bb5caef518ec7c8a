"""A stdout that cannot take what a command prints — closed at start-up (``>&-``), a full device (``> /dev/full``), a
pipe closed early (``| head -c 0``): each is one ``error:`` line and exit 1, never an internal error, never a report
lost with exit 0. Where the command's result is a file (OUT, the -o report, a release folder), it is complete before
anything is printed: the error says it is kept. Without anything for stdout (-q, or the report in -o FILE) a closed
stdout is no error."""

from __future__ import annotations

import errno
import io
import os
import sys
from typing import Any, Callable, TypeGuard

import click

from ..bounds import dumps
from ..errors import DFlashError
from ..files import write_text_atomic

#: the errors of a write to a stdout that cannot take it: a full device, an I/O error, a closed descriptor or pipe
STDOUT_ERRNOS = (errno.ENOSPC, errno.EIO, errno.EBADF, errno.EPIPE)
#: how a command without a report file (-o) can keep stdout out of its way
REDIRECT_OR_QUIET = "redirect stdout to a file, or use -q"


class StdoutClosedError(OSError):
    """A write to the stdout of a program started with it closed."""


class _ClosedStdout(io.TextIOBase):
    """``sys.stdout`` of a program started with descriptor 1 closed. Python leaves None there, and click.echo drops
    what it is given: a report vanished with exit 0. A write raises instead, as on a full device."""

    encoding = "utf-8"  # click.echo takes a text stream with an encoding as it is
    errors = "strict"

    def writable(self) -> bool:
        return True

    def write(self, text: Any) -> int:
        if not text:  # click probes a stream with an empty write
            return 0
        raise StdoutClosedError(errno.EBADF, "stdout is closed")


def guard_closed_stdout() -> None:
    """Run first in every command (`common.DFlashCommand.main`). Descriptor 1 is held on /dev/null as well: the next
    file opened would otherwise get it, and a child process (llama-server) would write its output into that file."""
    if sys.stdout is not None:
        return
    try:
        os.fstat(1)
    except OSError:
        held = os.open(os.devnull, os.O_WRONLY)
        if held != 1:
            os.dup2(held, 1)
            os.close(held)
    sys.stdout = sys.__stdout__ = _ClosedStdout()


class _DiagnosticsStderr(io.TextIOBase):
    """``sys.stderr`` when it cannot take a write (``2>/dev/full``, a closed pipe): progress, warnings and errors are
    dropped, the exit code still tells — a full stderr stopped a run at its first progress line."""

    def __init__(self, stream: Any) -> None:
        self.stream = stream

    @property
    def encoding(self) -> str:  # type: ignore[override]
        return getattr(self.stream, "encoding", None) or "utf-8"

    @property
    def errors(self) -> str:  # type: ignore[override]
        return getattr(self.stream, "errors", None) or "strict"

    def writable(self) -> bool:
        return True

    def isatty(self) -> bool:
        return bool(getattr(self.stream, "isatty", lambda: False)())

    def write(self, text: Any) -> int:
        try:
            return self.stream.write(text)
        except OSError as exc:
            if exc.errno not in STDOUT_ERRNOS:
                raise
            return len(text)

    def flush(self) -> None:
        try:
            self.stream.flush()
        except OSError as exc:
            if exc.errno not in STDOUT_ERRNOS:
                raise

    def fileno(self) -> int:
        return self.stream.fileno()


def guard_stderr() -> None:
    """Run first in every command, with `guard_closed_stdout`: a stderr that cannot take a line never ends a run."""
    if sys.stderr is not None and not isinstance(sys.stderr, _DiagnosticsStderr):
        sys.stderr = _DiagnosticsStderr(sys.stderr)


def is_stdout_error(exc: BaseException) -> TypeGuard[OSError]:
    return isinstance(exc, OSError) and exc.errno in STDOUT_ERRNOS


def silence_stdout() -> None:
    """Point stdout at /dev/null: the interpreter's own flush at exit must not fail a second time."""
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        os.close(devnull)
    except (OSError, AttributeError, ValueError):  # (the closed stdout has no descriptor, nor anything buffered)
        pass


def stdout_lost(exc: OSError, *, report: bool, fix: str | None = None) -> str:
    """The one line for what a command printed and stdout did not take. ``report``: the command has -o FILE for it;
    ``fix``: how else to keep stdout out of the way (default: -o FILE for a report, else a redirect or -q)."""
    silence_stdout()
    fix = fix or ("write it with -o FILE" if report else REDIRECT_OR_QUIET)
    if isinstance(exc, StdoutClosedError):
        return f"stdout is closed: the {'report' if report else 'output'} has nowhere to go; {fix}"
    if exc.errno == errno.EPIPE:
        return f"stdout was closed before the output was written (broken pipe); {fix}"
    return f"cannot write the output ({exc.strerror or exc}): is stdout a full device or closed? {fix}"


def print_summary(text: str, done: str, fix: str = REDIRECT_OR_QUIET) -> None:
    """Print the summary of a result that is already complete on disk; ``done`` says what is (``OUT is written and
    complete (kept)``). A stdout that cannot take it is one error line that says so, and how to avoid it."""
    try:
        write_stdout(text + "\n")
    except OSError as exc:
        if not is_stdout_error(exc):
            raise
        silence_stdout()
        why = ("stdout is closed" if isinstance(exc, StdoutClosedError) else
               "broken pipe: the reader of stdout stopped" if exc.errno == errno.EPIPE else
               f"{exc.strerror or exc} on stdout")
        raise DFlashError(f"{done}, but its summary could not be printed ({why}) — {fix}") from None


def write_stdout(text: str) -> None:
    """``text`` onto stdout in full, or an OSError. With ``PYTHONUNBUFFERED`` set (common in containers) sys.stdout
    writes straight to the descriptor, and CPython's text layer ignores a short write: a pipe whose reader leaves
    after the first 64 KiB took the rest of a report silently, exit 0. The bytes go through ``os.write`` until all
    are taken instead; a stream without a descriptor (a test runner's, a closed stdout) gets click's echo."""
    stream = sys.stdout
    try:
        fd = stream.fileno()
    except (AttributeError, OSError, ValueError):
        click.echo(text, nl=False)
        return
    stream.flush()
    view = memoryview(text.encode(getattr(stream, "encoding", None) or "utf-8",
                                  getattr(stream, "errors", None) or "strict"))
    while view:
        view = view[os.write(fd, view):]


def emit(text: str, output: str | None, force: bool, quiet: bool, status: str, prog: str) -> None:
    """The report on stdout (a stdout that cannot take it: `stdout_lost`), or into -o FILE with a 'wrote' line on
    stderr (unless -q)."""
    if output is None:
        write_stdout(text if text.endswith("\n") else text + "\n")
        return
    write_text_atomic(output, text, force=force)
    if not quiet:
        click.echo(f"{prog}: wrote {output} — {status}", err=True)


def echo_written(result: Any, as_json: bool, quiet: bool, line: Callable[[dict[str, Any]], str]) -> None:
    """A file-writing command's result (convert, quantize): its JSON, or one line built from it (nothing with -q)."""
    summary = result.to_json()
    if as_json:  # the JSON is what was asked for: -q does not drop it
        print_summary(dumps(summary, indent=2), f"{result.out} is written and complete (kept)",
                      "redirect stdout to a file")
    elif not quiet:
        print_summary(line(summary), f"{result.out} is written and complete (kept)")
