"""dflash-accept: τ, in this runtime and in llama.cpp; speed-up through llama-server."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import click

from ..bounds import escape_name
from ..errors import UsageError
from ..files import check_output, write_text_atomic
from .common import FiniteFloat, _emit, _parse_fraction, _resolve_format, dflash_command, format_option, output_option, user_errors


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
@click.option("--prompts", "prompts_file", type=click.Path(dir_okay=False), metavar="FILE.jsonl",
              help='Prompts, one JSON per line: {"messages": [...]} (chat template), {"prompt": "..."} or '
              '{"text": "..."} (raw). Default: the built-in chat/code/math set.')
@click.option("--max-prompts", type=click.IntRange(min=1), help="Use only the first N prompts.")
@click.option("--max-new-tokens", type=click.IntRange(min=2), default=128, show_default=True)
@click.option("--temperature", type=FiniteFloat(min=0.0), default=0.0, show_default=True,
              help="0 = greedy (output identical to the target's own greedy output); ≥ 1e-6 = rejection sampling.")
@click.option("--seed", type=click.IntRange(0, 2**63 - 1), default=0, show_default=True,
              help="Seed of sampling and of the bootstrap CI.")
@click.option("--device", type=click.Choice(["cpu", "cuda", "mps"], case_sensitive=False), default="cpu", show_default=True)
@click.option("--dtype", type=click.Choice(["float32", "bfloat16", "float16"], case_sensitive=False), default="float32", show_default=True,
              help="Of the target and the drafters.")
@click.option("--keep-quantized", is_flag=True,
              help="Keep quantized drafter weights quantized (fused dflashkit.kernels matmuls) instead of dequantizing.")
@click.option("--ignore-eos", is_flag=True, help="Do not stop at the target's end-of-sequence tokens.")
@click.option("--reasoning", metavar="off|on|LEVEL",
              help="Thinking switch of the chat template, as z-lab's `dflash benchmark --reasoning`: on/off set "
              "enable_thinking; a level (e.g. high) sets reasoning_strength or reasoning_effort.")
@click.option("--chat-template-kwargs", "chat_template_kwargs", metavar="JSON",
              help='Extra chat-template variables as a JSON object, e.g. \'{"enable_thinking": false}\' '
              "(merged over --reasoning).")
@click.option("--trace", type=click.Path(dir_okay=False), metavar="FILE.jsonl",
              help="Write the acceptance trace: one line per (drafter, prompt) (format: docs/formats.md).")
@click.option("--plot", type=click.Path(dir_okay=False), metavar="FILE.html|FILE.png",
              help="Write the τ-per-drafter plot: .html = the full report with charts, .png needs matplotlib.")
@click.option("--max-drop", metavar="FRAC",
              help="Exit 1 when a drafter's τ is more than FRAC (0.05 or 5%) below the first drafter's, or it "
              "accepts nothing where the first accepts (for CI).")
@click.option("--min-tau", type=FiniteFloat(min=0.0), metavar="X",
              help="Exit 1 when a drafter's τ is below X, or it accepts nothing where the first accepts.")
@click.option("--llama-cpp", "llama_cpp", type=click.Path(file_okay=False), metavar="BIN_DIR",
              help="Also run every drafter in llama.cpp (BIN_DIR/llama-speculative-simple) on the same prompts, "
              "greedy: τ llama.cpp beside this runtime's τ, with a paired CI and a verdict.")
@click.option("--target-gguf", type=click.Path(dir_okay=False), metavar="FILE", multiple=True,
              help="The target as a GGUF for --llama-cpp / --llama-server (default: --target converted by llama.cpp's "
              "own converter from --llama-cpp-src / $DFLASHKIT_LLAMA_CPP_SRC). Repeat it to sweep quantized targets "
              "through --llama-server (--llama-cpp uses the first).")
@click.option("--llama-cpp-src", type=click.Path(file_okay=False), metavar="DIR",
              help="llama.cpp's source tree (convert_hf_to_gguf.py), to make the target GGUF for --llama-cpp.")
@click.option("--max-gap", metavar="FRAC",
              help="With --llama-cpp: exit 1 when llama.cpp's τ is significantly more than FRAC below this "
              "runtime's τ of the same drafter, or llama.cpp refuses a drafter.")
@click.option("--llama-server", "llama_server", type=click.Path(file_okay=False), metavar="BIN_DIR",
              help="Measure every drafter where users run it: BIN_DIR/llama-server with and without the drafter on "
              "the same prompts (started on 127.0.0.1, stopped when done): τ, decode tok/s, speed-up with a paired "
              "CI, identical output, and a verdict (net gain, no gain, net loss, output differs).")
@click.option("--server-url", metavar="URL",
              help="Measure a llama-server you already run (started with -md DRAFTER.gguf) instead of starting one.")
@click.option("--baseline-url", metavar="URL",
              help="With --server-url: a llama-server of the same target without a drafter, for the speed-up.")
@click.option("--draft-n-max", metavar="N[,N...]",
              help="With --llama-server: --spec-draft-n-max values to sweep, e.g. 4,8,15 (default: block size − 1).")
@click.option("--draft-cache-type", metavar="TYPE[,TYPE...]",
              help="With --llama-server: draft KV cache types to sweep (-ctkd / -ctvd), e.g. f16,q8_0 (default: "
              "the server's).")
@click.option("--min-speedup", type=FiniteFloat(min=0.0), metavar="X",
              help="With --llama-server / --server-url: exit 1 when a combination's speed-up is below X (e.g. 1.1), "
              "its output differs from the target's own, or the server refuses the drafter.")
@click.option("--llama-cpp-arg", "llama_cpp_args", metavar="ARG", multiple=True,
              help="An extra argument for every llama.cpp process (repeatable), e.g. --llama-cpp-arg=--no-repack. "
              "What dflashkit sets itself (-m, -md, --port, ...) is refused.")
@click.option("--llama-cpp-timeout", type=FiniteFloat(min=0.0, min_open=True, max=604800.0), default=600.0,
              show_default=True,
              metavar="SECONDS", help="The longest one llama.cpp run, server start or request may take.")
@click.option("--threads", type=click.IntRange(1, 512), default=1, show_default=True,
              help="llama.cpp threads (-t, target and drafter) for --llama-cpp / --llama-server. ggml's threads spin "
              "while they wait: more threads than idle cores makes a run many times slower.")
@click.option("--force", is_flag=True, help="Overwrite the --trace / --plot / -o files if they exist.")
@format_option()
@output_option
@click.option("--quiet", "-q", is_flag=True, help="No progress on stderr.")
@user_errors
def accept_command(
    drafters: tuple[str, ...], target: str, prompts_file: str | None, max_prompts: int | None, max_new_tokens: int,
    temperature: float, seed: int, device: str, dtype: str, keep_quantized: bool, ignore_eos: bool,
    reasoning: str | None, chat_template_kwargs: str | None,
    trace: str | None, plot: str | None, max_drop: str | None, min_tau: float | None, llama_cpp: str | None,
    target_gguf: tuple[str, ...], llama_cpp_src: str | None, max_gap: str | None, llama_server: str | None,
    server_url: str | None, baseline_url: str | None, draft_n_max: str | None, draft_cache_type: str | None,
    min_speedup: float | None, llama_cpp_args: tuple[str, ...], llama_cpp_timeout: float, threads: int, force: bool,
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
    output differs, refused to load, crashed).

    Exit 0 on success; 1 when a drafter has non-finite logits, a gate (--max-drop, --min-tau, --max-gap,
    --min-speedup) fails or an input is bad; 2 for usage.
    """
    import os

    from ..accept import parse_template_kwargs, require_matplotlib, run_acceptance, write_png
    from ..accept.prompts import builtin_prompts_path
    from ..accept.serving import cache_type_value, draft_n_max_value, parse_list

    drop = _parse_fraction(max_drop, "--max-drop")
    gap = _parse_fraction(max_gap, "--max-gap")
    if gap is not None and llama_cpp is None:
        raise UsageError("--max-gap gates llama.cpp's τ: pass --llama-cpp BIN_DIR")
    serving = llama_server is not None or server_url is not None
    if not serving and (min_speedup is not None or draft_n_max is not None or draft_cache_type is not None):
        raise UsageError("--min-speedup / --draft-n-max / --draft-cache-type measure llama-server: pass "
                         "--llama-server BIN_DIR (or --server-url URL)")
    n_max_list = parse_list(draft_n_max, "--draft-n-max", draft_n_max_value)
    cache_list = parse_list(draft_cache_type, "--draft-cache-type", cache_type_value)
    template_kwargs = parse_template_kwargs(chat_template_kwargs)  # a usage error now, not after loading
    fmt = _resolve_format(fmt, legacy_fmt, output)
    outputs = [(opt, p) for opt, p in (("--trace", trace), ("--plot", plot), ("-o", output)) if p is not None]
    if len({os.path.abspath(p) for _, p in outputs}) < len(outputs):
        raise UsageError(f"{' / '.join(opt for opt, _ in outputs)} name the same file; give each its own")
    for opt, p in outputs:  # checked now, not after a long run
        check_output(p, inputs=[*drafters, target, prompts_file or builtin_prompts_path(), *target_gguf,
                                *_llama_cpp_inputs(llama_cpp, llama_server, llama_cpp_src)], force=force, label=opt)
    if plot is not None:
        if Path(plot).suffix.lower() not in _PLOT_SUFFIXES:
            raise UsageError(f"--plot {plot}: give a .html or .png file")
        if Path(plot).suffix.lower() == ".png":
            require_matplotlib()

    result = run_acceptance(
        target, list(drafters), prompts_file, max_new_tokens=max_new_tokens, temperature=temperature, seed=seed,
        device=device, dtype=dtype, keep_quantized=keep_quantized, max_prompts=max_prompts, ignore_eos=ignore_eos,
        reasoning=reasoning, chat_template_kwargs=template_kwargs, llama_cpp=llama_cpp,
        target_gguf=list(target_gguf) or None, llama_cpp_src=llama_cpp_src, threads=threads, llama_server=llama_server,
        server_url=server_url, baseline_url=baseline_url, draft_n_max=n_max_list, draft_cache_types=cache_list,
        llama_cpp_args=llama_cpp_args, llama_cpp_timeout=llama_cpp_timeout,
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
