"""Kernel-side byte copies between files: unchanged tensor bytes never pass through Python buffers.

A conversion or quantization that keeps a tensor's type (bf16 -> bf16, a kept Q8_0 ...) only has to
move bytes from the input file into the output file. Reading them into a numpy buffer and writing
them back costs two user-space copies and the page-cache footprint of both; the kernel can do it
alone. :func:`copy_range` tries, in order:

1. ``FICLONERANGE`` (reflink): shares the extents, no data moves — only on filesystems that have it
   (btrfs, XFS, bcachefs ...) and only when both offsets and the length are block-aligned;
2. ``os.copy_file_range``: an in-kernel copy (server-side on NFS, reflinked by some filesystems);
3. ``os.sendfile``: an in-kernel copy from the page cache for kernels/filesystems that refuse 2;
4. ``os.preadv`` / ``os.pwrite`` through one reusable bounded buffer (never the whole range).

Each step falls back to the next on the errors that mean "not supported here" (EXDEV, EINVAL,
EOPNOTSUPP, ENOSYS, ...); other errors (ENOSPC, EIO) propagate. Offsets are explicit: the
descriptors' file positions are not used or moved. Hand-written because neither gguf-py nor
shutil offers a ranged copy between two already-open files at given offsets.
"""

from __future__ import annotations

import errno
import os
import threading

_FICLONERANGE = 0x4020940D  # _IOW(0x94, 13, struct file_clone_range)
_UNSUPPORTED = {errno.EXDEV, errno.EINVAL, errno.EOPNOTSUPP, errno.ENOSYS, errno.EBADF, errno.ETXTBSY,
                errno.EPERM, errno.ENOTTY}
_STEP = 1 << 30  # per syscall: the kernel caps one call at ~2 GiB anyway
_BUF = 8 << 20  # the user-space fallback's buffer


def _reflink(src_fd: int, src_off: int, dst_fd: int, dst_off: int, n: int) -> bool:
    try:
        import fcntl
        import struct

        block = os.fstatvfs(dst_fd).f_bsize or 4096
        if src_off % block or dst_off % block or n % block:
            return False
        # struct file_clone_range { __s64 src_fd; __u64 src_offset, src_length, dest_offset; }
        fcntl.ioctl(dst_fd, _FICLONERANGE, struct.pack("qQQQ", src_fd, src_off, n, dst_off))
        return True
    except (OSError, ImportError):
        return False


def copy_range(src_fd: int, src_off: int, dst_fd: int, dst_off: int, n: int) -> str:
    """Copy ``n`` bytes from ``src_fd`` at ``src_off`` to ``dst_fd`` at ``dst_off``.

    Returns the method that did the work: ``"reflink"``, ``"copy_file_range"``, ``"sendfile"`` or
    ``"pread"``. Raises EOFError when the source ends before ``n`` bytes.
    """
    if n <= 0:
        return "none"
    if _reflink(src_fd, src_off, dst_fd, dst_off, n):
        return "reflink"
    done = 0
    method = "copy_file_range"
    if hasattr(os, "copy_file_range"):
        try:
            while done < n:
                k = os.copy_file_range(src_fd, dst_fd, min(_STEP, n - done), src_off + done, dst_off + done)
                if k == 0:
                    raise EOFError(f"source ended {n - done} bytes early")
                done += k
            return method
        except OSError as exc:
            if exc.errno not in _UNSUPPORTED:
                raise
    # sendfile writes at the destination's file position: set it, and restore it afterwards
    if hasattr(os, "sendfile"):
        saved = os.lseek(dst_fd, 0, os.SEEK_CUR)
        try:
            os.lseek(dst_fd, dst_off + done, os.SEEK_SET)
            while done < n:
                k = os.sendfile(dst_fd, src_fd, src_off + done, min(_STEP, n - done))
                if k == 0:
                    raise EOFError(f"source ended {n - done} bytes early")
                done += k
            return "sendfile"
        except OSError as exc:
            if exc.errno not in _UNSUPPORTED:
                raise
        finally:
            os.lseek(dst_fd, saved, os.SEEK_SET)
    buf = bytearray(min(_BUF, n - done))
    view = memoryview(buf)
    while done < n:
        want = min(len(buf), n - done)
        k = os.preadv(src_fd, [view[:want]], src_off + done)
        if k == 0:
            raise EOFError(f"source ended {n - done} bytes early")
        w = 0
        while w < k:
            w += os.pwrite(dst_fd, view[w:k], dst_off + done + w)
        done += k
    return "pread"


def prefetch(paths: list[os.PathLike[str] | str]) -> None:
    """Ask the kernel to start reading ``paths`` into the page cache now (``POSIX_FADV_WILLNEED``).

    A conversion spends its first few hundred milliseconds on the config and the target's tokenizer
    before the first tensor byte is copied; with a cold page cache the shards' reads then overlap
    that work instead of following it. Advisory only: any error is ignored, nothing is allocated in
    this process (page-cache pages are not its RSS), and the call runs in a daemon thread because
    the kernel may block while it queues a large range."""
    if not hasattr(os, "posix_fadvise"):
        return

    def advise() -> None:
        for path in paths:
            try:
                fd = os.open(path, os.O_RDONLY)
            except OSError:
                continue
            try:
                os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_WILLNEED)
            except OSError:
                pass
            finally:
                os.close(fd)

    threading.Thread(target=advise, name="dflashkit-prefetch", daemon=True).start()
