"""dflashkit.io.copy: every step of the kernel-copy fallback chain copies exactly the requested range."""

from __future__ import annotations

import errno
import os
import sys

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


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="fallocate is Linux's")
def test_preallocate_reserves_the_size_and_kernel_copies_fill_it_exactly(tmp_path):
    from dflashkit.files import preallocate

    src = tmp_path / "src.bin"
    data = np.random.default_rng(1).integers(0, 256, 3 << 20, dtype=np.uint8).tobytes()
    src.write_bytes(data)
    out = tmp_path / "out.bin"
    with open(src, "rb") as s, open(out, "wb") as d:
        assert preallocate(d.fileno(), len(data) + 100) is True
        assert os.fstat(d.fileno()).st_size == len(data) + 100  # reserved before a byte is written
        kcopy.copy_range(s.fileno(), 0, d.fileno(), 100, len(data))
        os.pwrite(d.fileno(), b"h" * 100, 0)
    assert out.read_bytes() == b"h" * 100 + data
    with open(out, "r+b") as d:
        assert preallocate(d.fileno(), 0) is False  # nothing to reserve


def test_write_gguf_preallocates_exactly_the_file_it_writes(tmp_path, monkeypatch):
    """The reservation is the final size (header, padding, every tensor): no zeros are left at the end."""
    from dflashkit.io import gguf_writer

    calls = []
    real = gguf_writer.preallocate
    monkeypatch.setattr(gguf_writer, "preallocate", lambda fd, n: calls.append(n) or real(fd, n))
    x = np.arange(96, dtype=np.float32).reshape(3, 32)
    plan = [gguf_writer.TensorToWrite(name, x.shape, gguf_writer.GGMLQuantizationType.F32, lambda: iter([x]))
            for name in ("a.weight", "b.weight")]
    out = tmp_path / "t.gguf"
    size = gguf_writer.write_gguf(out, "llama", [], plan, progress=False)
    assert calls == [size] == [out.stat().st_size]
