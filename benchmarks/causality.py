"""What a publisher ships today without a word, and which setting of llama.cpp's one causal flag loses least: the
long pair's drafter trained as the field trains them (``fixtures/trained-long/drafter-sliding-causal``: three
sliding layers causal inside the block, the full layer bidirectional — z-lab's default rule — and no ``is_causal``
in its config; ``fixtures/make_long_pair.py --sliding-causal``), measured in both pinned llama.cpp builds.

For each file llama.cpp can be given — dflash-convert's default (no causal key, as llama.cpp's own converter
writes: every layer bidirectional), ``--llama-cpp-causal false`` (the key, false: the same graph) and
``--llama-cpp-causal true`` (every layer causal) — and each build: τ of the GGUF in llama.cpp (llama-server's JSON
counts, n-max 15) beside τ of the same GGUF in dflashkit's runtime under llama.cpp's rules on llama-server's
schedule (prompt by prompt: how many equal), and beside τ of the checkpoint as trained, in the reference runtime on
the same schedule — the loss. And for contrast the long pair's own drafter (trained with ``is_causal: false``, as
llama.cpp runs every layer): nothing to lose.

    python benchmarks/causality.py           # writes benchmarks/CAUSALITY.md (the causality section)
    python benchmarks/causality.py windows   # appends the window-keys section: llama.cpp's τ by context on the
                                             # long pair's drafter as dflashkit and as llama.cpp's converter write it

Environment: $DFLASHKIT_LLAMA_CPP_BIN / _SRC (0.3.36) and $DFLASHKIT_LLAMA_CPP_MAINLINE_BIN / _SRC (b11549). The
builds run one after the other, nothing else of ours beside them.
"""

from __future__ import annotations

import os
import platform
import sys
import tempfile
import time
from datetime import datetime, timezone
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
LONG = ROOT / "fixtures" / "trained-long"
DRAFTER = LONG / "drafter-sliding-causal"
BUILDS = {"0.3.36": "DFLASHKIT_LLAMA_CPP", "b11549": "DFLASHKIT_LLAMA_CPP_MAINLINE"}
N_PREDICT = 64
N_PROMPTS = 48
SETTINGS = {"default (no key)": None, "--llama-cpp-causal false": False, "--llama-cpp-causal true": True}


def held_out_prompts(out: Path) -> Path:
    """The long pair's held-out prompts, N_PROMPTS of them (the committed 12 are the first): a loss of a few per cent
    needs more than 12 prompts for its CI to exclude 0."""
    sys.path.insert(0, str(ROOT / "fixtures"))
    import make_long_pair
    import make_trained_pair

    make_trained_pair.write_prompts(out, make_long_pair.held_out_prompts(N_PROMPTS))
    return out


def say(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


def _ci(c) -> str:  # type: ignore[no-untyped-def]
    if c is None or c.ci is None:
        return "—"
    return f"{c.delta:+.2f} [{c.ci[0]:+.2f}, {c.ci[1]:+.2f}]"


def windows() -> int:
    """llama.cpp's τ by context on dflashkit's file (window keys from layer_types) and llama.cpp's converter's (none)."""
    from dflashkit.accept import run_acceptance
    from dflashkit.converters.convert import convert
    from dflashkit.llama_cpp import target_gguf_from_hf
    from dflashkit.runtime import HFTarget

    sys.path.insert(0, str(ROOT / "tests"))
    from llama_cpp_oracle import run_oracle

    started = time.time()
    levels = (0, 256, 512)
    lines = ["", "## Window keys: dflashkit's file against llama.cpp's converter's", "",
             "`fixtures/trained-long/drafter` (3 sliding layers, window 128, trained with it; `use_sliding_window: "
             "false` in its config) converted to bf16 by dflash-convert (window keys from `layer_types`) and by each "
             "build's own `convert_hf_to_gguf.py` (no window keys: every layer unwindowed), measured through that "
             "build's llama-server (n-max 15), the 12 prompts after N tokens of `context.txt`, 64 new tokens.", ""]
    target = HFTarget(LONG / "target")
    with tempfile.TemporaryDirectory(prefix="dflashkit-windows-") as tmp_name:
        tmp = Path(tmp_name)
        ours = tmp / "dflashkit.gguf"
        convert(LONG / "drafter", ours, outtype="bf16", target=LONG / "target", progress=False, warn=lambda m: None)
        for build, env in BUILDS.items():
            binary, src = Path(os.environ[f"{env}_BIN"]), Path(os.environ[f"{env}_SRC"])
            theirs = run_oracle(LONG / "drafter", tmp / f"llama-{build}.gguf", outtype="bf16",
                                target_dir=LONG / "target", src=src)
            target_gguf = target_gguf_from_hf(LONG / "target", tmp / f"target-{build}.gguf", src)
            say(f"build {build}")
            result = run_acceptance(target, [ours, theirs], LONG / "prompts.jsonl", max_new_tokens=N_PREDICT,
                                    llama_server=binary, target_gguf=target_gguf, context=levels,
                                    context_file=LONG / "context.txt", progress=say)
            lines += [f"### llama.cpp {build}", "", "| --context | τ dflashkit's file | τ llama.cpp's converter's file |",
                      "|---|---|---|"]
            for level, res in zip(result.by_context.levels, result.by_context.results):
                a, b = res.serving.runs[0], res.serving.runs[1]
                lines.append(f"| {level} | {a.tau:.2f} | {b.tau:.2f} |")
            lines.append("")
    lines.append(f"({(time.time() - started) / 60:.1f} min, nothing else running.)")
    text = "\n".join(lines) + "\n"
    with open(ROOT / "benchmarks" / "CAUSALITY.md", "a", encoding="utf-8") as f:
        f.write(text)
    print(text)
    return 0


def main() -> int:
    from dflashkit.accept import run_acceptance
    from dflashkit.converters.convert import convert
    from dflashkit.llama_cpp import target_gguf_from_hf
    from dflashkit.runtime import HFTarget
    from dflashkit.stats import paired_comparison

    started = time.time()
    target = HFTarget(LONG / "target")
    lines: list[str] = []
    with tempfile.TemporaryDirectory(prefix="dflashkit-causality-") as tmp_name:
        tmp = Path(tmp_name)
        prompts = held_out_prompts(tmp / "prompts.jsonl")
        files = {}
        for label, flag in SETTINGS.items():
            files[label] = tmp / f"drafter-{flag}.gguf"
            convert(DRAFTER, files[label], outtype="bf16", target=LONG / "target", progress=False,
                    warn=lambda m: None, llama_cpp_causal=flag)
        files["long pair's drafter (is_causal: false)"] = tmp / "long-drafter.gguf"
        convert(LONG / "drafter", files["long pair's drafter (is_causal: false)"], outtype="bf16",
                target=LONG / "target", progress=False, warn=lambda m: None)
        say("the checkpoint as trained, in the reference runtime")
        for build, env in BUILDS.items():
            binary, src = Path(os.environ[f"{env}_BIN"]), Path(os.environ[f"{env}_SRC"])
            target_gguf = target_gguf_from_hf(LONG / "target", tmp / f"target-{build}.gguf", src)
            say(f"build {build}")
            result = run_acceptance(target, [DRAFTER, LONG / "drafter", *files.values()], prompts,
                                    max_new_tokens=N_PREDICT, llama_cpp=binary, target_gguf=target_gguf,
                                    progress=say)
            checkpoint, long_checkpoint, *ggufs = result.drafters
            ran = result.llama_cpp[2:]
            verdicts = result.llama_cpp_verdicts()[2:]
            lines += [f"### llama.cpp {build}", "",
                      f"The checkpoint as trained, in the reference runtime on llama-server's schedule: τ "
                      f"**{checkpoint.schedule_tau:.2f}** (its own loop: {checkpoint.tau:.2f}); the long pair's "
                      f"drafter: {long_checkpoint.schedule_tau:.2f}. `dflash-accept CHECKPOINT --llama-cpp` on the "
                      f"checkpoint itself: llama.cpp τ {result.llama_cpp[0].tau:.2f}, verdict "
                      f"*{result.llama_cpp_verdicts()[0]}*; `--max-gap`: "
                      + ", ".join(f"{g:.0%} exit {result.exit_code(max_gap=g)}" for g in (0.01, 0.02, 0.05))
                      + ".", "",
                      "| file given to llama.cpp | τ llama.cpp | τ runtime, llama.cpp's rules | prompts equal | "
                      "verdict | τ checkpoint as trained | loss (llama.cpp − checkpoint) [95 % CI] |",
                      "|---|---|---|---|---|---|---|"]
            for (label, _), d, l, v in zip(files.items(), ggufs, ran, verdicts):
                base = long_checkpoint if label.startswith("long pair") else checkpoint
                loss = paired_comparison(base.schedule_taus, l.taus)
                equal = sum(a == b for a, b in zip(d.schedule_taus, l.taus))
                lines.append(f"| {label} | {l.tau:.2f} | {d.schedule_tau:.2f} | {equal}/{len(l.taus)} | {v} | "
                             f"{base.schedule_tau:.2f} | {_ci(loss)} ({loss.relative:+.1%}) |")
            lines.append("")
    elapsed = time.time() - started
    head = [
        "# Per-layer causality: what llama.cpp's one flag costs a drafter trained per layer",
        "",
        f"Measured {datetime.now(timezone.utc):%Y-%m-%d %H:%M} UTC by `python benchmarks/causality.py` on "
        f"{platform.machine()} ({os.cpu_count()} cores), nothing else running, {elapsed / 60:.1f} min. Target "
        "`fixtures/trained-long/target`; drafter `fixtures/trained-long/drafter-sliding-causal` (z-lab DFlash, "
        "3 sliding layers (window 128) + 1 full, block 16, trained under z-lab's default rule and shipped without "
        f"`is_causal`). {N_PROMPTS} held-out prompts of the long pair (`make_long_pair.held_out_prompts`; the "
        "committed `prompts.jsonl` is their first 12), greedy, "
        f"{N_PREDICT} new tokens, llama-server with n-max 15 and 1 thread (counts from its JSON); every τ on "
        "llama-server's schedule (`dflashkit.runtime.schedules`). Each GGUF is bf16 from dflash-convert.",
        "",
        "*τ runtime, llama.cpp's rules*: the GGUF in dflashkit's runtime, which runs a llama.cpp-dialect file as "
        "llama.cpp does (one causal flag for every layer). *verdict*: llama.cpp against that, as `dflash-accept` "
        "gives it. *loss*: llama.cpp's τ against the checkpoint as trained (the reference's per-layer rule), paired "
        "over prompts.",
        "",
    ]
    text = "\n".join(head + lines)
    (ROOT / "benchmarks" / "CAUSALITY.md").write_text(text, encoding="utf-8")
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(windows() if sys.argv[1:] == ["windows"] else main())
