"""How long each command takes to stop after Ctrl-C, in the middle of its work (issue 26's bound: 2 s).

Each trial runs a command in a child that sends itself SIGINT a random moment into one unit of its work (a tensor
written, a tensor's values scanned, a tensor pair compared, a draft round, a prompt's generation: the technique of
``tests/interrupting.py``) and measures from the signal to the process's exit. The reference, measured in the same
run, is the same trial with the interpreter's usual finalisation (``os._exit`` replaced by ``sys.exit``: what every
command did before it ended interrupted runs without finalisation).

    python benchmarks/interrupt.py [--trials 5]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))

from interrupting import start_interrupted, wait_or_kill, write_big_f32_gguf  # noqa: E402

TRAINED = ROOT / "fixtures" / "trained"
WITH_FINALISATION = "import os, sys\nos._exit = lambda code: sys.exit(code)\n"


def workloads(tmp: Path) -> dict[str, tuple[str, str, int, list[str]]]:
    """name → (command, unit, its fewest calls, arguments)."""
    from dflashkit.converters.convert import convert

    drafter = tmp / "drafter-f32.gguf"
    convert(TRAINED / "drafter", drafter, outtype="f32", target=TRAINED / "target", progress=False)
    big = write_big_f32_gguf(tmp / "big-f32.gguf")
    out, report = str(tmp / "out.gguf"), str(tmp / "report.json")
    target = ["--target", str(TRAINED / "target")]
    padding = "dflashkit.io.gguf_writer:_Writer.write_padding"
    return {
        "convert (HF → f32 GGUF)": ("convert_command", padding, 20,
                                    [str(TRAINED / "drafter"), out, "--outtype", "f32", *target]),
        "quantize (64 MB F32 → Q6_K)": ("quantize_command", padding, 2, [str(big), out, "Q6_K"]),
        "inspect": ("inspect_command", "dflashkit.inspect.values:nonfinite_count", 20,
                    [str(drafter), *target, "-o", report]),
        "diff": ("diff_command", "dflashkit.diff.stats:StatsAccumulator.add", 20,
                 [str(TRAINED / "drafter"), str(drafter), "-o", report]),
        "parity (50 rounds)": ("parity_command", "dflashkit.runtime.dflash:DFlashDraftModel.draft", 100,
                               [str(TRAINED / "drafter"), str(drafter), *target, "--rounds", "50", "-o", report]),
        "accept (24 prompts)": ("accept_command", "dflashkit.accept.run:speculative_generate", 24,
                                [str(drafter), *target, "--prompts", str(TRAINED / "prompts.jsonl"), "-o", report]),
    }


def stop_seconds(command: str, unit: str, k: int, delay: float, args: list[str], stamp: Path, setup: str) -> float:
    proc = start_interrupted(command, [*args, "-q"], unit, k, delay, stamp=stamp, setup=setup)
    rc, _, err = wait_or_kill(proc)
    ended = time.time()
    if rc != 130:
        raise SystemExit(f"{command}: exit {rc}, not 130: {err[-2000:]}")
    return ended - float(stamp.read_text())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--trials", type=int, default=5)
    opts = parser.parse_args()
    rng = np.random.default_rng(0)
    with tempfile.TemporaryDirectory(prefix="dflashkit-interrupt-") as tmp_name:
        tmp = Path(tmp_name)
        print(f"{'command':30} {'stop after Ctrl-C (median / max)':>34} {'with finalisation (reference)':>32}")
        for name, (command, unit, calls, args) in workloads(tmp).items():
            now, before = [], []
            for _ in range(opts.trials):
                k, delay = int(rng.integers(1, calls + 1)), float(rng.uniform(0.0, 0.3))
                now.append(stop_seconds(command, unit, k, delay, args, tmp / "stamp", ""))
                before.append(stop_seconds(command, unit, k, delay, args, tmp / "stamp", WITH_FINALISATION))
            print(f"{name:30} {statistics.median(now):>26.2f} / {max(now):.2f} s "
                  f"{statistics.median(before):>24.2f} / {max(before):.2f} s")
    print("bound (issue 26): 2 s")


if __name__ == "__main__":
    main()
