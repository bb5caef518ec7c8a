"""dflashkit.io.copy: every step of the kernel-copy fallback chain copies exactly the requested range."""

from __future__ import annotations

import errno
import os

import numpy as np
import pytest

from dflashkit.io import copy as kcopy


def _unsupported(*_args, **_kwargs):
    raise OSError(errno.EXDEV, "cross-device")


@pytest.mark.parametrize("disable", [(), ("copy_file_range",), ("copy_file_range", "sendfile")])
def test_copy_range_each_method_copies_the_exact_range(tmp_path, monkeypatch, disable):
    data = np.random.default_rng(0).integers(0, 256, 3 * (1 << 20) + 77, dtype=np.uint8).tobytes()
    src, dst = tmp_path / "src.bin", tmp_path / "dst.bin"
    src.write_bytes(data)
    dst.write_bytes(b"H" * 100)
    for name in disable:
        monkeypatch.setattr(os, name, _unsupported)
    monkeypatch.setattr(kcopy, "_BUF", 4096 + 3)  # several rounds through the user-space buffer
    with open(src, "rb") as s, open(dst, "r+b") as d:
        d.seek(5)
        method = kcopy.copy_range(s.fileno(), 13, d.fileno(), 100, len(data) - 20)
        assert d.tell() == 5  # the destination's position is left alone
    expected = {(): "copy_file_range", ("copy_file_range",): "sendfile"}.get(disable, "pread")
    assert method == expected
    assert dst.read_bytes() == b"H" * 100 + data[13 : len(data) - 7]


def test_copy_range_past_the_end_of_the_source_is_eof(tmp_path):
    src, dst = tmp_path / "src.bin", tmp_path / "dst.bin"
    src.write_bytes(b"abc")
    dst.write_bytes(b"")
    with open(src, "rb") as s, open(dst, "r+b") as d, pytest.raises(EOFError):
        kcopy.copy_range(s.fileno(), 0, d.fileno(), 0, 10)


def test_prefetch_advises_willneed_for_each_readable_file_and_never_raises(tmp_path, monkeypatch):
    import threading

    present = tmp_path / "model-00001-of-00002.safetensors"
    present.write_bytes(b"x" * 4096)
    calls: list[tuple[int, int, int]] = []
    names: list[str] = []

    def record(fd: int, offset: int, length: int, advice: int) -> None:
        names.append(os.readlink(f"/proc/self/fd/{fd}") if os.path.exists("/proc/self/fd") else "?")
        calls.append((offset, length, advice))
        raise OSError(errno.ESPIPE, "advice refused")  # advisory: an error is ignored

    monkeypatch.setattr(os, "posix_fadvise", record)
    before = set(threading.enumerate())
    kcopy.prefetch([tmp_path / "missing.safetensors", present])
    for t in set(threading.enumerate()) - before:
        t.join(timeout=10)
    assert calls == [(0, 0, os.POSIX_FADV_WILLNEED)]  # the whole file; the missing one is skipped
    if names != ["?"]:
        assert names == [str(present)]
