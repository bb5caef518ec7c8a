"""``dflash-convert --outtype bf16`` (no ``--target``: the copy, not a tokenizer) against the copy floor, same run.

Three programs, interleaved run by run on the 4B-size drafter (page cache warm before each, the output a new file):

- ``floor``     ``copy_floor.py``: Python start-up + the tensor byte ranges copied in the kernel, nothing else;
- ``gguf-py``   ``copy_floor.py --import-gguf-py``: the same after importing click and gguf-py (numpy, yaml), what
                a converter that writes its header and ``general.*`` keys with gguf-py must load before its first
                tensor byte (the GGUF header precedes the data and its length depends on those keys);
- ``dflash-convert``.

Prints the medians, each ratio to the floor, and the issue-48 goal (ours ≤ 1.4× the floor). Nothing else of ours
may run meanwhile (a timing never shares the machine).

    python benchmarks/bf16_floor.py [--runs 9] [--workdir DIR] [--keep]
"""

from __future__ import annotations

import argparse
import shutil
import statistics
import sys
import tempfile
from pathlib import Path

from commands_vs_reference import (HERE, machine, ours, run_external, warm_page_cache,  # noqa: E402
                                   write_checkpoint)
from _measure import CONFIG_4B  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=9)
    ap.add_argument("--workdir", type=Path, default=None)
    ap.add_argument("--keep", action="store_true")
    args = ap.parse_args()
    work = args.workdir or Path(tempfile.mkdtemp(prefix="dflash-bf16-"))
    src = work / "drafter4b"
    try:
        if not (src / "config.json").exists():
            print("writing a synthetic Qwen3-4B-DFlash-b16-size drafter ...", flush=True)
            write_checkpoint(src, CONFIG_4B)
        print(f"{machine()}; {args.runs} interleaved runs each, page cache warm", flush=True)
        floor_cmd = [sys.executable, str(HERE / "copy_floor.py")]
        times: dict[str, list[float]] = {"floor": [], "gguf-py": [], "dflash-convert": []}
        for _ in range(args.runs):
            for name in times:
                warm_page_cache(src)
                out = work / ("bf16.gguf" if name == "dflash-convert" else "floor.bin")
                if name == "dflash-convert":
                    seconds = ours("convert_command", [str(src), str(out), "--outtype", "bf16", "-q"])[0]
                else:
                    extra = ["--import-gguf-py"] if name == "gguf-py" else []
                    seconds = run_external([*floor_cmd, *extra, str(src), str(out)])[0]
                times[name].append(seconds)
                out.unlink()
        floor = statistics.median(times["floor"])
        for name, runs in times.items():
            median = statistics.median(runs)
            print(f"{name:15s} median {median:.3f} s = {median / floor:.2f}x the floor   "
                  f"(runs: {' '.join(f'{t:.2f}' for t in runs)})")
        ratio = statistics.median(times["dflash-convert"]) / floor
        print(f"goal: dflash-convert <= 1.4x the floor -> {'MET' if ratio <= 1.4 else 'not met'} ({ratio:.2f}x)")
    finally:
        if not args.keep:
            shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
