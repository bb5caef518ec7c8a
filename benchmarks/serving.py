"""What the trained drafter is worth through llama-server: τ, decode tok/s without and with it, the speed-up with
its paired CI, and identical output — per drafter type × draft n-max × draft KV cache type, for each pinned
llama.cpp build, with the target alone measured in the same run (each pair of requests back to back).

    python benchmarks/serving.py [--build 0.3.36=BIN_DIR --build b11549=BIN_DIR] [--prompts FILE]
        [--max-new-tokens 128] [--threads 1] [--costly-layers 28] [--out benchmarks/SERVING.md]

``--costly-layers N`` (default 28; 0 leaves it out) adds one table per build against a target made costlier the
way real pairs are: the trained target with N zero-output layers appended (`costly_target.py`: the same tokens,
many times the cost), labelled as such — what a drafter's type and n-max do when the target dominates the round.
Every combination runs alone: one server pair at a time, nothing else of the benchmark beside it.

Without ``--build`` the bins come from $DFLASHKIT_LLAMA_CPP_BIN and $DFLASHKIT_LLAMA_CPP_MAINLINE_BIN (what .ci/run
builds), and each build's own converter (…_SRC) makes the bf16 target GGUF. The figures are a tiny pair's (a 4-layer,
256-wide target and its 2-layer drafter) on a CPU: the drafter costs about what a target layer costs, which no
real pair does. What carries over is the method: the same requests with and without the drafter, paired.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import tempfile
from datetime import datetime, timezone
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "fixtures"))

sys.path.insert(0, str(ROOT / "benchmarks"))

from dflashkit.llama_cpp import target_gguf_from_hf  # noqa: E402
from dflashkit.accept.serving_measure import measure_serving  # noqa: E402
from _trained_files import make_files  # noqa: E402

TRAINED = ROOT / "fixtures" / "trained"
TYPES = ("bf16", "Q8_0", "Q4_K_M", "Q4_K_M_DRAFT")
N_MAX = (4, 8, 15)
CACHE_TYPES = ("f16", "q8_0")
ENV = {"0.3.36": ("DFLASHKIT_LLAMA_CPP_BIN", "DFLASHKIT_LLAMA_CPP_SRC"),
       "b11549": ("DFLASHKIT_LLAMA_CPP_MAINLINE_BIN", "DFLASHKIT_LLAMA_CPP_MAINLINE_SRC")}


def costly_section(tmp: Path, builds: dict[str, str], drafters: dict[str, Path], sizes: dict[str, int],
                   texts: list[str], names: list[str], args: argparse.Namespace) -> list[str]:
    """The same drafter files against the costly target (module doc), n-max 4, 8, 15, the server's draft cache."""
    from costly_target import make_costly_target

    hf = make_costly_target(tmp / "target-costly", args.costly_layers)
    n_layers = 4 + args.costly_layers
    lines = [f"## A costlier target (labelled): the trained target + {args.costly_layers} zero-output layers", "",
             f"**Not the trained pair's own target.** `benchmarks/costly_target.py` appends {args.costly_layers} "
             f"decoder layers whose `o_proj` and `down_proj` are zero to the 4-layer trained target ({n_layers} layers): "
             "every hidden state and logit is the original's — the same greedy tokens, the same τ (the script "
             "checks it) — while each target forward does the extra layers' work, so the target dominates a round as "
             "a real 8 B–27 B target does beside its drafter. "
             f"{len(texts)} prompts, {args.max_new_tokens // 2} new tokens, draft cache: the server's default.", ""]
    for build, bin_dir in builds.items():
        src = os.environ.get(ENV.get(build, ("", ""))[1])
        if not src:
            continue
        target = tmp / f"target-costly-{build}.gguf"
        target_gguf_from_hf(hf, target, Path(src))
        print(f"{build}: the costly target, {len(TYPES) * len(N_MAX)} combinations", file=sys.stderr)
        result = measure_serving(
            [(t, drafters[t], 16) for t in TYPES], texts, names, llama_server=bin_dir, target_ggufs=[target],
            draft_n_max=list(N_MAX), max_new_tokens=args.max_new_tokens // 2, threads=args.threads,
            progress=lambda m: print(m, file=sys.stderr))
        lines += [f"### llama.cpp {build}, the costly target ({n_layers} layers)", "",
                  "| drafter | size | n-max | τ | tok/s alone | tok/s with drafter | speed-up | 95 % CI | identical output "
                  "| verdict |", "|---|---|---|---|---|---|---|---|---|---|"]
        for r, v in zip(result.runs, result.verdicts()):
            ci = r.speedup_ci
            same = "—" if r.refused else ("yes" if not r.differences(names) else "no")
            lines.append(f"| {r.drafter} | {sizes[r.drafter] / 1e6:.2f} MB | {r.draft_n_max} | " + (
                f"{r.tau:.2f} | {r.tokens_per_s_off:.0f} | {r.tokens_per_s_on:.0f} | ×{r.speedup:.2f} | "
                f"[{ci[0]:.2f}, {ci[1]:.2f}] | {same} | {v} |" if not r.refused else f"— | — | — | — | — | — | {v} |"))
        lines.append("")
    return lines


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--build", action="append", default=[], metavar="NAME=BIN_DIR")
    ap.add_argument("--prompts", default=str(TRAINED / "prompts.jsonl"))
    ap.add_argument("--max-new-tokens", type=int, default=128)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--out", default=None)
    ap.add_argument("--costly-layers", type=int, default=28)
    args = ap.parse_args()
    builds = dict(b.split("=", 1) for b in args.build) or {
        name: os.environ[bin_var] for name, (bin_var, _) in ENV.items() if os.environ.get(bin_var)}
    if not builds:
        sys.exit("no llama.cpp build: pass --build NAME=BIN_DIR or set $DFLASHKIT_LLAMA_CPP_BIN")
    prompts = [json.loads(line) for line in Path(args.prompts).read_text(encoding="utf-8").splitlines() if line.strip()]
    texts = [p.get("text") or p.get("prompt") for p in prompts]
    names = [p.get("id", f"p{i}") for i, p in enumerate(prompts)]

    lines = [
        "# llama-server: speed-up against the target alone (trained fixture pair, CPU)",
        "",
        f"Written by `benchmarks/serving.py` on {datetime.now(timezone.utc):%Y-%m-%d %H:%M} UTC — {platform.machine()}, "
        f"{os.cpu_count()} cores, `-t {args.threads}`, {len(texts)} prompts from `{Path(args.prompts).relative_to(ROOT)}`, "
        f"{args.max_new_tokens} new tokens, greedy. **A tiny pair's figures on a CPU** (4-layer 256-wide target, "
        "2-layer drafter): here the drafter costs about as much as the target it drafts for, which no real pair does. "
        "The reference — the same target GGUF alone, same prompts and seeds — is measured in the same run, each "
        "request right beside its pair, order alternating. Speed-up: geometric mean over prompts of (decode tok/s "
        "with the drafter) / (decode tok/s alone), 95 % paired bootstrap CI. Identical output: every speculative "
        "token equals the target's own greedy token.",
        "",
    ]
    with tempfile.TemporaryDirectory(prefix="dflashkit-serving-") as tmp_name:
        tmp = Path(tmp_name)
        drafters = make_files(tmp, TYPES)
        sizes = {t: p.stat().st_size for t, p in drafters.items()}
        for build, bin_dir in builds.items():
            src = os.environ.get(ENV.get(build, ("", ""))[1])
            target = tmp / f"target-{build}.gguf"
            if src:
                target_gguf_from_hf(TRAINED / "target", target, Path(src))
            else:
                import make_target

                make_target.make_gguf_target(target, TRAINED / "target")
            print(f"{build}: measuring {len(TYPES) * len(N_MAX) * len(CACHE_TYPES)} combinations", file=sys.stderr)
            result = measure_serving(
                [(t, drafters[t], 16) for t in TYPES], texts, names, llama_server=bin_dir, target_ggufs=[target],
                draft_n_max=list(N_MAX), draft_cache_types=list(CACHE_TYPES), max_new_tokens=args.max_new_tokens,
                threads=args.threads, progress=lambda m: print(m, file=sys.stderr))
            lines += [f"## llama.cpp {build}", "",
                      "| drafter | size | draft cache | n-max | τ | tok/s alone | tok/s with drafter | speed-up | 95 % CI "
                      "| identical output | verdict |",
                      "|---|---|---|---|---|---|---|---|---|---|---|"]
            for r, v in zip(result.runs, result.verdicts()):
                ci = r.speedup_ci
                same = "—" if r.refused else ("yes" if not r.differences(names) else
                                              f"no ({r.differences(names)[0].text()})")
                lines.append(
                    f"| {r.drafter} | {sizes[r.drafter] / 1e6:.2f} MB | {r.draft_cache_type} | {r.draft_n_max} | "
                    + (f"{r.tau:.2f} | {r.tokens_per_s_off:.0f} | {r.tokens_per_s_on:.0f} | ×{r.speedup:.2f} | "
                       f"[{ci[0]:.2f}, {ci[1]:.2f}] | {same} | {v} |" if not r.refused else
                       f"— | — | — | — | — | — | {v}: {r.refused} |"))
            lines.append("")
        if args.costly_layers > 0:
            lines += costly_section(tmp, builds, drafters, sizes, texts[:12], names[:12], args)
    text = "\n".join(lines)
    print(text)
    if args.out:
        Path(args.out).write_text(text, encoding="utf-8")


if __name__ == "__main__":
    main()
