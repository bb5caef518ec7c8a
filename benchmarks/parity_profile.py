"""Where `dflash-parity`'s time and memory go: phase timers (wall, CPU) and each phase's peak RSS.

Runs the command in this process with its phases wrapped — loading each drafter, the target head, every
draft round, the weight section (``diff_drafters``) — and a thread sampling RSS every 10 ms; prints one
line per phase, the number of draft calls and packed matmuls, the values they unpacked, and VmHWM.
Figures in benchmarks/PERFORMANCE.md ("What changed"). Pass dflash-parity's own arguments, e.g. on the
inputs `commands_vs_reference.py --rows parity --keep` leaves in its work directory:

    python benchmarks/parity_profile.py W/drafter4b W/drafter4b-q8_0.gguf --target W/target-head.gguf --rounds 3 --json
"""

from __future__ import annotations

import contextlib
import io
import re
import resource
import sys
import threading
import time
from typing import Any, Callable

T0 = time.perf_counter()


def rss_mb() -> tuple[int, int]:
    """(VmRSS, VmHWM) in MB of 2^20 bytes."""
    status = open("/proc/self/status").read()
    return tuple(int(re.search(rf"{k}:\s+(\d+)", status).group(1)) // 1024 for k in ("VmRSS", "VmHWM"))  # type: ignore[return-value]


def cpu_s() -> float:
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


_peak = [0]


def _sample() -> None:
    while True:
        _peak[0] = max(_peak[0], rss_mb()[0])
        time.sleep(0.01)


def phase(name: str, fn: Callable[..., Any]) -> Callable[..., Any]:
    def wrapped(*a: Any, **k: Any) -> Any:
        _peak[0] = rss_mb()[0]
        t, c = time.perf_counter(), cpu_s()
        try:
            return fn(*a, **k)
        finally:
            print(f"{name}: {time.perf_counter() - t:.2f} s wall, {cpu_s() - c:.2f} s CPU, RSS {rss_mb()[0]} MB "
                  f"after, {_peak[0]} MB peak", file=sys.stderr)

    return wrapped


def main() -> None:
    threading.Thread(target=_sample, daemon=True).start()
    import torch  # noqa: F401

    print(f"import torch: {time.perf_counter() - T0:.2f} s, RSS {rss_mb()[0]} MB", file=sys.stderr)
    from dflashkit import cli
    from dflashkit.parity import run as parity
    from dflashkit.runtime import dflash

    parity.load_drafter = phase("load drafter", parity.load_drafter)
    parity.load_target_head = phase("load target head", parity.load_target_head)
    parity._run_rounds = phase("all rounds", parity._run_rounds)
    parity._project = phase("  head, every round of both", parity._project)
    parity.diff_drafters = phase("weight section", parity.diff_drafters)
    dflash.DFlashDraftModel.draft = phase("  draft", dflash.DFlashDraftModel.draft)
    counts = {"matmuls": 0, "values": 0}
    packed = dflash.Linear._packed_forward

    def counted(self: Any, x: Any) -> Any:
        counts["matmuls"] += 1
        counts["values"] += self.out_features * self.in_features
        return packed(self, x)

    dflash.Linear._packed_forward = counted
    sys.argv = ["dflash-parity", *sys.argv[1:]]
    with contextlib.suppress(SystemExit), contextlib.redirect_stdout(io.StringIO()):
        cli.parity_command()
    print(f"total {time.perf_counter() - T0:.2f} s, {cpu_s():.2f} s CPU; {counts['matmuls']} packed matmuls "
          f"unpacked {counts['values'] / 1e9:.2f} G values; VmHWM {rss_mb()[1]} MB", file=sys.stderr)


if __name__ == "__main__":
    main()
