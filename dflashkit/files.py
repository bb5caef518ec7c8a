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

Standard library only (layer L0: imports nothing from dflashkit but ``errors``).
"""

from __future__ import annotations

import contextlib
import ctypes
import ctypes.util
import errno
import functools
import json
import os
import stat
import signal
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import IO, Any, Iterable, Iterator, Sequence

from .errors import DFlashError, UsageError

#: Test hook: when set to a path, the first write to an output creates that file and then waits (up to
#: 60 s) until the file is deleted, so that a test can signal or race the process mid-write. Never set
#: in normal use.
PAUSE_ENV = "DFLASHKIT_TEST_PAUSE_AFTER_FIRST_WRITE"

_MAX_INPUT_FILES = 100_000  # files listed per input directory (a checkpoint has a few dozen)
#: Kinds of file that no directory reader (ours, transformers') reads out of a checkpoint directory: dflashkit's
#: own outputs, so that ``dflash-convert DIR DIR/d.gguf --force`` can be re-run. Every other file in an input
#: directory counts as read (config, index, shards, tokenizer and chat-template files, ...).
_NOT_READ_FROM_DIRS = frozenset({".gguf", ".npz", ".png", ".html", ".htm", ".md", ".markdown", ".jsonl"})
_SIGNALS = tuple(s for s in (getattr(signal, "SIGTERM", None), getattr(signal, "SIGHUP", None)) if s is not None)
_RENAME_NOREPLACE = 1
_AT_FDCWD = -100
_AT_SYMLINK_FOLLOW = 0x400

# --------------------------------------------------------------------------------------------
# The output check
# --------------------------------------------------------------------------------------------


def input_files(paths: Iterable[str | os.PathLike[str] | None]) -> list[Path]:
    """Every file the given inputs stand for: a file itself; every file under a directory except the kinds no
    directory reader reads (``_NOT_READ_FROM_DIRS``: GGUF, npz, png, html, markdown, jsonl)."""
    files: list[Path] = []
    for p in paths:
        if p is None:
            continue
        path = Path(p)
        if path.is_dir():
            n = 0
            for root, _dirs, names in os.walk(path):
                for name in names:
                    # README.md is read (a model card: the license, the source) though other Markdown is not
                    if name == "README.md" or os.path.splitext(name)[1].lower() not in _NOT_READ_FROM_DIRS:
                        files.append(Path(root) / name)
                    n += 1
                if n > _MAX_INPUT_FILES:
                    break
        else:
            files.append(path)
    return files


def _identity(path: Path) -> tuple[str | None, tuple[int, int] | None]:
    try:
        resolved = str(path.resolve())
    except (OSError, RuntimeError):
        resolved = None
    try:
        st = path.stat()
        ident: tuple[int, int] | None = (st.st_dev, st.st_ino)
    except OSError:
        ident = None
    return resolved, ident


_KINDS = ((stat.S_ISCHR, "a character device"), (stat.S_ISBLK, "a block device"), (stat.S_ISFIFO, "a FIFO"),
          (stat.S_ISSOCK, "a socket"), (stat.S_ISDIR, "a directory"))


def file_kind(path: Path) -> str:
    """What ``path`` is, in words ("a FIFO", "a directory", "a broken symbolic link", "a regular file", ...)."""
    try:
        mode = os.stat(path).st_mode
    except OSError:
        return "a broken symbolic link" if os.path.islink(path) else "missing"
    if stat.S_ISREG(mode):
        return "a regular file"
    return next((k for test, k in _KINDS if test(mode)), "not a regular file")


def side_file(path: Path) -> bool:
    """Whether an optional input file (a model card, generation_config.json, tokenizer files, mask_embedding.pt)
    is there to read: False when missing, True for a regular file (or a link to one); anything else (a FIFO, a
    directory, a device) is a one-line DFlashError naming it — skipping it would silently change the output, and
    opening a FIFO would block."""
    kind = file_kind(path)
    if kind == "missing":
        return False
    if kind == "a regular file":
        return True
    raise DFlashError(f"{path}: is {kind}, not a regular file — replace it with the file, or remove it")


def refuse_non_regular(out: Path, name: str | None = None) -> None:
    """An existing OUT that is not a regular file (device, FIFO, socket, directory, or a link to one) is a usage
    error: publishing over it would replace the node itself (run as root, ``/dev/null`` became a file)."""
    try:
        mode = os.stat(out).st_mode  # follows links: a link to a device is a device here
    except OSError:
        return  # missing, or a dangling link: nothing but the link itself can be replaced
    if stat.S_ISREG(mode):
        return
    kind = next((k for test, k in _KINDS if test(mode)), "not a regular file")
    via = " (through a symbolic link)" if out.is_symlink() else ""
    raise UsageError(f"{name or out}: exists and is {kind}{via} — outputs are written to regular files only "
                     "(--force replaces a regular file, nothing else); give a file name")


def check_output(
    out: str | os.PathLike[str],
    *,
    inputs: Sequence[str | os.PathLike[str] | None] = (),
    force: bool = False,
    label: str | None = None,
) -> Path:
    """Validate OUT before any work; returns it as a Path.

    ``inputs``: every file or directory the command reads (directories stand for all files in them).
    Raises UsageError (exit 2) when OUT is a directory or one of the input files, DFlashError (exit 1)
    when its folder is missing or OUT exists and ``force`` is false. ``label`` (e.g. ``"--dump"``)
    prefixes the message.
    """
    out = Path(out)
    name = f"{label} {out}" if label else str(out)
    if out.is_dir():
        raise UsageError(f"{name}: is a directory; give the output file name")
    refuse_non_regular(out, name)
    out_path, out_id = _identity(out)
    for src in input_files(inputs):
        src_path, src_id = _identity(src)
        if (out_path is not None and out_path == src_path) or (out_id is not None and out_id == src_id):
            also = "" if str(src) == str(out) else f" ({src})"
            raise UsageError(f"{name}: is also an input{also}; write to another file (inputs are never modified)")
    if not out.parent.exists():
        raise DFlashError(f"{name}: the folder {out.parent} does not exist")
    if os.path.lexists(out) and not force:
        raise DFlashError(f"{name}: already exists — pass --force to overwrite it")
    return out


# --------------------------------------------------------------------------------------------
# The atomic writer
# --------------------------------------------------------------------------------------------


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


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


def _os_error(out: Path, exc: OSError) -> DFlashError:
    reason = exc.strerror or str(exc) or type(exc).__name__
    if exc.errno in (errno.EACCES, errno.EPERM, errno.EROFS):
        return DFlashError(f"{out}: cannot write ({reason}); choose a writable folder")
    return DFlashError(f"{out}: cannot write ({reason})")


def _renameat2_noreplace(src: str, dst: str) -> bool | None:
    """``renameat2(src, dst, RENAME_NOREPLACE)``; None where the call does not exist here."""
    try:
        fn = _libc().renameat2
    except (OSError, AttributeError):
        return None
    at_fdcwd = _AT_FDCWD
    fn.argtypes = [ctypes.c_int, ctypes.c_char_p, ctypes.c_int, ctypes.c_char_p, ctypes.c_uint]
    if fn(at_fdcwd, os.fsencode(src), at_fdcwd, os.fsencode(dst), _RENAME_NOREPLACE) == 0:
        return True
    err = ctypes.get_errno()
    if err in (errno.ENOSYS, errno.EINVAL, errno.EOPNOTSUPP):
        return None
    raise OSError(err, os.strerror(err), dst)


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


def _open_tmpfile(directory: Path) -> int | None:
    """An unnamed file in ``directory`` (Linux O_TMPFILE) that a SIGKILL cannot leave behind."""
    flag = getattr(os, "O_TMPFILE", None)
    if flag is None or not os.path.isdir("/proc/self/fd"):
        return None
    try:
        _libc().linkat
    except (OSError, AttributeError):
        return None
    try:
        return os.open(directory, flag | os.O_WRONLY | getattr(os, "O_CLOEXEC", 0), 0o666)
    except OSError as exc:
        if exc.errno in (errno.EOPNOTSUPP, errno.EISDIR, errno.EINVAL, errno.ENOENT):
            return None  # this file system (or kernel) has no O_TMPFILE: use a named temp file
        raise


@functools.lru_cache(maxsize=1)
def _libc() -> Any:
    # The process's own symbols include libc's on Linux; find_library (which may spawn ldconfig) only if not.
    try:
        lib = ctypes.CDLL(None, use_errno=True)
        lib.linkat
        return lib
    except (OSError, AttributeError):
        return ctypes.CDLL(ctypes.util.find_library("c") or None, use_errno=True)


def preallocate(fd: int, length: int) -> bool:
    """Reserve the first ``length`` bytes of an output file before writing them (Linux ``fallocate``, mode 0).

    Writing a large file by extending it one copy at a time makes ext4 allocate blocks and grow the
    size again and again: a 1 GB in-kernel copy into one growing file took 0.36 s here, 0.28 s into a
    preallocated one, as fast as ``cp``. A hint only: False where the platform or the filesystem lacks it
    (and no zero-filling emulation, which glibc's ``posix_fallocate`` falls back to); a full disk still
    shows up as the write's own ENOSPC."""
    if length <= 0 or not sys.platform.startswith("linux"):
        return False
    try:
        fn = _libc().fallocate
    except (OSError, AttributeError):
        return False
    fn.argtypes = [ctypes.c_int, ctypes.c_int, ctypes.c_int64, ctypes.c_int64]
    fn.restype = ctypes.c_int
    return fn(fd, 0, 0, length) == 0


def _linkat_follow(src: str, dst: Path) -> None:
    """``linkat(AT_FDCWD, src, AT_FDCWD, dst, AT_SYMLINK_FOLLOW)`` (Python's os.link calls plain
    link() here, which links the /proc symlink itself and fails with EXDEV)."""
    fn = _libc().linkat
    fn.argtypes = [ctypes.c_int, ctypes.c_char_p, ctypes.c_int, ctypes.c_char_p, ctypes.c_int]
    if fn(_AT_FDCWD, os.fsencode(src), _AT_FDCWD, os.fsencode(str(dst)), _AT_SYMLINK_FOLLOW) != 0:
        err = ctypes.get_errno()
        raise OSError(err, os.strerror(err), str(dst))


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


# --------------------------------------------------------------------------------------------
# JSON
# --------------------------------------------------------------------------------------------


#: objects + arrays one JSON document may hold. A real tokenizer.json (the largest JSON dflashkit reads, 150 k–500 k
#: merges) stays far below; 60 MB of ``[{}, {}, ...]`` is 15 M objects and ~2.9 GB of Python objects.
MAX_JSON_CONTAINERS = 4_000_000


def write_text_atomic(path: str | os.PathLike[str], text: str, *, force: bool = False) -> Path:
    """Write ``text`` (UTF-8) to ``path`` through `atomic_output`; refuses to overwrite without force."""
    out = Path(path)
    if out.is_dir():
        raise DFlashError(f"{out}: is a directory; give the report file name")
    return write_bytes_atomic(out, text.encode("utf-8"), force=force)


def json_container_count(raw: bytes) -> int:
    """An upper bound of the objects and arrays in ``raw`` (brackets inside strings count too), in one pass of C."""
    return raw.count(b"{") + raw.count(b"[")


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
