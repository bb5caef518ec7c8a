"""Command-line entry points. Thin: parse, call the library, print.

Errors: one line on stderr, exit 1 for bad input and 2 for usage; ``--debug`` shows the traceback.
"""

from __future__ import annotations

import functools
import json
import sys
import traceback
from typing import Any, Callable

import click

from .errors import DFlashError


def _fail(message: str, code: int) -> None:
    click.echo(f"error: {message}", err=True)
    sys.exit(code)


def user_errors(func: Callable[..., Any]) -> Callable[..., Any]:
    """Turn library errors into one-line messages and exit codes (tracebacks only with --debug)."""

    @functools.wraps(func)
    def wrapper(*args: Any, debug: bool = False, **kwargs: Any) -> Any:
        try:
            return func(*args, **kwargs)
        except DFlashError as exc:
            if debug:
                traceback.print_exc()
            _fail(str(exc), exc.exit_code)
        except KeyboardInterrupt:
            click.echo("interrupted (no output written)", err=True)
            sys.exit(130)
        except MemoryError:
            _fail("out of memory", 1)
        except Exception as exc:  # an unexpected failure is still one line, unless --debug
            if debug:
                traceback.print_exc()
            _fail(f"internal error: {type(exc).__name__}: {exc} (re-run with --debug for the traceback)", 1)

    return click.option("--debug", is_flag=True, help="Show tracebacks.")(wrapper)


def _warn(message: str) -> None:
    click.echo(click.style("warning: ", fg="yellow", bold=True) + message, err=True)


@click.command(context_settings={"help_option_names": ["-h", "--help"]})
@click.argument("src")
@click.argument("out", type=click.Path(dir_okay=False))
@click.option(
    "--outtype",
    type=click.Choice(["auto", "f32", "f16", "bf16", "q8_0"], case_sensitive=False),
    default="auto",
    show_default=True,
    help="Type of the weight matrices (norms and 1-D tensors stay F32). auto = the checkpoint's 16-bit type.",
)
@click.option("--target", help="Target model (GGUF file or HF dir): tokenizer source and compatibility check.")
@click.option(
    "--dialect",
    type=click.Choice(["llama.cpp", "luce", "dflash-draft"]),
    default="llama.cpp",
    show_default=True,
    help="GGUF dialect to write.",
)
@click.option("--force", is_flag=True, help="Overwrite OUT if it exists.")
@click.option("--quiet", "-q", is_flag=True, help="No progress bar or warnings.")
@click.option("--json", "as_json", is_flag=True, help="Print a machine-readable summary on stdout.")
@user_errors
def convert_command(
    src: str, out: str, outtype: str, target: str | None, dialect: str, force: bool, quiet: bool, as_json: bool
) -> None:
    """Convert a DFlash drafter (HF dir or hub repo id SRC) to a GGUF file OUT."""
    from .converters.convert import convert

    result = convert(
        src,
        out,
        outtype=outtype.lower(),
        target=target,
        dialect=dialect,
        force=force,
        progress=not quiet,
        warn=(lambda m: None) if quiet else _warn,
    )
    if as_json:
        click.echo(json.dumps(result.to_json(), indent=2))
    elif not quiet:
        types = result.to_json()["tensor_types"]
        mix = ", ".join(f"{n} {t}" for t, n in sorted(types.items()))
        click.echo(
            f"wrote {result.out} ({result.bytes_written / 1e6:.1f} MB, {len(result.tensors)} tensors: {mix}; "
            f"dialect {result.dialect}, arch {result.architecture})"
        )


def main() -> None:  # pragma: no cover - convenience for `python -m dflashkit.cli`
    convert_command()


if __name__ == "__main__":  # pragma: no cover
    main()
