"""Signals around work that must not be cut short: `signals_unwind` turns TERM / HUP into an unwinding exception
(``finally`` clauses run, then the process dies of the signal), `signals_deferred` holds Ctrl-C / TERM / HUP back
over a few lines that take locks a signal must not split.
"""

from __future__ import annotations

import contextlib
import os
import signal
import threading
from typing import Any, Iterator

_SIGNALS = tuple(s for s in (getattr(signal, "SIGTERM", None), getattr(signal, "SIGHUP", None)) if s is not None)


class _Terminated(BaseException):
    """SIGTERM/SIGHUP during a write: unwinds like KeyboardInterrupt so the temp file is removed."""

    def __init__(self, signum: int) -> None:
        super().__init__(signum)
        self.signum = signum


def _raise_terminated(signum: int, _frame: Any) -> None:
    raise _Terminated(signum)


@contextlib.contextmanager
def signals_unwind() -> Iterator[None]:
    """TERM / HUP unwind the block like Ctrl-C (its ``finally`` clauses run: temp files removed, children
    stopped), then the process dies of the signal as it would have (exit status 128 + signal)."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = {}
    for s in _SIGNALS:
        if signal.getsignal(s) in (signal.SIG_DFL, None):  # leave handlers someone else installed alone
            previous[s] = signal.signal(s, _raise_terminated)
    try:
        yield
    except _Terminated as exc:
        if not previous:  # an outer level installed the handlers: let it finish unwinding (its temp folders too)
            raise
        for s, h in previous.items():
            signal.signal(s, h)
        previous = {}
        signal.signal(exc.signum, signal.SIG_DFL)
        os.kill(os.getpid(), exc.signum)  # die of the signal, as without us (exit status 128+sig)
        raise  # not reached where the default action terminates
    finally:
        for s, h in previous.items():
            signal.signal(s, h)


_DEFERRED = tuple(s for s in (signal.SIGINT, *_SIGNALS))


@contextlib.contextmanager
def signals_deferred() -> Iterator[None]:
    """Hold Ctrl-C / TERM / HUP back while a few lines take locks that a signal must not split.

    ``with lock:`` is not signal-safe: an exception raised between the acquire and the block leaves the lock held
    (CPython bpo-29988). ``ThreadPoolExecutor.submit`` takes the module's ``_global_shutdown_lock`` that way, and
    ``threading._shutdown`` takes it again at exit — so a Ctrl-C landing inside a submit hung the interpreter at
    exit (the quantizer's pool: issue 26). Blocking the signal mask is no help: a pool thread takes the signal and
    the main thread runs the handler anyway. So the handlers only record it here, and it is raised on leaving."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    got: list[int] = []
    previous = {s: signal.signal(s, lambda signum, _frame: got.append(signum))
                for s in _DEFERRED if signal.getsignal(s) is not None}  # None: a C handler, left alone
    try:
        yield
    finally:
        for s, h in previous.items():
            signal.signal(s, h)
        for signum in got[:1]:  # the first one, through the handler that was in place
            handler = previous[signum]
            if callable(handler):
                handler(signum, None)
            elif handler == signal.SIG_DFL:
                os.kill(os.getpid(), signum)


#: how long a Ctrl-C that landed inside an import waits before it is delivered again
_REDELIVER_S = 0.01


def _interrupt_outside_imports(signum: int, frame: Any) -> None:
    """Ctrl-C as Python's own handler raises it — except inside importlib's bootstrap. There a KeyboardInterrupt can
    land in a module lock's weakref callback, which CPython ignores ("Exception ignored in … _get_module_lock …
    cb") while the global import lock stays held: every later import, in any thread, then hangs (a background
    thread importing numba while a write runs made ``dflash-quantize`` hang on Ctrl-C now and then). Such a signal is
    sent again a moment later, until it lands outside an import."""
    f = frame
    while f is not None:
        if f.f_code.co_filename.startswith("<frozen importlib"):
            timer = threading.Timer(_REDELIVER_S, os.kill, (os.getpid(), signum))
            timer.daemon = True
            timer.start()
            return
        f = f.f_back
    raise KeyboardInterrupt


def install_interrupt_handler() -> None:
    """`_interrupt_outside_imports` for Ctrl-C, where Python's default handler is in place (an ignored SIGINT — under
    nohup, a background job — stays ignored; another program's handler stays)."""
    if threading.current_thread() is threading.main_thread() and \
            signal.getsignal(signal.SIGINT) is signal.default_int_handler:
        signal.signal(signal.SIGINT, _interrupt_outside_imports)
