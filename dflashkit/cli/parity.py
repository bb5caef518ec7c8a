"""dflash-parity: does the candidate still draft what the reference drafts?"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import click

from ..errors import UsageError
from ..files import check_output
from .common import AsciiIntRange, PathParam, ascii_int, context_options, FiniteFloat, MAX_PARITY_ROUNDS, _emit, _parse_fraction, _resolve_format, dflash_command, format_option, output_option, user_errors


def _parse_ids(value: str | None) -> list[int] | None:

    if value is None:
        return None
    parts = [p for p in value.replace(",", " ").replace("[", " ").replace("]", " ").split() if p]
    try:
        ids = [ascii_int(p) for p in parts]
    except ValueError:
        raise UsageError(f"--prompt-ids: expected integers separated by commas or spaces, got {value!r}") from None
    if not ids or any(i < 0 for i in ids):
        raise UsageError("--prompt-ids: give at least one non-negative token id")
    return ids


@dflash_command(
    "dflash-parity ./hf-drafter drafter-Q4_K_M.gguf --target ./Qwen3-8B",
    "dflash-parity drafter-bf16.gguf drafter-Q4_K_M.gguf --target target.gguf --threshold-top1 95% --format json",
)
@click.argument("reference")
@click.argument("candidate")
@click.option(
    "--target",
    help="Target model. HF dir: run it with transformers on the prompt (real tap hidden states). "
    "GGUF: its token_embd/output give embeddings and lm_head (hidden states seeded random). "
    "None: hidden-state parity only.",
)
@click.option("--prompt", help="Prompt text for an HF --target (default: a fixed built-in prompt; chat template applied).")
@click.option("--prompt-ids", metavar="IDS", help="Prompt token ids for an HF --target, e.g. '151644,872,198'.")
@click.option("--rounds", type=AsciiIntRange(1, MAX_PARITY_ROUNDS), default=1, show_default=True,
              help="Draft rounds, each from the cache of the previous ones (cropped as dflash_generate does).")
@click.option("--device", type=click.Choice(["cpu", "cuda", "mps"], case_sensitive=False), default="cpu", show_default=True)
@click.option("--dtype", type=click.Choice(["float32", "bfloat16", "float16"], case_sensitive=False), default="float32", show_default=True)
@click.option("--seed", type=AsciiIntRange(0, 2**63 - 1), default=0, show_default=True,
              help="Seed of the random hidden states / embeddings.")
@click.option("--threshold-top1", metavar="FRAC",
              help="Exit 1 when overall top-1 agreement is below FRAC (0.99 or 99%).")
@click.option("--threshold-kl", type=FiniteFloat(min=0.0), metavar="NATS",
              help="Exit 1 when the mean KL(ref‖cand) exceeds NATS.")
@click.option("--no-default-gate", is_flag=True,
              help="Without --threshold-top1 / --threshold-kl, gate nothing (default: the gate for the files' "
              "precision — float: top-1 ≥ 99 %, KL ≤ 0.01; 8-bit: 97 %, 0.02; without --target the output hidden "
              "states' cosine ≥ 0.999 / 0.99; no default below 8 bits).")
@click.option("--dump", type=PathParam(dir_okay=False, expect="the dump's file name"), metavar="FILE.npz",
              help="Write the first round's exact inputs and both sides' outputs (format: docs/formats.md).")
@click.option("--force", is_flag=True, help="Overwrite the --dump / -o files if they exist.")
@format_option()
@output_option
@click.option("--keep-quantized", is_flag=True,
              help="Keep quantized weights quantized (fused dflashkit.runtime.kernels matmuls) instead of dequantizing.")
@click.option("--float-activations", is_flag=True,
              help="Multiply a llama.cpp GGUF's weights with float32 activations, so only the weights' own rounding "
              "shows (default: as llama.cpp, the activations rounded to F16 / BF16 / Q8_0 / Q8_1 / Q8_K by the "
              "weight's type).")
@click.option("--skip-weights", is_flag=True, help="Skip the per-tensor weight diff (faster on big files).")
@click.option("--quiet", "-q", is_flag=True, help="No 'wrote' line for -o (a failure's reason still goes to stderr).")
@user_errors
@context_options
def parity_command(
    reference: str, candidate: str, target: str | None, prompt: str | None, prompt_ids: str | None, rounds: int,
    device: str, dtype: str, seed: int, threshold_top1: str | None, threshold_kl: float | None,
    no_default_gate: bool, dump: str | None,
    force: bool, fmt: str | None, legacy_fmt: str | None, output: str | None, keep_quantized: bool,
    float_activations: bool, skip_weights: bool, quiet: bool, context: Any,
) -> None:
    """Does CANDIDATE still draft what REFERENCE drafts? Run both drafters (HF dirs or GGUFs) on the same
    inputs and compare weights, logits per block position and accepted-prefix length.

    With --context N[,N…], once per context length with the anchors past N tokens (an HF target: the prompt after
    N tokens of --context-file or of itself repeated; else N random context positions): a file whose sliding window
    or rope metadata is wrong drafts like the right one until the context passes its window. The gates apply to
    every level.

    Without --threshold-top1 / --threshold-kl the default gate for the files' precision applies (float and 8-bit
    files must draft what their reference drafts; none below 8 bits; --no-default-gate: none at all).

    Exit 0 when the gate holds, 1 when it is missed or an input is bad, 2 for usage.
    """

    from ..parity import run_parity

    top1 = _parse_fraction(threshold_top1, "--threshold-top1")
    fmt = _resolve_format(fmt, legacy_fmt, output)
    if output is not None:
        if dump is not None and Path(dump).absolute() == Path(output).absolute():
            raise UsageError("--dump and -o name the same file")
        check_output(output, inputs=[reference, candidate, target], force=force, label="-o")
    if (top1 is not None or threshold_kl is not None) and target is None:
        raise UsageError("--threshold-top1 / --threshold-kl gate on logits, which need a target head — pass --target")
    if context.levels:
        if dump is not None:
            raise UsageError("--dump writes one run's tensors: give it without --context")
        from ..parity.sweep import run_parity_by_context

        result = run_parity_by_context(
            reference, candidate, levels=context.levels, context_file=context.file, target=target, prompt=prompt,
            prompt_ids=_parse_ids(prompt_ids), rounds=rounds, device=device, dtype=dtype, seed=seed,
            keep_quantized=keep_quantized, weights=not skip_weights, ggml_activations=not float_activations)
    else:
        result = run_parity(
            reference, candidate, target=target, prompt=prompt, prompt_ids=_parse_ids(prompt_ids), rounds=rounds,
            device=device, dtype=dtype, seed=seed, dump=dump, keep_quantized=keep_quantized, weights=not skip_weights,
            force=force, ggml_activations=not float_activations,
        )
    report = result.report(threshold_top1=top1, threshold_kl=threshold_kl, default_gate=not no_default_gate)
    _emit(report.render(fmt), output, force, quiet, report.status, "dflash-parity")
    code = result.exit_code(top1, threshold_kl, default_gate=not no_default_gate)
    if fmt != "text" and code and output is None:  # the reason for exit 1, -q or not
        click.echo(f"dflash-parity: {report.status}", err=True)
    sys.exit(code)
