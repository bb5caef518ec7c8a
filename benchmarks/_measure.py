"""Timing + peak memory of a dflashkit command run in a child process (shared by the benchmarks).

The child reports its own peak RSS at exit as VmHWM of its own address space: ``ru_maxrss``
(self or children) also counts the pages of the large benchmark process it was forked from.
"""

from __future__ import annotations

import subprocess
import sys
import time

_WRAPPER = (
    "import atexit, re, sys\n"
    "def _hwm():\n"
    "    status = open('/proc/self/status').read()\n"
    "    print('MAXRSS_KB=' + re.search(r'VmHWM:\\s+(\\d+)', status).group(1), file=sys.stderr)\n"
    "atexit.register(_hwm)\n"
    "from dflashkit import cli\n"
    "sys.argv[0] = {name!r}\n"
    "getattr(cli, {command!r})()\n"
)


def run_measured(command: str, args: list[str], ok_codes: tuple[int, ...] = (0,)) -> tuple[float, float, str]:
    """Run the click command ``dflashkit.cli.<command>`` with ``args``: (seconds, peak RSS MB, stdout)."""
    code = _WRAPPER.format(name=command, command=command)
    t = time.perf_counter()
    proc = subprocess.run([sys.executable, "-c", code, *args], capture_output=True, text=True)
    dt = time.perf_counter() - t
    if proc.returncode not in ok_codes:
        raise SystemExit(f"{command} {' '.join(args)} failed ({proc.returncode}): {proc.stderr.strip()[-2000:]}")
    rss = [int(line.split("=")[1]) for line in proc.stderr.splitlines() if line.startswith("MAXRSS_KB=")]
    return dt, (rss[-1] / 1024 if rss else 0.0), proc.stdout
