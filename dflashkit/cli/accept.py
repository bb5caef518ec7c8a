"""dflash-accept: τ, in this runtime and in llama.cpp; speed-up through llama-server."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import click

from ..bounds import escape_name
from ..errors import UsageError
from ..files import check_output, write_text_atomic
from ..accept.options import ContextOptions, LlamaCppOptions, PromptOptions
from .common import (FiniteFloat, PathParam, _emit, _parse_fraction, _resolve_format, dflash_command, format_option,
                     context_options, llama_cpp_options, output_option, prompt_options, user_errors)


_PLOT_SUFFIXES = (".html", ".htm", ".png")


def _llama_cpp_inputs(*folders: str | None) -> list[str]:
    """The llama.cpp programs and converter dflash-accept would run: inputs, never an output's place."""
    names = ("llama-speculative-simple", "llama-server", "convert_hf_to_gguf.py")
    return [os.path.join(f, n) for f in folders if f is not None for n in names]


@dflash_command(
    "dflash-accept fixtures/trained/drafter --target fixtures/trained/target --prompts fixtures/trained/prompts.jsonl",
    "dflash-accept drafter-bf16.gguf drafter-Q4_K_M.gguf --target ./Qwen3-8B --max-drop 5% --llama-cpp ~/llama.cpp/build/bin --target-gguf Qwen3-8B-bf16.gguf",
)
@click.argument("drafters", nargs=-1, required=True)
@click.option("--target", required=True,
              help="Target model as an HF directory (transformers runs it: prefill, verify, tap hidden states).")
@click.option("--temperature", type=FiniteFloat(min=0.0), default=0.0, show_default=True,
              help="0 = greedy (output identical to the target's own greedy output); ≥ 1e-6 = rejection sampling.")
@click.option("--device", type=click.Choice(["cpu", "cuda", "mps"], case_sensitive=False), default="cpu", show_default=True)
@click.option("--dtype", type=click.Choice(["float32", "bfloat16", "float16"], case_sensitive=False), default="float32", show_default=True,
              help="Of the target and the drafters.")
@click.option("--keep-quantized", is_flag=True,
              help="Keep quantized drafter weights quantized (fused dflashkit.runtime.kernels matmuls) instead of dequantizing.")
@click.option("--ignore-eos", is_flag=True, help="Do not stop at the target's end-of-sequence tokens.")
@click.option("--trace", type=PathParam(dir_okay=False, expect="the trace's file name"), metavar="FILE.jsonl",
              help="Write the acceptance trace: one line per (drafter, prompt) (format: docs/formats.md).")
@click.option("--plot", type=PathParam(dir_okay=False, expect="the plot's file name"), metavar="FILE.html|FILE.png",
              help="Write the τ-per-drafter plot: .html = the full report with charts, .png needs matplotlib.")
@click.option("--max-drop", metavar="FRAC",
              help="Exit 1 when a drafter's τ is more than FRAC (0.05 or 5%) below the first drafter's, or it "
              "accepts nothing where the first accepts (for CI).")
@click.option("--min-tau", type=FiniteFloat(min=0.0), metavar="X",
              help="Exit 1 when a drafter's τ is below X, or it accepts nothing where the first accepts.")
@click.option("--max-gap", metavar="FRAC",
              help="With --llama-cpp / --llama-server / --server-url: exit 1 when llama.cpp's τ is more than FRAC "
              "below or above this runtime's τ of the same drafter on llama.cpp's schedule and significantly off it "
              "(paired CI), or llama.cpp refuses a drafter.")
@click.option("--server-url", metavar="URL",
              help="Measure a llama-server you already run (started with -md DRAFTER.gguf) instead of starting one.")
@click.option("--baseline-url", metavar="URL",
              help="With --server-url: a llama-server of the same target without a drafter, for the speed-up.")
@click.option("--min-speedup", type=FiniteFloat(min=0.0), metavar="X",
              help="With --llama-server / --server-url: exit 1 when a combination's speed-up is below X (e.g. 1.1), "
              "its output differs from the target's own, or the server refuses the drafter.")
@click.option("--force", is_flag=True, help="Overwrite the --trace / --plot / -o files if they exist.")
@format_option()
@output_option
@click.option("--quiet", "-q", is_flag=True, help="No progress on stderr.")
@user_errors
@prompt_options
@context_options
@llama_cpp_options
def accept_command(
    drafters: tuple[str, ...], target: str, prompt_options: PromptOptions, context: ContextOptions,
    llama: LlamaCppOptions,
    temperature: float, device: str, dtype: str, keep_quantized: bool, ignore_eos: bool,
    trace: str | None, plot: str | None, max_drop: str | None, min_tau: float | None, max_gap: str | None,
    server_url: str | None, baseline_url: str | None, min_speedup: float | None, force: bool,
    fmt: str | None, legacy_fmt: str | None, output: str | None, quiet: bool,
) -> None:
    """Acceptance length τ of each DRAFTER (HF dir or GGUF of any type) in speculative decoding with --target.

    Runs the draft–verify loop per drafter on the same prompts; reports mean τ, accepted tokens per
    round, acceptance per block position, this runtime's decode speed, and the difference to the
    first drafter with a paired bootstrap confidence interval over prompts. Each drafter gets a verdict:
    reference (the first), agrees, below / above reference, zero accepted, non-finite logits. With --llama-cpp,
    τ in llama.cpp beside it (verdicts: agrees, below / above reference, zero accepted, refused to load, crashed).
    With --llama-server (or --server-url), the drafter where it is served: τ, speed-up against the target alone
    and identical output per target GGUF × draft cache type × draft n-max (verdicts: net gain, no gain, net loss,
    output differs, refused to load, crashed). With --context N[,N…], all of it once per context length: each
    prompt after N tokens of long context (--context-file, else the other prompts), a "τ by context length" table
    and where τ or the speed-up falls, with the likely cause. Prompts with a "category" get a τ per category.

    Exit 0 on success; 1 when a drafter has non-finite logits, a gate (--max-drop, --min-tau, --max-gap,
    --min-speedup) fails or an input is bad; 2 for usage.
    """
    import os

    from ..accept import require_matplotlib, run_acceptance, write_png
    from ..accept.prompts import builtin_prompts_path

    drop = _parse_fraction(max_drop, "--max-drop")
    gap = _parse_fraction(max_gap, "--max-gap")
    if gap is not None and llama.llama_cpp is None and not llama.llama_servers and server_url is None:
        raise UsageError("--max-gap gates llama.cpp's τ: pass --llama-cpp BIN_DIR or --llama-server BIN_DIR")
    if (min_speedup is not None or llama.draft_n_max or llama.draft_cache_types) and not llama.llama_servers \
            and server_url is None:
        raise UsageError("--min-speedup / --draft-n-max / --draft-cache-type measure llama-server: pass "
                         "--llama-server BIN_DIR (or --server-url URL)")
    fmt = _resolve_format(fmt, legacy_fmt, output)
    outputs = [(opt, p) for opt, p in (("--trace", trace), ("--plot", plot), ("-o", output)) if p is not None]
    if len({os.path.abspath(p) for _, p in outputs}) < len(outputs):
        raise UsageError(f"{' / '.join(opt for opt, _ in outputs)} name the same file; give each its own")
    for opt, p in outputs:  # checked now, not after a long run
        check_output(p, inputs=[*drafters, target, prompt_options.prompts or builtin_prompts_path(),
                                *llama.target_ggufs, *([context.file] if context.file else []),
                                *_llama_cpp_inputs(llama.llama_cpp, *llama.llama_servers, llama.llama_cpp_src)],
                     force=force, label=opt)
    if plot is not None:
        if Path(plot).suffix.lower() not in _PLOT_SUFFIXES:
            raise UsageError(f"--plot {plot}: give a .html or .png file")
        if Path(plot).suffix.lower() == ".png":
            require_matplotlib()

    result = run_acceptance(
        target, list(drafters), temperature=temperature, device=device, dtype=dtype, keep_quantized=keep_quantized,
        ignore_eos=ignore_eos, server_url=server_url, baseline_url=baseline_url, prompt_options=prompt_options,
        llama=llama, context=context.levels or None, context_file=context.file,
        progress=None if quiet else (
            lambda message: click.echo(f"dflash-accept: {escape_name(message, limit=2000)}", err=True)),
    )
    report = result.report(max_drop=drop, min_tau=min_tau, max_gap=gap, min_speedup=min_speedup)
    if trace is not None:
        result.write_trace(trace, force=force)
        if not quiet:
            click.echo(f"dflash-accept: wrote {trace}", err=True)
    if plot is not None:
        if Path(plot).suffix.lower() == ".png":
            write_png(result, plot, force=force)
        else:
            write_text_atomic(plot, report.to_html(), force=force)
        if not quiet:
            click.echo(f"dflash-accept: wrote {plot}", err=True)
    _emit(report.render(fmt), output, force, quiet, report.status, "dflash-accept")
    code = result.exit_code(drop, min_tau, gap, min_speedup)
    if fmt != "text" and code and output is None:  # the reason for exit 1, -q or not
        click.echo(f"dflash-accept: {report.status}", err=True)
    sys.exit(code)
