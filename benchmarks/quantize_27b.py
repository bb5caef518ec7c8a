"""Every quant type at a real drafter's size: ``dflash-quantize`` against ``llama-quantize`` (2 threads each) on the
synthetic Qwen3.6-27B-size drafter (~1.7 B parameters, a 3.5 GB F16 GGUF), beside each type's memory-bandwidth
floor, all in one run.

Per type, in this order, each run alone with its input in the page cache and every dirty page written back first
(``settle``), every output file deleted before its run (neither side pays for removing the last one):
``llama-quantize F16 OUT TYPE 2``, ``dflash-quantize F16 OUT TYPE`` (``DFLASHKIT_THREADS=2``), the two outputs
compared byte for byte (the script stops when they differ), then ``bandwidth_floor.py`` — Python start-up, the
input read once and the output's size written once, nothing computed. Peaks: llama-quantize's from
``/usr/bin/time``, ours the child's VmHWM. ``--pairs N`` repeats the two commands N times (medians).

    python benchmarks/quantize_27b.py [--types Q8_0,Q4_0,...] [--pairs 1] [--workdir DIR] [--keep]
"""

from __future__ import annotations

import argparse
import datetime
import filecmp
import os
import shutil
import statistics
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from commands_vs_reference import (CONFIG_27B, LLAMA_BIN, machine, ours, run_external, settle,  # noqa: E402
                                   warm_page_cache, write_checkpoint, write_hf_target)

#: the file types drafters ship in, by llama-quantize's name
TYPES = ("Q8_0", "Q6_K", "Q5_K_M", "Q5_K_S", "Q5_1", "Q5_0", "Q4_K_M", "Q4_K_S", "Q4_1", "Q4_0", "IQ4_XS",
         "IQ4_NL", "Q3_K_L", "Q3_K_M", "Q3_K_S", "Q2_K")


def f16_drafter(work: Path) -> Path:
    """The 27B-size drafter as an F16 GGUF (written once per work folder)."""
    f16 = work / "d27-f16.gguf"
    if not f16.exists():
        print(f"writing a synthetic Qwen3.6-27B-size drafter to {work} ...", flush=True)
        write_checkpoint(work / "drafter27b", CONFIG_27B, n_shards=2)
        write_hf_target(work / "target27b", CONFIG_27B)
        ours("convert_command", [str(work / "drafter27b"), str(f16), "--outtype", "f16", "--target",
                                 str(work / "target27b"), "-q", "--force"])
        shutil.rmtree(work / "drafter27b")
    return f16


def measure(work: Path, f16: Path, ftype: str, pairs: int) -> dict:
    ref_out, our_out, floor_out = work / "ref.gguf", work / "ours.gguf", work / "floor.bin"
    ref, our = [], []
    for _ in range(pairs):
        for f in (ref_out, our_out):
            f.unlink(missing_ok=True)
        warm_page_cache(f16)
        ref.append(run_external([str(LLAMA_BIN / "llama-quantize"), str(f16), str(ref_out), ftype, "2"]))
        warm_page_cache(f16)
        our.append(ours("quantize_command", [str(f16), str(our_out), ftype, "-q"], {"DFLASHKIT_THREADS": "2"}))
        if not filecmp.cmp(ref_out, our_out, shallow=False):
            raise SystemExit(f"{ftype}: dflash-quantize's output differs from llama-quantize's")
    out_bytes = our_out.stat().st_size
    floor_out.unlink(missing_ok=True)
    warm_page_cache(f16)
    floor = run_external([sys.executable, str(HERE / "bandwidth_floor.py"), str(f16), str(out_bytes), str(floor_out)])
    for f in (ref_out, our_out, floor_out):
        f.unlink(missing_ok=True)
    ref_s, our_s = statistics.median(r[0] for r in ref), statistics.median(o[0] for o in our)
    ref_mb, our_mb = max(r[1] for r in ref), max(o[1] for o in our)
    row = {"type": ftype, "ref_s": ref_s, "ref_mb": ref_mb, "ours_s": our_s, "ours_mb": our_mb, "floor_s": floor[0],
           "out_gb": out_bytes / 1e9, "speed": ref_s / our_s, "peak": our_mb / ref_mb, "of_floor": our_s / floor[0]}
    met = "**met**" if row["speed"] >= 2 and row["peak"] <= 1 else "not met"
    print(f"| {ftype} | {ref_s:.2f} s / {ref_mb:.0f} MB | {our_s:.2f} s / {our_mb:.0f} MB | {row['speed']:.2f}× | "
          f"{row['peak']:.2f}× | {floor[0]:.2f} s ({row['out_gb']:.2f} GB out) | {row['of_floor']:.2f}× | {met} |",
          flush=True)
    return row


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--types", default=",".join(TYPES))
    ap.add_argument("--pairs", type=int, default=1)
    ap.add_argument("--workdir", type=Path, default=None)
    ap.add_argument("--keep", action="store_true", help="keep the work folder (the F16 GGUF) for the next run")
    args = ap.parse_args()
    work = args.workdir or Path(tempfile.mkdtemp(prefix="dflash-27b-"))
    work.mkdir(parents=True, exist_ok=True)
    try:
        f16 = f16_drafter(work)
        settle()
        print(f"{datetime.datetime.now(datetime.timezone.utc):%Y-%m-%d %H:%M} UTC; {machine()}; load average "
              f"{os.getloadavg()[0]:.1f}; {f16.stat().st_size / 1e9:.2f} GB F16 in; {args.pairs} pair(s) per type",
              flush=True)
        print("| type | llama-quantize, 2 threads | dflash-quantize | speed | peak | bandwidth floor | ours / floor "
              "| goal (≥ 2×, peak ≤ 1×) |\n|---|---|---|---|---|---|---|---|", flush=True)
        for ftype in args.types.split(","):
            measure(work, f16, ftype, args.pairs)
    finally:
        if not args.keep and args.workdir is None:
            shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
