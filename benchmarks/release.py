"""dflash-release of the trained pair (six types), three ways, on this machine: in-process (``--jobs 1``), the local
process pool (the default) and Ray on a local cluster (``--ray``; the driver starts it with the machine's CPUs);
then the release with its serving step and the same files through ``dflash-accept --llama-server``.

    python benchmarks/release.py [--out /tmp/release-bench] [--example docs/example-release/README.md]

Per way: wall time of the whole command (start-up included) and the peak of the summed RSS of the command's process
tree (the driver, its pool workers, Ray's daemons and workers), sampled every 0.1 s. The three releases must be
identical (every file byte for byte, timings.json aside); the script checks it.

Serving (with $DFLASHKIT_LLAMA_CPP_BIN / $DFLASHKIT_LLAMA_CPP_MAINLINE_BIN, the builds .ci/run makes): the default
pool release with ``--llama-server`` of both builds, ``--draft-n-max 4,8,15`` and ``--naming target``, against the
target GGUF llama.cpp's own converter makes — its card is what ``--example`` copies —, then ``dflash-accept
--llama-server`` of each build on the very files the release wrote, same prompts, tokens, seed and n-max, one after
the other: each type's speed-up from the release beside the one dflash-accept measures.
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


def serving_comparison(out: Path, builds: dict[str, str], prompts: Path, max_new_tokens: int) -> list[str]:
    """The release with its serving step, then dflash-accept on its files: a Markdown table side by side."""
    import json

    from dflashkit.llama_cpp import target_gguf_from_hf

    src = os.environ.get("DFLASHKIT_LLAMA_CPP_SRC")
    target_gguf = out / "tiny-qwen3-bf16.gguf"
    out.mkdir(parents=True, exist_ok=True)
    target_gguf_from_hf(TRAINED / "target", target_gguf, Path(src))
    folder = out / "served"
    extra = ["--target-gguf", str(target_gguf), "--draft-n-max", "4,8,15", "--naming", "target", "--target-name",
             "tiny-qwen3", "--prompts", str(prompts), "--max-new-tokens", str(max_new_tokens)]
    for bin_dir in builds.values():
        extra += ["--llama-server", bin_dir]
    wall, peak = run("pool + serving", extra, folder)
    record = json.loads((folder / "release.json").read_text())
    timings = json.loads((folder / "timings.json").read_text())
    last_job = max(j["finished"] for j in timings["jobs"].values())
    serving = sorted((s["started"], s["finished"]) for s in timings["serving"])
    alone = all(a >= last_job for a, _ in serving) and all(e <= b for (_, e), (b, _) in zip(serving, serving[1:]))
    files = [folder / record["jobs"][t]["file"] for t in record["types"]]
    accepted: dict[str, dict] = {}
    for name, bin_dir in builds.items():
        report = out / f"accept-{name}.json"
        cmd = [sys.executable, "-c", "from dflashkit.cli import accept_command; accept_command()", *map(str, files),
               "--target", str(TRAINED / "target"), "--llama-server", bin_dir, "--target-gguf", str(target_gguf),
               "--draft-n-max", "4,8,15", "--max-new-tokens", str(max_new_tokens), "--prompts", str(prompts),
               "--json", "-q", "-o", str(report)]
        subprocess.run(cmd, check=True, cwd=ROOT, env={**os.environ, "PYTHONPATH": str(ROOT)})
        rows = next(s["rows"] for s in json.loads(report.read_text())["sections"] if s["id"] == "serving")
        accepted[name] = {(Path(r["drafter"]).name, r["draft_n_max"]): r for r in rows}
    from dflashkit.release.serving_record import build_name

    by_card_name = {build_name(bin_dir): name for name, bin_dir in builds.items()}
    lines = [f"Release with its serving step (pool, both builds, n-max 4, 8, 15): {wall:.1f} s wall, peak "
             f"{peak / 1e6:.0f} MB; serving steps after the last job and one at a time: {'yes' if alone else 'NO'} "
             f"(timings.json, {len(serving)} steps); host {record['serving']['host']}.", "",
             "| type | build | n-max | release: speed-up [95 % CI] | verdict | dflash-accept: speed-up [95 % CI] "
             "| verdict | release τ | accept τ |", "|---|---|---:|---|---|---|---|---:|---:|"]

    def fig(speedup: float | None, ci: list | None) -> str:
        return "–" if speedup is None else f"×{speedup:.2f}" + (f" [{ci[0]:.2f}, {ci[1]:.2f}]" if ci else "")

    for t in record["types"]:
        job = record["jobs"][t]
        for e in job["serving"]:
            a = accepted[by_card_name[e["build"]]].get((job["file"], e["draft_n_max"]))
            lines.append(f"| {t} | {e['build']} | {e['draft_n_max']} | {fig(e['speedup'], e['speedup_ci'])} | "
                         f"{e['verdict']} | {fig(a['speedup'], a['speedup_ci']) if a else '–'} | "
                         f"{a['verdict'] if a else '–'} | {e['tau']:.2f} | {a['tau'] if a else float('nan'):.2f} |")
    return lines


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, default=Path("/tmp/dflashkit-release-bench"))
    ap.add_argument("--example", type=Path, help="copy the card here (docs/example-release/README.md)")
    ap.add_argument("--serving-prompts", type=Path, default=TRAINED / "prompts.jsonl",
                    help="the serving part's prompts (default: the trained pair's own, where its τ is ~14)")
    ap.add_argument("--serving-tokens", type=int, default=128)
    ap.add_argument("--serving-only", action="store_true", help="leave the three ways out")
    args = ap.parse_args()
    load = os.getloadavg()[0]
    print(f"# dflash-release benchmark, {datetime.date.today()}, {platform.machine()}, {os.cpu_count()} CPUs "
          f"(load average {load:.1f}), Python {platform.python_version()}")
    ways = [("in-process (--jobs 1)", "in-process", ["--jobs", "1"]), ("process pool (default)", "pool", []),
            ("Ray, local cluster (--ray)", "ray", ["--ray"])] if not args.serving_only else []
    results = {}
    print(f"{'way':28s} {'wall s':>8s} {'peak RSS MB':>12s}")
    for label, name, extra in ways:
        folder = args.out / name
        wall, peak = run(label, extra, folder)
        results[label] = folder
        print(f"{label:28s} {wall:8.1f} {peak / 1e6:12.0f}")
    first = next(iter(results.values()), None)
    for label, folder in results.items():
        for f in first.iterdir():  # type: ignore[union-attr]
            if f.name != "timings.json" and f.read_bytes() != (folder / f.name).read_bytes():
                raise SystemExit(f"{label}: {f.name} differs from the in-process release")
    if results:
        print("all three releases identical (every file byte for byte, timings.json aside)")
    builds = {name: os.environ[var] for name, var in (("0.3.36", "DFLASHKIT_LLAMA_CPP_BIN"),
                                                      ("b11549", "DFLASHKIT_LLAMA_CPP_MAINLINE_BIN"))
              if os.environ.get(var)}
    if not builds:
        print("no llama.cpp build ($DFLASHKIT_LLAMA_CPP_BIN): the serving part is left out")
        return
    print("\n".join(serving_comparison(args.out / "serving", builds, args.serving_prompts, args.serving_tokens)))
    if args.example:
        args.example.parent.mkdir(parents=True, exist_ok=True)
        card = (args.out / "serving" / "served" / "README.md").read_text()
        args.example.write_text(
            "# Example: the card dflash-release writes\n\n"
            f"Written by `dflash-release fixtures/trained/drafter OUT --target fixtures/trained/target --llama-server "
            f"BUILD_0.3.36 --llama-server BUILD_b11549 --target-gguf tiny-qwen3-bf16.gguf --draft-n-max 4,8,15 "
            f"--naming target --target-name tiny-qwen3 --prompts {args.serving_prompts.name} --max-new-tokens "
            f"{args.serving_tokens}` on {datetime.date.today()} (`python benchmarks/release.py "
            f"--example {args.example}`). **Its figures are the tiny trained test pair's** (a 2-layer, 256-wide "
            "drafter of a 4-layer target, `fixtures/trained/`, on a 2-core CPU, where the drafter costs about what "
            "the target costs), not a real model's; the card of a real release has the same sections.\n\n"
            f"`````markdown\n{card}`````\n")
        print(f"card copied to {args.example}")


if __name__ == "__main__":
    main()
