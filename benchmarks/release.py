"""dflash-release of the trained pair (six types), three ways, on this machine: in-process (``--jobs 1``), the local
process pool (the default) and Ray on a local cluster (``--ray``; the driver starts it with the machine's CPUs).

    python benchmarks/release.py [--out /tmp/release-bench] [--example docs/example-release/README.md]

Per way: wall time of the whole command (start-up included) and the peak of the summed RSS of the command's process
tree (the driver, its pool workers, Ray's daemons and workers), sampled every 0.1 s. The three releases must be
identical (every file byte for byte, timings.json aside); the script checks it, and ``--example`` copies the card.
"""

from __future__ import annotations

import argparse
import datetime
import os
import platform
import shutil
import subprocess
import sys
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
TRAINED = ROOT / "fixtures" / "trained"


def tree_rss(pid: int) -> int:
    """Summed RSS (bytes) of ``pid`` and every descendant."""
    children: dict[int, list[int]] = {}
    rss: dict[int, int] = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text().rsplit(")", 1)[1].split()
            rss[int(entry.name)] = int(stat[21]) * os.sysconf("SC_PAGE_SIZE")
            children.setdefault(int(stat[1]), []).append(int(entry.name))
        except (OSError, IndexError, ValueError):
            continue
    total, todo = 0, [pid]
    while todo:
        p = todo.pop()
        total += rss.get(p, 0)
        todo += children.get(p, [])
    return total


def run(label: str, extra: list[str], out: Path) -> tuple[float, int]:
    shutil.rmtree(out, ignore_errors=True)
    out.parent.mkdir(parents=True, exist_ok=True)
    cmd = [sys.executable, "-c", "from dflashkit.cli import release_command; release_command()",
           "fixtures/trained/drafter", str(out), "--target", "fixtures/trained/target", "-q", *extra]
    start = time.monotonic()
    proc = subprocess.Popen(cmd, env={**os.environ, "PYTHONPATH": str(ROOT)}, cwd=ROOT)
    peak = [0]
    stop = threading.Event()

    def sample() -> None:
        while not stop.wait(0.1):
            peak[0] = max(peak[0], tree_rss(proc.pid))

    t = threading.Thread(target=sample, daemon=True)
    t.start()
    code = proc.wait()
    wall = time.monotonic() - start
    stop.set()
    t.join()
    if code != 0:
        raise SystemExit(f"{label}: exit {code}")
    return wall, peak[0]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, default=Path("/tmp/dflashkit-release-bench"))
    ap.add_argument("--example", type=Path, help="copy the card here (docs/example-release/README.md)")
    args = ap.parse_args()
    load = os.getloadavg()[0]
    print(f"# dflash-release benchmark, {datetime.date.today()}, {platform.machine()}, {os.cpu_count()} CPUs "
          f"(load average {load:.1f}), Python {platform.python_version()}")
    ways = [("in-process (--jobs 1)", "in-process", ["--jobs", "1"]), ("process pool (default)", "pool", []),
            ("Ray, local cluster (--ray)", "ray", ["--ray"])]
    results = {}
    print(f"{'way':28s} {'wall s':>8s} {'peak RSS MB':>12s}")
    for label, name, extra in ways:
        folder = args.out / name
        wall, peak = run(label, extra, folder)
        results[label] = folder
        print(f"{label:28s} {wall:8.1f} {peak / 1e6:12.0f}")
    first = next(iter(results.values()))
    for label, folder in results.items():
        for f in first.iterdir():
            if f.name != "timings.json" and f.read_bytes() != (folder / f.name).read_bytes():
                raise SystemExit(f"{label}: {f.name} differs from the in-process release")
    print("all three releases identical (every file byte for byte, timings.json aside)")
    if args.example:
        args.example.parent.mkdir(parents=True, exist_ok=True)
        card = (first / "README.md").read_text()
        args.example.write_text(
            "# Example: the card dflash-release writes\n\n"
            f"Written by `dflash-release fixtures/trained/drafter OUT --target fixtures/trained/target` on "
            f"{datetime.date.today()} (`python benchmarks/release.py --example {args.example}`). **Its figures are "
            "the tiny trained test pair's** (a 2-layer, 256-wide drafter of a 4-layer target, `fixtures/trained/`), "
            "not a real model's; the card of a real release has the same sections.\n\n"
            f"`````markdown\n{card}`````\n")
        print(f"card copied to {args.example}")


if __name__ == "__main__":
    main()
