"""dflash-diff: per-tensor differences between two forms of a drafter."""

from __future__ import annotations

import sys

import click

from ..files import check_output, write_text_atomic
from .common import FiniteFloat, _resolve_format, dflash_command, format_option, output_option, user_errors
from .stdout import print_summary, write_stdout


@dflash_command(
    "dflash-diff ./hf-drafter drafter-Q4_K_M.gguf",
    "dflash-diff drafter-bf16.gguf drafter-Q4_K_M.gguf -o diff.html --threshold 0.05",
)
@click.argument("a")
@click.argument("b")
@format_option()
@output_option
@click.option("--force", is_flag=True, help="Overwrite the -o file if it exists.")
@click.option(
    "--threshold",
    type=FiniteFloat(min=0.0),
    metavar="REL",
    help="Exit 1 when any tensor's relative RMS error ‖a−b‖/‖a‖ exceeds REL (for CI).",
)
@click.option("--allow-missing", is_flag=True, help="Tensors on one side only and unmapped names do not fail the diff (still listed).")
@click.option("--quiet", "-q", is_flag=True, help="No progress bar and no 'wrote' line; the exit code still tells.")
@user_errors
def diff_command(
    a: str, b: str, fmt: str | None, legacy_fmt: str | None, output: str | None, force: bool,
    threshold: float | None, allow_missing: bool, quiet: bool,
) -> None:
    """Per-tensor differences between drafters A (the reference) and B: HF dirs or GGUFs of any dialect/type.

    Exit 0 when they match, 1 when a tensor is missing/unmapped/reshaped/unreadable, the metadata means
    something else, or --threshold is exceeded; 2 for usage errors.
    """
    from ..diff import diff_drafters

    fmt = _resolve_format(fmt, legacy_fmt, output)
    if output is not None:
        check_output(output, inputs=[a, b], force=force)  # now, not after a long diff; never an input file
    result = diff_drafters(a, b, progress=not quiet)
    report = result.report(threshold=threshold, allow_missing=allow_missing)
    text = report.render(fmt)
    code = result.exit_code(threshold, allow_missing)
    if output is not None:
        write_text_atomic(output, text, force=force)
        if not quiet:  # (on stdout, as convert's and quantize's summary)
            print_summary(f"wrote {output} — {report.status}", f"{output} is written and complete (kept)")
    else:
        write_stdout(text)
        if fmt != "text" and code and not quiet:
            click.echo(f"dflash-diff: {report.status}", err=True)
    sys.exit(code)
