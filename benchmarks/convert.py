"""Convert benchmark: a synthetic drafter with real Qwen3-4B-DFlash-b16 dimensions (~1 GB bf16) → f16.

Prints the conversion's MB/s beside `cp` of the same bytes measured in the same run, and the
converter's peak RSS beside the largest tensor. Targets (issue "Convert"): ≥ 70 % of cp
throughput; peak RSS < 2 × largest tensor + 300 MB.

    python benchmarks/convert.py [--workdir DIR] [--keep]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import struct
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _measure import CONFIG_4B, run_measured  # noqa: E402



def tensor_shapes(c: dict) -> dict[str, tuple[int, ...]]:
    """HF tensor names and shapes implied by the config (the converter's own table)."""
    from dflashkit.families import expected_tensors, spec_from_hf_config

    return expected_tensors(spec_from_hf_config(c))


def write_checkpoint(directory: Path, seed: int = 0) -> int:
    """Stream a bf16 safetensors file tensor by tensor; returns the largest tensor's bytes."""
    directory.mkdir(parents=True, exist_ok=True)
    (directory / "config.json").write_text(json.dumps(CONFIG_4B))
    shapes = tensor_shapes(CONFIG_4B)
    header, offset = {}, 0
    for name, shape in shapes.items():
        n = int(np.prod(shape)) * 2
        header[name] = {"dtype": "BF16", "shape": list(shape), "data_offsets": [offset, offset + n]}
        offset += n
    raw = json.dumps(header).encode()
    raw += b" " * (-len(raw) % 8)
    rng = np.random.default_rng(seed)
    with open(directory / "model.safetensors", "wb") as f:
        f.write(struct.pack("<Q", len(raw)) + raw)
        for name, shape in shapes.items():
            x = rng.standard_normal(int(np.prod(shape)), dtype=np.float32) * 0.02
            u = x.view(np.uint32)
            f.write(((u + (0x7FFF + ((u >> 16) & 1))) >> 16).astype(np.uint16).tobytes())
    return max(int(np.prod(s)) * 2 for s in shapes.values())


def timed_cp(src: Path, dst: Path) -> float:
    t = time.perf_counter()
    subprocess.run(["cp", str(src), str(dst)], check=True)
    return time.perf_counter() - t


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--workdir", type=Path, default=None)
    ap.add_argument("--keep", action="store_true")
    args = ap.parse_args()
    work = args.workdir or Path(tempfile.mkdtemp(prefix="dflash-bench-"))
    src = work / "drafter"
    try:
        print(f"writing synthetic Qwen3-4B-DFlash-b16 drafter to {src} ...", flush=True)
        largest = write_checkpoint(src)
        st = src / "model.safetensors"
        size = st.stat().st_size
        os.sync()
        # warm the page cache for both contenders the same way
        with open(st, "rb") as f:
            while f.read(64 << 20):
                pass
        cp_s = min(timed_cp(st, work / f"copy{i}.bin") for i in range(3))
        for i in range(3):
            (work / f"copy{i}.bin").unlink()
        conv_args = [str(src), str(work / "out.gguf"), "--outtype", "f16", "-q", "--force"]
        runs = [run_measured("convert_command", conv_args)[:2] for _ in range(3)]
        conv_s = min(r[0] for r in runs)
        peak_mb = max(r[1] for r in runs)
        out_size = (work / "out.gguf").stat().st_size
        cp_rate, conv_rate = size / cp_s / 1e6, size / conv_s / 1e6
        budget = 2 * largest / 1e6 + 300
        print(f"input: {size / 1e6:.0f} MB bf16 safetensors, output {out_size / 1e6:.0f} MB f16 GGUF, "
              f"largest tensor {largest / 1e6:.1f} MB")
        print(f"cp (same bytes, same run):   {cp_rate:8.0f} MB/s  ({cp_s:.2f} s)")
        print(f"dflash-convert --outtype f16: {conv_rate:8.0f} MB/s  ({conv_s:.2f} s, incl. interpreter start)")
        print(f"ratio to cp: {conv_rate / cp_rate * 100:.0f} %   (target >= 70 %)")
        print(f"peak RSS: {peak_mb:.0f} MB   (target < 2 x largest tensor + 300 MB = {budget:.0f} MB)")
    finally:
        if not args.keep:
            shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
