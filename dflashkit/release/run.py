"""``dflash-release``: a checkpoint → every quant type, each checked, a model card, checksums and ``release.json``.

One shared F32 conversion, then one job per type (`jobs.run_job`), run in this process (``workers=1``), in a local
process pool (the default, sized to the machine) or as Ray tasks (``ray``: an existing engine schedules them; the
``dflashkit[ray]`` extra). ``release.json`` is rewritten after every finished job, so a release killed half-way and
run again skips each job whose file still has the checksum recorded there. The card, ``SHA256SUMS`` and the final
``release.json`` are written when every job is done and every gate passed (or ``allow_failures``).
"""

from __future__ import annotations

import concurrent.futures
import multiprocessing
import os
import re
import shutil
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Sequence

from ..bounds import dumps
from ..errors import DFlashError, UsageError
from ..files import check_output, read_json, write_text_atomic
from ..filetypes import ALL_FILE_TYPES
from .card import recommended, render_card, sha256_of, sha256sums
from .jobs import JobSpec, run_job

DEFAULT_TYPES = ("BF16", "Q8_0", "Q6_K", "Q5_K_M", "Q4_K_M", "Q4_K_M_DRAFT")
FORMAT = "dflashkit-release/1"
WORK_FOLDER = ".dflash-release"  # the shared conversion while a release runs; removed when it is complete
CARD, SUMS, RECORD = "README.md", "SHA256SUMS", "release.json"
TIMINGS = "timings.json"  # wall times and workers: the one file that differs between runners (not in SHA256SUMS)


@dataclass
class ReleaseResult:
    outdir: Path
    record: dict[str, Any]
    ran: list[str]  # types run this time
    skipped: list[str]  # types whose finished files were kept (a resumed release)

    @property
    def failures(self) -> list[tuple[str, dict[str, str]]]:
        return [(t, g) for t, j in self.record["jobs"].items() for g in j["gates_failed"]]


def parse_types(types: str | Sequence[str]) -> list[str]:
    """``bf16,q8_0,…`` → llama.cpp's spellings, in order, each once; an unknown type is a usage error."""
    from ..quantize.policy import PRESETS

    names = [t.strip() for t in (types.split(",") if isinstance(types, str) else types) if t.strip()]
    out: list[str] = []
    for n in names:
        up = n.upper()
        if up not in ALL_FILE_TYPES and up not in PRESETS or up == "F32":
            raise UsageError(f"--types {n}: not a release type — choose from "
                             f"{', '.join(t for t in [*ALL_FILE_TYPES, *PRESETS] if t != 'F32')}")
        if up not in out:
            out.append(up)
    if not out:
        raise UsageError("--types: give at least one type")
    return out


def _name_of(src: str, source_repo: str | None) -> str:
    base = (source_repo or str(src)).rstrip("/").split("/")[-1] or "drafter"
    return re.sub(r"[^A-Za-z0-9._-]", "-", base)


def _license_of(src: Path) -> str | None:
    card = src / "README.md"
    if not card.is_file():
        return None
    try:
        from huggingface_hub import ModelCard

        return ModelCard.load(card).data.license
    except Exception:  # noqa: BLE001 - a source card we cannot read only leaves the license out
        return None


def _load_previous(outdir: Path) -> dict[str, Any] | None:
    path = outdir / RECORD
    if not path.exists():
        return None
    record = read_json(path)
    if not isinstance(record, dict) or record.get("format") != FORMAT:
        raise DFlashError(f"{path}: not a dflashkit release record — give another OUTDIR or remove it")
    return record


def _finished(previous: dict[str, Any] | None, outdir: Path, type_name: str, same_inputs: bool) -> dict | None:
    """The previous run's record of ``type_name`` when its file is still the one recorded."""
    if not previous or not same_inputs:
        return None
    job = previous.get("jobs", {}).get(type_name)
    if not isinstance(job, dict) or not (outdir / str(job.get("file", ""))).is_file():
        return None
    return job if sha256_of(outdir / job["file"]) == job.get("sha256") else None


def _pool(workers: int) -> concurrent.futures.Executor:
    # spawn: a forked torch process can deadlock on the parent's thread pools
    return concurrent.futures.ProcessPoolExecutor(max_workers=workers, mp_context=multiprocessing.get_context("spawn"))


def _run_ray(specs: list[JobSpec], address: str, gpus: float, done: Callable[[JobSpec, dict | BaseException], None]
             ) -> None:
    try:
        import ray
    except ImportError:
        raise UsageError("--ray needs Ray: pip install 'dflashkit[ray]'") from None
    if not ray.is_initialized():
        ray.init(address=None if address in ("", "local") else address, include_dashboard=False,
                 log_to_driver=False, configure_logging=False)
    task = ray.remote(num_cpus=1, num_gpus=gpus, max_retries=0)(run_job)
    pending = {task.remote(s): s for s in specs}
    try:
        while pending:
            ready, _ = ray.wait(list(pending), num_returns=1)
            spec = pending.pop(ready[0])
            try:
                done(spec, ray.get(ready[0]))
            except ray.exceptions.RayTaskError as exc:  # the job's own error, never Ray's traceback
                cause = exc.cause if isinstance(getattr(exc, "cause", None), BaseException) else exc
                done(spec, cause if isinstance(cause, DFlashError) else
                     DFlashError(f"{spec.type_name}: {type(cause).__name__}: {str(cause).splitlines()[0][:300]}"))
    except BaseException:
        for ref in pending:
            ray.cancel(ref, force=True)
        raise


def release(
    src: str | os.PathLike, outdir: str | os.PathLike, *, target: str | os.PathLike,
    types: str | Sequence[str] = DEFAULT_TYPES, prompts: str | os.PathLike | None = None,
    max_prompts: int | None = None, max_new_tokens: int = 64, seed: int = 0, parity_rounds: int = 4,
    min_top1: float = 0.75, min_tau: float | None = None, allow_failures: bool = False,
    llama_cpp: str | os.PathLike | None = None, llama_server: str | os.PathLike | None = None,
    target_gguf: str | os.PathLike | None = None, source_repo: str | None = None,
    source_revision: str | None = None, workers: int | None = None, ray: str | None = None,
    ray_gpus_per_job: float = 0.0, progress: Callable[[str], None] | None = None,
) -> ReleaseResult:
    """Release ``src`` into ``outdir`` (module doc). Raises `DFlashError` naming the type and the gate or step that
    failed (gates: unless ``allow_failures``, which writes the card with those rows marked)."""
    from .. import __version__
    from ..converters.convert import convert
    from ..drafters import open_drafter
    from ..llama_cpp.process import spec_type_of

    say = progress or (lambda message: None)
    type_names = parse_types(types)
    out = Path(outdir)
    if out.exists() and not out.is_dir():
        raise UsageError(f"{out}: is not a folder — give the release's output folder")
    if not out.parent.is_dir():
        raise DFlashError(f"{out}: the folder {out.parent} does not exist")
    if workers is not None and workers < 1:
        raise UsageError(f"--jobs {workers}: give at least 1")
    inputs = [src, target, prompts, target_gguf]
    name = _name_of(str(src), source_repo)
    files = {t: out / f"{name}-{t}.gguf" for t in type_names}
    resolved = out.resolve()
    for given in (src, target):
        folder = Path(given)
        if folder.is_dir() and (resolved == folder.resolve() or folder.resolve() in resolved.parents):
            raise UsageError(f"{out}: is inside the input {given} — write the release to another folder (inputs are "
                             "never modified)")
    created = not out.exists()
    out.mkdir(exist_ok=True)
    try:
        for f in [*files.values(), out / CARD, out / SUMS, out / RECORD, out / TIMINGS]:
            check_output(f, inputs=[p for p in inputs if p is not None and Path(p).exists()], force=True)
    except DFlashError:
        if created:
            out.rmdir()
        raise
    previous = _load_previous(out)
    settings = {"prompts": str(prompts) if prompts else "dflashkit's built-in set", "max_prompts": max_prompts,
                "max_new_tokens": max_new_tokens, "seed": seed, "parity_rounds": parity_rounds,
                "min_top1": min_top1, "min_tau": min_tau}
    inputs_key = {"source": str(src), "target": str(target), "settings": settings}
    same = previous is not None and previous.get("inputs_key") == inputs_key
    work = out / WORK_FOLDER
    work.mkdir(exist_ok=True)
    base = work / "base-F32.gguf"
    started = time.time()
    base_sha256 = sha256_of(base) if same and base.is_file() else None
    if base_sha256 is None or previous.get("base_sha256") != base_sha256:
        say(f"converting {src} → F32 (shared by every type)")
        convert(src, base, outtype="f32", target=target, source_repo=source_repo, source_revision=source_revision,
                force=True, progress=False, warn=say)
        base_sha256 = sha256_of(base)
    with open_drafter(base) as d:
        family, block_size = d.family.name if d.family else "unknown", d.spec.block_size
    src_path = Path(src)
    record: dict[str, Any] = {
        "format": FORMAT, "name": name, "family": family, "block_size": block_size,
        "spec_type": spec_type_of(base), "types": type_names, "inputs_key": inputs_key,
        "source": {"path": str(src), "repo": source_repo or (str(src) if not src_path.exists() else src_path.name),
                   "revision": source_revision, "license": _license_of(src_path) if src_path.is_dir() else None},
        "target": str(target), "target_gguf_name": Path(target_gguf).name if target_gguf else
        f"{Path(str(target)).name}.gguf", "dflashkit_version": __version__,
        "llama_cpp": str(llama_server or llama_cpp) if (llama_server or llama_cpp) else None,
        "settings": settings, "base_sha256": base_sha256, "jobs": {}, "complete": False,
    }
    timings: dict[str, Any] = {"jobs": {}}
    skipped = []
    for t in type_names:
        kept = _finished(previous, out, t, same)
        if kept is not None:
            record["jobs"][t] = kept
            skipped.append(t)
            say(f"{t}: kept ({files[t].name} unchanged since the last run)")
    specs = [JobSpec(t, str(base), str(files[t]), str(src), str(target), str(prompts) if prompts else None,
                     max_prompts, max_new_tokens, seed, parity_rounds, min_top1, min_tau,
                     str(llama_cpp) if llama_cpp else None, str(llama_server) if llama_server else None,
                     str(target_gguf) if target_gguf else None) for t in type_names if t not in record["jobs"]]
    errors: list[str] = []

    def save() -> None:
        record["jobs"] = {t: record["jobs"][t] for t in type_names if t in record["jobs"]}  # not completion order
        write_text_atomic(out / RECORD, dumps(record, indent=2) + "\n", force=True)

    def done(spec: JobSpec, result: dict | BaseException) -> None:
        if isinstance(result, BaseException):
            errors.append(str(result) if isinstance(result, DFlashError) else
                          f"{spec.type_name}: {type(result).__name__}: {result}")
            say(f"{spec.type_name}: failed: {errors[-1]}")
            return
        timings["jobs"][spec.type_name] = {"seconds": result.pop("seconds"), "worker_pid": result.pop("worker_pid")}
        result["sha256"] = sha256_of(Path(spec.out))
        record["jobs"][spec.type_name] = result
        save()
        gates = ", ".join(g["gate"] for g in result["gates_failed"]) or "all gates passed"
        say(f"{spec.type_name}: done (τ {result['tau']['mean']:.3f}; {gates})")

    save()
    n = workers or min(len(specs), os.cpu_count() or 1) or 1
    if specs and ray is not None:
        for s in specs:
            say(f"{s.type_name}: started (Ray task)")
        _run_ray(specs, ray, ray_gpus_per_job, done)
    elif specs and n == 1:
        for s in specs:
            say(f"{s.type_name}: started")
            try:
                result: dict | BaseException = run_job(s)
            except DFlashError as exc:
                result = exc
            done(s, result)
    elif specs:
        with _pool(n) as pool:
            futures = {}
            for s in specs:
                say(f"{s.type_name}: started (process pool of {n})")
                futures[pool.submit(run_job, s)] = s
            try:
                for fut in concurrent.futures.as_completed(futures):
                    exc = fut.exception()
                    done(futures[fut], exc if exc is not None else fut.result())
            except BaseException:
                pool.shutdown(wait=True, cancel_futures=True)
                raise
    timings["total_seconds"] = round(time.time() - started, 3)
    timings["runner"] = "ray" if ray is not None else "in-process" if n == 1 else f"process pool of {n}"
    if errors:
        save()
        raise DFlashError(errors[0] + (f" (and {len(errors) - 1} more job(s) failed)" if len(errors) > 1 else ""))
    failed = [(t, g) for t in type_names for g in record["jobs"][t]["gates_failed"]]
    if failed and not allow_failures:
        save()
        t, g = failed[0]
        raise DFlashError(f"{t}: the {g['gate']} gate failed: {g['why']} — no card written (--allow-failures writes "
                          "it with the row marked)")
    record["recommended"] = recommended(record)
    record["complete"] = True
    save()
    write_text_atomic(out / TIMINGS, dumps(timings, indent=2) + "\n", force=True)
    write_text_atomic(out / CARD, render_card(record), force=True)
    names = [files[t].name for t in type_names] + [CARD, RECORD]
    write_text_atomic(out / SUMS, sha256sums(out, names), force=True)
    shutil.rmtree(work, ignore_errors=True)
    return ReleaseResult(out, record, [s.type_name for s in specs], skipped)
