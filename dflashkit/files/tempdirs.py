"""Temporary folders that a killed process cannot leave for ever.

Every temporary folder dflashkit makes is named ``dflashkit-<kind>-<pid>-<random>`` and holds a marker file naming
that PID (`make_temp_dir`); it is removed when its work ends. SIGKILL runs no clean-up, so each command's start
removes the stale ones (`remove_stale`): a folder of this user, in the temp folder, with dflashkit's marker, whose
PID no longer runs — a folder of the user's own that merely has such a name is never touched. (A PID reused by
another process keeps its folder until that process ends too: a folder is never removed while its PID runs.)
"""

from __future__ import annotations

import os
import re
import shutil
import stat
import tempfile

PREFIX = "dflashkit-"
_NAME = re.compile(r"^dflashkit-[a-z]+-(\d{1,10})-[A-Za-z0-9_]+$")
MAX_LOOKED_AT = 100_000  # entries of the temp folder examined at start


MARKER = ".dflashkit-temp"  # in every folder of ours: the PID that made it


def make_temp_dir(kind: str, base: str | None = None) -> str:
    """A new ``dflashkit-<kind>-<pid>-…`` folder (mode 0700) in ``base`` (default: the temp folder), marked ours."""
    path = tempfile.mkdtemp(prefix=f"{PREFIX}{kind}-{os.getpid()}-", dir=base)
    with open(os.path.join(path, MARKER), "w", encoding="ascii") as f:
        f.write(f"{os.getpid()}\n")
    return path


def _marked(path: str, pid: int) -> bool:
    """The folder holds dflashkit's marker naming ``pid`` (a regular file, not followed through a link)."""
    try:
        fd = os.open(os.path.join(path, MARKER), os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
    except OSError:
        return False
    try:
        return stat.S_ISREG(os.fstat(fd).st_mode) and os.read(fd, 32).decode("ascii", "replace").strip() == str(pid)
    finally:
        os.close(fd)


def remove_temp_dir(path: str | os.PathLike[str]) -> None:
    shutil.rmtree(path, ignore_errors=True)


def _running(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True  # someone else's process: not ours to judge
    except OverflowError:
        return False
    return True


def remove_stale(base: str | None = None) -> list[str]:
    """Remove this user's ``dflashkit-*-<pid>-*`` folders in ``base`` (default: the temp folder) whose process is
    gone; returns their names. Never follows a link; silent on any error (it is housekeeping, not the command)."""
    removed: list[str] = []
    folder = base or tempfile.gettempdir()
    uid = os.getuid() if hasattr(os, "getuid") else None
    try:
        with os.scandir(folder) as entries:
            for n, entry in enumerate(entries):
                if n >= MAX_LOOKED_AT:
                    break
                m = _NAME.match(entry.name)
                if m is None or int(m.group(1)) == os.getpid() or _running(int(m.group(1))):
                    continue
                try:
                    st = entry.stat(follow_symlinks=False)
                except OSError:
                    continue
                if not stat.S_ISDIR(st.st_mode) or (uid is not None and st.st_uid != uid):
                    continue
                if not _marked(entry.path, int(m.group(1))):
                    continue  # a folder of the user's that only looks like ours
                shutil.rmtree(entry.path, ignore_errors=True)
                removed.append(entry.name)
    except OSError:
        pass
    return removed
