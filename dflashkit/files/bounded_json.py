"""Reading JSON bounded: `read_json` refuses (one line naming the file) a FIFO, an oversized file, too many
objects/arrays (`MAX_JSON_CONTAINERS`, counted in one pass by `json_container_count`), bad UTF-8 or bad JSON,
and nesting too deep.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from ..errors import DFlashError
from .checks import file_kind

#: objects + arrays one JSON document may hold. A real tokenizer.json (the largest JSON dflashkit reads, 150 k–500 k
#: merges) stays far below; 60 MB of ``[{}, {}, ...]`` is 15 M objects and ~2.9 GB of Python objects.
MAX_JSON_CONTAINERS = 4_000_000


def json_container_count(raw: bytes) -> int:
    """An upper bound of the objects and arrays in ``raw`` (brackets inside strings count too), in one pass of C."""
    return raw.count(b"{") + raw.count(b"[")


def read_bounded(path: str | os.PathLike[str], limit: int) -> bytes:
    """Up to ``limit + 1`` bytes of ``path`` (more than ``limit``: the caller's "too large"). Opened non-blocking, so
    a FIFO nobody writes to never blocks the open, then read blocking: a pipe whose writer is still writing is read
    to its end, one with no writer reads as empty. OSError (a missing file…) is the caller's to word."""
    fd = os.open(path, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0))
    if hasattr(os, "set_blocking"):
        os.set_blocking(fd, True)
    with open(fd, "rb") as f:
        return f.read(limit + 1)


def read_json(path: str | os.PathLike[str], *, hint: str = "", max_bytes: int = 64 << 20) -> Any:
    """The JSON document in ``path``; a one-line DFlashError ``PATH: cannot read JSON (reason)HINT``
    for a missing/unreadable/oversized file, bad UTF-8, bad JSON, or nesting too deep."""
    p = Path(path)
    try:
        if not p.is_file() and os.path.lexists(p):  # opening a FIFO blocks until a writer comes: never open one
            raise DFlashError(f"{p}: cannot read JSON (it is {file_kind(p)}, not a file){hint}")
        size = p.stat().st_size
        if size > max_bytes:
            raise DFlashError(f"{p}: cannot read JSON (file of {size} bytes, over {max_bytes}){hint}")
        with open(p, "rb") as f:
            raw = f.read(max_bytes + 1)
        if (n := json_container_count(raw)) > MAX_JSON_CONTAINERS:
            raise DFlashError(f"{p}: cannot read JSON ({n} objects/arrays, over the cap of {MAX_JSON_CONTAINERS}; "
                              f"no config or tokenizer has that many){hint}")
        return json.loads(raw.decode("utf-8"))
    except DFlashError:
        raise
    except RecursionError:
        raise DFlashError(f"{p}: cannot read JSON (nested too deeply){hint}") from None
    except (OSError, ValueError) as exc:  # JSONDecodeError, UnicodeDecodeError, over-long integers
        reason = (str(exc).splitlines() or [type(exc).__name__])[0][:200]
        raise DFlashError(f"{p}: cannot read JSON ({reason}){hint}") from None
