"""``dflash-convert --outtype bf16`` (no ``--target``: the copy, not a tokenizer) against the copy floor, same run.

Three programs, interleaved run by run on the 4B-size drafter (page cache warm before each, the output a new file):

- ``floor``     ``copy_floor.py``: Python start-up + the tensor byte ranges copied in the kernel, nothing else;
- ``gguf-py``   ``copy_floor.py --import-gguf-py``: the same after importing click and gguf-py (numpy, yaml), what
                a converter that writes its header and ``general.*`` keys with gguf-py must load before its first
                tensor byte (the GGUF header precedes the data and its length depends on those keys);
- ``dflash-convert``.

Prints the medians, each ratio to the floor, and the issue-48 goal (ours ≤ 1.4× the floor). The order of the three
rotates from run to run; the floors run under ``/usr/bin/time`` (``run_external``: one fork more, ~1–2 ms, charged to
the floor), ``dflash-convert`` as ``_measure.measure_command`` runs every command of ours. The programs start in
the work folder, so the dflashkit timed is the installed one, not a checkout in the current directory. Nothing
else of ours may run meanwhile (a timing never shares the machine). ``--workdir`` is kept (only a folder this script
made is removed, and only without ``--keep``).

    python benchmarks/bf16_floor.py [--runs 9] [--workdir DIR] [--keep]
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import sys
import tempfile
from pathlib import Path

from _measure import CONFIG_4B
from commands_vs_reference import HERE, machine, ours, run_external, warm_page_cache, write_checkpoint


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=9)
    ap.add_argument("--workdir", type=Path, default=None)
    ap.add_argument("--keep", action="store_true")
    args = ap.parse_args()
    if args.runs < 1:
        ap.error("--runs must be at least 1")
    made = args.workdir is None
    work = (Path(tempfile.mkdtemp(prefix="dflash-bf16-")) if made else args.workdir).resolve()
    work.mkdir(parents=True, exist_ok=True)
    src = work / "drafter4b"
    here = os.getcwd()
    try:
        if not (src / "config.json").exists():
            print("writing a synthetic Qwen3-4B-DFlash-b16-size drafter ...", flush=True)
            write_checkpoint(src, CONFIG_4B)
        print(f"{machine()}; {args.runs} interleaved runs each, page cache warm", flush=True)
        os.chdir(work)  # python -c puts the working directory first on sys.path: a checkout there would win
        floor_cmd = [sys.executable, str(HERE / "copy_floor.py")]
        times: dict[str, list[float]] = {"floor": [], "gguf-py": [], "dflash-convert": []}
        names = list(times)
        for run in range(args.runs):
            for name in names[run % 3:] + names[: run % 3]:  # each program first, second and last in turn
                warm_page_cache(src)
                out = work / ("bf16.gguf" if name == "dflash-convert" else "floor.bin")
                out.unlink(missing_ok=True)
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
        os.chdir(here)
        if made and not args.keep:
            shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
