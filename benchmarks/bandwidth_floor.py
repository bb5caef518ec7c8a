"""The memory-bandwidth floor of a quantizer: read its input once and write its output's size once, nothing else
(``benchmarks/quantize_27b.py`` times it beside each type): Python start-up, the input read through one 16 MiB
buffer, and as many bytes written to a new file as the type's output has — in the same proportion as they are
read, so reading and writing alternate as a streaming quantizer's do.

    python benchmarks/bandwidth_floor.py INPUT OUTPUT_BYTES OUTPUT
"""

import os
import sys

CHUNK = 16 << 20


def main(src: str, out_bytes: int, out: str) -> None:
    size = os.path.getsize(src)
    buf = bytearray(CHUNK)
    view = memoryview(buf)
    read = written = 0
    with open(src, "rb", buffering=0) as fin, open(out, "xb", buffering=0) as fout:
        while True:
            n = fin.readinto(buf)
            if not n:
                break
            read += n
            due = out_bytes * read // size - written  # the output's share of what has been read so far
            while due > 0:
                k = fout.write(view[: min(due, n)])
                written += k
                due -= k


if __name__ == "__main__":
    main(sys.argv[1], int(sys.argv[2]), sys.argv[3])
