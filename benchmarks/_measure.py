"""Timing + peak memory of a dflashkit command run in a child process, and the 4B drafter's config (shared by
the benchmarks).

The child reports its own peak RSS at exit as VmHWM of its own address space: ``ru_maxrss``
(self or children) also counts the pages of the large benchmark process it was forked from.
"""

from __future__ import annotations

import os
import resource
import subprocess
import sys
import time
from pathlib import Path
from typing import NamedTuple

#: z-lab Qwen3-4B-DFlash-b16's config.json (docs/dialects.md): the drafter every 4B-size benchmark writes
CONFIG_4B = {
    "architectures": ["DFlashDraftModel"],
    "model_type": "qwen3",
    "hidden_size": 2560,
    "num_hidden_layers": 5,
    "num_attention_heads": 32,
    "num_key_value_heads": 8,
    "head_dim": 128,
    "intermediate_size": 9728,
    "rms_norm_eps": 1e-6,
    "max_position_embeddings": 40960,
    "rope_theta": 1000000.0,
    "block_size": 16,
    "num_target_layers": 36,
    "vocab_size": 151936,
    "hidden_act": "silu",
    "attention_bias": False,
    "tie_word_embeddings": False,
    "torch_dtype": "bfloat16",
    "dflash_config": {"mask_token_id": 151669, "target_layer_ids": [1, 9, 17, 25, 33]},
}

_WRAPPER = (
    "import atexit, re, sys\n"
    "def _hwm():\n"
    "    status = open('/proc/self/status').read()\n"
    "    print('MAXRSS_KB=' + re.search(r'VmHWM:\\s+(\\d+)', status).group(1), file=sys.stderr)\n"
    "atexit.register(_hwm)\n"
    "from dflashkit import cli\n"
    "sys.argv[0] = 'dflash-' + {name!r}.removesuffix('_command')  # what a console script sees\n"
    "getattr(cli, {command!r})()\n"
)


class Measured(NamedTuple):
    wall_s: float
    cpu_s: float  # the child's user + system time
    peak_mb: float  # its own VmHWM at exit
    stdout: str


def measure_command(command: str, args: list[str], ok_codes: tuple[int, ...] = (0,),
                    tree: Path | None = None) -> Measured:
    """Run the click command ``dflashkit.cli.<command>`` with ``args`` in a child process — with ``tree``'s
    dflashkit (a worktree of another revision) where given: its wall time, CPU time, peak memory and stdout."""
    code = _WRAPPER.format(name=command, command=command)
    env = None if tree is None else {**os.environ, "PYTHONPATH": str(tree)}
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    t = time.perf_counter()
    proc = subprocess.run([sys.executable, "-c", code, *args], capture_output=True, text=True, env=env, cwd=tree)
    dt = time.perf_counter() - t
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if proc.returncode not in ok_codes:
        where = f"{tree}: " if tree is not None else ""
        raise SystemExit(f"{where}{command} {' '.join(args)} failed ({proc.returncode}): "
                         f"{proc.stderr.strip()[-2000:]}")
    rss = [int(line.split("=")[1]) for line in proc.stderr.splitlines() if line.startswith("MAXRSS_KB=")]
    cpu = after.ru_utime + after.ru_stime - before.ru_utime - before.ru_stime
    return Measured(dt, cpu, rss[-1] / 1024 if rss else 0.0, proc.stdout)


def run_measured(command: str, args: list[str], ok_codes: tuple[int, ...] = (0,)) -> tuple[float, float, str]:
    """Run the click command ``dflashkit.cli.<command>`` with ``args``: (seconds, peak RSS MB, stdout)."""
    m = measure_command(command, args, ok_codes)
    return m.wall_s, m.peak_mb, m.stdout
