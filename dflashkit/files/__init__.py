"""Files every command writes and reads: the output check, the atomic writer, JSON reading.

Guarantees (README "Guarantees"), each enforced here once for every command:

* **No input modified.** :func:`check_output` refuses (exit 2) an OUT that is any file the command
  reads — compared by resolved path and by ``(st_dev, st_ino)``, so hard links and symlinks are
  caught. A directory input (an HF checkpoint or target) contributes every file inside it (config,
  index, shards, tokenizer files) except dflashkit's own output kinds, which no directory reader reads.
* **No overwrite without --force, race-free.** :func:`atomic_output` writes a temporary file in OUT's
  directory and publishes it *without replacing* (``link``, which fails when OUT exists, or
  ``renameat2(RENAME_NOREPLACE)`` on file systems without hard links; only where neither exists, a check
  just before an ordinary rename) unless ``force`` (then ``os.replace``). Two concurrent runs to one
  new OUT: one succeeds, the other gets "already exists — pass --force"; a file created at OUT during
  a run is never clobbered.
* **Nothing left behind.** The temporary file is removed on any exception; SIGTERM and SIGHUP are
  turned into an exception during the write (like SIGINT), so the temporary file is removed and the
  process then dies of the signal as usual. On Linux the data goes to an unnamed ``O_TMPFILE`` that
  is ``linkat``-ed into place at the end, so even SIGKILL leaves nothing; elsewhere (or where the
  file system lacks ``O_TMPFILE``) a named ``OUT.tmp-*`` is used.
* **A failed --force run keeps the old file**: OUT is only ever replaced by a complete file.
* Outputs get mode ``0666 & ~umask`` like any ordinary file; OS failures (read-only folder, disk
  full) are one-line errors naming OUT.

Standard library only (layer L0: imports nothing from dflashkit but ``errors``). The package: `checks` (the output
check, what a path is), `signals` (TERM / HUP unwinding, signals deferred), `libc` (O_TMPFILE, linkat, renameat2,
fallocate), `bounded_json` (JSON reading); the atomic writer itself is here, because the tests replace its seams
(``files._open_tmpfile``, ``files._open_fd``, ``files._renameat2_noreplace``) on this module, where it reads them.
Everything is importable from ``dflashkit.files`` itself.
"""

from __future__ import annotations

import contextlib
import errno
import os
import tempfile
import time
from pathlib import Path
from typing import IO, Any, Iterator

from ..errors import DFlashError, UsageError
from .bounded_json import MAX_JSON_CONTAINERS, json_container_count, read_bounded, read_json
from .checks import check_output, check_outside_inputs, file_kind, input_files, refuse_non_regular, side_file
from .libc import _linkat_follow, _open_tmpfile, _renameat2_noreplace, preallocate
from .signals import signals_deferred, signals_unwind

__all__ = [
    "MAX_JSON_CONTAINERS",
    "PAUSE_ENV",
    "atomic_output",
    "check_output",
    "check_outside_inputs",
    "file_kind",
    "input_files",
    "json_container_count",
    "preallocate",
    "read_bounded",
    "read_json",
    "refuse_non_regular",
    "side_file",
    "signals_deferred",
    "signals_unwind",
    "write_bytes_atomic",
    "write_text_atomic",
]

#: Test hook: when set to a path, the first write to an output creates that file and then waits (up to
#: 60 s) until the file is deleted, so that a test can signal or race the process mid-write. Never set
#: in normal use.
PAUSE_ENV = "DFLASHKIT_TEST_PAUSE_AFTER_FIRST_WRITE"


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


def _os_error(out: Path, exc: OSError) -> DFlashError:
    reason = exc.strerror or str(exc) or type(exc).__name__
    if exc.errno in (errno.EACCES, errno.EPERM, errno.EROFS):
        return DFlashError(f"{out}: cannot write ({reason}); choose a writable folder")
    return DFlashError(f"{out}: cannot write ({reason})")


def _tmp_prefix(out: Path) -> str:
    """``OUT.tmp-``, the name cut to 64 bytes: a 255-byte OUT must still leave room for the suffix."""
    return os.fsencode(out.name)[:64].decode("utf-8", errors="ignore") + ".tmp-"


def _exists_error(out: Path) -> DFlashError:
    return DFlashError(f"{out}: already exists — pass --force to overwrite it")


def _publish_named(tmp: str, out: Path, force: bool) -> None:
    """Move the complete temp file to OUT (replacing only with force)."""
    if force:
        os.replace(tmp, out)
        return
    try:
        os.link(tmp, out)
    except FileExistsError:
        raise _exists_error(out) from None
    except OSError as exc:
        if exc.errno not in (errno.EPERM, errno.EOPNOTSUPP, errno.EXDEV, errno.EMLINK):
            raise
        # No hard links on this file system: an atomic no-replace rename, else check-then-rename.
        try:
            done = _renameat2_noreplace(tmp, str(out))
        except FileExistsError:
            raise _exists_error(out) from None
        if not done:
            if os.path.lexists(out):
                raise _exists_error(out) from None
            os.replace(tmp, out)
        return
    os.unlink(tmp)


def _link_tmpfile(fd: int, out: Path, force: bool) -> None:
    proc = f"/proc/self/fd/{fd}"
    try:
        _linkat_follow(proc, out)  # fails if OUT exists: the no-replace publication
        return
    except FileExistsError:
        if not force:
            raise _exists_error(out) from None
    # --force: give the file a temporary name first, then replace OUT in one step.
    for _ in range(100):
        tmp = out.with_name(f"{_tmp_prefix(out)}{os.getpid()}-{time.monotonic_ns() % 10**9}")
        try:
            _linkat_follow(proc, tmp)
            break
        except FileExistsError:
            continue
    else:
        raise DFlashError(f"{out}: cannot find a free temporary name next to it")
    try:
        os.replace(tmp, out)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


def _open_fd(fd: int) -> IO[bytes]:
    """The file object the caller writes through (a seam the tests use to simulate a full disk)."""
    return os.fdopen(fd, "wb", closefd=True)


class _PausingFile:
    """Test hook (``PAUSE_ENV``): pauses after the first write so a test can signal mid-write."""

    def __init__(self, f: IO[bytes], marker: str) -> None:
        self._f, self._marker, self._paused = f, marker, False

    def write(self, data: Any) -> int:
        n = self._f.write(data)
        if not self._paused:
            self._paused = True
            self._f.flush()
            marker = Path(self._marker)
            marker.write_text(str(os.getpid()))
            deadline = time.monotonic() + 60
            while marker.exists() and time.monotonic() < deadline:  # the test deletes it to resume us
                time.sleep(0.01)
        return n

    def __getattr__(self, name: str) -> Any:
        return getattr(self._f, name)


@contextlib.contextmanager
def atomic_output(out: str | os.PathLike[str], *, force: bool = False) -> Iterator[IO[bytes]]:
    """Write OUT atomically: ``with atomic_output(out, force=f) as fh: fh.write(...)``.

    OUT appears only complete, only at the end, never replacing an existing file unless ``force``
    (checked at publication, race-free). On any exception or SIGTERM/SIGHUP/SIGINT nothing is left
    behind and an old OUT is intact. OS errors become one-line errors naming OUT.
    """
    out = Path(out)
    if out.is_dir():
        raise UsageError(f"{out}: is a directory; give the output file name")
    refuse_non_regular(out)
    if not out.parent.exists():
        raise DFlashError(f"{out}: the folder {out.parent} does not exist")
    if os.path.lexists(out) and not force:
        raise _exists_error(out)
    directory = out.parent if str(out.parent) else Path(".")
    with signals_unwind():
        tmp_name: str | None = None
        anon_fd: int | None = None
        fh: IO[bytes] | None = None
        try:
            try:
                anon_fd = _open_tmpfile(directory)
                if anon_fd is not None:
                    fh = _open_fd(os.dup(anon_fd))
                else:
                    fd, tmp_name = tempfile.mkstemp(prefix=_tmp_prefix(out), dir=directory)
                    os.fchmod(fd, 0o666 & ~_umask())  # mkstemp makes 0600; an output is an ordinary file
                    fh = _open_fd(fd)
            except OSError as exc:
                raise _os_error(out, exc) from None
            marker = os.environ.get(PAUSE_ENV)
            try:
                yield _PausingFile(fh, marker) if marker else fh  # type: ignore[misc]
                fh.close()
                if anon_fd is not None:
                    _link_tmpfile(anon_fd, out, force)
                else:
                    assert tmp_name is not None
                    _publish_named(tmp_name, out, force)
                    tmp_name = None
            except OSError as exc:
                raise _os_error(out, exc) from None
        finally:
            if fh is not None and not fh.closed:
                with contextlib.suppress(OSError):
                    fh.close()
            if anon_fd is not None:
                os.close(anon_fd)
            if tmp_name is not None:
                with contextlib.suppress(OSError):
                    os.unlink(tmp_name)


def write_bytes_atomic(out: str | os.PathLike[str], data: bytes, *, force: bool = False) -> Path:
    """``atomic_output`` for a small payload held in memory."""
    with atomic_output(out, force=force) as fh:
        fh.write(data)
    return Path(out)


def write_text_atomic(path: str | os.PathLike[str], text: str, *, force: bool = False) -> Path:
    """Write ``text`` (UTF-8) to ``path`` through `atomic_output`; refuses to overwrite without force."""
    out = Path(path)
    if out.is_dir():
        raise DFlashError(f"{out}: is a directory; give the report file name")
    return write_bytes_atomic(out, text.encode("utf-8"), force=force)
