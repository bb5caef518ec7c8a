"""How exactly can the reference runtime agree with llama.cpp prompt by prompt? Every file type of the trained
fixture drafter, greedy, on llama-speculative-simple's schedule, measured against three floors of the same kind.

Per type, on 48 evaluation prompts (seed 2026, ``benchmarks/ACCEPTANCE.md``'s), 64 new tokens, n-max 15:

1. llama.cpp's τ per prompt (``llama-speculative-simple``, each build given), its CPU kernels as they load the file;
2. the same build with ``--no-repack`` for the types ggml repacks on x86 (Q4_0, Q4_K, IQ4_NL, Q8_0 rows): llama.cpp
   against itself, its two kernel paths computing the same values in another order; and the same build with
   ``-fa off`` for every type: llama.cpp against itself with its other attention path (``soft_max`` then a ``V``
   product, where the default on CPU is flash attention's online softmax);
3. the runtime's replay of that schedule (`dflashkit.runtime.schedules`) as it runs a llama.cpp GGUF — the
   activations rounded as ggml rounds them before each matmul (`dflashkit.runtime.ggml_rounding`) — and with float32
   activations (``ggml_activations=False``), the runtime before that rounding;
4. the runtime against itself: the same replay with every dense matmul accumulated in float64 instead of float32
   (another summation order, a measure of how many prompts hang on float ties).

*equal*: prompts whose τ is exactly the same. Writes ``benchmarks/AGREEMENT.md``.

    python benchmarks/agreement.py --llama-cpp ~/.cache/dflashkit/llama-build-0.3.36/bin --llama-cpp-src DIR \
        [--llama-cpp ~/.cache/dflashkit/llama-build-b11549/bin --llama-cpp-src DIR2] [--count 48]
"""

from __future__ import annotations

import argparse
import os
import platform
import sys
import tempfile
import time
from datetime import datetime, timezone
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "fixtures"))
sys.path.insert(0, str(ROOT / "benchmarks"))

from dflashkit.accept.prompts import load_prompts  # noqa: E402
from dflashkit.accept.run import encode_prompts  # noqa: E402
from dflashkit.llama_cpp import find_binary, llama_cpp_src, run_prompt, target_gguf_from_hf  # noqa: E402
from dflashkit.llama_cpp.speculative_simple import context_size  # noqa: E402
from dflashkit.runtime import HFTarget, load_drafter  # noqa: E402
from dflashkit.runtime import linear as runtime_linear  # noqa: E402
from dflashkit.runtime.schedules import replay_llama_cpp  # noqa: E402
from dflashkit.runtime.speculative import default_stop_ids  # noqa: E402

from _trained_files import TRAINED, make_files  # noqa: E402
from acceptance import TYPES, prompts  # noqa: E402

N_PREDICT, N_MAX = 64, 15
#: types whose tensors ggml's CPU backend repacks on x86 (``ggml_repack_get_optimal_repack_type``, AVX2)
REPACKED = ("Q8_0", "Q4_K_M", "Q4_K_S", "Q4_0", "IQ4_NL")


def say(message: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {message}", file=sys.stderr, flush=True)


def _float64_forward(self: runtime_linear.Linear, x: torch.Tensor) -> torch.Tensor:
    """A dense Linear's matmul accumulated in float64 (rounded to float32 once): the floor measure of item 4."""
    if self.weight is None or self.qdata is not None:
        return _FLOAT32_FORWARD(self, x)
    y = torch.nn.functional.linear(x.double(), self.weight.double()).float()
    return y if self.bias is None else y + self.bias


_FLOAT32_FORWARD = runtime_linear.Linear._forward


def replay(path: Path, target: HFTarget, ids: list[list[int]], stops: list[int], *, ggml_activations: bool,
           float64: bool = False) -> list[float]:
    model = load_drafter(path, ggml_activations=ggml_activations)
    runtime_linear.Linear._forward = _float64_forward if float64 else _FLOAT32_FORWARD  # type: ignore[method-assign]
    try:
        return [replay_llama_cpp(model, target, p, schedule="simple", n_predict=N_PREDICT, n_max=N_MAX,
                                 n_ctx=context_size(len(p), N_PREDICT, N_MAX), stop_token_ids=stops).tau for p in ids]
    finally:
        runtime_linear.Linear._forward = _FLOAT32_FORWARD  # type: ignore[method-assign]


def equal(a: list[float], b: list[float]) -> str:
    return f"{sum(x == y for x, y in zip(a, b))}/{len(a)}"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--llama-cpp", required=True, action="append", help="llama.cpp bin/ folder; repeat per build")
    parser.add_argument("--llama-cpp-src", action="append", default=[], help="its source (the target's converter)")
    parser.add_argument("--seed", type=int, default=2026)
    parser.add_argument("--count", type=int, default=48)
    parser.add_argument("--out", default=str(ROOT / "benchmarks" / "AGREEMENT.md"))
    args = parser.parse_args()
    started = time.time()
    torch.set_num_threads(1)
    with tempfile.TemporaryDirectory(prefix="dflashkit-agreement-") as tmp_name:
        tmp = Path(tmp_name)
        files = make_files(tmp, TYPES)
        target = HFTarget(TRAINED / "target")
        prompt_list = load_prompts(str(prompts(args.seed, args.count, tmp / "evaluation.jsonl")))
        ids, texts, _ = encode_prompts(target, prompt_list, N_PREDICT, {})
        stops = default_stop_ids(target)
        runtime: dict[str, dict[str, list[float]]] = {}
        for t, path in files.items():
            say(f"runtime: {t}")
            runtime[t] = {"ggml": replay(path, target, ids, stops, ggml_activations=True),
                          "float": replay(path, target, ids, stops, ggml_activations=False),
                          "float64": replay(path, target, ids, stops, ggml_activations=True, float64=True)}
        builds: list[tuple[str, dict[str, dict[str, list[float]]]]] = []
        srcs = args.llama_cpp_src or [None] * len(args.llama_cpp)
        for n, (bin_dir, given) in enumerate(zip(args.llama_cpp, srcs)):
            src = llama_cpp_src(given)
            if src is None:
                raise SystemExit("give --llama-cpp-src (or set DFLASHKIT_LLAMA_CPP_SRC)")
            binary = find_binary(bin_dir)
            target_gguf = target_gguf_from_hf(TRAINED / "target", tmp / f"target-{n}.gguf", src)
            llama: dict[str, dict[str, list[float]]] = {}
            for t, path in files.items():
                say(f"{Path(bin_dir).parent.name}: {t}")
                runs = {"repack": [], "no-repack": [], "fa-off": []} if t in REPACKED else {"repack": [], "fa-off": []}
                for kind, extra in (("repack", ()), ("no-repack", ("--no-repack",)), ("fa-off", ("-fa", "off"))):
                    if kind in runs:
                        runs[kind] = [run_prompt(binary, target_gguf, path, text, n_predict=N_PREDICT, draft_max=N_MAX,
                                                 prompt_tokens=len(p), extra_args=extra).tau for p, text in zip(ids, texts)]
                llama[t] = runs
            builds.append((Path(bin_dir).parent.name, llama))
    elapsed = time.time() - started
    lines = [
        "# Prompt by prompt: how exactly the runtime can agree with llama.cpp",
        "",
        f"Measured {datetime.now(timezone.utc):%Y-%m-%d %H:%M} UTC by `python benchmarks/agreement.py` on "
        f"{platform.machine()} ({os.cpu_count()} cores), {elapsed / 60:.1f} min (τ only: no timing). Target "
        "`fixtures/trained/target` (its bf16 GGUF from llama.cpp's own converter), drafter `fixtures/trained/drafter` "
        f"as every type (`benchmarks/_trained_files.py`), {args.count} evaluation prompts (seed {args.seed}, those of "
        f"`benchmarks/ACCEPTANCE.md`), greedy, {N_PREDICT} new tokens, llama-speculative-simple with n-max {N_MAX} "
        "and 1 thread; the runtime replays that schedule (`dflashkit.runtime.schedules`). Every column is the number "
        "of prompts whose τ is exactly equal.",
        "",
        "- *runtime (ggml activations)*: the runtime as it runs a llama.cpp GGUF — the activations rounded before each "
        "matmul as ggml's CPU backend rounds them (`dflashkit.runtime.ggml_rounding`);",
        "- *runtime (float activations)*: the same with float32 activations (`ggml_activations=False`, the runtime "
        "before that rounding);",
        "- *llama.cpp vs itself*: the same build and file with `--no-repack`, for the types ggml repacks on this CPU "
        "(AVX2): the same values in another kernel's order;",
        "- *llama.cpp vs itself (-fa off)*: the same build and file without flash attention (its attention as "
        "`soft_max` then the product with V, where the default on CPU is flash attention's online softmax);",
        "- *runtime vs itself*: the runtime's replay with its dense matmuls accumulated in float64 against float32.",
        "",
    ]
    for name, llama in builds:
        lines += [f"### {name}", "",
                  "| type | τ llama.cpp | runtime (ggml activations) | runtime (float activations) | "
                  "llama.cpp vs itself (--no-repack) | llama.cpp vs itself (-fa off) | runtime (ggml activations) vs "
                  "llama.cpp -fa off | runtime vs itself (float64) |",
                  "|---|---|---|---|---|---|---|---|"]
        totals = [0, 0, 0, 0, 0]
        for t in files:
            ref = llama[t]["repack"]
            r = runtime[t]
            self_llama = equal(ref, llama[t]["no-repack"]) if "no-repack" in llama[t] else "—"
            lines.append(f"| {t} | {sum(ref) / len(ref):.2f} | {equal(r['ggml'], ref)} | {equal(r['float'], ref)} | "
                         f"{self_llama} | {equal(ref, llama[t]['fa-off'])} | {equal(r['ggml'], llama[t]['fa-off'])} | "
                         f"{equal(r['ggml'], r['float64'])} |")
            totals[0] += sum(a != b for a, b in zip(r["ggml"], ref))
            totals[1] += sum(a != b for a, b in zip(r["float"], ref))
            totals[2] += sum(a != b for a, b in zip(r["ggml"], r["float64"]))
            totals[3] += sum(a != b for a, b in zip(ref, llama[t]["fa-off"]))
            totals[4] += sum(a != b for a, b in zip(r["ggml"], llama[t]["fa-off"]))
        n = len(files) * args.count
        lines += ["", f"Prompts that differ, all {len(files)} types ({n} prompt runs): runtime with ggml activations "
                  f"{totals[0]}, with float activations {totals[1]}; llama.cpp against itself with -fa off "
                  f"{totals[3]}, and the runtime against llama.cpp -fa off {totals[4]}; the runtime against itself "
                  f"(float64) {totals[2]}.",
                  ""]
    Path(args.out).write_text("\n".join(lines), encoding="utf-8")
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())
