"""The output check and what a path is: every file an input stands for (`input_files`), a path's kind in words
(`file_kind`), optional side files (`side_file`), and `check_output`, which refuses an OUT that is an input, a
directory, a device, or exists without --force, before any work.
"""

from __future__ import annotations

import os
import stat
from pathlib import Path
from typing import Iterable, Sequence

from ..errors import DFlashError, UsageError

_MAX_INPUT_FILES = 100_000  # files listed per input directory (a checkpoint has a few dozen)
#: Kinds of file that no directory reader (ours, transformers') reads out of a checkpoint directory: dflashkit's
#: own outputs, so that ``dflash-convert DIR DIR/d.gguf --force`` can be re-run. Every other file in an input
#: directory counts as read (config, index, shards, tokenizer and chat-template files, ...).
_NOT_READ_FROM_DIRS = frozenset({".gguf", ".npz", ".png", ".html", ".htm", ".md", ".markdown", ".jsonl"})


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


def _ancestors(path: Path) -> list[Path]:
    """``path`` and every parent, both as written (made absolute) and as the kernel resolves it: ``L/..`` with ``L``
    a link is the link's target's parent to the kernel, and a link to a sub-folder of an input is inside it."""
    out: list[Path] = []
    for form in (Path(os.path.abspath(path)), Path(os.path.realpath(path))):
        for p in (form, *form.parents):
            if p not in out:
                out.append(p)
    return out


def check_outside_inputs(out: str | os.PathLike[str], inputs: Iterable[str | os.PathLike[str] | None], *,
                         what: str = "write the release to another folder") -> None:
    """A usage error when ``out`` is an input folder or inside one, by path and by (device, inode) of every
    component — a bind mount of an input is the same directory under another path. Inputs that are files (or
    missing) are not folders of anyone's: writing beside them is fine."""
    folders = []
    for given in inputs:
        if given is None:
            continue
        try:
            st = os.stat(given)
        except OSError:
            continue
        if stat.S_ISDIR(st.st_mode):
            folders.append((str(given), (st.st_dev, st.st_ino), Path(given).resolve()))
    for component in _ancestors(Path(out)):
        try:
            st = os.stat(component)
        except OSError:
            continue  # OUT itself may not exist yet
        for given, ident, resolved in folders:
            if (st.st_dev, st.st_ino) == ident or component.resolve() == resolved:
                raise UsageError(f"{out}: is inside the input {given} — {what} (inputs are never modified)")
