"""OUTDIR is the release's alone: what a release may write into, and never outside of.

- **Only its own folder.** A release writes into an empty OUTDIR, or one that holds a release of the same inputs
  (its ``release.json``) and nothing but a release's files; any other entry is a usage error naming it — a user's
  ``README.md``, ``SHA256SUMS`` or GGUF is never overwritten, nothing of theirs deleted (`claim`).
- **Never inside an input.** OUTDIR and each of its ancestors is compared with SRC and the target by device and
  inode, so a bind mount or a hard-linked folder of the checkpoint is found where resolved paths differ.
- **One release at a time.** The release holds an exclusive ``flock`` on OUTDIR for its whole run; a second one
  exits 2 naming the holder's PID (kept in the work folder), instead of deleting the first one's work.
- **The work folder is made, not followed.** ``.dflash-release`` is created by the release (``mkdir``) or, left by
  an interrupted run, accepted only as a real directory (``lstat``, never a symbolic link); it is emptied and
  removed through a file descriptor of it (``unlink(dir_fd=…)``), so nothing outside OUTDIR is ever deleted.
- **Nothing unrecorded left, nothing of the user's taken.** Before the jobs run, the type files they will write are
  listed in the work folder (`Claim.write_pending`). On an interrupt or a failure those that ``release.json`` does
  not record are removed (`remove_unrecorded`): the folder is what its record says. A file under a type file's name
  that neither the record nor that list holds is the user's: a usage error names it.
"""

from __future__ import annotations

import errno
import fcntl
import os
import stat
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterable

from ..errors import DFlashError, UsageError

WORK_FOLDER = ".dflash-release"
OWNER = "owner.pid"  # in the work folder: the PID of the release that holds OUTDIR
PENDING = "pending"  # in the work folder: the type files the running jobs will write, one per line
MAX_ENTRIES = 10_000  # entries of OUTDIR looked at (a release has a dozen)


@dataclass
class Claim:
    """A held OUTDIR: its descriptor (the lock lives as long as it is open) and the work folder's."""

    out: Path
    fd: int
    created: bool  # OUTDIR was made by this release
    work_fd: int | None = None
    work_ident: tuple[int, int] | None = None
    closed: bool = field(default=False)
    owned: bool = False  # OUTDIR was found to hold nothing but this release's files (`foreign_entry`)

    @property
    def work(self) -> Path:
        return self.out / WORK_FOLDER

    def make_work_folder(self) -> Path:
        """``.dflash-release``, made now or left by an interrupted run of this release — a real directory, never a
        link; this run's PID written into it (the holder a second run names)."""
        try:
            os.mkdir(WORK_FOLDER, 0o777, dir_fd=self.fd)
        except FileExistsError:
            pass
        except OSError as exc:
            raise DFlashError(f"{self.work}: cannot create it ({exc.strerror or exc})") from None
        try:
            fd = os.open(WORK_FOLDER, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW, dir_fd=self.fd)
        except OSError as exc:
            if exc.errno in (errno.ELOOP, errno.ENOTDIR):
                raise UsageError(f"{self.work}: is not a folder the release made (a symbolic link or a file) — remove "
                                 "it; the release writes its work there") from None
            raise DFlashError(f"{self.work}: cannot open it ({exc.strerror or exc})") from None
        st = os.fstat(fd)
        self.work_fd, self.work_ident = fd, (st.st_dev, st.st_ino)
        for name in os.listdir(fd):
            if name not in (OWNER, PENDING, "base-F32.gguf") and not name.startswith("base-F32.gguf.tmp-"):
                raise UsageError(f"{self.work / name}: not a file of a release's work folder — remove it")
        _write_small(fd, OWNER, f"{os.getpid()}\n")
        return self.work

    def write_pending(self, names: Iterable[str]) -> None:
        """Record the type files the jobs about to run will write: what an interrupted run leaves is then known to
        be the release's (removed or overwritten), and any other file under a type file's name is the user's."""
        assert self.work_fd is not None
        _write_small(self.work_fd, PENDING, "".join(f"{n}\n" for n in names))

    def work_file(self, name: str) -> Path:
        """A path in the work folder that still names the folder this release made (checked by device and inode:
        a folder swapped for a link meanwhile is refused)."""
        assert self.work_ident is not None
        try:
            st = os.stat(WORK_FOLDER, dir_fd=self.fd, follow_symlinks=False)
        except OSError:
            st = None
        if st is None or not stat.S_ISDIR(st.st_mode) or (st.st_dev, st.st_ino) != self.work_ident:
            raise DFlashError(f"{self.work}: replaced while the release ran — stopped (nothing is written outside "
                              "OUTDIR)")
        return self.work / name

    def remove_work_folder(self) -> None:
        """Empty and remove the work folder through its descriptor: only what is in the folder this release made."""
        if self.work_fd is None:
            return
        for name in os.listdir(self.work_fd):
            try:
                os.unlink(name, dir_fd=self.work_fd)
            except OSError:
                pass
        try:
            st = os.stat(WORK_FOLDER, dir_fd=self.fd, follow_symlinks=False)
            if (st.st_dev, st.st_ino) == self.work_ident:
                os.rmdir(WORK_FOLDER, dir_fd=self.fd)
        except OSError:
            pass
        os.close(self.work_fd)
        self.work_fd = None

    def release(self) -> None:
        if self.closed:
            return
        self.closed = True
        if self.work_fd is not None:
            try:  # the holder's PID goes with the lock
                os.unlink(OWNER, dir_fd=self.work_fd)
            except OSError:
                pass
            os.close(self.work_fd)
            self.work_fd = None
        os.close(self.fd)  # the lock goes with it


def _write_small(dir_fd: int, name: str, text: str) -> None:
    fd = os.open(name, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, 0o644, dir_fd=dir_fd)
    try:
        os.write(fd, text.encode())
    finally:
        os.close(fd)


def _holder(fd: int) -> str:
    try:
        owner = os.open(f"{WORK_FOLDER}/{OWNER}", os.O_RDONLY | os.O_NOFOLLOW, dir_fd=fd)
    except OSError:
        return "another dflash-release"
    try:
        pid = os.read(owner, 32).decode("ascii", "replace").strip()
    finally:
        os.close(owner)
    return f"another dflash-release (PID {pid})" if pid.isdigit() else "another dflash-release"


def claim(out: Path) -> Claim:
    """Create or open OUTDIR and hold it (module doc): a usage error when another release holds it."""
    created = False
    try:
        os.mkdir(out)
        created = True
    except FileExistsError:
        pass
    except OSError as exc:
        raise DFlashError(f"{out}: cannot create it ({exc.strerror or exc})") from None
    try:
        fd = os.open(out, os.O_RDONLY | os.O_DIRECTORY)
    except OSError as exc:
        raise UsageError(f"{out}: is not a folder ({exc.strerror or exc}) — give the release's output folder") from None
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        who = _holder(fd)
        os.close(fd)
        raise UsageError(f"{out}: {who} is writing this folder — wait for it to end, or give another OUTDIR") from None
    except OSError:
        pass  # a file system without flock (some network mounts): run unlocked rather than not at all
    return Claim(out, fd, created)


def entries(folder: Path | int, limit: int = MAX_ENTRIES) -> list[str]:
    """The first ``limit`` names in OUTDIR (a path or an open descriptor), sorted: what a release looks at of it."""
    return sorted(os.listdir(folder))[:limit]


def foreign_entry(claimed: Claim, own_names: set[str], has_record: bool) -> str | None:
    """The first entry of OUTDIR that is not the release's (``own_names``: its fixed files and the type files its
    record lists or a run cut short was writing), None when there is none. Without a release record of the same
    inputs only the work folder may be there."""
    names = entries(claimed.fd, MAX_ENTRIES + 1)
    if len(names) > MAX_ENTRIES:
        return names[MAX_ENTRIES]
    for name in names:
        if name == WORK_FOLDER:
            continue
        if not has_record or name not in own_names:
            return name
        st = os.stat(name, dir_fd=claimed.fd, follow_symlinks=False)
        if not stat.S_ISREG(st.st_mode):  # a link, a FIFO, a folder under a release's file name
            return name
    return None


def read_pending(claimed: Claim) -> set[str]:
    """The type files the last run started writing (`Claim.write_pending`), read through the work folder without
    following a link; empty when there is none."""
    try:
        fd = os.open(f"{WORK_FOLDER}/{PENDING}", os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK, dir_fd=claimed.fd)
    except OSError:
        return set()
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode) or os.path.islink(claimed.out / WORK_FOLDER):
            return set()
        text = os.read(fd, 64 << 10).decode("utf-8", errors="replace")
    finally:
        os.close(fd)
    return {line for line in text.split("\n") if line and "/" not in line and line not in (".", "..")}


def remove_unrecorded(claimed: Claim, type_files: Iterable[str], recorded: set[str]) -> list[str]:
    """Remove the type files the record does not list (a job cut short after its write): regular files only."""
    removed = []
    for name in type_files:
        if name in recorded:
            continue
        try:
            st = os.stat(name, dir_fd=claimed.fd, follow_symlinks=False)
        except OSError:
            continue
        if stat.S_ISREG(st.st_mode):
            try:
                os.unlink(name, dir_fd=claimed.fd)
                removed.append(name)
            except OSError:
                pass
    return removed

