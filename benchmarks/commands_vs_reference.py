"""Every command against its reference, each row with its reference measured in the same run, pair by pair.

Rows (``--rows`` picks some; default all):

- ``f16``     bf16 HF checkpoint → f16 GGUF: llama.cpp's ``convert_hf_to_gguf.py`` (from the sdist) vs ``dflash-convert``
- ``bf16``    bf16 HF checkpoint → bf16 GGUF (tensor bytes unchanged): ``cp -r`` of the checkpoint vs ``dflash-convert``,
              and ``copy_floor.py`` (Python start-up + the kernel copy alone: the floor of any Python converter)
- ``bf16scan`` bf16 → bf16 again, against revision 5125974 (the converter before the NaN / inf scan of copied
              tensors) and ``copy_floor.py``, same run: the scan must cost ≤ 10 % of its time and keep the peak ≤ 60 MB
- ``q4km``    f16 GGUF → Q4_K_M: ``llama-quantize`` (2 threads) vs ``dflash-quantize``; the bytes must be identical
- ``newtypes`` the same for every type issue 40 added (Q4_0 … Q2_K): ≥ 2x faster, peak no higher than llama-quantize's
- ``tensor``  one 8192 × 8192 f32 tensor, whole command, Q4_K / Q6_K / Q8_0: ``llama-quantize --pure`` on one
              thread (ggml's reference quantizer) vs ``dflash-quantize --pure``; bytes identical
- ``parity``  ``dflash-parity`` HF vs Q8_0 GGUF at Qwen3-4B-DFlash-b16 dims (no reference; goal < 60 s, < 2.5 GB)
- ``large``   Qwen3.6-27B drafter dims (~1.7 B params, 3.5 GB bf16): convert → f16, quantize Q4_K_M, inspect, diff;
              each peak ≤ 2 × the largest tensor + 300 MB (quantize: + its output row buffer)

The 4B-size drafter has z-lab Qwen3-4B-DFlash-b16's exact dimensions (537 M parameters, 3 bf16 shards,
1.07 GB), random seeded weights. Each pair runs the reference, then ours; the table shows medians over
``--pairs`` pairs (the machine is shared: interleaving exposes both sides to the same load).

Peak RSS: ours is the child's own VmHWM (``_measure.run_measured``); a reference's is ``/usr/bin/time``'s
maximum resident set (ru_maxrss of the program itself).

llama.cpp's converter refuses a DFlash drafter without ``--target-model-dir`` (it takes the tokenizer from
there) and refuses a tokenizer whose pre-tokenizer hash it does not list; the synthetic target's tokenizer is
tiny, so the converter is started through a 3-line shim that answers ``"qwen2"`` (what Qwen3's real tokenizer
hashes to). Tensor conversion — what is measured — is untouched; the tiny vocabulary only makes the
reference's tokenizer step cheaper than with the real one.

Environment: ``DFLASHKIT_LLAMA_CPP_SRC`` (llama.cpp source tree, default the llama-cpp-python 0.3.36 sdist's
``vendor/llama.cpp`` in ~/.cache/dflashkit), ``DFLASHKIT_LLAMA_CPP_BIN`` (folder with ``llama-quantize``).

    python benchmarks/commands_vs_reference.py [--rows f16,bf16,bf16scan,q4km,newtypes,tensor,parity,large] [--pairs 3] [--workdir DIR] [--keep]
"""

from __future__ import annotations

import argparse
import datetime
import filecmp
import json
import os
import platform
import resource
import shutil
import statistics
import struct
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(ROOT / "fixtures"))
from _measure import CONFIG_4B, run_measured  # noqa: E402

CACHE = Path.home() / ".cache" / "dflashkit"
LLAMA_SRC = Path(os.environ.get("DFLASHKIT_LLAMA_CPP_SRC",
                                CACHE / "llama_cpp_python-0.3.36" / "vendor" / "llama.cpp"))
LLAMA_BIN = Path(os.environ.get("DFLASHKIT_LLAMA_CPP_BIN", CACHE / "llama-build-0.3.36" / "bin"))

# z-lab Qwen3.6-27B drafter dimensions (written in the qwen3-b16 schema: the layout of the bytes is what counts)
CONFIG_27B = {
    **CONFIG_4B,
    "hidden_size": 5120,
    "num_hidden_layers": 5,
    "num_attention_heads": 32,
    "num_key_value_heads": 8,
    "head_dim": 128,
    "intermediate_size": 17408,
    "num_target_layers": 64,
    "vocab_size": 248320,
    "dflash_config": {"mask_token_id": 248077, "target_layer_ids": [1, 16, 31, 46, 61]},
}

# Runs llama.cpp's converter with the pre-tokenizer check answered (see the module docstring).
_LLAMA_CONVERT_SHIM = (
    "import sys, runpy; sys.path.insert(0, {src!r}); sys.argv = [{script!r}] + sys.argv[1:]\n"
    "import conversion.base as b; b.TextModel.get_vocab_base_pre = lambda self, tokenizer: 'qwen2'\n"
    "runpy.run_path({script!r}, run_name='__main__')\n"
)


# ------------------------------------------------------------------------------------------ fixtures


def write_checkpoint(directory: Path, config: dict, n_shards: int = 3, seed: int = 0) -> int:
    """Stream a random bf16 checkpoint in ``n_shards`` safetensors files (+ index); returns the largest tensor's bytes."""
    from dflashkit.families import expected_tensors, spec_from_hf_config

    directory.mkdir(parents=True, exist_ok=True)
    (directory / "config.json").write_text(json.dumps(config, indent=2))
    shapes = expected_tensors(spec_from_hf_config(config))
    sizes = {name: int(np.prod(s)) * 2 for name, s in shapes.items()}
    per_shard = sum(sizes.values()) / n_shards
    shards: list[list[str]] = [[]]
    acc = 0
    for name in shapes:
        if acc >= per_shard * len(shards) and len(shards) < n_shards:
            shards.append([])
        shards[-1].append(name)
        acc += sizes[name]
    rng = np.random.default_rng(seed)
    weight_map = {}
    for i, names in enumerate(shards):
        fname = f"model-{i + 1:05d}-of-{len(shards):05d}.safetensors"
        header, offset = {}, 0
        for name in names:
            header[name] = {"dtype": "BF16", "shape": list(shapes[name]), "data_offsets": [offset, offset + sizes[name]]}
            offset += sizes[name]
            weight_map[name] = fname
        raw = json.dumps(header).encode()
        raw += b" " * (-len(raw) % 8)
        with open(directory / fname, "wb") as f:
            f.write(struct.pack("<Q", len(raw)) + raw)
            for name in names:
                n = sizes[name] // 2
                for start in range(0, n, 1 << 24):  # 64 MB of float32 at a time
                    m = min(1 << 24, n - start)
                    x = rng.standard_normal(m, dtype=np.float32)
                    x *= 0.02
                    u = x.view(np.uint32)
                    f.write(((u + (0x7FFF + ((u >> 16) & 1))) >> 16).astype(np.uint16).tobytes())
    (directory / "model.safetensors.index.json").write_text(json.dumps(
        {"metadata": {"total_size": sum(sizes.values())}, "weight_map": weight_map}, indent=2))
    return max(sizes.values())


def write_hf_target(directory: Path, config: dict) -> Path:
    """An HF target directory with the drafter's target shape (config + tokenizer only: no weights are read)."""
    import make_target

    make_target.make_hf_target(directory, hidden_size=64, n_layers=4, mask_token_id=None)
    # fill the tiny tokenizer up to the full vocabulary: a real tokenizer defines every id, and the
    # converters refuse to pad more than 65536 ids (bounds.MAX_VOCAB_PADDING)
    tok = json.loads((directory / "tokenizer.json").read_text())
    vocab = tok["model"]["vocab"]
    first = 1 + max(max(vocab.values()), *(t["id"] for t in tok.get("added_tokens", [])))
    vocab.update({f"<fill{i}>": i for i in range(first, config["vocab_size"])})
    (directory / "tokenizer.json").write_text(json.dumps(tok, ensure_ascii=False))
    cfg = json.loads((directory / "config.json").read_text())
    cfg.update(hidden_size=config["hidden_size"], num_hidden_layers=config["num_target_layers"],
               vocab_size=config["vocab_size"])
    (directory / "config.json").write_text(json.dumps(cfg, indent=2))
    for f in directory.glob("*.safetensors"):
        f.unlink()
    return directory


def write_one_tensor_gguf(path: Path, n: int = 8192, seed: int = 0) -> None:
    import gguf

    w = gguf.GGUFWriter(str(path), "llama")
    w.add_block_count(1)  # the hyper-parameters llama-quantize's loader requires of a "llama" file
    w.add_context_length(4096)
    w.add_embedding_length(n)
    w.add_feed_forward_length(4 * n)
    w.add_head_count(64)
    w.add_head_count_kv(64)
    w.add_layer_norm_rms_eps(1e-6)
    w.add_rope_dimension_count(128)
    x = np.random.default_rng(seed).standard_normal((n, n), dtype=np.float32)
    x *= 0.02
    w.add_tensor("blk.0.attn_q.weight", x)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


# ------------------------------------------------------------------------------------------ measuring


def settle() -> None:
    """Write back dirty pages before a measured run, so neither side pays for the previous run's
    output (on this box a 1 GB write can take 0.3 s or 3 s depending on the dirty pages left over)."""
    os.sync()


def drop_page_cache() -> bool:
    """Empty the page cache (root only): a cold-cache run reads its input from the disk."""
    try:
        os.sync()
        with open("/proc/sys/vm/drop_caches", "w") as f:
            f.write("1\n")
        return True
    except OSError:
        return False


def run_external(cmd: list[str], env: dict | None = None) -> tuple[float, float]:
    """(seconds, peak RSS MB) of an external program, its peak from /usr/bin/time."""
    settle()
    t = time.perf_counter()
    proc = subprocess.run(["/usr/bin/time", "-f", "MAXRSS_KB=%M", *cmd], capture_output=True, text=True,
                          env={**os.environ, **(env or {})})
    dt = time.perf_counter() - t
    if proc.returncode != 0:
        raise SystemExit(f"{' '.join(cmd)} failed ({proc.returncode}): {proc.stderr[-2000:]}")
    kb = [int(line.split("=")[1]) for line in proc.stderr.splitlines() if line.startswith("MAXRSS_KB=")]
    return dt, kb[-1] / 1024


def ours(command: str, args: list[str], env: dict | None = None) -> tuple[float, float]:
    saved = {k: os.environ.get(k) for k in (env or {})}
    os.environ.update(env or {})
    # exit 1 is a finding only for the comparing commands (diff, parity); a failed convert/quantize stops the run
    ok = (0, 1) if command in ("diff_command", "parity_command") else (0,)
    settle()
    try:
        dt, peak, _ = run_measured(command, args, ok)
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
    return dt, peak


ROWS: list[dict] = []


def record(row: str, reference: str, ref: list[tuple[float, float]] | None, our: list[tuple[float, float]],
           goal: str, met: bool | None, note: str = "") -> None:
    med = lambda xs: statistics.median(xs)  # noqa: E731
    r = {"row": row, "reference": reference, "ours_s": med([o[0] for o in our]), "ours_mb": max(o[1] for o in our),
         "goal": goal, "met": met, "note": note, "pairs": len(our)}
    if ref:
        r.update(ref_s=med([x[0] for x in ref]), ref_mb=max(x[1] for x in ref))
        r["speedup"] = r["ref_s"] / r["ours_s"]
    ROWS.append(r)
    line = f"[{row}] ours {r['ours_s']:.2f} s, {r['ours_mb']:.0f} MB"
    if ref:
        line += f" | {reference} {r['ref_s']:.2f} s, {r['ref_mb']:.0f} MB | ours is {r['speedup']:.2f}x its speed"
    print(line + f" | goal: {goal} -> {'MET' if met else 'not met' if met is not None else '-'} {note}", flush=True)


def warm_page_cache(path: Path) -> None:
    """Read a file once so both sides start with it in the page cache."""
    for f in (path.rglob("*") if path.is_dir() else [path]):
        if f.is_file():
            with open(f, "rb") as fh:
                while fh.read(64 << 20):
                    pass


# ------------------------------------------------------------------------------------------ rows


def row_f16(work: Path, pairs: int) -> None:
    src, target = work / "drafter4b", work / "target4b"
    script = LLAMA_SRC / "convert_hf_to_gguf.py"
    shim = _LLAMA_CONVERT_SHIM.format(src=str(LLAMA_SRC), script=str(script))
    env = {"PYTHONPATH": str(LLAMA_SRC / "gguf-py")}
    ref, our = [], []
    for _ in range(pairs):
        ref.append(run_external([sys.executable, "-c", shim, str(src), "--outfile", str(work / "ref-f16.gguf"),
                                 "--outtype", "f16", "--target-model-dir", str(target)], env))
        (work / "ref-f16.gguf").unlink()
        (work / "f16.gguf").unlink(missing_ok=True)  # a new file on both sides: replacing one costs a flush on ext4
        our.append(ours("convert_command", [str(src), str(work / "f16.gguf"), "--outtype", "f16", "--target",
                                            str(target), "-q"]))
    speed = statistics.median(x[0] for x in ref) / statistics.median(x[0] for x in our)
    record("bf16 -> f16 GGUF (4B dims)", "llama.cpp convert_hf_to_gguf.py", ref, our, ">= 4x faster", speed >= 4)


def row_bf16(work: Path, pairs: int) -> None:
    """Twice: with the checkpoint in the page cache (warm), and read from the disk (cold: the page cache
    is dropped before each side's run, which needs root; skipped with a note otherwise)."""
    src, target = work / "drafter4b", work / "target4b"
    for cache in ("warm", "cold"):
        if cache == "cold" and not drop_page_cache():
            print("[bf16 -> bf16, cold cache] not measured: /proc/sys/vm/drop_caches is not writable", flush=True)
            continue
        ref, our, floor = [], [], []
        prepare = (lambda: warm_page_cache(src)) if cache == "warm" else drop_page_cache  # before every command
        for _ in range(pairs):
            prepare()
            ref.append(run_external(["cp", "-r", str(src), str(work / "cp-copy")]))
            shutil.rmtree(work / "cp-copy")
            # what no Python converter can beat: start-up + the tensor ranges copied in the kernel, nothing else
            prepare()
            floor.append(run_external([sys.executable, str(HERE / "copy_floor.py"), str(src), str(work / "floor.bin")]))
            (work / "floor.bin").unlink()
            prepare()
            out = work / "bf16.gguf"
            our.append(ours("convert_command", [str(src), str(out), "--outtype", "bf16", "--target", str(target),
                                                "-q", "--force"]))
            out.unlink()
        cp_s = statistics.median(x[0] for x in ref)
        ratio = statistics.median(x[0] for x in our) / cp_s
        floor_s = statistics.median(x[0] for x in floor)
        record(f"bf16 -> bf16 GGUF (4B dims), {cache} page cache", "cp -r", ref, our, "<= 1.2x cp's time",
               ratio <= 1.2, f"(time ratio {ratio:.2f}; copy-only Python floor, benchmarks/copy_floor.py: "
               f"{floor_s:.2f} s = {floor_s / cp_s:.2f}x cp)")


#: the converter before the NaN / inf scan beside kernel copies came in (2cbb4be)
BEFORE_SCAN = "5125974"


def row_bf16scan(work: Path, pairs: int) -> None:
    """bf16 → bf16 (warm page cache) with the scan beside the copy, against BEFORE_SCAN run from a git worktree
    (PYTHONPATH puts it before the installed package) and the copy floor, interleaved pair by pair."""
    src, tree = work / "drafter4b", work / f"rev-{BEFORE_SCAN}"
    if not tree.exists():
        subprocess.run(["git", "-C", str(ROOT), "worktree", "add", "--detach", str(tree), BEFORE_SCAN], check=True,
                       capture_output=True)
    here = os.getcwd()
    os.chdir(work)  # python -c puts the working directory first on sys.path: a checkout there would win
    try:
        found = subprocess.run([sys.executable, "-c", "import dflashkit; print(dflashkit.__file__)"], text=True,
                               capture_output=True, env={**os.environ, "PYTHONPATH": str(tree)}).stdout.strip()
        if not Path(found).is_relative_to(tree):
            raise SystemExit(f"revision {BEFORE_SCAN} is not what PYTHONPATH={tree} imports ({found})")
        before, our, floor = [], [], []
        out = work / "bf16.gguf"
        # no --target, as the issue measured it: the copy and its scan, not the target's 152 k-token vocabulary
        # (whose parsing peaks at ~150 MB in every revision)
        args = [str(src), str(out), "--outtype", "bf16", "-q", "--force"]
        for _ in range(pairs):
            warm_page_cache(src)
            floor.append(run_external([sys.executable, str(HERE / "copy_floor.py"), str(src), str(work / "floor.bin")]))
            (work / "floor.bin").unlink()
            warm_page_cache(src)
            before.append(ours("convert_command", args, {"PYTHONPATH": str(tree)}))
            out.unlink()
            warm_page_cache(src)
            our.append(ours("convert_command", args))
            out.unlink()
    finally:
        os.chdir(here)
        subprocess.run(["git", "-C", str(ROOT), "worktree", "remove", "--force", str(tree)], capture_output=True)
    ratio = statistics.median(x[0] for x in our) / statistics.median(x[0] for x in before)
    peak = max(x[1] for x in our)
    floor_s = statistics.median(x[0] for x in floor)
    record("bf16 -> bf16 GGUF (4B dims), warm, NaN/inf scan beside the copy", f"revision {BEFORE_SCAN} (no scan)",
           before, our, "<= 1.10x its time, <= 60 MB", ratio <= 1.10 and peak <= 60,
           f"(time ratio {ratio:.2f}; copy floor, benchmarks/copy_floor.py: {floor_s:.2f} s)")


def _quantize_vs_llama(work: Path, pairs: int, ftype: str, goal_peak: float = 2.0) -> None:
    """f16 GGUF (4B dims) -> ``ftype``: llama-quantize on 2 threads vs dflash-quantize on 2, bytes identical."""
    f16 = work / "f16.gguf"
    if not f16.exists():
        ours("convert_command", [str(work / "drafter4b"), str(f16), "--outtype", "f16", "--target",
                                 str(work / "target4b"), "-q", "--force"])
    ref, our = [], []
    for _ in range(pairs):
        ref.append(run_external([str(LLAMA_BIN / "llama-quantize"), str(f16), str(work / "ref-q.gguf"), ftype, "2"]))
        our.append(ours("quantize_command", [str(f16), str(work / "q.gguf"), ftype, "--force"],
                        {"DFLASHKIT_THREADS": "2"}))
        if not filecmp.cmp(work / "ref-q.gguf", work / "q.gguf", shallow=False):
            raise SystemExit(f"{ftype} output differs from llama-quantize's")
        (work / "ref-q.gguf").unlink()
    speed = statistics.median(x[0] for x in ref) / statistics.median(x[0] for x in our)
    peak_ratio = max(o[1] for o in our) / max(x[1] for x in ref)
    record(f"f16 -> {ftype} (4B dims), bytes identical", "llama-quantize, 2 threads", ref, our,
           f">= 2x faster, peak <= {goal_peak:g}x llama-quantize's", speed >= 2 and peak_ratio <= goal_peak,
           f"(speed {speed:.2f}x, peak ratio {peak_ratio:.2f})")


def row_q4km(work: Path, pairs: int) -> None:
    _quantize_vs_llama(work, pairs, "Q4_K_M", goal_peak=2.0)


#: issue 40's types: each at least 2x faster than llama-quantize on 2 threads, with a peak no higher than its
#: ($DFLASHKIT_BENCH_NEW_TYPES=Q3_K_L,Q2_K measures a subset)
NEW_TYPES = ("Q4_0", "Q4_1", "Q5_0", "Q5_1", "IQ4_NL", "IQ4_XS", "Q3_K_L", "Q3_K_M", "Q3_K_S", "Q2_K")


def row_newtypes(work: Path, pairs: int) -> None:
    for ftype in os.environ.get("DFLASHKIT_BENCH_NEW_TYPES", ",".join(NEW_TYPES)).split(","):  # a subset: rerun some
        _quantize_vs_llama(work, pairs, ftype, goal_peak=1.0)


def row_tensor(work: Path, pairs: int) -> None:
    src = work / "one-tensor-f32.gguf"
    write_one_tensor_gguf(src)
    warm_page_cache(src)
    for ftype, qtype, goal in (("Q4_K_M", "Q4_K", 2.0), ("Q6_K", "Q6_K", 2.0), ("Q8_0", "Q8_0", 1.0)):
        ref, our = [], []
        for _ in range(pairs):
            ref.append(run_external([str(LLAMA_BIN / "llama-quantize"), "--pure", str(src), str(work / "ref-t.gguf"),
                                     ftype, "1"]))
            our.append(ours("quantize_command", [str(src), str(work / "t.gguf"), ftype, "--pure", "--force"]))
            if not filecmp.cmp(work / "ref-t.gguf", work / "t.gguf", shallow=False):
                raise SystemExit(f"{qtype} output differs from llama-quantize's")
        speed = statistics.median(x[0] for x in ref) / statistics.median(x[0] for x in our)
        record(f"8192x8192 f32 -> {qtype}, whole command", "llama-quantize --pure, 1 thread", ref, our,
               f">= {goal:g}x its speed", speed >= goal, f"(ours on {os.cpu_count()} threads)")
    for f in (src, work / "ref-t.gguf", work / "t.gguf"):
        f.unlink(missing_ok=True)


def row_parity(work: Path, pairs: int) -> None:
    import parity as parity_bench  # benchmarks/parity.py: its drafter and target writers

    drafter, q8, target = work / "drafter4b", work / "drafter4b-q8_0.gguf", work / "target-head.gguf"
    if not q8.exists():
        ours("convert_command", [str(drafter), str(q8), "--outtype", "q8_0", "-q", "--force"])
    if not target.exists():
        parity_bench.write_target(target)
    our, cpu = [], []
    for _ in range(pairs):
        before = resource.getrusage(resource.RUSAGE_CHILDREN)
        our.append(ours("parity_command", [str(drafter), str(q8), "--target", str(target), "--rounds", "3", "--json"]))
        after = resource.getrusage(resource.RUSAGE_CHILDREN)  # the child's own CPU time: less load-dependent
        cpu.append(after.ru_utime + after.ru_stime - before.ru_utime - before.ru_stime)
    t, peak = statistics.median(o[0] for o in our), max(o[1] for o in our)
    record("dflash-parity HF vs Q8_0 GGUF (4B dims)", "-", None, our, "< 60 s, peak < 2.5 GB",
           t < 60 and peak < 2500, f"(user+sys CPU {statistics.median(cpu):.1f} s; load average "
           f"{os.getloadavg()[0]:.1f} after)")


def row_large(work: Path, pairs: int) -> None:
    src = work / "drafter27b"
    print(f"writing a synthetic Qwen3.6-27B-size drafter to {src} ...", flush=True)
    largest = write_checkpoint(src, CONFIG_27B, n_shards=2)
    target = write_hf_target(work / "target27b", CONFIG_27B)
    budget = 2 * largest / 1e6 + 300
    f16, q4 = work / "d27-f16.gguf", work / "d27-q4.gguf"
    # the output row buffer of the quantizer: one chunk of output rows of the largest tensor
    conv = [ours("convert_command", [str(src), str(f16), "--outtype", "f16", "--target", str(target), "-q",
                                     "--force"]) for _ in range(pairs)]
    record("27B drafter: convert bf16 -> f16", "-", None, conv, f"peak <= {budget:.0f} MB",
           max(c[1] for c in conv) <= budget, f"(largest tensor {largest / 1e6:.0f} MB bf16)")
    quant = [ours("quantize_command", [str(f16), str(q4), "Q4_K_M", "--force"]) for _ in range(pairs)]
    record("27B drafter: quantize f16 -> Q4_K_M", "-", None, quant, f"peak <= {budget:.0f} MB + row buffer",
           max(c[1] for c in quant) <= budget + 16)
    insp = [ours("inspect_command", [str(q4)]) for _ in range(pairs)]
    record("27B drafter: inspect Q4_K_M", "-", None, insp, f"peak <= {budget:.0f} MB",
           max(c[1] for c in insp) <= budget)
    diff = [ours("diff_command", [str(src), str(q4)]) for _ in range(pairs)]
    record("27B drafter: diff HF vs Q4_K_M", "-", None, diff, f"peak <= {budget:.0f} MB",
           max(c[1] for c in diff) <= budget)
    for f in (f16, q4):
        f.unlink(missing_ok=True)
    shutil.rmtree(src, ignore_errors=True)


def machine() -> str:
    cpu = "?"
    try:
        for line in open("/proc/cpuinfo"):
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    return f"{os.cpu_count()} cores ({cpu}), {platform.system()} {platform.release()}, Python {platform.python_version()}"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rows", default="f16,bf16,bf16scan,q4km,tensor,parity,large")
    ap.add_argument("--pairs", type=int, default=3)
    ap.add_argument("--workdir", type=Path, default=None)
    ap.add_argument("--keep", action="store_true")
    ap.add_argument("--json", type=Path, default=None, help="also write the rows as JSON here")
    args = ap.parse_args()
    rows = args.rows.split(",")
    work = args.workdir or Path(tempfile.mkdtemp(prefix="dflash-bench-"))
    work.mkdir(parents=True, exist_ok=True)
    print(f"{datetime.datetime.now(datetime.timezone.utc):%Y-%m-%d %H:%M} UTC; {machine()}; "
          f"load average {os.getloadavg()[0]:.1f}; {args.pairs} interleaved pairs per row, medians", flush=True)
    try:
        if {"f16", "bf16", "bf16scan", "q4km", "newtypes", "parity"} & set(rows) and not (work / "drafter4b" / "config.json").exists():
            print("writing a synthetic Qwen3-4B-DFlash-b16-size drafter ...", flush=True)
            write_checkpoint(work / "drafter4b", CONFIG_4B)
            write_hf_target(work / "target4b", CONFIG_4B)
            warm_page_cache(work / "drafter4b")
        for name in rows:
            {"f16": row_f16, "bf16": row_bf16, "bf16scan": row_bf16scan, "q4km": row_q4km, "newtypes": row_newtypes,
             "tensor": row_tensor, "parity": row_parity, "large": row_large}[name](work, args.pairs)
    finally:
        if args.json:
            args.json.write_text(json.dumps({"machine": machine(), "rows": ROWS}, indent=2))
        if not args.keep:
            shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
