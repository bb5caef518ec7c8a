"""What every command shares: errors as one line and an exit code, the option decorators, report output."""

from __future__ import annotations

import atexit
import contextlib
import errno
import functools
import os
import sys
import traceback
import warnings
from pathlib import Path
from typing import Any, Callable, Iterator

import click

from ..bounds import MAX_LAYERS, escape_name
from ..errors import DFlashError, UsageError
from ..files.tempdirs import remove_stale
from ..files.signals import install_interrupt_handler
from .params import AsciiIntRange, FiniteFloat, LazyChoice, PathParam, ascii_float, ascii_int  # noqa: F401 (shared)
from .stdout import echo_written as _echo_written, emit as _emit  # noqa: F401 (the commands' report output)
from .stdout import guard_closed_stdout, guard_stderr, is_stdout_error, stdout_lost

MAX_PARITY_ROUNDS = 10_000  # each round keeps a block of logits for the report: 1e8 rounds asked for ~82 GB
_REPORT_SUFFIXES = {".html": "html", ".htm": "html", ".json": "json", ".md": "markdown", ".markdown": "markdown"}


def _fail(message: str, code: int) -> None:
    # One line, whatever a file put into a name or value: control characters escaped, length cut.
    click.echo(f"error: {escape_name(message, limit=2000)}", err=True)
    sys.exit(code)


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


#: warnings about a library's own API (transformers ≥ 5.24: "`past_key_values` is deprecated"): nothing a user can
#: act on, so not shown unless --debug
_API_WARNINGS = (FutureWarning, DeprecationWarning, PendingDeprecationWarning)


@contextlib.contextmanager
def library_warnings(debug: bool) -> Iterator[None]:
    """While a command runs, a Python warning from a library is one ``warning:`` line like ours (its category and
    message, escaped), never the interpreter's two-line form with a source line; an API deprecation none at all."""

    def show(message: Any, category: type[Warning], filename: str, lineno: int, file: Any = None,
             line: str | None = None) -> None:
        _warn(f"{category.__name__}: {message}")

    with warnings.catch_warnings():
        if not debug:
            warnings.showwarning = show
            for category in _API_WARNINGS:
                warnings.simplefilter("ignore", category)
        yield


def user_errors(func: Callable[..., Any]) -> Callable[..., Any]:
    """Turn library errors into one-line messages and exit codes (tracebacks only with --debug)."""

    @functools.wraps(func)
    def wrapper(*args: Any, debug: bool = False, **kwargs: Any) -> Any:
        remove_stale()  # temp folders of dflashkit processes that were killed outright (files.tempdirs)
        install_interrupt_handler()  # Ctrl-C never inside an import, where it can hang the process (files.signals)
        try:
            try:
                with library_warnings(debug):
                    return func(*args, **kwargs)
            finally:  # a write error on stdout surfaces here, as one line, not at interpreter exit
                if sys.stdout is not None:
                    sys.stdout.flush()
        except DFlashError as exc:
            if debug:
                traceback.print_exc()
            _fail(str(exc), exc.exit_code)
        except KeyboardInterrupt as exc:  # a command that did keep something says what (dflash-release)
            click.echo(f"interrupted: {exc}" if str(exc) else "interrupted (no output written)", err=True)
            _exit_interrupted()
        except MemoryError:
            _fail("out of memory", 1)
        except Exception as exc:  # an unexpected failure is still one line, unless --debug
            if debug:
                traceback.print_exc()
            if isinstance(exc, OSError) and exc.filename is not None:  # a path the system refuses (too long, …)
                _fail(f"{escape_name(str(exc.filename), limit=160)}: {exc.strerror or type(exc).__name__}", 1)
            if is_stdout_error(exc):  # stdout closed, a full device, a closed pipe: "output" is the -o report option
                _fail(stdout_lost(exc, report="output" in kwargs), 1)
            _fail(f"internal error: {type(exc).__name__}: {exc} (re-run with --debug for the traceback)", 1)

    return click.option("--debug", is_flag=True, help="Show tracebacks.")(wrapper)


def _expect_verdicts() -> list[str]:
    from ..inspect.provenance import VERDICTS

    return [v for v in VERDICTS if v != "unknown"]


def _layer_ids(value: str) -> list[int]:
    """``--target-layer-ids 1,9,17``: sorted, unique, non-negative integers."""

    try:
        ids = [ascii_int(v) for v in value.replace(" ", "").split(",") if v != ""]
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


#: how --help / --version (whose output is click's, not a report's) keep stdout out of the way
_REDIRECT = "redirect stdout to a file"


class DFlashCommand(click.Command):
    """A command that, run as a program (its console script: no ``args``, standalone), leaves the interpreter at
    once after its last output once numba is loaded: tearing down LLVM's loaded kernels takes ~0.35 s at exit —
    a tenth of quantizing a 27B-size drafter — and nothing of ours runs then (every output is published and
    closed before the command returns; numba writes its cache when it compiles). The ``atexit`` functions still
    run. Only where the program is a ``dflash-*`` script (``sys.argv[0]``), not with Ray loaded (its exit hooks
    stop its workers), and never for a caller that passes ``args`` (a test, a Python user)."""

    def main(self, args: Any = None, *rest: Any, standalone_mode: bool = True, **kw: Any) -> Any:
        guard_closed_stdout()  # started with stdout closed (>&-): what is printed fails as on a full device
        guard_stderr()  # a stderr that cannot take a progress line (2>/dev/full) does not end the run
        program = args is None and standalone_mode and os.path.basename(sys.argv[0]).startswith("dflash-")
        try:
            return super().main(args, *rest, standalone_mode=standalone_mode, **kw)
        except OSError as exc:  # click's own output (--help, --version); a command's is one line in user_errors
            if not standalone_mode or not is_stdout_error(exc):
                raise
            _fail(stdout_lost(exc, report=False, fix=_REDIRECT), 1)
        except SystemExit as exc:
            if standalone_mode and exc.code == 1 and type(sys.stdout).__name__.endswith("PacifyFlushWrapper"):
                # click's own EPIPE ending (--help / --version into a pipe whose reader is gone): said in one line
                lost = stdout_lost(BrokenPipeError(errno.EPIPE, "Broken pipe"), report=False, fix=_REDIRECT)
                click.echo(f"error: {lost}", err=True)
            if program and "numba" in sys.modules and "ray" not in sys.modules \
                    and isinstance(exc.code, (int, type(None))):
                atexit._run_exitfuncs()  # what registered itself for the exit still runs (0.001 s): not the teardown
                for stream in (sys.stdout, sys.stderr):
                    try:
                        stream.flush()
                    except (OSError, ValueError, AttributeError):  # a closed pipe, no stderr (2>&-): what could
                        pass  # be said was said
                os._exit(exc.code or 0)
            raise


def dflash_command(*examples: str, exit_codes: str = EXIT_CODES,
                   help: str | None = None) -> Callable[[Callable[..., Any]], click.Command]:
    """``click.command`` with -h, --version and an epilog: the examples, then the exit codes. ``help``: the text
    above the options when it is built from a table (else the function's docstring)."""
    epilog = "\b\nExamples:\n" + "\n".join(f"  {e}" for e in examples) + "\n\n" + exit_codes

    def decorate(func: Callable[..., Any]) -> click.Command:
        func = click.version_option(package_name="dflashkit", message="%(prog)s (dflashkit) %(version)s")(func)
        return click.command(cls=DFlashCommand, context_settings={"help_option_names": ["-h", "--help"]},
                             epilog=epilog, help=help)(func)

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
    return click.option("-o", "--output", metavar="FILE",
                        type=PathParam(dir_okay=False, allow_dash=True, expect="the report's file name"),
                        callback=_stdout_as_stream,
                        help="Write the report to FILE (atomically; --force to replace it) instead of stdout; - or "
                             "/dev/stdout: stdout.")(func)


def _warnings(quiet: bool) -> Callable[[str], None]:
    return (lambda m: None) if quiet else _warn


def _warn(message: str) -> None:
    click.echo(click.style("warning: ", fg="yellow", bold=True) + escape_name(message, limit=2000), err=True)


def _parse_fraction(value: str | None, option: str) -> float | None:
    """'0.99', '99%' or '99' (values above 1 are percentages) → 0.99."""

    if value is None:
        return None
    text = value.strip()
    try:
        number = ascii_float(text.rstrip("%"))
    except ValueError:
        raise UsageError(f"{option}: expected a fraction like 0.99 or a percentage like 99%, got {value!r}") from None
    if text.endswith("%") or number > 1:
        number /= 100
    if not 0 <= number <= 1:
        raise UsageError(f"{option}: must lie between 0 and 1 (or 0% and 100%), got {value!r}")
    return number



# --------------------------------------------------------------------------------------------
# The measuring options dflash-accept and dflash-release share: defined once, each group collapsed into one frozen
# value (`dflashkit.accept.options`) before the command's body runs. Put a group under @user_errors: its parsing
# errors are then one line like any other.
# --------------------------------------------------------------------------------------------


def _group(options: list[Callable[[Any], Any]], names: tuple[str, ...], key: str,
           build: Callable[..., Any]) -> Callable[[Any], Any]:
    def decorate(func: Any) -> Any:
        @functools.wraps(func)
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            kwargs[key] = build(**{n: kwargs.pop(n) for n in names})
            return func(*args, **kwargs)

        for option in reversed(options):
            wrapper = option(wrapper)
        return wrapper

    return decorate


def _prompt_options(prompts_file: str | None, max_prompts: int | None, max_new_tokens: int, seed: int,
                    reasoning: str | None, chat_template_kwargs: str | None) -> Any:
    from ..accept.options import PromptOptions

    kwargs: dict[str, Any] = {}
    if chat_template_kwargs is not None:  # (the prompts module loads the runtime: only when it is given)
        from ..accept.prompts import parse_template_kwargs

        kwargs = parse_template_kwargs(chat_template_kwargs) or {}
    return PromptOptions(prompts_file, max_prompts, max_new_tokens, seed, reasoning, kwargs)


def prompt_options(func: Any) -> Any:
    """--prompts, --max-prompts, --max-new-tokens, --seed, --reasoning, --chat-template-kwargs → ``prompt_options``
    (a `PromptOptions`)."""
    from ..accept.options import DEFAULT_MAX_NEW_TOKENS

    return _group([
        click.option("--prompts", "prompts_file", type=PathParam(dir_okay=False, expect="a JSONL file"),
                     metavar="FILE.jsonl", help='Prompts, one JSON per line: {"messages": [...]} (chat template), '
                     '{"prompt": "..."} or {"text": "..."} (raw). Default: the built-in chat / code / math / '
                     'long-context set.'),
        click.option("--max-prompts", type=AsciiIntRange(min=1), help="Use only the first N prompts."),
        click.option("--max-new-tokens", type=AsciiIntRange(min=2), default=DEFAULT_MAX_NEW_TOKENS,
                     show_default=True, help="New tokens per prompt."),
        click.option("--seed", type=AsciiIntRange(0, 2**63 - 1), default=0, show_default=True,
                     help="Seed of sampling and of the bootstrap CI."),
        click.option("--reasoning", metavar="off|on|LEVEL",
                     help="Thinking switch of the chat template, as z-lab's `dflash benchmark --reasoning`: on/off "
                     "set enable_thinking; a level (e.g. high) sets reasoning_strength or reasoning_effort."),
        click.option("--chat-template-kwargs", "chat_template_kwargs", metavar="JSON",
                     help='Extra chat-template variables as a JSON object, e.g. \'{"enable_thinking": false}\' '
                     "(merged over --reasoning)."),
    ], ("prompts_file", "max_prompts", "max_new_tokens", "seed", "reasoning", "chat_template_kwargs"),
        "prompt_options", _prompt_options)(func)


def _context_options(context: str | None, context_file: str | None) -> Any:
    from ..accept.options import ContextOptions
    from ..sweeps import parse_context_levels

    if context_file is not None and context is None:
        raise UsageError("--context-file is the source of --context: give --context N[,N…] too")
    return ContextOptions(parse_context_levels(context) if context is not None else (), context_file)


def context_options(func: Any) -> Any:
    """--context, --context-file → ``context`` (a `ContextOptions`): dflash-accept, dflash-parity, dflash-release."""
    return _group([
        click.option("--context", metavar="N[,N…]",
                     help="Measure each prompt after N tokens of long context, per level (token counts, 4k = 4096, "
                     "1M = 1048576, at most 1M; e.g. 0,1k,4k): τ, speed-up and parity by context length, and where "
                     "they fall."),
        click.option("--context-file", type=PathParam(dir_okay=False, expect="a UTF-8 text file"), metavar="FILE.txt",
                     help="The long context: UTF-8 text of the target's domain (default: the other prompts)."),
    ], ("context", "context_file"), "context", _context_options)(func)


def parse_list(value: str | None, option: str, convert: Callable[[str], Any]) -> list[Any]:
    """``4,8,15`` → [4, 8, 15]: non-empty, unique, each checked by ``convert`` (a usage error names the value)."""
    if value is None:
        return [None]
    items = [v.strip() for v in value.split(",")]
    if not items or any(not v for v in items):
        raise UsageError(f"{option} {value!r}: give values separated by commas (e.g. {option} 4,8,15)")
    out = []
    for v in items:
        try:
            x = convert(v)
        except (ValueError, UsageError) as exc:
            raise UsageError(f"{option} {value!r}: {v!r} {exc}") from None
        if x in out:
            raise UsageError(f"{option} {value!r}: {v!r} is given twice")
        out.append(x)
    return out


def _llama_cpp_options(llama_cpp: str | None, llama_server: tuple[str, ...], target_gguf: tuple[str, ...],
                       llama_cpp_src: str | None, draft_n_max: str | None, draft_cache_type: str | None,
                       llama_cpp_args: tuple[str, ...], llama_cpp_timeout: float, threads: int,
                       parallel: str | None) -> Any:
    from ..accept.options import LlamaCppOptions
    from ..sweeps import parse_parallel_levels
    from ..llama_cpp.process import check_extra_args

    n_max: list[Any] = []
    caches: list[Any] = []
    if draft_n_max is not None or draft_cache_type is not None:  # (the serving module only when they are given)
        from ..accept.serving_measure import cache_type_value, draft_n_max_value

        def n_max_value(text: str) -> int:
            ascii_int(text)  # (a ValueError says why)
            return draft_n_max_value(text)

        n_max = parse_list(draft_n_max, "--draft-n-max", n_max_value) if draft_n_max is not None else []
        caches = parse_list(draft_cache_type, "--draft-cache-type", cache_type_value) if draft_cache_type else []
    levels = parse_parallel_levels(parallel) if parallel is not None else ()  # checked with the servers (plan_serving)
    return LlamaCppOptions(llama_cpp, tuple(llama_server), tuple(target_gguf), llama_cpp_src, tuple(n_max),
                           tuple(caches), tuple(check_extra_args(llama_cpp_args)), llama_cpp_timeout, threads, levels)


def llama_cpp_options(func: Any) -> Any:
    """--llama-cpp, --llama-server, --target-gguf, --llama-cpp-src, --draft-n-max, --draft-cache-type,
    --llama-cpp-arg, --llama-cpp-timeout, --threads → ``llama`` (a `LlamaCppOptions`)."""
    from ..accept.options import DEFAULT_LLAMA_CPP_TIMEOUT_S

    return _group([
        click.option("--llama-cpp", "llama_cpp", type=PathParam(file_okay=False, expect="llama.cpp's bin folder"),
                     metavar="BIN_DIR", help="Also run every drafter in llama.cpp (BIN_DIR/llama-speculative-simple) "
                     "on the same prompts, greedy: τ llama.cpp beside this runtime's τ."),
        click.option("--llama-server", "llama_server", type=PathParam(file_okay=False, expect="llama.cpp's bin folder"),
                     metavar="BIN_DIR", multiple=True, help="Measure every drafter where users run it: "
                     "BIN_DIR/llama-server with and without the drafter on the same prompts (started on 127.0.0.1, "
                     "stopped when done): τ, speed-up with a paired CI, identical output, a verdict. dflash-release "
                     "takes it repeated (builds side by side)."),
        click.option("--target-gguf", type=PathParam(dir_okay=False, expect="a GGUF file"), metavar="FILE",
                     multiple=True, help="The target as a GGUF for --llama-cpp / --llama-server (default: --target "
                     "converted by llama.cpp's own converter from --llama-cpp-src). Repeat it to sweep quantized "
                     "targets through --llama-server (--llama-cpp uses the first)."),
        click.option("--llama-cpp-src", type=PathParam(file_okay=False, expect="llama.cpp's source folder"),
                     metavar="DIR", help="llama.cpp's source tree (convert_hf_to_gguf.py), to make the target GGUF."),
        click.option("--draft-n-max", metavar="N[,N...]",
                     help="With --llama-server: --spec-draft-n-max values to sweep, e.g. 4,8,15 (default: block "
                     "size − 1)."),
        click.option("--draft-cache-type", metavar="TYPE[,TYPE...]",
                     help="With --llama-server: draft KV cache types to sweep (-ctkd / -ctvd), e.g. f16,q8_0 "
                     "(default: the server's)."),
        click.option("--llama-cpp-arg", "llama_cpp_args", metavar="ARG", multiple=True,
                     help="An extra argument for every llama.cpp process (repeatable), e.g. "
                     "--llama-cpp-arg=--no-repack. What dflashkit sets itself (-m, -md, --port, ...) is refused."),
        click.option("--llama-cpp-timeout", type=FiniteFloat(min=0.0, min_open=True, max=604800.0),
                     default=DEFAULT_LLAMA_CPP_TIMEOUT_S, show_default=True, metavar="SECONDS",
                     help="The longest one llama.cpp run, server start or request may take."),
        click.option("--threads", type=AsciiIntRange(1, 512), default=1, show_default=True,
                     help="llama.cpp threads (-t, target and drafter). ggml's threads spin while they wait: more "
                     "threads than idle cores makes a run many times slower."),
        click.option("--parallel", metavar="N[,N…]",
                     help="With --llama-server: per level, -np N and N concurrent requests — identical output per "
                     "request, τ per slot, aggregate tok/s with and without the drafter and the speed-up, e.g. 1,2,4."),
    ], ("llama_cpp", "llama_server", "target_gguf", "llama_cpp_src", "draft_n_max", "draft_cache_type",
        "llama_cpp_args", "llama_cpp_timeout", "threads", "parallel"), "llama", _llama_cpp_options)(func)
