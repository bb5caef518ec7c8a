"""``dflash-release``: the command line of `dflashkit.release` (parse, call, print)."""

from __future__ import annotations

import click

from ..bounds import escape_name
from ..errors import UsageError
from ..release.runners import DEFAULT_RAY_TIMEOUT_S
from ..accept.options import ContextOptions, LlamaCppOptions, PromptOptions
from .common import (AsciiIntRange, FiniteFloat, _parse_fraction, context_options, dflash_command, llama_cpp_options,
                     prompt_options, user_errors)
from .stdout import print_summary


@dflash_command(
    "dflash-release z-lab/Qwen3-8B-DFlash-b16 out/ --target Qwen/Qwen3-8B",
    "dflash-release ./my-drafter out/ --target ./Qwen3-8B --types bf16,q8_0,q4_k_m_draft --ray",
    "dflash-release ./my-drafter out/ --target ./Qwen3-8B --naming target --llama-server ~/llama.cpp/build/bin \\",
    "    --target-gguf Qwen3-8B-Q4_K_M.gguf --draft-n-max 4,8,15",
    "dflash-release --check out/",
)
@click.argument("paths", nargs=-1, metavar="SRC OUTDIR")
@click.option("--target", "target", metavar="DIR", help="The target model (HF folder): inspect, parity and τ run "
              "against it.")
@click.option("--types", default="bf16,q8_0,q6_k,q5_k_m,q4_k_m,q4_k_m_draft", show_default=True,
              help="Quant types, comma-separated: any dflash-quantize TYPE (q4_0, iq4_xs, q3_k_m, q2_k, …; q2_k_s "
              "needs --imatrix) and the Q4_K_M_DRAFT preset.")
@click.option("--imatrix", "imatrix", metavar="FILE", help="Importance matrix every quantized type is made with "
              "(dflash-imatrix makes a drafter's; recorded in the card).")
@click.option("--parity-rounds", type=AsciiIntRange(min=1, max=1000), default=4, show_default=True,
              help="Draft rounds compared with the checkpoint per type.")
@click.option("--min-top1", default="75%", show_default=True, metavar="FRAC",
              help="Parity gate: top-1 agreement with the checkpoint.")
@click.option("--min-tau", type=FiniteFloat(min=0), metavar="TAU", help="τ gate, per type.")
@click.option("--allow-failures", is_flag=True, help="Write the card even when a gate fails, with that row marked.")
@click.option("--naming", type=click.Choice(["source", "target"]), default="source", show_default=True,
              help="File names: source — <drafter>-<TYPE>.gguf; target — dflash-<target>-<TYPE>.gguf, as "
              "ggml-org/convert names a drafter beside its target (Unsloth Studio finds it by that name).")
@click.option("--target-name", metavar="NAME", help="The <target> of --naming target (default: the target's hub id "
              "or folder name, its last part).")
@click.option("--source-repo", metavar="ID", help="The hub repo a local SRC came from (the card's base_model).")
@click.option("--source-revision", metavar="REV", help="Its revision.")
@click.option("--target-repo", metavar="ID", help="The hub repo of a local --target (how the card names it; "
              "default: its hub id when it is in the Hugging Face cache, else its folder's name).")
@click.option("--jobs", "workers", type=AsciiIntRange(min=1), help="Local worker processes (default: one per CPU, "
              "at most one per type; 1 runs in this process).")
@click.option("--ray", "ray_address", is_flag=False, flag_value="local", default=None, metavar="[ADDRESS]",
              help="Run the jobs as Ray tasks (a local cluster, or ADDRESS); needs pip install 'dflashkit[ray]'.")
@click.option("--ray-gpus-per-job", type=FiniteFloat(min=0), default=0.0, help="GPUs Ray reserves per job.")
@click.option("--ray-timeout", type=FiniteFloat(min=0, min_open=True, max=86400), default=DEFAULT_RAY_TIMEOUT_S,
              show_default=True, metavar="SECONDS", help="Bound on connecting to Ray and on its starting a task "
              "with the jobs' resources (an address that does not answer, a request the cluster cannot meet).")
@click.option("--check", "check", is_flag=True, help="Verify a release folder (OUTDIR alone): checksums, files, "
              "and that the card's figures are release.json's.")
@click.option("-q", "--quiet", is_flag=True, help="No progress on stderr and no summary on stdout (the exit code "
              "tells; the card and release.json hold the figures).")
@user_errors
@prompt_options
@context_options
@llama_cpp_options
def release_command(paths: tuple[str, ...], target: str | None, types: str, prompt_options: PromptOptions,
                    context: ContextOptions, llama: LlamaCppOptions, parity_rounds: int, min_top1: str, min_tau: float | None,
                    allow_failures: bool, source_repo: str | None, source_revision: str | None,
                    target_repo: str | None, workers: int | None, ray_address: str | None, ray_gpus_per_job: float,
                    ray_timeout: float, check: bool, quiet: bool, imatrix: str | None, naming: str,
                    target_name: str | None) -> None:
    """Release SRC (an HF drafter folder or hub id) as GGUFs of every --types into OUTDIR, each checked (inspect
    --strict, diff and parity against the checkpoint, τ), with a model card (README.md), SHA256SUMS and
    release.json. Resumable: run it again after an interruption and the finished types are kept. With --context
    N[,N…] (and --parallel N[,N…] with --llama-server) the card gains "By context length" (a table and a picture,
    tau-by-context.png) and "By concurrent requests", measured after every file is made.

    Exit 0 when every gate passed (or --allow-failures); 1 naming the type and the gate or step that failed; 2 for
    usage. With --check OUTDIR: exit 0 when the folder is what its release.json says, else 1 with each problem."""
    from ..release import check_release, release

    if check:
        if len(paths) != 1:
            raise UsageError("--check takes the release folder alone: dflash-release --check OUTDIR")
        problems = check_release(paths[0])
        if problems:
            for p in problems[:20]:
                click.echo(f"error: {escape_name(p, limit=400)}", err=True)
            raise SystemExit(1)
        if not quiet:
            print_summary(f"OK: {paths[0]} is the release its release.json records",
                          f"{paths[0]} is the release its release.json records")
        return
    if len(paths) != 2:
        raise UsageError("give SRC and OUTDIR: dflash-release SRC OUTDIR --target DIR (or --check OUTDIR)")
    if target is None:
        raise UsageError("--target DIR is required: inspect, parity and τ run against the target")
    top1 = _parse_fraction(min_top1, "--min-top1")
    say = None if quiet else (lambda m: click.echo(escape_name(m, limit=600), err=True))
    result = release(paths[0], paths[1], target=target, types=types, prompt_options=prompt_options, llama=llama,
                     context=context,
                     parity_rounds=parity_rounds, min_top1=top1 if top1 is not None else 0.75, min_tau=min_tau,
                     allow_failures=allow_failures, source_repo=source_repo, source_revision=source_revision,
                     target_repo=target_repo, workers=workers, ray=ray_address, ray_gpus_per_job=ray_gpus_per_job,
                     ray_timeout=ray_timeout, imatrix=imatrix, naming=naming, target_name=target_name, progress=say)
    rec = result.record
    best = rec.get("recommended")
    marked = [f"{t} ({g['gate']})" for t, g in result.failures]
    if not quiet:
        print_summary(f"OK: {len(rec['types'])} type(s) in {result.outdir}" + (f"; recommended {best}" if best else "")
                      + (f"; gates failed (marked in the card): {', '.join(marked)}" if marked else "")
                      + (f"; kept from the last run: {', '.join(result.skipped)}" if result.skipped else ""),
                      f"{result.outdir} is written and complete (kept)")
