"""dflash-convert: an HF drafter (or a drafter GGUF) to GGUF."""

from __future__ import annotations


import click

from ..bounds import MAX_LAYERS, U32_MAX
from ..dialects import DEFAULT_DIALECT, DIALECTS
from ..filetypes import OUTTYPE_CHOICES
from .common import AsciiIntRange, FiniteFloat, PathParam, _echo_written, _layer_ids, _resolve_format, _warnings, dflash_command, format_option, user_errors, values_strict_option


@dflash_command(
    "dflash-convert fixtures/trained/drafter drafter.gguf --target fixtures/trained/target",
    "dflash-convert z-lab/Qwen3-8B-DFlash-b16 drafter-Q4_K_M.gguf --outtype q4_k_m --target Qwen3-8B.gguf --format json",
)
@click.argument("src")
@click.argument("out", type=PathParam(dir_okay=False, expect="the output file name"))
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
@click.option("--num-target-layers", type=AsciiIntRange(min=1, max=MAX_LAYERS), help="Layer count of the target model, when neither the source nor --target gives it.")
@click.option("--mask-token-id", type=AsciiIntRange(min=0, max=U32_MAX), help="Mask token id, when the source does not carry it.")
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
@click.option(
    "--llama-cpp-causal", type=click.Choice(["true", "false"], case_sensitive=False),
    help="Write llama.cpp's one causal flag (dflash.attention.causal) as given, for a checkpoint whose reference runs "
    "some layers causal and others not (sliding layers without is_causal), which one flag cannot say. Default: as "
    "llama.cpp's converter — absent, so every layer bidirectional; a warning names the layers that change, and "
    "--strict refuses such a file.",
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
    llama_cpp_causal: str | None,
    force: bool,
    quiet: bool,
    strict: bool,
    fmt: str | None,
    legacy_fmt: str | None,
) -> None:
    """Convert a DFlash drafter SRC (HF dir, hub repo id, or a drafter GGUF of any dialect) to a GGUF file OUT."""
    from ..converters.convert import convert

    as_json = _resolve_format(fmt, legacy_fmt) == "json"

    result = convert(
        src, out, outtype=outtype.lower(), target=target, dialect=dialect, num_target_layers=num_target_layers,
        mask_token_id=mask_token_id, taps_are_raw=taps_are_raw,
        target_layer_ids=_layer_ids(target_layer_ids) if target_layer_ids is not None else None,
        source_repo=source_repo, source_revision=source_revision, force=force, progress=not quiet, warn=_warnings(quiet),
        strict=strict, embedding_scale=embedding_scale,
        llama_cpp_causal=None if llama_cpp_causal is None else llama_cpp_causal.lower() == "true",
    )
    _echo_written(result, as_json, quiet, lambda summary: (
        f"wrote {result.out} ({result.bytes_written / 1e6:.1f} MB, {len(result.tensors)} tensors: "
        f"{', '.join(f'{n} {t}' for t, n in sorted(summary['tensor_types'].items()))}; "
        f"dialect {result.dialect}, arch {result.architecture})"
        + (f"; {n} tensor(s) fell back to another type (rows too short for the requested type's blocks: see the "
           "warnings)" if (n := sum(1 for t in result.tensors if t.note)) else "")
    ))
