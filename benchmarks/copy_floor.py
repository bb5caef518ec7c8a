"""The floor of any Python bf16 -> bf16 converter, for the "<= 1.2x cp" row (``commands_vs_reference.py`` times it
beside ``cp -r`` and ``dflash-convert``): interpreter start plus the checkpoint's tensor byte ranges copied in the
kernel (``copy_file_range``) into one preallocated file at GGUF's 32-byte alignment. No numpy, no GGUF header,
no tokenizer: less than any converter can do.

``--import-gguf-py`` first imports what a converter that writes its GGUF header with gguf-py must import before
its first tensor byte — gguf-py (numpy, yaml: ``gguf.Metadata`` and ``GGUFWriter`` give the ``general.*`` keys and
the header) and click — and nothing of dflashkit: the floor of a converter built as the standards ask
(``benchmarks/bf16_floor.py`` times both beside ``dflash-convert``).

    python benchmarks/copy_floor.py [--import-gguf-py] CHECKPOINT_DIR OUT
"""

import ctypes
import json
import os
import struct
import sys


def main(src: str, out: str) -> None:
    jobs, total = [], 0
    for name in sorted(f for f in os.listdir(src) if f.endswith(".safetensors")):
        fd = os.open(os.path.join(src, name), os.O_RDONLY)
        header_len = struct.unpack("<Q", os.pread(fd, 8, 0))[0]
        for key, info in json.loads(os.pread(fd, header_len, 8)).items():
            if key != "__metadata__":
                a, b = info["data_offsets"]
                jobs.append((fd, 8 + header_len + a, b - a, total))
                total += (b - a + 31) // 32 * 32
    dst = os.open(out, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
    ctypes.CDLL(None).fallocate(dst, 0, ctypes.c_int64(0), ctypes.c_int64(total))
    for fd, src_off, n, dst_off in jobs:
        done = 0
        while done < n:
            done += os.copy_file_range(fd, dst, n - done, src_off + done, dst_off + done)
    os.close(dst)


if __name__ == "__main__":
    argv = sys.argv[1:]
    if "--import-gguf-py" in argv:
        argv.remove("--import-gguf-py")
        import click  # noqa: F401
        import gguf  # noqa: F401
    if len(argv) != 2:
        sys.exit("usage: python benchmarks/copy_floor.py [--import-gguf-py] CHECKPOINT_DIR OUT")
    main(argv[0], argv[1])
