"""``dflash-imatrix``: the command line of `dflashkit.imatrix_collect` (parse, call, print)."""

from __future__ import annotations

import click

from ..bounds import escape_name
from .common import AsciiIntRange, dflash_command, user_errors
from .stdout import print_summary


@dflash_command(
    "dflash-imatrix ./my-drafter --target ./Qwen3-8B --prompts calib.jsonl -o drafter.imatrix.gguf",
    "dflash-quantize drafter-f32.gguf drafter-IQ4_XS.gguf iq4_xs --imatrix drafter.imatrix.gguf",
    exit_codes="Exit codes: 0 written; 1 bad input; 2 usage error; 130 interrupted (nothing written).",
)
@click.argument("drafter")
@click.option("--target", required=True, metavar="DIR", help="The target's HF model folder: its hidden states are "
              "the drafter's input.")
@click.option("--prompts", "prompts_file", metavar="FILE.jsonl", help="Calibration prompts (default: the built-in "
              "set); use prompts like the ones the drafter will serve.")
@click.option("--max-prompts", type=AsciiIntRange(min=1), help="Use only the first N prompts.")
@click.option("--max-new-tokens", type=AsciiIntRange(min=2), default=64, show_default=True,
              help="Tokens generated per prompt (draft rounds run until then).")
@click.option("--seed", type=AsciiIntRange(0, 2**63 - 1), default=0, show_default=True)
@click.option("-o", "--output", "out", required=True, metavar="FILE.gguf", help="The importance matrix to write.")
@click.option("--force", is_flag=True, help="Overwrite FILE if it exists.")
@click.option("-q", "--quiet", is_flag=True, help="No progress on stderr, no summary on stdout.")
@user_errors
def imatrix_command(drafter: str, target: str, prompts_file: str | None, max_prompts: int | None,
                    max_new_tokens: int, seed: int, out: str, force: bool, quiet: bool) -> None:
    """Make DRAFTER's importance matrix: its real draft rounds with the target on the prompts, the squares of every
    linear layer's inputs summed per column (llama-imatrix's GGUF format; llama-quantize --imatrix and
    dflash-quantize --imatrix take it)."""
    from ..files import check_output, check_outside_inputs
    from ..imatrix_collect import collect_imatrix, write_imatrix

    inputs = [p for p in (drafter, target, prompts_file) if p]
    check_output(out, inputs=inputs, force=force)  # before minutes of draft rounds
    check_outside_inputs(out, inputs, what="write the importance matrix to another folder")
    say = None if quiet else (lambda m: click.echo(escape_name(m, limit=400), err=True))
    result = collect_imatrix(drafter, target, prompts_file, max_prompts=max_prompts, max_new_tokens=max_new_tokens,
                             seed=seed, progress=say)
    path = write_imatrix(result, out, force=force, inputs=tuple(inputs))
    if not quiet:
        print_summary(f"wrote {path}: {len(result.sums)} tensors, {result.rounds} draft rounds over {result.prompts} "
                      f"prompt(s) from {result.dataset}", f"{path} is written and complete (kept)")
