"""Reading a release folder's files without reading anything else.

A name from ``release.json`` or ``SHA256SUMS`` is a base name in OUTDIR or nothing: no path (``../../etc/passwd``,
``/etc/shadow``), no link (``README.md`` → a ``.env`` would have its first line printed), no FIFO or device (opened
``O_NOFOLLOW | O_NONBLOCK``, then checked to be a regular file by ``fstat`` of what was opened), and read up to a
bound (a 3 GB ``SHA256SUMS`` is refused at its size, not read into memory).
"""

from __future__ import annotations

import hashlib
import os
import stat
from pathlib import Path


class NotInside(Exception):
    """The name is not a regular file of the folder (the message says what it is)."""


def _base_name(name: str) -> bool:
    return bool(name) and name not in (".", "..") and "/" not in name and "\x00" not in name and len(name) <= 255


def open_inside(folder: Path, name: str) -> tuple[int, os.stat_result]:
    """``folder/name`` opened for reading — a regular file there, not through a link — with its ``fstat``."""
    if not _base_name(name):
        raise NotInside("not a file name in the release folder (a path)")
    try:
        fd = os.open(folder / name, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0))
    except FileNotFoundError:
        raise NotInside("missing") from None
    except OSError as exc:
        if os.path.islink(folder / name):
            raise NotInside("a symbolic link, not a file of the release") from None
        raise NotInside(f"cannot be read ({exc.strerror or exc})") from None
    st = os.fstat(fd)
    if not stat.S_ISREG(st.st_mode):
        os.close(fd)
        raise NotInside("not a regular file")
    return fd, st


def read_inside(folder: Path, name: str, max_bytes: int) -> bytes:
    fd, st = open_inside(folder, name)
    try:
        if st.st_size > max_bytes:
            raise NotInside(f"{st.st_size} bytes, over the {max_bytes} a release writes there")
        with os.fdopen(fd, "rb", closefd=False) as f:
            data = f.read(max_bytes + 1)
    finally:
        os.close(fd)
    if len(data) > max_bytes:
        raise NotInside(f"over the {max_bytes} bytes a release writes there")
    return data


def sha256_inside(folder: Path, name: str, size: int | None = None) -> str:
    """sha256 of ``folder/name``; with ``size`` (what the record says), a file of another size is refused before a
    byte is read (a 1 TB sparse file is not hashed for a mismatch its size already shows)."""
    fd, st = open_inside(folder, name)
    try:
        if size is not None and st.st_size != size:
            raise NotInside(f"{st.st_size} bytes where the record says {size}")
        h = hashlib.sha256()
        with os.fdopen(fd, "rb", closefd=False) as f:
            while chunk := f.read(1 << 20):
                h.update(chunk)
        return h.hexdigest()
    finally:
        os.close(fd)
