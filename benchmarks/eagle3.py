"""The DFlash drafter and the EAGLE-3 drafter of the same trained target, side by side in one ``dflash-accept`` run.

On ``fixtures/trained``: the DFlash drafter (``drafter``, 2 layers, block 16) and the EAGLE-3 drafter
(``drafter-eagle3``, one layer, speculators' ``Eagle3DraftModel``), both as bf16 GGUFs from dflash-convert, and for
contrast an *untrained* EAGLE-3 drafter of exactly the trained one's shape (its fc, layer and norm re-drawn from a
seeded N(0, 0.02); embeddings and head the target's, as speculators starts one). One ``run_acceptance`` per llama.cpp
build: the reference runtime's τ; ``--llama-cpp`` (llama.cpp's τ beside the runtime's on llama.cpp's schedule, and
how many prompts are equal); ``--llama-server`` at ``--spec-draft-n-max`` 3, 8 and 15 for every drafter (llama.cpp's
EAGLE-3 default is 3; DFlash's block gives 15; draft-eagle3 takes any n-max) — τ and the speed-up against the target
alone, one server pair at a time; and ``--context`` 0, 512 (each prompt after that many tokens of the other
prompts): τ and speed-up by context length.

    python benchmarks/eagle3.py            # writes benchmarks/EAGLE3.md (both builds: $DFLASHKIT_LLAMA_CPP_BIN /
                                           # _SRC and $DFLASHKIT_LLAMA_CPP_MAINLINE_BIN / _SRC)
    python benchmarks/eagle3.py types      # appends τ per file type of the EAGLE-3 drafter (llama-server 0.3.36)

Nothing else of ours may run beside it: the speed-ups are timings. A tiny target's speed-ups are not a big one's
(a 4-layer target costs about what a drafter does); what carries over is τ, its agreement with llama.cpp, and the
relative order.
"""

from __future__ import annotations

import json
import math
import os
import platform
import shutil
import sys
import tempfile
import time
from datetime import datetime, timezone
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
TRAINED = ROOT / "fixtures" / "trained"
BUILDS = {"0.3.36": "DFLASHKIT_LLAMA_CPP", "b11549": "DFLASHKIT_LLAMA_CPP_MAINLINE"}
N_PREDICT = 64
N_MAX = (3, 8, 15)
CONTEXT = (0, 512)

from dflashkit.accept import run_acceptance  # noqa: E402
from dflashkit.converters.convert import convert  # noqa: E402
from dflashkit.llama_cpp import target_gguf_from_hf  # noqa: E402


def say(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


def untrained_eagle3(out: Path) -> Path:
    """The trained EAGLE-3 checkpoint with fc, the decoder layer and the final norm re-drawn (seed 0)."""
    from safetensors.torch import load_file, save_file

    shutil.copytree(TRAINED / "drafter-eagle3", out)
    tensors = load_file(str(out / "model.safetensors"))
    g = torch.Generator().manual_seed(0)
    for name in sorted(tensors):
        if name.startswith(("fc.", "layers.", "norm.")):
            t = tensors[name]
            base = 1.0 if name.endswith("norm.weight") else 0.0
            tensors[name] = (base + 0.02 * torch.randn(t.shape, generator=g)).to(t.dtype)
    save_file(tensors, str(out / "model.safetensors"), metadata={"format": "pt"})
    return out


def files(tmp: Path) -> dict[str, Path]:
    quiet = {"progress": False, "warn": lambda _: None}
    out = {"DFlash": tmp / "dflash-bf16.gguf", "EAGLE-3": tmp / "eagle3-bf16.gguf",
           "EAGLE-3 untrained": tmp / "eagle3-untrained-bf16.gguf"}
    convert(TRAINED / "drafter", out["DFlash"], outtype="bf16", target=TRAINED / "target", **quiet)
    convert(TRAINED / "drafter-eagle3", out["EAGLE-3"], outtype="bf16", target=TRAINED / "target", **quiet)
    convert(untrained_eagle3(tmp / "untrained"), out["EAGLE-3 untrained"], outtype="bf16", target=TRAINED / "target",
            **quiet)
    return out


def _section(rep: dict, sid: str) -> list[dict]:
    return next((s["rows"] for s in rep["sections"] if s.get("id") == sid), [])


def measure(build: str, var: str, tmp: Path, drafters: dict[str, Path]) -> list[str]:
    binary, src = Path(os.environ[f"{var}_BIN"]), Path(os.environ[f"{var}_SRC"])
    target_gguf = target_gguf_from_hf(TRAINED / "target", tmp / f"target-{build}.gguf", src)
    names = {str(p): n for n, p in drafters.items()}
    t0 = time.time()
    result = run_acceptance(TRAINED / "target", list(drafters.values()), TRAINED / "prompts.jsonl",
                            max_new_tokens=N_PREDICT, llama_cpp=binary, llama_server=binary, target_gguf=target_gguf,
                            draft_n_max=N_MAX, context=CONTEXT, progress=say)
    minutes = (time.time() - t0) / 60
    rep = json.loads(result.report().to_json())
    lines = [f"### llama.cpp {build}", "", f"One `run_acceptance` ({minutes:.1f} min): 24 prompts, greedy, "
             f"{N_PREDICT} new tokens, one thread for llama.cpp.", "",
             "| drafter | τ runtime (own loop) | τ llama.cpp | τ runtime on llama.cpp's schedule | prompts equal | verdict |",
             "|---|---|---|---|---|---|"]
    for d, ran in zip(result.drafters, result.llama_cpp or []):
        equal = sum(a == b for a, b in zip(d.schedule_taus, ran.taus))
        lines.append(f"| {names[d.path]} | {d.tau:.2f} | {ran.tau:.2f} | {d.schedule_tau:.2f} | {equal}/{len(ran.taus)} "
                     f"| {result.llama_cpp_verdicts()[result.drafters.index(d)]} |")
    lines += ["", "Through llama-server (at the shortest context):", "",
              "| drafter | n-max | τ llama-server | τ runtime (server schedule) | prompts equal | speed-up [95 % CI] | verdict |",
              "|---|---|---|---|---|---|---|"]
    for row in _section(rep, "serving"):
        equal = sum(a == b for a, b in zip(row["tau_per_prompt"], row["reference_tau_per_prompt"]))
        ci = row.get("speedup_ci") or [float("nan"), float("nan")]
        lines.append(f"| {names.get(row['drafter'], Path(row['drafter']).name)} | {row['draft_n_max']} | "
                     f"{row['tau']:.2f} | {row['reference_tau']:.2f} | {equal}/{len(row['tau_per_prompt'])} | "
                     f"×{row['speedup']:.2f} [{ci[0]:.2f}, {ci[1]:.2f}] | {row['verdict']} |")
    if result.by_context is not None:
        lines += ["", "By context length (τ in the runtime; llama-server's speed-up at each drafter's best n-max):", "",
                  "| context | " + " | ".join(drafters) + " |", "|---|" + "---|" * len(drafters)]
        for level, res in zip(result.by_context.levels, result.by_context.results):
            cells = []
            for d in res.drafters:
                best = None
                if res.serving is not None:
                    runs = [r for r in res.serving.runs if r.drafter == d.path and math.isfinite(r.speedup)]
                    best = max(runs, key=lambda r: r.speedup, default=None)
                cells.append(f"τ {d.tau:.2f}" + (f", ×{best.speedup:.2f} (n-max {best.draft_n_max})" if best else ""))
            lines.append(f"| {level} | " + " | ".join(cells) + " |")
    return lines + [""]


TYPES = ("bf16", "Q8_0", "Q6_K", "Q5_K_M", "Q4_K_M", "Q4_K_M_DRAFT", "Q4_0", "IQ4_XS", "Q3_K_M", "Q2_K")


def types() -> int:
    """``python benchmarks/eagle3.py types``: append τ per file type of the EAGLE-3 drafter through llama-server
    (0.3.36) at n-max 15 — at llama.cpp's default 3 this drafter accepts nearly every draft and τ saturates near 4,
    whatever the type — beside the runtime's τ on the server's schedule (prompts equal), Δτ against bf16 and the
    speed-up; and what each type keeps of ``fc`` and the head (the drafter-aware policy of Q4_K_M_DRAFT)."""
    from dflashkit.io.gguf_reader import open_gguf
    from dflashkit.quantize.gguf_file import quantize_gguf
    from dflashkit.stats import paired_comparison

    torch.set_num_threads(1)
    binary, src = Path(os.environ["DFLASHKIT_LLAMA_CPP_BIN"]), Path(os.environ["DFLASHKIT_LLAMA_CPP_SRC"])
    quiet = {"progress": False, "warn": lambda _: None}
    with tempfile.TemporaryDirectory(prefix="dflashkit-eagle3-types-") as t:
        tmp = Path(t)
        f32 = convert(TRAINED / "drafter-eagle3", tmp / "f32.gguf", outtype="f32", target=TRAINED / "target", **quiet).out
        made = {}
        for name in TYPES:
            made[name] = tmp / f"eagle3-{name}.gguf"
            if name == "bf16":
                convert(TRAINED / "drafter-eagle3", made[name], outtype="bf16", target=TRAINED / "target", **quiet)
            else:
                quantize_gguf(f32, made[name], name, **quiet)
        target_gguf = target_gguf_from_hf(TRAINED / "target", tmp / "target.gguf", src)
        t0 = time.time()
        result = run_acceptance(TRAINED / "target", list(made.values()), TRAINED / "prompts.jsonl",
                                max_new_tokens=N_PREDICT, llama_server=binary, target_gguf=target_gguf,
                                draft_n_max=(15,), progress=say)
        minutes = (time.time() - t0) / 60
        kept = {}
        for name, path in made.items():
            with open_gguf(path) as g:
                kept[name] = (g.tensors["fc.weight"].ggml_type.name, g.tensors["output.weight"].ggml_type.name)
        rows = {Path(r["drafter"]).name: r for r in _section(json.loads(result.report().to_json()), "serving")}
    ref = rows[made["bf16"].name]["tau_per_prompt"]
    lines = ["", "## τ per file type (EAGLE-3)", "",
             f"Measured {datetime.now(timezone.utc):%Y-%m-%d %H:%M} UTC by `python benchmarks/eagle3.py types` "
             f"({minutes:.1f} min, nothing else running): each type of `fixtures/trained/drafter-eagle3` (bf16 "
             "converted, the rest quantized from F32 by dflash-quantize) through llama-server 0.3.36 at n-max 15 (at "
             "the default 3 this drafter's τ saturates near 4 for every type), 24 prompts, greedy, "
             f"{N_PREDICT} new tokens, beside the runtime on the server's schedule. Δτ: llama-server's, against bf16, "
             "paired over prompts (95 % CI).", "",
             "| type | fc | output | τ llama-server | τ runtime | prompts equal | Δτ vs bf16 [95 % CI] | speed-up [95 % CI] |",
             "|---|---|---|---|---|---|---|---|"]
    for name, path in made.items():
        r = rows[path.name]
        c = paired_comparison(ref, r["tau_per_prompt"])
        ci = f"[{c.ci[0]:+.2f}, {c.ci[1]:+.2f}]" if c.ci else "–"
        equal = sum(a == b for a, b in zip(r["tau_per_prompt"], r["reference_tau_per_prompt"]))
        sp = r.get("speedup_ci") or [math.nan, math.nan]
        lines.append(f"| {name} | {kept[name][0]} | {kept[name][1]} | {r['tau']:.2f} | {r['reference_tau']:.2f} | "
                     f"{equal}/{len(r['tau_per_prompt'])} | {c.delta:+.2f} {ci} | ×{r['speedup']:.2f} "
                     f"[{sp[0]:.2f}, {sp[1]:.2f}] |")
    path = ROOT / "benchmarks" / "EAGLE3.md"
    path.write_text(path.read_text().rstrip("\n") + "\n" + "\n".join(lines) + "\n")
    say("appended the per-type section to benchmarks/EAGLE3.md")
    return 0


def main() -> int:
    torch.set_num_threads(1)
    with tempfile.TemporaryDirectory(prefix="dflashkit-eagle3-bench-") as t:
        tmp = Path(t)
        drafters = files(tmp)
        body: list[str] = []
        for build, var in BUILDS.items():
            if not os.environ.get(f"{var}_BIN"):
                say(f"skipping {build}: ${var}_BIN is not set")
                continue
            body += measure(build, var, tmp, drafters)
    cpu = platform.processor() or platform.machine()
    head = ["# DFlash and EAGLE-3 drafters of one target, side by side", "",
            f"Measured {datetime.now(timezone.utc):%Y-%m-%d %H:%M} UTC by `python benchmarks/eagle3.py` on "
            f"{platform.machine()} ({os.cpu_count()} cores, {cpu}), nothing else running. Target `fixtures/trained/target`"
            " (Qwen3, 4 layers, hidden 256); drafters as bf16 GGUFs: DFlash `fixtures/trained/drafter` (2 layers, "
            "block 16), EAGLE-3 `fixtures/trained/drafter-eagle3` (speculators' `Eagle3DraftModel`, 1 layer, taps "
            "[1, 2, 3]), and an untrained EAGLE-3 of the same shape (fc, layer and norm re-drawn). *prompts equal*: "
            "prompts whose τ is exactly llama.cpp's. Speed-ups are a 4-layer target's: a drafter costs about what "
            "the target does here, so they say little about a big target; τ and its agreement do.", ""]
    (ROOT / "benchmarks" / "EAGLE3.md").write_text("\n".join(head + body))
    say("wrote benchmarks/EAGLE3.md")
    return 0


if __name__ == "__main__":
    sys.exit(types() if sys.argv[1:] == ["types"] else main())
