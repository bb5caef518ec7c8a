"""Where the long pair (fixtures/trained-long/, fixtures/make_long_pair.py) stops paying: τ by context length in the
reference runtime and both pinned llama.cpp builds, for the correct file and three planted file defects, parity by
context for each, llama-server under -np 1/2/4, and the reference runtime's cost at 1×, 4×, 16× a context.

    python benchmarks/context.py cost      # time and peak memory of dflash-accept --context L, 4L, 16L (alone)
    python benchmarks/context.py parity    # dflash-parity --context on the correct file and each planted defect
    python benchmarks/context.py tau       # dflash-accept --context … with both builds' llama-server
    python benchmarks/context.py parallel  # dflash-accept --llama-server … --parallel 1,2,4, both builds

Each figure comes from its own dflashkit process with nothing else of ours running (the builds one after the
other). The planted files are the correct bf16 GGUF rewritten by ``tests/hostile.py``'s ``rewrite_gguf`` (gguf-py):
the sliding-window keys dropped, the window changed 128 → 512, ``rope.freq_base`` 1e6 → 1e4. Environment: the
bin/ folders in $DFLASHKIT_LLAMA_CPP_BIN (0.3.36) and $DFLASHKIT_LLAMA_CPP_MAINLINE_BIN (b11549).
"""

from __future__ import annotations

import json
import os
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(ROOT / "tests"))

from _measure import run_measured  # noqa: E402

LONG = ROOT / "fixtures" / "trained-long"
BUILDS = {"0.3.36": "DFLASHKIT_LLAMA_CPP_BIN", "b11549": "DFLASHKIT_LLAMA_CPP_MAINLINE_BIN"}
LEVELS = "0,256,512,1k,2k"


def planted(work: Path) -> dict[str, Path]:
    """The correct bf16 GGUF and the three planted defects."""
    from hostile import plant_context_defects

    from dflashkit.converters.convert import convert

    good = work / "drafter-bf16.gguf"
    convert(LONG / "drafter", good, outtype="bf16", target=LONG / "target", progress=False, warn=lambda m: None)
    return plant_context_defects(good, work)


def _section(data: dict, sid: str) -> list[dict]:
    return next((s["rows"] for s in data["sections"] if s["id"] == sid), [])


def cost() -> None:
    """dflash-accept --context L (one level a process) at 1×, 4×, 16× L: seconds, peak RSS, prefills."""
    print("| --context | mean prompt tokens | seconds | peak RSS MB | target prefills | τ |")
    print("|---|---|---|---|---|---|")
    for level in (64, 256, 1024):
        args = [str(LONG / "drafter"), str(LONG / "drafter"), "--target", str(LONG / "target"), "--prompts",
                str(LONG / "prompts.jsonl"), "--context-file", str(LONG / "context.txt"), "--context", str(level),
                "--max-new-tokens", "64", "--json", "-q"]
        seconds, rss, out = run_measured("accept_command", args)
        row = _section(json.loads(out), "by_context")[0]
        print(f"| {level} | {row['prompt_tokens']:.0f} | {seconds:.1f} | {rss:.0f} | {row['prefills']} | "
              f"{row['tau']:.2f} |", flush=True)


def parity(work: Path) -> None:
    files = planted(work)
    print(f"| file | {' | '.join(f'top-1 at {lv}' for lv in LEVELS.split(','))} | breaks from |")
    print("|---|" + "---|" * (len(LEVELS.split(",")) + 1))
    for name, path in files.items():
        args = [str(LONG / "drafter"), str(path), "--target", str(LONG / "target"), "--context", LEVELS,
                "--context-file", str(LONG / "context.txt"), "--rounds", "4", "--skip-weights", "--json"]
        _, _, out = run_measured("parity_command", args, ok_codes=(0, 1))
        data = json.loads(out)
        rows = _section(data, "by_context")
        broken = [s for s in data["sections"] if s["id"] == "breaks"][0]["items"]
        where = broken[0].split(" the candidate")[0].replace("from --context ", "") if broken else "—"
        cells = " | ".join(f"{r['top1']:.1%}" for r in rows)
        print(f"| {name} | {cells} | {where} |", flush=True)


def tau(work: Path) -> None:
    """One dflash-accept run per build: the correct file first, the three planted ones beside it (one prefill per
    prompt and level serves all four), τ in the reference runtime and τ + speed-up through llama-server."""
    files = planted(work)
    for build, var in BUILDS.items():
        bin_dir = os.environ.get(var)
        if not bin_dir:
            print(f"{build}: set ${var}")
            continue
        args = [*(str(p) for p in files.values()), "--target", str(LONG / "target"), "--prompts",
                str(LONG / "prompts.jsonl"), "--context-file", str(LONG / "context.txt"), "--context", LEVELS,
                "--max-new-tokens", "64", "--llama-server", bin_dir, "--target-gguf", str(work / "target.gguf"),
                "--json", "-q"]
        seconds, rss, out = run_measured("accept_command", args, ok_codes=(0, 1))
        data = json.loads(out)
        names = {p.name: n for n, p in files.items()}
        print(f"\n### {build} ({seconds:.0f} s, peak {rss:.0f} MB)\n\n| file | --context | mean prompt tokens | τ | "
              "τ 95% CI | Δ vs shortest | τ llama-server | speed-up [95% CI] |\n|---|---|---|---|---|---|---|---|")
        for r in _section(data, "by_context"):
            rel = f"{r['relative']:+.0%}" if r.get("relative") is not None else "—"
            ci = r.get("speedup_ci")
            sp = f"{r['speedup']:.2f} [{ci[0]:.2f}, {ci[1]:.2f}]" if ci else "—"
            tci = r.get("tau_ci")
            print(f"| {names.get(Path(r['drafter']).name, r['drafter'])} | {r['context']} | {r['prompt_tokens']:.0f} | "
                  f"{r['tau']:.2f} | {f'[{tci[0]:.2f}, {tci[1]:.2f}]' if tci else '—'} | {rel} | "
                  f"{r.get('tau_server', float('nan')):.2f} | {sp} |")
        print()
        for item in [s for s in data["sections"] if s["id"] == "cliffs"][0]["items"]:
            for p, n in names.items():
                item = item.replace(p, n)
            print(f"- {item}")
        sys.stdout.flush()


def parallel(work: Path) -> None:
    for build, var in BUILDS.items():
        bin_dir = os.environ.get(var)
        if not bin_dir:
            continue
        args = [str(LONG / "drafter"), "--target", str(LONG / "target"), "--prompts", str(LONG / "prompts.jsonl"),
                "--max-new-tokens", "64", "--llama-server", bin_dir, "--target-gguf", str(work / "target.gguf"),
                "--parallel", "1,2,4", "--json", "-q"]
        _, _, out = run_measured("accept_command", args, ok_codes=(0, 1))
        data = json.loads(out)
        print(f"\n### {build}\n\n| -np | batches | τ per slot | tok/s alone | tok/s with drafter | speed-up | 95% CI | "
              "verdict |\n|---|---|---|---|---|---|---|---|")
        for r in _section(data, "by_parallel"):
            print(f"| {r['np']} | {r['batches']} | {r['slot_taus']} | {r['tok_s_off']:.1f} | {r['tok_s_on']:.1f} | "
                  f"{r['speedup']:.2f} | {r['speedup_ci_text']} | {r['verdict']} |")
        for item in [s for s in data["sections"] if s["id"] == "parallel_findings"][0]["items"]:
            print(f"- {item}")
        sys.stdout.flush()


def main() -> None:
    what = sys.argv[1] if len(sys.argv) > 1 else "cost"
    if what == "cost":
        cost()
        return
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        if what in ("tau", "parallel"):
            from dflashkit.llama_cpp import target_gguf_from_hf

            src = os.environ.get("DFLASHKIT_LLAMA_CPP_MAINLINE_SRC") or os.environ["DFLASHKIT_LLAMA_CPP_SRC"]
            target_gguf_from_hf(LONG / "target", work / "target.gguf", Path(src))
        {"parity": parity, "tau": tau, "parallel": parallel}[what](work)


if __name__ == "__main__":
    main()
