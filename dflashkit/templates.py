"""A chat template rendered as the untrusted code it is: under a time limit, a memory budget and an output limit.

A template is Jinja run by transformers' sandbox, which stops attribute tricks but not work: a loop can run for
hours and ``'x' * 10**10`` allocates 10 GB. `render_bounded` gives one render

- ``TEMPLATE_TIMEOUT_S`` seconds (a SIGALRM timer, where it runs in the main thread: Jinja renders in Python, so the
  timer interrupts it);
- ``TEMPLATE_MEMORY_BYTES`` of address space beyond what the process has mapped when it starts (``RLIMIT_AS``,
  lowered for the render and restored after it, on systems that enforce it): an allocation past it is a
  ``MemoryError`` inside the template instead of gigabytes taken from a shared machine;
- ``max_bytes`` of text.

Any failure inside is one line naming where. Used for every render of a target's template (``dflash-accept``'s
prompts, the runtime's plain prompts).
"""

from __future__ import annotations

import contextlib
import signal
import threading
from typing import Any, Callable, Iterator

from .errors import DFlashError

#: the longest a chat template may take to render one prompt (a template is code: its loops can be unbounded)
TEMPLATE_TIMEOUT_S = 10.0
#: the address space one render may add (a real template renders a prompt in kilobytes)
TEMPLATE_MEMORY_BYTES = 512 << 20
#: the longest text one render may produce
TEMPLATE_TEXT_BYTES = 1 << 20


class _TemplateTimeout(BaseException):
    """Raised by the timer inside a render: a BaseException, so no ``except Exception`` in the template's code or
    in transformers swallows it."""


def _alarm(signum: int, frame: Any) -> None:
    raise _TemplateTimeout


def _mapped_bytes() -> int | None:
    try:
        with open("/proc/self/status", encoding="ascii") as f:
            return next(int(line.split()[1]) * 1024 for line in f if line.startswith("VmSize:"))
    except (OSError, StopIteration, ValueError):
        return None


@contextlib.contextmanager
def _memory_budget(extra: int) -> Iterator[None]:
    """``RLIMIT_AS`` at what is mapped now + ``extra`` for the block, where that lowers it; else nothing."""
    try:
        import resource
    except ImportError:  # not POSIX
        yield
        return
    mapped = _mapped_bytes()
    soft, hard = resource.getrlimit(resource.RLIMIT_AS)
    limit = None if mapped is None else mapped + extra
    if limit is None or (soft != resource.RLIM_INFINITY and soft <= limit) or \
            (hard != resource.RLIM_INFINITY and hard < limit):
        yield
        return
    try:
        resource.setrlimit(resource.RLIMIT_AS, (limit, hard))
    except (OSError, ValueError):
        yield
        return
    try:
        yield
    finally:
        resource.setrlimit(resource.RLIMIT_AS, (soft, hard))


def render_bounded(render: Callable[[], Any], where: str, timeout: float = TEMPLATE_TIMEOUT_S, *,
                   memory: int = TEMPLATE_MEMORY_BYTES, max_bytes: int = TEMPLATE_TEXT_BYTES) -> str:
    """``render()`` (a chat template) under a time limit, a memory budget and an output-size limit (module doc);
    any failure inside it is one line naming ``where``."""
    armed = threading.current_thread() is threading.main_thread() and hasattr(signal, "setitimer") \
        and signal.getsignal(signal.SIGALRM) in (signal.SIG_DFL, None)
    previous = signal.signal(signal.SIGALRM, _alarm) if armed else None
    try:
        if armed:
            signal.setitimer(signal.ITIMER_REAL, timeout)
        with _memory_budget(memory):
            text = render()
    except _TemplateTimeout:
        raise DFlashError(f"{where} did not finish rendering in {timeout:g} s (a loop in the template?)") from None
    except MemoryError:
        raise DFlashError(f"{where} needed over {memory >> 20} MiB of memory to render (a string or list "
                          "multiplied in the template?)") from None
    except (DFlashError, KeyboardInterrupt):
        raise
    except Exception as exc:  # noqa: BLE001 - a template is the target's code: its failure is bad input
        message = " ".join(str(exc).split())[:300] or type(exc).__name__
        raise DFlashError(f"{where} failed: {type(exc).__name__}: {message}") from None
    finally:
        if armed:
            try:
                signal.setitimer(signal.ITIMER_REAL, 0)
            except _TemplateTimeout:  # fired just as the render ended: the render is done, the text is kept
                pass
            signal.signal(signal.SIGALRM, previous)
    if not isinstance(text, str):
        raise DFlashError(f"{where} rendered a {type(text).__name__}, not text")
    if len(text.encode("utf-8", "surrogatepass")) > max_bytes:
        raise DFlashError(f"{where} rendered over {max_bytes >> 10} KiB of text for one prompt")
    return text
