"""Hostile inputs for issue 16 (reliability): GGUF metadata of every wrong type and range, HF configs
with NaN / Infinity / huge / negative values, and a runner that executes a command in a child
process and reports its exit code, stderr and peak RSS (``ru_maxrss`` of the child).

Used by tests/test_hostile_inputs.py, tests/test_metadata_fuzz.py and tests/test_memory_cap.py.

A watchdog kills a child whose RSS passes ``KILL_RSS`` so that a regression cannot take the machine
down; a killed child is reported as over the cap (the memory assertion is on ``ru_maxrss``, never on
time).
"""

from __future__ import annotations

import json
import os
import resource
import shutil
import subprocess
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

import gguf
import numpy as np
from gguf import GGUFValueType as V

CAP_BYTES = 2 * 1024**3
KILL_RSS = int(2.5 * 1024**3)


# --- GGUF metadata rewriting ------------------------------------------------------------------------


class _EmptyArrayWriter(gguf.GGUFWriter):
    """gguf-py refuses to write an empty array, which GGUF allows (type, element type, count 0)."""

    def _pack_val(self, val, vtype, add_vtype, sub_type=None):  # type: ignore[no-untyped-def]
        if vtype == V.ARRAY and isinstance(val, list) and not val:
            head = self._pack("I", vtype) if add_vtype else b""
            return head + self._pack("I", sub_type or V.INT32) + self._pack("Q", 0)
        if vtype == V.ARRAY and isinstance(val, np.ndarray):  # a large numeric array, as its bytes
            head = self._pack("I", vtype) if add_vtype else b""
            return head + self._pack("I", sub_type) + self._pack("Q", val.size) + val.astype("<" + val.dtype.char).tobytes()
        return super()._pack_val(val, vtype, add_vtype, sub_type)


def rewrite_gguf(src: Path, dst: Path, set_keys: dict[str, tuple] | None = None, drop_keys: tuple[str, ...] = (),
                 replace: dict[str, np.ndarray] | None = None, *, drop_tensors: tuple[str, ...] = (),
                 rename: dict[str, str] | None = None) -> Path:
    """Copy a GGUF with edits: metadata keys set (``set_keys[key] = (value, type[, sub_type])``) or dropped,
    tensors dropped, renamed or replaced (``replace[name]``: new float data of the same shape).

    Other tensors are copied byte for byte. gguf-py writes any value of the declared type, so a key can be
    given a string, an array, an empty array or an out-of-range number. The one GGUF rewriter of the tests."""
    set_keys = set_keys or {}
    rename = rename or {}
    replace = replace or {}
    r = gguf.GGUFReader(src)
    arch = set_keys.get("general.architecture", (r.fields["general.architecture"].contents(),))[0]
    w = _EmptyArrayWriter(dst, arch)
    for k, f in r.fields.items():
        if k.startswith("GGUF.") or k == "general.architecture" or k in drop_keys or k in set_keys:
            continue
        w.add_key_value(k, f.contents(), f.types[0], f.types[1] if len(f.types) > 1 else None)
    for k, value in set_keys.items():
        if k != "general.architecture":
            w.add_key_value(k, value[0], value[1], value[2] if len(value) > 2 else None)
    for t in r.tensors:
        if t.name in drop_tensors:
            continue
        name = rename.get(t.name, t.name)
        if t.name in replace:
            w.add_tensor(name, replace[t.name])
            continue
        # F32/F16 data is typed; any other type comes as bytes whose shape gguf-py maps back itself
        w.add_tensor(name, np.asarray(t.data), raw_dtype=t.tensor_type if t.tensor_type not in (0, 1) else None)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return dst


def plant_context_defects(good: Path, folder: Path) -> dict[str, Path]:
    """``good`` (a drafter GGUF with a sliding window) and three copies whose defect shows only with context: the
    sliding-window keys dropped, the window set to 512, ``rope.freq_base`` 1e4 — by name (the long pair's tests and
    ``benchmarks/context.py``)."""
    return {
        "correct": good,
        "window removed": rewrite_gguf(good, folder / "no-window.gguf", drop_keys=(
            "dflash.attention.sliding_window", "dflash.attention.sliding_window_pattern")),
        "window 512": rewrite_gguf(good, folder / "window-512.gguf",
                                   set_keys={"dflash.attention.sliding_window": (512, V.UINT32)}),
        "rope base 1e4": rewrite_gguf(good, folder / "rope-1e4.gguf",
                                      set_keys={"dflash.rope.freq_base": (10000.0, V.FLOAT32)}),
    }


#: Every drafter metadata key the readers use (llama.cpp dialect, arch ``dflash``) → its good type.
DRAFTER_KEYS: dict[str, V] = {
    "general.file_type": V.UINT32,
    "dflash.context_length": V.UINT32,
    "dflash.embedding_length": V.UINT32,
    "dflash.block_count": V.UINT32,
    "dflash.feed_forward_length": V.UINT32,
    "dflash.attention.head_count": V.UINT32,
    "dflash.attention.head_count_kv": V.UINT32,
    "dflash.attention.key_length": V.UINT32,
    "dflash.attention.value_length": V.UINT32,
    "dflash.attention.layer_norm_rms_epsilon": V.FLOAT32,
    "dflash.rope.freq_base": V.FLOAT32,
    "dflash.block_size": V.UINT32,
    "dflash.target_layers": V.ARRAY,
    "tokenizer.ggml.mask_token_id": V.UINT32,
    "dflash.attention.sliding_window": V.UINT32,
    "dflash.rope.dimension_count": V.UINT32,
    "general.alignment": V.UINT32,
}

#: (label, value, type, sub_type) — one value of every wrong type and range.
WRONG_VALUES: list[tuple[str, Any, V, V | None]] = [
    ("string", "16", V.STRING, None),
    ("empty-string", "", V.STRING, None),
    ("bool", True, V.BOOL, None),
    ("zero", 0, V.UINT32, None),
    ("negative", -1, V.INT32, None),
    ("int64-min", -(2**63), V.INT64, None),
    ("u32-max", 2**32 - 1, V.UINT32, None),
    ("u64-max", 2**64 - 1, V.UINT64, None),
    ("float", 2.5, V.FLOAT32, None),
    ("nan", float("nan"), V.FLOAT32, None),
    ("inf", float("inf"), V.FLOAT64, None),
    ("neg-inf", float("-inf"), V.FLOAT32, None),
    ("huge-float", 1e308, V.FLOAT64, None),
    ("empty-array", [], V.ARRAY, V.INT32),
    ("int-array", [1, 2, 3], V.ARRAY, V.INT32),
    ("string-array", ["a", "b"], V.ARRAY, V.STRING),
    ("float-array", [float("nan")], V.ARRAY, V.FLOAT32),
    ("negative-array", [-5, 3], V.ARRAY, V.INT32),
    ("huge-array", [2**31 - 1], V.ARRAY, V.INT32),
]


# --- HF config editing ------------------------------------------------------------------------------


def hf_copy(src: Path, dst: Path, edit: Callable[[dict], Any] | None = None, raw: str | None = None) -> Path:
    """Copy an HF drafter dir; ``edit`` changes the parsed config in place, or ``raw`` replaces its text
    (for JSON that only Python's json accepts: NaN, Infinity, 10,000 digits, deep nesting)."""
    if dst.exists():
        shutil.rmtree(dst)
    shutil.copytree(src, dst)
    cfg = dst / "config.json"
    if raw is not None:
        cfg.write_text(raw)
    elif edit is not None:
        config = json.loads(cfg.read_text())
        edit(config)
        cfg.write_text(json.dumps(config))
    return dst


def config_text_with(src: Path, key: str, literal: str, nested: bool = False) -> str:
    """config.json of ``src`` with ``key`` set to a raw JSON literal (``NaN``, ``1e999``, digits ...)."""
    config = json.loads((src / "config.json").read_text())
    marker = "__HOSTILE__"
    (config.setdefault("dflash_config", {}) if nested else config)[key] = marker
    return json.dumps(config).replace(f'"{marker}"', literal)


# --- running a command under the cap ----------------------------------------------------------------


@dataclass
class Run:
    argv: list[str]
    returncode: int
    stdout: str
    stderr: str
    peak_rss: int  # bytes: the child's own VmHWM (see run_capped)
    killed: bool

    def describe(self) -> str:
        last = self.stderr.strip().splitlines()[-1:] or [""]
        shown = " ".join(self.argv[3:] if self.argv[1:2] == ["-c"] else self.argv)
        return f"rc={self.returncode} rss={self.peak_rss / 2**20:.0f}MiB {shown} :: {last[0][:200]}"


def run_capped(argv: list[str], env: dict[str, str] | None = None, cwd: str | None = None) -> Run:
    """Run ``argv`` in a child and return its exit code, output and own peak RSS.

    The peak is the VmHWM a `cli` child reports at exit, else ``wait4``'s ru_maxrss of that child alone
    (which also counts the pages it was forked with); a watchdog kills the child when its RSS passes
    `KILL_RSS` (reported as ``killed``)."""
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env, cwd=cwd)
    killed = False
    stop = threading.Event()

    def watch() -> None:
        nonlocal killed
        status = Path(f"/proc/{proc.pid}/status")
        while not stop.wait(0.05):
            try:
                text = status.read_text()
            except OSError:
                return
            for line in text.splitlines():
                if line.startswith("VmRSS:") and int(line.split()[1]) * 1024 > KILL_RSS:
                    killed = True
                    proc.kill()
                    return

    watcher = threading.Thread(target=watch, daemon=True)
    watcher.start()
    out_chunks: list[bytes] = []
    err_chunks: list[bytes] = []
    readers = [threading.Thread(target=lambda s=s, c=c: c.append(s.read()), daemon=True)
               for s, c in ((proc.stdout, out_chunks), (proc.stderr, err_chunks))]
    for t in readers:
        t.start()
    _, status, usage = os.wait4(proc.pid, 0)
    proc.returncode = os.waitstatus_to_exitcode(status)
    stop.set()
    for t in readers:
        t.join()
    watcher.join()
    stderr = b"".join(err_chunks).decode(errors="replace")
    hwm = [int(line[len(HWM_PREFIX):]) * 1024 for line in stderr.splitlines() if line.startswith(HWM_PREFIX)]
    stderr = "".join(line for line in stderr.splitlines(keepends=True) if not line.startswith(HWM_PREFIX))
    # the child's own VmHWM when it reported one; else wait4's ru_maxrss (an upper bound: it includes the fork)
    peak = hwm[-1] if hwm else usage.ru_maxrss * 1024
    return Run(argv, proc.returncode, b"".join(out_chunks).decode(errors="replace"), stderr, peak, killed)


HWM_PREFIX = "HOSTILE_VMHWM_KB="


def cli(command: str) -> list[str]:
    """argv that runs the click command ``command`` of dflashkit.cli (e.g. ``inspect_command``) in a child
    Python with the dflashkit this test run imports. At exit the child prints its own peak RSS (VmHWM of
    its own address space) on stderr: ``ru_maxrss`` also counts the pages of the large pytest process
    the child was forked from."""
    code = (
        "import atexit, re, sys\n"
        "atexit.register(lambda: print('" + HWM_PREFIX + "' + re.search(r'VmHWM:\\s+(\\d+)', "
        "open('/proc/self/status').read()).group(1), file=sys.stderr))\n"
        f"from dflashkit.cli import {command} as c\n"
        f"c.main(sys.argv[1:], prog_name='{command}')\n"
    )
    return [sys.executable, "-c", code]



def _set(key: str, value: Any, nested: bool = False) -> Callable[[dict], None]:
    def edit(config: dict) -> None:
        (config.setdefault("dflash_config", {}) if nested else config)[key] = value
    return edit


#: (label, edit or None, raw JSON literal for (key, nested) or None) — hostile HF drafter configs.
#: Each must give a one-line error naming the file and (where there is one) the key.
HF_CASES: list[tuple[str, Any, tuple[str, str, bool] | None, str]] = [
    # label, edit, (key, literal, nested), a word the message must contain
    ("layers-1e6", _set("num_hidden_layers", 1000000), None, "num_hidden_layers"),
    ("layers-1e9-float", _set("num_hidden_layers", 1e9), None, "num_hidden_layers"),
    ("layers-1e6-use-swa", lambda c: (c.update(num_hidden_layers=1000000), c["dflash_config"].update(use_swa=True, swa_window_size=8)), None, "num_hidden_layers"),
    ("layers-1e6-layer-types", lambda c: c.update(num_hidden_layers=1000000, layer_types=["full_attention"] * 3, sliding_window=8), None, "num_hidden_layers"),
    ("hidden-nan", None, ("hidden_size", "NaN", False), "hidden_size"),
    ("hidden-infinity", None, ("hidden_size", "Infinity", False), "hidden_size"),
    ("block-nan", None, ("block_size", "NaN", False), "block_size"),
    ("mask-neg-infinity", None, ("mask_token_id", "-Infinity", True), "mask_token_id"),
    ("block-2^40", _set("block_size", 2**40), None, "block_size"),
    ("mask-1e12", _set("mask_token_id", 10**12, nested=True), None, "mask_token_id"),
    ("mask-past-vocab", _set("mask_token_id", 512, nested=True), None, "mask_token_id"),
    ("eps-1e308", _set("rms_norm_eps", 1e308), None, "rms_norm_eps"),
    ("rope-theta-1e300", _set("rope_theta", 1e300), None, "rope_theta"),
    ("partial-rotary-negative", _set("partial_rotary_factor", -0.5), None, "partial_rotary_factor"),
    ("taps-negative", _set("target_layer_ids", [-1, 8], nested=True), None, "target_layer_ids"),
    ("taps-huge", _set("target_layer_ids", [1, 2**40], nested=True), None, "target_layer_ids"),
    ("layer-types-dict", lambda c: c.update(layer_types=[{}, {}]), None, "layer_types"),
    ("layer-types-list", lambda c: c.update(layer_types=[[1], "full_attention"]), None, "layer_types"),
    ("architectures-list-of-int", _set("architectures", [1]), None, "architecture"),
    ("dflash-config-list", _set("dflash_config", [1]), None, "dflash_config"),
    ("ten-thousand-digits", None, ("hidden_size", "9" * 10000, False), "config.json"),
    ("deep-nesting", None, ("text_config", "[" * 100000 + "]" * 100000, False), "nested too deeply"),
    ("top-level-list", None, None, "JSON object"),
    ("not-json", None, None, "cannot read JSON"),
]


def make_hf_case(src: Path, dst: Path, label: str) -> Path:
    """The hostile copy of the HF drafter ``src`` for case ``label`` of `HF_CASES`."""
    case = {c[0]: c for c in HF_CASES}[label]
    _, edit, raw, _ = case
    if label == "top-level-list":
        return hf_copy(src, dst, raw="[1, 2]")
    if label == "not-json":
        return hf_copy(src, dst, raw="{bad")
    if raw is not None:
        key, literal, nested = raw
        return hf_copy(src, dst, raw=config_text_with(src, key, literal, nested))
    return hf_copy(src, dst, edit=edit)
