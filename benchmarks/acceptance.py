"""τ per file type — every type drafters ship in — in the reference runtime, in llama.cpp and through llama-server,
and whether a drafter's own importance matrix helps its low-bit types; on the trained fixture pair.

1. Prompts never used before: calibration prompts (``--calibration-seed``) for the importance matrix and evaluation
   prompts (``--seed``) for every figure, both drawn by ``fixtures/make_trained_pair.py --prompts-only`` from the
   held-out distribution (the committed ``prompts.jsonl`` is seed 0).
2. ``dflash-imatrix`` of the drafter on the calibration prompts.
3. The drafter as every type: bf16 / f16 by dflash-convert, the rest by dflash-quantize of f32 — and Q2_K, Q3_K_S,
   IQ4_XS, Q4_0 (and Q2_K_S, which needs one) again with the importance matrix.
4. ``dflash-accept`` of all of them on the evaluation prompts with ``--llama-cpp`` (τ inside llama.cpp, counts from
   llama-server's JSON) and ``--llama-server`` (speed-up against the target alone, one server pair at a time) — once
   per llama.cpp build given (``--llama-cpp`` / ``--llama-cpp-src`` repeated, in pairs).
5. Per build and type: does the GGUF *agree* with llama.cpp — the reference runtime's τ on llama.cpp's schedule
   against llama.cpp's, prompt by prompt (how many prompts equal exactly), the paired CI and the verdict, for
   ``--llama-cpp``'s rows and for ``--llama-server``'s.

Writes ``benchmarks/ACCEPTANCE.md``: τ and Δτ against bf16 with paired 95 % CIs in both runtimes, size, bits per
weight, speed-up with its CI and verdict, and the with / without importance matrix comparison (paired per prompt).

    python benchmarks/acceptance.py --llama-cpp ~/.cache/dflashkit/llama-build-0.3.36/bin --llama-cpp-src DIR \
        [--llama-cpp ~/.cache/dflashkit/llama-build-b11549/bin --llama-cpp-src DIR2]
        [--seed 2026] [--calibration-seed 101] [--count 48] [--max-new-tokens 64]

A tiny model's quantization error is not a 27 B target's; what carries over is the method and the relative order.
"""

from __future__ import annotations

import argparse
import os
import platform
import subprocess
import sys
import tempfile
import time
from datetime import datetime, timezone
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "fixtures"))

from dflashkit.accept import paired_comparison, run_acceptance  # noqa: E402
from dflashkit.imatrix_collect import collect_imatrix, write_imatrix  # noqa: E402
from dflashkit.io.gguf_reader import open_gguf  # noqa: E402
from dflashkit.llama_cpp import llama_cpp_src, target_gguf_from_hf  # noqa: E402
from dflashkit.stats import paired_bootstrap_ci  # noqa: E402

sys.path.insert(0, str(ROOT / "benchmarks"))
from _trained_files import make_files  # noqa: E402

TRAINED = ROOT / "fixtures" / "trained"
TYPES = ("bf16", "f16", "Q8_0", "Q6_K", "Q5_K_M", "Q5_K_S", "Q5_1", "Q5_0", "Q4_K_M", "Q4_K_S", "Q4_K_M_DRAFT",
         "Q4_1", "Q4_0", "IQ4_NL", "IQ4_XS", "Q3_K_L", "Q3_K_M", "Q3_K_S", "Q2_K")
WITH_IMATRIX = ("Q4_0", "IQ4_XS", "Q3_K_S", "Q2_K", "Q2_K_S")


def say(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


def prompts(seed: int, count: int, out: Path) -> Path:
    subprocess.run([sys.executable, str(ROOT / "fixtures" / "make_trained_pair.py"), "--prompts-only", "--seed",
                    str(seed), "--count", str(count), "--out", str(out)], check=True)
    return out


def bits_per_weight(path: Path) -> float:
    with open_gguf(path) as g:
        n = sum(t.n_elements for t in g.tensors.values())
        return 8 * sum(t.nbytes for t in g.tensors.values()) / n


def _ci(c) -> str:  # type: ignore[no-untyped-def]
    if c is None or c.ci is None:
        return "—"
    return f"{c.delta:+.2f} [{c.ci[0]:+.2f}, {c.ci[1]:+.2f}]"


def _survives(c) -> str:  # type: ignore[no-untyped-def]
    if c is None or c.ci is None:
        return "—"
    if c.ci[0] > 0:
        return "higher τ"
    return "loses τ" if c.ci[1] < 0 else "no measurable loss"


def _equal(a: list[float], b: list[float]) -> str:
    return f"{sum(x == y for x, y in zip(a, b))}/{len(a)}"


def agreement_section(names: list[str], results: list, builds: list[str]) -> list[str]:  # type: ignore[type-arg]
    """Per build and type: llama.cpp's τ against the reference's on the same schedule, prompt by prompt."""
    lines = ["## Does every file agree with llama.cpp? (one accounting)", "",
             "The reference runtime replays each tool's schedule (`dflashkit.runtime.schedules`: "
             "llama-speculative-simple anchors its first round at the last prompt token and runs past `-n` to finish "
             "a block; llama-server takes the first token from the prefill and stops at `-n`; n-max 15), so a file "
             "that llama.cpp computes as the reference does shows the same τ prompt by prompt. *equal*: prompts whose τ is exactly the same; Δ: llama.cpp − "
             "reference, paired over prompts (95 % bootstrap CI); verdict as `dflash-accept` gives it "
             "(`llama_cpp_verdict`, and the `--llama-server` row's `tau_verdict`).", ""]
    for binary, result in zip(builds, results):
        lines += [f"### {Path(binary).parent.name}", "",
                  "| type | τ reference (simple's schedule) | τ llama-speculative-simple | equal | Δ [95 % CI] | "
                  "verdict | τ reference (server's schedule) | τ llama-server | equal | verdict |",
                  "|---|---|---|---|---|---|---|---|---|---|"]
        comps, verdicts = result.llama_cpp_comparisons(), result.llama_cpp_verdicts()
        agree = 0
        for t, d, l, c, v, s in zip(names, result.drafters, result.llama_cpp, comps, verdicts, result.serving.runs):
            ref = d.schedule_taus
            sv = s.tau_verdict()
            agree += v == "agrees" and sv == "agrees"
            lines.append(f"| {t} | {d.schedule_tau:.2f} | {l.tau:.2f} | {_equal(ref, l.taus)} | {_ci(c)} | {v} | "
                         f"{s.reference_tau:.2f} | {s.tau:.2f} | {_equal(s.reference_taus or [], s.taus)} | {sv} |")
        lines += ["", f"{agree} of {len(names)} files agree in both tools of this build.", ""]
    return lines


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--llama-cpp", required=True, action="append",
                        help="llama.cpp bin/ folder (llama-server); repeat for another build")
    parser.add_argument("--llama-cpp-src", action="append", default=[],
                        help="llama.cpp source (its converter makes the target GGUF), one per --llama-cpp")
    parser.add_argument("--seed", type=int, default=2026, help="the evaluation prompts' seed (never used before)")
    parser.add_argument("--calibration-seed", type=int, default=101, help="the importance matrix's prompts' seed")
    parser.add_argument("--count", type=int, default=48)
    parser.add_argument("--max-new-tokens", type=int, default=64)
    parser.add_argument("--out", default=str(ROOT / "benchmarks" / "ACCEPTANCE.md"))
    args = parser.parse_args()
    started = time.time()
    with tempfile.TemporaryDirectory(prefix="dflashkit-acceptance-") as tmp_name:
        tmp = Path(tmp_name)
        evaluation = prompts(args.seed, args.count, tmp / "evaluation.jsonl")
        calibration = prompts(args.calibration_seed, args.count, tmp / "calibration.jsonl")
        say("dflash-imatrix on the calibration prompts")
        im = collect_imatrix(TRAINED / "drafter", TRAINED / "target", calibration, max_new_tokens=args.max_new_tokens)
        imatrix = write_imatrix(im, tmp / "drafter.imatrix.gguf")
        files = make_files(tmp, TYPES, imatrix, WITH_IMATRIX)
        srcs = args.llama_cpp_src or [None]
        if len(srcs) != len(args.llama_cpp):
            raise SystemExit("give one --llama-cpp-src per --llama-cpp")
        results = []
        for n, (binary, given) in enumerate(zip(args.llama_cpp, srcs)):
            src = llama_cpp_src(given)
            if src is None:
                raise SystemExit("give --llama-cpp-src (or set DFLASHKIT_LLAMA_CPP_SRC): the target GGUF is made by "
                                 "llama.cpp's own converter")
            target_gguf = target_gguf_from_hf(TRAINED / "target", tmp / f"target-bf16-{n}.gguf", src)
            # --llama-cpp through llama-speculative-simple (a folder holding only it: dflash-accept takes
            # llama-server where a build has one), --llama-server through llama-server: both pinned tools
            simple = tmp / f"simple-{n}"
            simple.mkdir()
            (simple / "llama-speculative-simple").symlink_to(Path(binary).resolve() / "llama-speculative-simple")
            results.append(run_acceptance(TRAINED / "target", list(files.values()), evaluation,
                                          max_new_tokens=args.max_new_tokens, llama_cpp=simple,
                                          llama_server=binary, target_gguf=target_gguf, progress=say))
        result = results[0]
        sizes = {t: p.stat().st_size for t, p in files.items()}
        bpw = {t: bits_per_weight(p) for t, p in files.items()}
    elapsed = time.time() - started
    names = list(files)
    runs = dict(zip(names, result.drafters))
    llama = dict(zip(names, result.llama_cpp))  # type: ignore[arg-type]
    serving = dict(zip(names, result.serving.runs))  # type: ignore[union-attr]
    verdicts = dict(zip(names, result.serving.verdicts()))  # type: ignore[union-attr]
    base, base_l = runs["bf16"], llama["bf16"]
    lines = [
        "# Acceptance length τ per file type — the trained fixture pair",
        "",
        f"Measured {datetime.now(timezone.utc):%Y-%m-%d %H:%M} UTC by `python benchmarks/acceptance.py` on "
        f"{platform.machine()} ({os.cpu_count()} cores), nothing else running, {elapsed / 60:.1f} min. Target "
        "`fixtures/trained/target` (Qwen3, 4 layers, hidden 256), drafter `fixtures/trained/drafter` (z-lab DFlash, "
        f"2 layers, block 16). {args.count} evaluation prompts drawn with seed {args.seed} (never used before: the "
        "committed prompts are seed 0), greedy, "
        f"{args.max_new_tokens} new tokens. Importance matrix: `dflash-imatrix` on {args.count} other prompts (seed "
        f"{args.calibration_seed}), {im.rounds} draft rounds. Reference runtime: dflashkit's PyTorch runtime (f32 "
        "compute, the file's values). llama.cpp: the first build below — τ llama.cpp from llama-speculative-simple "
        "(counts from its log), speed-up from llama-server; target GGUF bf16 from llama.cpp's own converter, n-max 15, "
        "1 thread; speed-up: decode tok/s with the drafter / the target alone, one server pair at a time "
        "(docs/serving.md).",
        "",
        "A tiny model's numbers: its quantization error is not a 27 B target's. Δ columns are paired over prompts "
        "against bf16 in the same runtime (95 % bootstrap CI); *survives* reads the reference Δ: *no measurable loss* "
        "when its CI reaches 0, *loses τ* when it lies below. On this pair the target is as cheap as the drafter, so "
        "no speed-up is large; the column shows how each type fares in the server, not what a 27 B target gains.",
        "",
        "| type | file size | bits/weight | τ reference | Δ vs bf16 (reference) | survives | τ llama.cpp | "
        "Δ vs bf16 (llama.cpp) | speed-up [95 % CI] | verdict |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for t in names:
        c = None if t == "bf16" else paired_comparison(base.taus, runs[t].taus)
        cl = None if t == "bf16" else paired_comparison(base_l.taus, llama[t].taus)
        s = serving[t]
        ci = s.speedup_ci
        speed = f"×{s.speedup:.2f} [{ci[0]:.2f}, {ci[1]:.2f}]" if ci else "—"
        lines.append(f"| {t} | {sizes[t] / 1e6:.2f} MB | {bpw[t]:.2f} | {runs[t].tau:.2f} | "
                     f"{'—' if c is None else _ci(c)} | {'reference' if c is None else _survives(c)} | "
                     f"{'refused' if llama[t].refused else f'{llama[t].tau:.2f}'} | {'—' if cl is None else _ci(cl)} | "
                     f"{speed} | {verdicts[t]} |")
    lines += ["", "## Does the drafter's own importance matrix help?", "",
              "τ with the `dflash-imatrix` matrix against the same type without, paired per evaluation prompt "
              "(Δ = with − without, 95 % bootstrap CI), in both runtimes. Q2_K_S exists only with a matrix: it is "
              "compared with Q2_K without one.", "",
              "| type | τ without (ref) | τ with (ref) | Δ (reference) | τ without (llama.cpp) | τ with (llama.cpp) | "
              "Δ (llama.cpp) |", "|---|---|---|---|---|---|---|"]
    helped = []
    for t in WITH_IMATRIX:
        plain = "Q2_K" if t == "Q2_K_S" else t
        c = paired_comparison(runs[plain].taus, runs[f"{t} +imatrix"].taus)
        cl = paired_comparison(llama[plain].taus, llama[f"{t} +imatrix"].taus)
        helped.append((t, c, cl))
        lines.append(f"| {t}{' (vs Q2_K)' if t == 'Q2_K_S' else ''} | {runs[plain].tau:.2f} | "
                     f"{runs[f'{t} +imatrix'].tau:.2f} | {_ci(c)} | {llama[plain].tau:.2f} | "
                     f"{llama[f'{t} +imatrix'].tau:.2f} | {_ci(cl)} |")
    better = [t for t, c, _ in helped if c.ci and c.ci[0] > 0]
    worse = [t for t, c, _ in helped if c.ci and c.ci[1] < 0]
    lines += ["", "Verdict (reference runtime): " + (
        f"the matrix raises τ at {', '.join(better)}" if better else "no type gains τ that the CI can tell from zero")
        + (f"; it lowers τ at {', '.join(worse)}" if worse else "") + ".", ""]
    base_ci = paired_bootstrap_ci(base.taus)
    lines += [f"bf16 τ over the evaluation prompts: {base.tau:.2f} (95 % CI {base_ci[0]:.2f} – {base_ci[1]:.2f}).", ""]
    lines += agreement_section(names, results, args.llama_cpp)
    Path(args.out).write_text("\n".join(lines), encoding="utf-8")
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())
