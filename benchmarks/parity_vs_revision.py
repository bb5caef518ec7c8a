"""`dflash-parity` on the 4B-size drafter, this tree against an earlier revision run from a git worktree, in the
same run: wall time, CPU time (user + sys of the command's process) and peak RSS (its VmHWM), interleaved pair by
pair, and the two JSON reports compared byte for byte (the script stops when they differ).

    python benchmarks/parity_vs_revision.py --ref REV [--pairs 3] [--workdir DIR]

The inputs are `commands_vs_reference.py`'s (its ``parity`` row writes them, or reuses them in ``--workdir``): the
synthetic Qwen3-4B-DFlash-b16-size bf16 drafter (537 M parameters), its Q8_0 GGUF and a target GGUF holding only
Qwen3-4B's tied 151 936 × 2560 embedding in Q8_0; `--rounds 3 --json`. Goal (issue 42): peak < 1.5 GB and < 10 s
of CPU.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))

from _measure import measure_command  # noqa: E402


def run_parity(tree: Path, work: Path) -> tuple[float, float, float, str]:
    """(wall s, CPU s, peak MB, the JSON report) of one ``dflash-parity`` with ``tree``'s dflashkit."""
    args = [str(work / "drafter4b"), str(work / "drafter4b-q8_0.gguf"), "--target", str(work / "target-head.gguf"),
            "--rounds", "3", "--json"]
    m = measure_command("parity_command", args, tree=tree)
    return m.wall_s, m.cpu_s, m.peak_mb, m.stdout


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--ref", required=True, help="the revision to measure beside this tree")
    ap.add_argument("--pairs", type=int, default=3)
    ap.add_argument("--workdir", type=Path, default=Path(tempfile.gettempdir()) / "dflashkit-bench")
    args = ap.parse_args()
    work = args.workdir
    if not (work / "target-head.gguf").exists() or not (work / "drafter4b-q8_0.gguf").exists():
        subprocess.run([sys.executable, str(ROOT / "benchmarks" / "commands_vs_reference.py"), "--rows", "parity",
                        "--pairs", "1", "--workdir", str(work), "--keep"], check=True)
    print(f"{time.strftime('%Y-%m-%d %H:%M', time.gmtime())} UTC; load average {os.getloadavg()[0]:.1f}; "
          f"{args.pairs} interleaved pairs", flush=True)
    ref_tree = Path(tempfile.mkdtemp(prefix="dflashkit-parity-ref-")) / "tree"
    subprocess.run(["git", "-C", str(ROOT), "worktree", "add", "--detach", "-q", str(ref_tree), args.ref], check=True)
    try:
        rows: dict[str, list[tuple[float, float, float]]] = {"ref": [], "now": []}
        reports = {}
        for i in range(args.pairs):
            for name, tree in (("ref", ref_tree), ("now", ROOT)) if i % 2 == 0 else (("now", ROOT), ("ref", ref_tree)):
                wall, cpu, peak, report = run_parity(tree, work)
                rows[name].append((wall, cpu, peak))
                reports.setdefault(name, report)
                if report != reports[name]:
                    raise SystemExit(f"{name}: the report changed between runs")
        if reports["ref"] != reports["now"]:
            raise SystemExit("the JSON reports differ between the revisions")
    finally:
        subprocess.run(["git", "-C", str(ROOT), "worktree", "remove", "--force", str(ref_tree)], check=False)
    for name, label in (("ref", f"{args.ref} (before)"), ("now", "this tree")):
        w = statistics.median(r[0] for r in rows[name])
        c = statistics.median(r[1] for r in rows[name])
        p = max(r[2] for r in rows[name])
        print(f"{label:24s} wall {w:6.2f} s  CPU {c:6.2f} s  peak {p:7.0f} MB")
    print("JSON reports: byte-identical")


if __name__ == "__main__":
    main()
