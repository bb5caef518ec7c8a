"""dflash-quantize: a GGUF to a llama.cpp quant type, byte-identical to llama-quantize."""

from __future__ import annotations


import click

from ..filetypes import FILE_TYPE_ALIASES, NEEDS_IMATRIX, QUANTIZE_FILE_TYPES
from .common import PathParam, _echo_written, _resolve_format, _warnings, dflash_command, format_option, user_errors


def _type_list() -> str:
    """The TYPE values as the help lists them, from the file-type table (each quant type's module)."""
    names = [f"{n} (needs --imatrix)" if n in NEEDS_IMATRIX else n for n in QUANTIZE_FILE_TYPES]
    return (f"{', '.join(names[:-1])} or {names[-1]} (any case; {', '.join(sorted(FILE_TYPE_ALIASES))} are "
            "llama-quantize's aliases)")


HELP = f"""Quantize the GGUF SRC to OUT with llama-quantize's per-tensor rules.

TYPE: {_type_list()}, or the drafter-aware preset Q4_K_M_DRAFT: Q4_K_M with fc and the attention projections at Q8_0
(llama-quantize makes the same file with --tensor-type "^fc\\.weight$=q8_0" --tensor-type
"attn_(q|k|v|output)\\.weight=q8_0" ... Q4_K_M).
"""


@dflash_command(
    "dflash-quantize drafter-f16.gguf drafter-Q4_K_M.gguf Q4_K_M",
    "dflash-quantize drafter-f16.gguf drafter-draft.gguf q4_k_m_draft --format json > summary.json",
    help=HELP,
)
@click.argument("src")
@click.argument("out", type=PathParam(dir_okay=False, expect="the output file name"))
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
@click.option("--imatrix", "imatrix", metavar="FILE", help="Importance matrix (llama-imatrix's GGUF or legacy .dat; "
              "dflash-imatrix makes a drafter's), applied as llama-quantize --imatrix applies it.")
@click.option("--include-weights", "include_weights", multiple=True, metavar="NAME",
              help="Use the imatrix only for tensors whose name contains NAME (repeatable), as llama-quantize.")
@click.option("--exclude-weights", "exclude_weights", multiple=True, metavar="NAME",
              help="Do not use the imatrix for tensors whose name contains NAME (repeatable), as llama-quantize.")
@click.option("--force", is_flag=True, help="Overwrite OUT if it exists.")
@click.option("--quiet", "-q", is_flag=True, help="No progress bar, warnings or summary.")
@click.option("--allow-nonfinite", is_flag=True, help="Write tensors with NaN / inf values, or values the new type "
              "turns into ±inf, with a warning — llama-quantize refuses them, and so does dflash-quantize without this.")
@click.option("--strict", is_flag=True, help="Refuse NaN / inf values (exit 1, nothing written): the default, as "
              "llama-quantize; accepted for scripts that pass it.")
@format_option(("text", "json"), from_suffix=False)
@user_errors
def quantize_command(src: str, out: str, file_type: str, pure: bool, tensor_types: tuple[str, ...], no_fallback: bool,
                     allow_requantize: bool, imatrix: str | None, include_weights: tuple[str, ...],
                     exclude_weights: tuple[str, ...], force: bool, quiet: bool, allow_nonfinite: bool, strict: bool,
                     fmt: str | None, legacy_fmt: str | None) -> None:
    """Quantize the GGUF SRC to OUT with llama-quantize's per-tensor rules (the TYPE list: `HELP`)."""
    from ..quantize.gguf_file import quantize_gguf

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
        allow_nonfinite=allow_nonfinite,
        imatrix=imatrix, include_weights=include_weights, exclude_weights=exclude_weights,
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
