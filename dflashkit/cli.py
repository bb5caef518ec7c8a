"""Command-line entry points. Thin: parse, call the library, print.

Errors: one line on stderr, exit 1 for bad input and 2 for usage; ``--debug`` shows the traceback.
"""

from __future__ import annotations

import errno
import functools
import math
import os
import sys
import traceback
from pathlib import Path
from typing import Any, Callable

import click

from .bounds import MAX_LAYERS, U32_MAX, dumps, escape_name
from .dialects import DEFAULT_DIALECT, DIALECTS
from .errors import DFlashError, UsageError
from .files import check_output, write_text_atomic
from .filetypes import OUTTYPE_CHOICES

MAX_PARITY_ROUNDS = 10_000  # each round keeps a block of logits for the report: 1e8 rounds asked for ~82 GB
_REPORT_SUFFIXES = {".html": "html", ".htm": "html", ".json": "json", ".md": "markdown", ".markdown": "markdown"}


def _fail(message: str, code: int) -> None:
    # One line, whatever a file put into a name or value: control characters escaped, length cut.
    click.echo(f"error: {escape_name(message, limit=2000)}", err=True)
    sys.exit(code)


_STDOUT_ERRNOS = (errno.ENOSPC, errno.EIO, errno.EBADF, errno.EPIPE)


def _silence_stdout() -> None:
    """Point stdout at /dev/null: the interpreter's own flush at exit must not fail a second time."""
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        os.close(devnull)
    except (OSError, AttributeError, ValueError):
        pass


def _exit_interrupted() -> None:
    """Exit 130 after Ctrl-C. Outputs are already unwound (temp files removed) when this runs. A program ends here
    without the interpreter's finalisation: its garbage collection walks every torch / transformers object, 1.2 s
    of a 1.4 s stop on a 2-core box. Called in-process (click's test runner, a Python caller), it raises SystemExit
    as usual."""
    if sys.stdout is sys.__stdout__ and sys.stderr is sys.__stderr__:
        for stream in (sys.stdout, sys.stderr):
            try:
                stream.flush()
            except (OSError, ValueError, AttributeError):
                pass
        os._exit(130)
    sys.exit(130)


def user_errors(func: Callable[..., Any]) -> Callable[..., Any]:
    """Turn library errors into one-line messages and exit codes (tracebacks only with --debug)."""

    @functools.wraps(func)
    def wrapper(*args: Any, debug: bool = False, **kwargs: Any) -> Any:
        try:
            try:
                return func(*args, **kwargs)
            finally:  # a write error on stdout surfaces here, as one line, not at interpreter exit
                if sys.stdout is not None:
                    sys.stdout.flush()
        except BrokenPipeError:
            _silence_stdout()
            _fail("stdout was closed before the output was written (broken pipe); write it with -o FILE", 1)
        except DFlashError as exc:
            if debug:
                traceback.print_exc()
            _fail(str(exc), exc.exit_code)
        except KeyboardInterrupt:
            click.echo("interrupted (no output written)", err=True)
            _exit_interrupted()
        except MemoryError:
            _fail("out of memory", 1)
        except Exception as exc:  # an unexpected failure is still one line, unless --debug
            if debug:
                traceback.print_exc()
            if isinstance(exc, OSError) and exc.errno in _STDOUT_ERRNOS:  # stdout on a full disk, a closed fd
                _silence_stdout()
                _fail(f"cannot write the output ({exc.strerror or exc}): is stdout a full device or closed? "
                      "write it with -o FILE", 1)
            _fail(f"internal error: {type(exc).__name__}: {exc} (re-run with --debug for the traceback)", 1)

    return click.option("--debug", is_flag=True, help="Show tracebacks.")(wrapper)


class FiniteFloat(click.FloatRange):
    """A float option that refuses ``nan`` and ``inf`` (click's FloatRange compares, and NaN passes any comparison)."""

    def convert(self, value: Any, param: Any, ctx: Any) -> Any:
        number = super().convert(value, param, ctx)
        if not math.isfinite(number):
            self.fail(f"{value!r} is not a finite number.", param, ctx)
        return number


class LazyChoice(click.Choice):
    """A click.Choice whose choices are read from a table on first use. The report formats and the
    provenance verdicts live in modules (the report model, the inspect checks) that the quantize and
    convert commands never load; importing them at start-up would cost every command ~40 ms."""

    def __init__(self, load: Callable[[], Any], case_sensitive: bool = True) -> None:  # noqa: D107
        self._load = load
        self._choices: tuple[str, ...] | None = None
        self.case_sensitive = case_sensitive

    @property  # type: ignore[override]
    def choices(self) -> tuple[str, ...]:
        if self._choices is None:
            self._choices = tuple(self._load())
        return self._choices


def _expect_verdicts() -> list[str]:
    from .inspect.provenance import VERDICTS

    return [v for v in VERDICTS if v != "unknown"]


def _layer_ids(value: str) -> list[int]:
    """``--target-layer-ids 1,9,17``: sorted, unique, non-negative integers."""

    try:
        ids = [int(v) for v in value.replace(" ", "").split(",") if v != ""]
    except ValueError:
        raise UsageError(f"--target-layer-ids: expected integers separated by commas (e.g. 1,9,17,25,33), got {value!r}") from None
    if not ids or any(i < 0 or i >= MAX_LAYERS for i in ids) or ids != sorted(set(ids)):
        raise UsageError(f"--target-layer-ids: give sorted, unique, non-negative layer ids (e.g. 1,9,17,25,33), got {value!r}")
    return ids


# --------------------------------------------------------------------------------------------
# The grammar every command shares: -h/--help, --version, --debug, -q/--quiet, --force, --format, -o/--output,
# and an epilog with two examples and the exit codes. Old spellings (--json, --markdown) stay as hidden aliases.
# --------------------------------------------------------------------------------------------

EXIT_CODES = ("Exit codes: 0 success; 1 bad input, or a check / gate failed; 2 usage error; 130 interrupted "
              "(Ctrl-C: nothing is left behind).")
REPORT_FORMATS = ("text", "json", "markdown", "html")


def dflash_command(*examples: str, exit_codes: str = EXIT_CODES) -> Callable[[Callable[..., Any]], click.Command]:
    """``click.command`` with -h, --version and an epilog: the examples, then the exit codes."""
    epilog = "\b\nExamples:\n" + "\n".join(f"  {e}" for e in examples) + "\n\n" + exit_codes

    def decorate(func: Callable[..., Any]) -> click.Command:
        func = click.version_option(package_name="dflashkit", message="%(prog)s (dflashkit) %(version)s")(func)
        return click.command(context_settings={"help_option_names": ["-h", "--help"]}, epilog=epilog)(func)

    return decorate


def format_option(formats: tuple[str, ...] = REPORT_FORMATS, *, from_suffix: bool = True) -> Callable[[Any], Any]:
    """``--format`` (case-insensitive) and the hidden old spellings ``--json`` / ``--markdown``."""
    default = "Default: from the -o suffix (.html/.json/.md), else text." if from_suffix else "Default: text."

    def decorate(func: Any) -> Any:
        func = click.option("--format", "fmt", type=click.Choice(formats, case_sensitive=False),
                            help=f"Output format: {' | '.join(formats)}. {default}")(func)
        for flag in ("json", "markdown"):
            if flag in formats:
                func = click.option(f"--{flag}", "legacy_fmt", flag_value=flag, hidden=True,
                                    help=f"Same as --format {flag} (old spelling).")(func)
        return func

    return decorate


def _resolve_format(fmt: str | None, legacy: str | None, output: str | None = None) -> str:
    """--format, else an old --json/--markdown, else the -o suffix, else text; two that disagree are a usage error."""


    fmt = fmt.lower() if fmt else None
    if fmt and legacy and fmt != legacy:
        raise UsageError(f"--{legacy} and --format {fmt} contradict each other; pass one of them")
    chosen = fmt or legacy
    if chosen:
        return chosen
    return _REPORT_SUFFIXES.get(Path(output).suffix.lower(), "text") if output else "text"


#: -o values that mean the standard output: the report is written there as a stream, not as a file
STDOUT_NAMES = ("-", "/dev/stdout")


def _stdout_as_stream(ctx: click.Context, param: click.Parameter, value: str | None) -> str | None:
    return None if value in STDOUT_NAMES else value


def values_strict_option(func: Any) -> Any:
    """convert / quantize: --strict refuses the values a conversion cannot carry over (`codecs.values`)."""
    return click.option("--strict", is_flag=True, help="Refuse (exit 1, nothing written) a tensor with NaN / inf "
                        "values, or values beyond ±65504 for F16.")(func)


def output_option(func: Any) -> Any:
    return click.option("-o", "--output", type=click.Path(dir_okay=False, allow_dash=True), metavar="FILE",
                        callback=_stdout_as_stream,
                        help="Write the report to FILE (atomically; --force to replace it) instead of stdout; - or "
                             "/dev/stdout: stdout.")(func)


def _emit(text: str, output: str | None, force: bool, quiet: bool, status: str, prog: str) -> None:
    """The report on stdout, or into -o FILE with a 'wrote' line (unless -q)."""
    if output is None:
        if sys.stdout is None:  # started with stdout closed (>&-): the report would vanish
            from .errors import DFlashError as _Error

            raise _Error("stdout is closed: the report has nowhere to go; write it with -o FILE")
        click.echo(text, nl=not text.endswith("\n"))
        return

    write_text_atomic(output, text, force=force)
    if not quiet:
        click.echo(f"{prog}: wrote {output} — {status}", err=True)


def _echo_written(result: Any, as_json: bool, quiet: bool, line: Callable[[dict[str, Any]], str]) -> None:
    """A file-writing command's result: its JSON, or one line built from it (nothing with -q). OUT is complete
    before this prints: when stdout cannot take the summary (a full device, a closed pipe), OUT is kept and the
    error says so."""
    summary = result.to_json()
    text = dumps(summary, indent=2) if as_json else None if quiet else line(summary)
    if text is None:
        return
    try:
        click.echo(text)
        sys.stdout.flush()
    except OSError as exc:
        if exc.errno not in _STDOUT_ERRNOS:
            raise
        _silence_stdout()
        raise DFlashError(f"{result.out} is written and complete (kept), but its summary could not be printed "
                          f"({exc.strerror or exc}): stdout is a full device or closed — redirect it, or use -q") from None


def _warnings(quiet: bool) -> Callable[[str], None]:
    return (lambda m: None) if quiet else _warn


def _warn(message: str) -> None:
    click.echo(click.style("warning: ", fg="yellow", bold=True) + escape_name(message, limit=2000), err=True)


@dflash_command(
    "dflash-convert fixtures/trained/drafter drafter.gguf --target fixtures/trained/target",
    "dflash-convert z-lab/Qwen3-8B-DFlash-b16 drafter-Q4_K_M.gguf --outtype q4_k_m --target Qwen3-8B.gguf --format json",
)
@click.argument("src")
@click.argument("out", type=click.Path(dir_okay=False))
@click.option(
    "--outtype",
    type=click.Choice(list(OUTTYPE_CHOICES), case_sensitive=False),
    default="auto",
    show_default=True,
    help="Type of the weight matrices (norms and 1-D tensors stay F32). auto = the checkpoint's 16-bit type; "
    "K-quants follow llama-quantize's per-tensor policy. A GGUF SRC is translated with its tensors untouched.",
)
@click.option("--target", help="Target model (GGUF file or HF dir): tokenizer source and compatibility check.")
@click.option(
    "--dialect",
    type=click.Choice(list(DIALECTS)),
    default=DEFAULT_DIALECT.name,
    show_default=True,
    help="GGUF dialect to write.",
)
@click.option("--num-target-layers", type=click.IntRange(min=1, max=MAX_LAYERS), help="Layer count of the target model, when neither the source nor --target gives it.")
@click.option("--mask-token-id", type=click.IntRange(min=0, max=U32_MAX), help="Mask token id, when the source does not carry it.")
@click.option(
    "--target-layer-ids",
    metavar="IDS",
    help="Target layers the drafter taps, as HF decoder-layer ids (e.g. 1,9,17,25,33), for a config without "
    "target_layer_ids: take them from the drafter's model card or training config.",
)
@click.option("--source-repo", metavar="OWNER/NAME", help="Hub repo a local checkpoint was downloaded from (general.source.repo_url).")
@click.option("--source-revision", metavar="REV", help="Its revision (commit or tag; general.source.url); for a repo-id SRC, the revision to fetch.")
@click.option(
    "--taps-are-raw",
    is_flag=True,
    help="GGUF SRC only: its dflash.target_layers are raw HF ids (a file carrying dflash.n_target_features); store them + 1.",
)
@click.option(
    "--embedding-scale", type=FiniteFloat(min=0.0, min_open=True), metavar="X",
    help="Write dflash.embedding_scale = X (the drafter's noise-embedding multiplier) whatever the config and target "
    "say. Default: the config's input_embedding_scale; for a Gemma target without one, √hidden_size as mainline "
    "llama.cpp writes it (a warning says so; --embedding-scale 1 keeps embeddings unscaled).",
)
@click.option("--force", is_flag=True, help="Overwrite OUT if it exists.")
@click.option("--quiet", "-q", is_flag=True, help="No progress bar or warnings.")
@values_strict_option
@format_option(("text", "json"), from_suffix=False)
@user_errors
def convert_command(
    src: str,
    out: str,
    outtype: str,
    target: str | None,
    dialect: str,
    num_target_layers: int | None,
    mask_token_id: int | None,
    taps_are_raw: bool,
    target_layer_ids: str | None,
    source_repo: str | None,
    source_revision: str | None,
    embedding_scale: float | None,
    force: bool,
    quiet: bool,
    strict: bool,
    fmt: str | None,
    legacy_fmt: str | None,
) -> None:
    """Convert a DFlash drafter SRC (HF dir, hub repo id, or a drafter GGUF of any dialect) to a GGUF file OUT."""
    from .converters.convert import convert

    as_json = _resolve_format(fmt, legacy_fmt) == "json"

    result = convert(
        src, out, outtype=outtype.lower(), target=target, dialect=dialect, num_target_layers=num_target_layers,
        mask_token_id=mask_token_id, taps_are_raw=taps_are_raw,
        target_layer_ids=_layer_ids(target_layer_ids) if target_layer_ids is not None else None,
        source_repo=source_repo, source_revision=source_revision, force=force, progress=not quiet, warn=_warnings(quiet),
        strict=strict, embedding_scale=embedding_scale,
    )
    _echo_written(result, as_json, quiet, lambda summary: (
        f"wrote {result.out} ({result.bytes_written / 1e6:.1f} MB, {len(result.tensors)} tensors: "
        f"{', '.join(f'{n} {t}' for t, n in sorted(summary['tensor_types'].items()))}; "
        f"dialect {result.dialect}, arch {result.architecture})"
        + (f"; {n} tensor(s) fell back to another type (rows too short for the requested type's blocks: see the "
           "warnings)" if (n := sum(1 for t in result.tensors if t.note)) else "")
    ))


@dflash_command(
    "dflash-quantize drafter-f16.gguf drafter-Q4_K_M.gguf Q4_K_M",
    "dflash-quantize drafter-f16.gguf drafter-draft.gguf q4_k_m_draft --format json > summary.json",
)
@click.argument("src")
@click.argument("out", type=click.Path(dir_okay=False))
@click.argument("file_type", metavar="TYPE")
@click.option("--pure", is_flag=True, help="One type for every quantizable tensor (no Q4_K_M/Q5_K_M mix), like llama-quantize --pure.")
@click.option(
    "--tensor-type",
    "tensor_types",
    multiple=True,
    metavar="REGEX=TYPE",
    help="Type for tensors whose name matches REGEX (searched, lower-cased as llama-quantize does; first match wins; repeatable), e.g. attn_v=q8_0.",
)
@click.option("--no-fallback", is_flag=True, help="Fail (exit 1) instead of falling back when a row length does not fit the type's block.")
@click.option("--allow-requantize", is_flag=True, help="Dequantize already-quantized input tensors first (quality loss).")
@click.option("--force", is_flag=True, help="Overwrite OUT if it exists.")
@click.option("--quiet", "-q", is_flag=True, help="No progress bar, warnings or summary.")
@values_strict_option
@format_option(("text", "json"), from_suffix=False)
@user_errors
def quantize_command(src: str, out: str, file_type: str, pure: bool, tensor_types: tuple[str, ...], no_fallback: bool,
                     allow_requantize: bool, force: bool, quiet: bool, strict: bool, fmt: str | None,
                     legacy_fmt: str | None) -> None:
    """Quantize the GGUF SRC to OUT with llama-quantize's per-tensor rules.

    TYPE: Q8_0, Q6_K, Q5_K_M, Q5_K_S, Q4_K_M, Q4_K_S, F16 or BF16 (any case), or the drafter-aware preset
    Q4_K_M_DRAFT: Q4_K_M with fc and the attention projections at Q8_0 (llama-quantize makes the same file with
    --tensor-type "^fc\\.weight$=q8_0" --tensor-type "attn_(q|k|v|output)\\.weight=q8_0" ... Q4_K_M).
    """
    from .quantize.gguf_file import quantize_gguf

    as_json = _resolve_format(fmt, legacy_fmt) == "json"
    result = quantize_gguf(
        src,
        out,
        file_type,
        pure=pure,
        overrides=tensor_types,
        allow_fallback=not no_fallback,
        allow_requantize=allow_requantize,
        force=force, progress=not quiet, warn=_warnings(quiet), strict=strict,
    )
    _echo_written(result, as_json, quiet, lambda summary: (
        f"wrote {result.out} ({result.bytes_written / 1e6:.2f} MB, {summary['tensor_count']} tensors: "
        f"{', '.join(f'{n} {t}' for t, n in summary['tensor_types'].items())}; {result.file_type.name}, "
        f"{summary['totals']['bits_per_weight']} bits/weight, arch {result.architecture})"
    ))
    if not as_json and not quiet:
        if result.fallbacks:
            click.echo(f"{len(result.fallbacks)} tensor(s) fell back to another type (as llama-quantize does):")
            for c in result.fallbacks:
                click.echo(f"  {c.name}: {c.fallback}")


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
    from .diff import diff_drafters

    fmt = _resolve_format(fmt, legacy_fmt, output)
    if output is not None:
        check_output(output, inputs=[a, b], force=force)  # now, not after a long diff; never an input file
    result = diff_drafters(a, b, progress=not quiet)
    report = result.report(threshold=threshold, allow_missing=allow_missing)
    text = report.render(fmt)
    code = result.exit_code(threshold, allow_missing)
    if output is not None:
        write_text_atomic(output, text, force=force)
        if not quiet:
            click.echo(f"wrote {output} — {report.status}")
    else:
        click.echo(text, nl=False)
        if fmt != "text" and code and not quiet:
            click.echo(f"dflash-diff: {report.status}", err=True)
    sys.exit(code)


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
    from .inspect import inspect_paths

    fmt = _resolve_format(fmt, legacy_fmt, output)
    if output is not None:
        check_output(output, inputs=[*paths, target], force=force)
    report = inspect_paths(list(paths), strict=strict, target=target, expect=expect)
    _emit(report.render(fmt), output, force, quiet, report.status(), "dflash-inspect")
    sys.exit(report.exit_code())


def _parse_fraction(value: str | None, option: str) -> float | None:
    """'0.99', '99%' or '99' (values above 1 are percentages) → 0.99."""

    if value is None:
        return None
    text = value.strip()
    try:
        number = float(text.rstrip("%"))
    except ValueError:
        raise UsageError(f"{option}: expected a fraction like 0.99 or a percentage like 99%, got {value!r}") from None
    if text.endswith("%") or number > 1:
        number /= 100
    if not 0 <= number <= 1:
        raise UsageError(f"{option}: must lie between 0 and 1 (or 0% and 100%), got {value!r}")
    return number


def _parse_ids(value: str | None) -> list[int] | None:

    if value is None:
        return None
    parts = [p for p in value.replace(",", " ").replace("[", " ").replace("]", " ").split() if p]
    try:
        ids = [int(p) for p in parts]
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
@click.option("--rounds", type=click.IntRange(1, MAX_PARITY_ROUNDS), default=1, show_default=True,
              help="Draft rounds, each from the cache of the previous ones (cropped as dflash_generate does).")
@click.option("--device", type=click.Choice(["cpu", "cuda", "mps"], case_sensitive=False), default="cpu", show_default=True)
@click.option("--dtype", type=click.Choice(["float32", "bfloat16", "float16"], case_sensitive=False), default="float32", show_default=True)
@click.option("--seed", type=click.IntRange(0, 2**63 - 1), default=0, show_default=True,
              help="Seed of the random hidden states / embeddings.")
@click.option("--threshold-top1", metavar="FRAC",
              help="Exit 1 when overall top-1 agreement is below FRAC (0.99 or 99%).")
@click.option("--threshold-kl", type=FiniteFloat(min=0.0), metavar="NATS",
              help="Exit 1 when the mean KL(ref‖cand) exceeds NATS.")
@click.option("--dump", type=click.Path(dir_okay=False), metavar="FILE.npz",
              help="Write the first round's exact inputs and both sides' outputs (format: docs/formats.md).")
@click.option("--force", is_flag=True, help="Overwrite the --dump / -o files if they exist.")
@format_option()
@output_option
@click.option("--keep-quantized", is_flag=True,
              help="Keep quantized weights quantized (fused dflashkit.kernels matmuls) instead of dequantizing.")
@click.option("--skip-weights", is_flag=True, help="Skip the per-tensor weight diff (faster on big files).")
@click.option("--quiet", "-q", is_flag=True, help="No 'wrote' line for -o (a failure's reason still goes to stderr).")
@user_errors
def parity_command(
    reference: str, candidate: str, target: str | None, prompt: str | None, prompt_ids: str | None, rounds: int,
    device: str, dtype: str, seed: int, threshold_top1: str | None, threshold_kl: float | None, dump: str | None,
    force: bool, fmt: str | None, legacy_fmt: str | None, output: str | None, keep_quantized: bool,
    skip_weights: bool, quiet: bool,
) -> None:
    """Does CANDIDATE still draft what REFERENCE drafts? Run both drafters (HF dirs or GGUFs) on the same
    inputs and compare weights, logits per block position and accepted-prefix length.

    Exit 0 when the thresholds hold (or none is given), 1 when one is missed or an input is bad, 2 for usage.
    """

    from .parity import run_parity

    top1 = _parse_fraction(threshold_top1, "--threshold-top1")
    fmt = _resolve_format(fmt, legacy_fmt, output)
    if output is not None:
        if dump is not None and Path(dump).absolute() == Path(output).absolute():
            raise UsageError("--dump and -o name the same file")
        check_output(output, inputs=[reference, candidate, target], force=force, label="-o")
    if (top1 is not None or threshold_kl is not None) and target is None:
        raise UsageError("--threshold-top1 / --threshold-kl gate on logits, which need a target head — pass --target")
    result = run_parity(
        reference, candidate, target=target, prompt=prompt, prompt_ids=_parse_ids(prompt_ids), rounds=rounds,
        device=device, dtype=dtype, seed=seed, dump=dump, keep_quantized=keep_quantized, weights=not skip_weights,
        force=force,
    )
    report = result.report(threshold_top1=top1, threshold_kl=threshold_kl)
    _emit(report.render(fmt), output, force, quiet, report.status, "dflash-parity")
    code = result.exit_code(top1, threshold_kl)
    if fmt != "text" and code and output is None:  # the reason for exit 1, -q or not
        click.echo(f"dflash-parity: {report.status}", err=True)
    sys.exit(code)


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

    from .accept import parse_template_kwargs, require_matplotlib, run_acceptance, write_png
    from .prompts import builtin_prompts_path
    from .serving import cache_type_value, draft_n_max_value, parse_list

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
