"""dflash-inspect: the CI gate for model files."""

from __future__ import annotations

import sys

import click

from ..files import check_output
from .common import LazyChoice, _emit, _expect_verdicts, _resolve_format, dflash_command, format_option, output_option, user_errors


@dflash_command(
    "dflash-inspect drafter.gguf --target target.gguf",
    "dflash-inspect *.gguf --format json --strict -o inspect.json",
)
@click.argument("paths", nargs=-1, required=True)
@click.option("--target", help="Target model (GGUF file or HF dir) to check each drafter against.")
@click.option(
    "--expect",
    type=LazyChoice(_expect_verdicts),
    help="Fail when a file does not look like this variant (instruct vs base).",
)
@format_option()
@output_option
@click.option("--force", is_flag=True, help="Overwrite the -o file if it exists.")
@click.option("--strict", is_flag=True, help="Warnings fail too (exit 1).")
@click.option("--quiet", "-q", is_flag=True, help="No 'wrote' line for -o; the exit code still tells.")
@user_errors
def inspect_command(
    paths: tuple[str, ...], target: str | None, expect: str | None, fmt: str | None, legacy_fmt: str | None,
    output: str | None, force: bool, strict: bool, quiet: bool,
) -> None:
    """Check GGUF files and safetensors checkpoints: structure, drafter metadata, dialect, target fit.

    Exit 0 when no error (warnings allowed unless --strict), 1 when any error, 2 for usage.
    """
    from ..inspect import inspect_paths

    fmt = _resolve_format(fmt, legacy_fmt, output)
    if output is not None:
        check_output(output, inputs=[*paths, target], force=force)
    report = inspect_paths(list(paths), strict=strict, target=target, expect=expect)
    _emit(report.render(fmt), output, force, quiet, report.status(), "dflash-inspect")
    sys.exit(report.exit_code())
