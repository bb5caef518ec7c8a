"""``dflash-release``: a checkpoint → every quant type, each checked, a model card, checksums and ``release.json``.

One shared F32 conversion, then one job per type (`jobs.run_job`), run in this process (``workers=1``), in a local
process pool (the default, sized to the machine) or as Ray tasks (``ray``: an existing engine schedules them;
`runners`). OUTDIR is the release's alone (`outdir`: its own folder or nothing, never inside an input, one
release at a time, a work folder it made). ``release.json`` is rewritten after every finished job; a release cut
short and run again keeps each job whose record is sealed by this machine (`seal`) and whose file still has the
recorded checksum, and redoes the rest. With ``--llama-server`` the speed-ups are measured after every job has
finished, one combination at a time, nothing else running (`serving_record`). Whatever ends a run early — a failed job, Ctrl-C, TERM, HUP — the folder
is left as ``release.json`` records it: a type file it does not record is removed. The card, ``SHA256SUMS`` and
the final ``release.json`` are written when every job is done and every gate passed (or ``allow_failures``).

Nothing private is published: inputs are named by hub id or by base name, never by a path of this machine; the
record keeps only a digest of what the figures depend on (`inputs`).
"""

from __future__ import annotations

import json
import os
import time
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Callable, Sequence

from ..bounds import dumps
from ..errors import DFlashError, UsageError
from ..accept.options import ContextOptions, LlamaCppOptions, PromptOptions
from ..files import (MAX_JSON_CONTAINERS, check_output, check_outside_inputs, json_container_count, read_json,
                     signals_unwind, write_bytes_atomic, write_text_atomic)
from ..filetypes import NEEDS_IMATRIX
from ..llama_cpp.process import check_extra_args
from .card import recommended, recommended_by_speed, render_card, sha256_of, sha256sums
from .inputs import (_license_of, check_names, file_prefix, inputs_digest, public_name, release_name, scrub_job,
                     scrub_paths)
from .inside import NotInside, sha256_inside
from .jobs import JobSpec
from .outdir import Claim, claim, foreign_entry, read_pending, remove_unrecorded
from .runners import DEFAULT_RAY_TIMEOUT_S, connect_ray, disconnect_ray, run_in_process, run_pool, run_ray
from .schema import FORMAT, RecordError, validate_record
from .seal import machine_key, seal, verify
from ..accept.serving_plan import ServingPlan, check_parallel_served
from .arguments import MAX_SEED, _check_arguments, parse_types, release_types, serving_plans  # noqa: F401 (re-exported)
from .serving_record import build_name, host_description, run_serving
from .sweeps import PICTURE, measure_sweeps, picture

DEFAULT_TYPES = ("BF16", "Q8_0", "Q6_K", "Q5_K_M", "Q4_K_M", "Q4_K_M_DRAFT")
CARD, SUMS, RECORD = "README.md", "SHA256SUMS", "release.json"
TIMINGS = "timings.json"  # wall times and workers: the one file that differs between runners (not in SHA256SUMS)
BASE = "base-F32.gguf"


@dataclass
class ReleaseResult:
    outdir: Path
    record: dict[str, Any]
    ran: list[str]  # types run this time
    skipped: list[str]  # types whose finished files were kept (a resumed release)

    @property
    def failures(self) -> list[tuple[str, dict[str, str]]]:
        return [(t, g) for t, j in self.record["jobs"].items() for g in j["gates_failed"]]


@dataclass(frozen=True)
class Options:
    """How the jobs measure and where they run: the measuring settings as ``dflash-accept`` takes them (checked by
    `release`: the serving options of each build as its plan), and what only a release has."""

    prompt: PromptOptions
    llama: LlamaCppOptions  # target GGUFs, extra arguments and --parallel levels checked; llama_servers: the builds
    context: ContextOptions
    serving_plans: tuple[ServingPlan, ...]  # each --llama-server build's checked plan
    parity_rounds: int
    min_top1: float
    min_tau: float | None
    allow_failures: bool
    source_repo: str | None
    source_revision: str | None
    target_repo: str | None
    workers: int | None
    ray: str | None
    ray_gpus_per_job: float
    ray_timeout: float
    imatrix: str | os.PathLike | None = None

    @property
    def target_gguf(self) -> str | None:
        """The first --target-gguf: the τ step's target (every one is served side by side)."""
        return self.llama.target_ggufs[0] if self.llama.target_ggufs else None


def _load_previous(out: Path, digest: str) -> dict[str, Any] | None:
    """The release already in OUTDIR, validated, when it is one of the same inputs; None when there is none. A
    record of other inputs, or one that is not a release's, is a usage error: OUTDIR is not this release's."""
    path = out / RECORD
    if not os.path.lexists(path):
        return None
    from .inside import read_inside

    try:
        raw = read_inside(out, RECORD, 64 << 20)
    except NotInside as exc:
        raise UsageError(f"{path}: {exc} — OUTDIR holds no release of these inputs; give another OUTDIR") from None
    try:
        if json_container_count(raw) > MAX_JSON_CONTAINERS:
            raise RecordError(f"over {MAX_JSON_CONTAINERS} objects/arrays")
        record = validate_record(json.loads(raw), str(path), release_types())
    except (ValueError, RecursionError, RecordError) as exc:
        why = (str(exc).splitlines() or [type(exc).__name__])[0][:300]
        raise UsageError(f"{path}: not a release record this version of dflashkit wrote ({why}) — give another "
                         "OUTDIR") from None
    if record["inputs_digest"] != digest:
        raise UsageError(f"{out}: holds a release of other inputs or settings ({record['name']}, "
                         f"{', '.join(record['types'])}) — give another OUTDIR")
    return record


def _kept_job(previous: dict[str, Any] | None, out: Path, t: str, digest: str, key: bytes | None) -> dict | None:
    """The previous run's record of ``t`` when this machine sealed it and its file is still the one recorded."""
    job = (previous or {}).get("jobs", {}).get(t)
    if job is None or not verify(job, digest, key):
        return None
    try:
        return job if sha256_inside(out, job["file"], job["size_bytes"]) == job["sha256"] else None
    except NotInside:
        return None


def release(
    src: str | os.PathLike, outdir: str | os.PathLike, *, target: str | os.PathLike,
    types: str | Sequence[str] = DEFAULT_TYPES, prompt_options: PromptOptions | None = None,
    llama: LlamaCppOptions | None = None, context: ContextOptions | None = None, parity_rounds: int = 4,
    min_top1: float = 0.75, min_tau: float | None = None, allow_failures: bool = False,
    source_repo: str | None = None, source_revision: str | None = None, target_repo: str | None = None,
    workers: int | None = None, ray: str | None = None, ray_gpus_per_job: float = 0.0,
    ray_timeout: float = DEFAULT_RAY_TIMEOUT_S, imatrix: str | os.PathLike | None = None, naming: str = "source",
    target_name: str | None = None, progress: Callable[[str], None] | None = None,
) -> ReleaseResult:
    """Release ``src`` into ``outdir`` (module doc). Raises `DFlashError` naming the type and the gate or step that
    failed (gates: unless ``allow_failures``, which writes the card with those rows marked); KeyboardInterrupt
    saying what the record holds when interrupted.

    The measuring settings are the values ``dflash-accept`` takes (`dflashkit.accept.options`): ``prompt_options``
    (the prompts, how many, how long, the seed, the rendering), ``llama`` (``llama_servers``: one build's bin/
    folder or several, measured side by side, with ``target_ggufs``; each type's file served at every
    ``draft_n_max`` — default the block − 1 — × ``draft_cache_types`` — default the server's) and ``context``.
    ``naming="target"`` names the files ``dflash-<target>-<TYPE>.gguf`` (``target_name``, default the target's hub
    id or folder name), else ``<name>-<TYPE>.gguf``. ``context`` levels and ``llama.parallel`` add the sweep step
    (`sweeps`): the card's "by context length" table and picture, and its "by concurrent requests" table."""
    say = progress or (lambda message: None)
    po = prompt_options or PromptOptions()
    prompts, max_prompts, max_new_tokens, seed, reasoning = po.prompts, po.max_prompts, po.max_new_tokens, po.seed, \
        po.reasoning
    chat_template_kwargs = dict(po.chat_template_kwargs)
    ll = llama or LlamaCppOptions()
    llama_cpp, threads = ll.llama_cpp, ll.threads
    context = context or ContextOptions()
    from ..accept.sweep import check_context_levels

    if context.levels:  # a Python caller's values bounded as the command line's are, before any work
        context = ContextOptions(check_context_levels(context.levels), context.file)
    parallel = check_parallel_served(ll.parallel, ll.llama_servers)  # before any other work, as the CLI's
    extra_args = tuple(check_extra_args(ll.extra_args))
    target_ggufs = tuple(str(g) for g in ll.target_ggufs)
    target_gguf = target_ggufs[0] if target_ggufs else None
    _check_arguments(seed, workers, max_prompts, ray_timeout)
    type_names = parse_types(types)
    out = Path(outdir)
    if os.path.lexists(out) and not out.is_dir():
        raise UsageError(f"{out}: is not a folder — give the release's output folder")
    if not out.parent.is_dir():
        raise DFlashError(f"{out}: the folder {out.parent} does not exist")
    check_outside_inputs(out, [src, target])
    servers, plans = serving_plans(ll.llama_servers, target_ggufs, ll.draft_n_max, ll.draft_cache_types, src,
                                   max_new_tokens=max_new_tokens, seed=seed, threads=threads,
                                   extra_args=extra_args, timeout=float(ll.timeout))
    if context.levels:  # every level's context built now (tokenizer only): a short source is said before any work
        from ..accept.sweep import check_context_plan

        check_context_plan(target, prompts, max_prompts, context.levels, context.file, max_new_tokens, reasoning,
                           chat_template_kwargs)
    elif context.file is not None:
        raise UsageError("--context-file is the source of --context: give --context N[,N…] too")
    if target_gguf is not None and llama_cpp is None and not servers:
        raise UsageError("--target-gguf only matters with --llama-cpp or --llama-server BIN_DIR")
    if imatrix is None and (need := [t for t in type_names if t in NEEDS_IMATRIX]):
        raise UsageError(f"--types {need[0]}: needs an importance matrix, as llama-quantize does — pass --imatrix FILE "
                         "(dflash-imatrix makes a drafter's)")
    if imatrix is not None:  # read now (its header and layout, no values): a bad one is refused before any work
        from ..quantize.imatrix_read import load_imatrix

        load_imatrix(imatrix)
    name = release_name(src, source_repo)
    prefix, short_target = file_prefix(naming, name, target, target_repo, target_name)
    files = {t: f"{prefix}-{t}.gguf" for t in type_names}
    settings = {"prompts": Path(prompts).name if prompts else "dflashkit's built-in set", "max_prompts": max_prompts,
                "max_new_tokens": max_new_tokens, "seed": seed, "parity_rounds": parity_rounds,
                "min_top1": min_top1, "min_tau": min_tau}
    check_names({"SRC": public_name(src, source_repo), "--target": public_name(target, target_repo),
                 "--prompts": settings["prompts"], "--source-revision": source_revision,
                 **{"--target-gguf" + (f" #{i + 1}" if i else ""): Path(g).name for i, g in enumerate(target_ggufs)},
                 "--imatrix": Path(imatrix).name if imatrix else None,
                 "--llama-cpp": build_name(llama_cpp),
                 **{f"--llama-server {b}": build_name(b) for b in servers}})
    from .. import __version__

    n_max = tuple(ll.draft_n_max) or (None,)
    caches = tuple(ll.draft_cache_types) or (None,)
    digest, content = inputs_digest(src, target, prompts, {**settings, "naming": [naming, prefix],
                                                           "draft_n_max": n_max, "draft_cache_types": caches},
                                    {"llama_cpp": llama_cpp, "llama_server": list(servers),
                                     "target_gguf": list(target_ggufs) if len(target_ggufs) > 1 else target_gguf,
                                     "imatrix": imatrix},
                                    __version__, extra={"llama_cpp_args": list(extra_args), "threads": threads,
                                                        "reasoning": reasoning,
                                                        "chat_template_kwargs": chat_template_kwargs or {},
                                                        "context": list(context.levels), "parallel": list(parallel),
                                                        "context_file": context.file})
    options = Options(replace(po, chat_template_kwargs=chat_template_kwargs),
                      replace(ll, llama_servers=servers, target_ggufs=target_ggufs, extra_args=extra_args,
                              parallel=tuple(parallel)), context, plans, parity_rounds, min_top1, min_tau,
                      allow_failures, source_repo, source_revision, target_repo, workers, ray, ray_gpus_per_job,
                      ray_timeout, imatrix)
    naming_record = {"naming": naming, "file_prefix": prefix, "target_name": short_target}
    with signals_unwind():  # TERM / HUP unwind like Ctrl-C: workers killed, OUTDIR left as its record says
        claimed = claim(out)
        try:
            return _run(claimed, src, target, type_names, files, name, settings, (digest, content), say, options,
                        naming_record)
        except BaseException as exc:
            recorded = _recorded(out)
            if claimed.owned:  # only files this release started writing: a user's files are never touched
                remove_unrecorded(claimed, read_pending(claimed), recorded)
            if claimed.created and not os.path.lexists(out / RECORD):
                claimed.remove_work_folder()  # stopped before it wrote anything: the folder it made goes too
                try:
                    os.rmdir(out)
                except OSError:
                    pass
            if isinstance(exc, KeyboardInterrupt):
                raise KeyboardInterrupt(f"{len(recorded)} of {len(type_names)} type(s) finished and recorded in "
                                        f"{out / RECORD}; run the same command again to finish") from None
            raise
        finally:
            claimed.release()


def _recorded(out: Path) -> set[str]:
    """The type files ``release.json`` records now (nothing when it cannot be read)."""
    try:
        record = read_json(out / RECORD)
        return {j["file"] for j in record["jobs"].values() if isinstance(j, dict) and isinstance(j.get("file"), str)}
    except (DFlashError, KeyError, TypeError, AttributeError):
        return set()


def _run(claimed: Claim, src: Any, target: Any, type_names: list[str], files: dict[str, str], name: str,
         settings: dict[str, Any], digests: tuple[str, str], say: Callable[[str], None], o: Options,
         naming: dict[str, Any]) -> ReleaseResult:
    out = claimed.out
    previous = _load_previous(out, digests[0])
    # the type files that are this release's: the ones its record lists, and the ones a run cut short was writing
    ours = {j["file"] for j in previous["jobs"].values()} | read_pending(claimed) if previous is not None else set()
    foreign = foreign_entry(claimed, {CARD, SUMS, RECORD, TIMINGS, PICTURE} | ours, previous is not None)
    if foreign is not None:
        raise UsageError(f"{out / foreign}: not a file of this release — dflash-release writes only into an empty "
                         "folder or a release of the same inputs; give another OUTDIR")
    claimed.owned = True  # from here on, what OUTDIR holds is this release's
    inputs = [p for p in (src, target, o.prompt.prompts, *o.llama.target_ggufs, o.imatrix)
              if p is not None and Path(p).exists()]
    for f in [*files.values(), CARD, SUMS, RECORD, TIMINGS, PICTURE]:
        check_output(out / f, inputs=inputs, force=True)
    # Ray first: an address that does not answer or a cluster that cannot run a job is said before minutes of work
    ray = connect_ray(o.ray, o.ray_gpus_per_job, o.ray_timeout) if o.ray is not None else None
    try:
        return _run_connected(claimed, src, target, type_names, files, name, settings, digests, say, o, previous, ray,
                              ours, naming)
    finally:
        if ray is not None:
            disconnect_ray(ray[1])


def _run_connected(claimed: Claim, src: Any, target: Any, type_names: list[str], files: dict[str, str], name: str,
                   settings: dict[str, Any], digests: tuple[str, str], say: Callable[[str], None], o: Options,
                   previous: dict[str, Any] | None, ray: tuple[Any, str | None] | None,
                   ours: set[str], naming: dict[str, Any]) -> ReleaseResult:
    from .. import __version__
    from ..converters.convert import convert
    from ..drafters import open_drafter
    from ..llama_cpp.process import spec_type_of

    out = claimed.out
    digest, content = digests
    key = machine_key()
    claimed.make_work_folder()
    base = claimed.work_file(BASE)
    started = time.time()
    base_sha256 = None
    if previous is not None and verify({"base_sha256": previous["base_sha256"], "seal": previous.get("base_seal")},
                                       f"{digest}:{content}", key):
        try:
            if sha256_inside(claimed.work, BASE) == previous["base_sha256"]:
                base_sha256 = previous["base_sha256"]
        except NotInside:
            pass
    if base_sha256 is None:
        say(f"converting {public_name(src, o.source_repo)} → F32 (shared by every type)")
        convert(src, base, outtype="f32", target=target, source_repo=o.source_repo,
                source_revision=o.source_revision, force=True, progress=False, warn=say)
        base_sha256 = sha256_of(claimed.work_file(BASE))
    with open_drafter(base) as d:
        family, block_size = d.family.name if d.family else "unknown", d.spec.block_size
    src_path = Path(src)
    record: dict[str, Any] = {
        "format": FORMAT, "name": name, "family": family, "block_size": block_size,
        "spec_type": spec_type_of(base), "types": type_names, "inputs_digest": digest,
        "source": {"repo": public_name(src, o.source_repo), "revision": o.source_revision,
                   "license": _license_of(src_path) if src_path.is_dir() else None},
        "target": public_name(target, o.target_repo),
        "target_gguf_name": Path(o.target_gguf).name if o.target_gguf else
        f"{public_name(target, o.target_repo).split('/')[-1]}.gguf", "dflashkit_version": __version__,
        "llama_cpp": build_name(o.llama.llama_cpp), **naming,
        "serving": {"builds": [build_name(b) for b in o.llama.llama_servers], "host": host_description(),
                    "draft_n_max": list(o.llama.draft_n_max or (None,)),
                    "draft_cache_types": list(o.llama.draft_cache_types or (None,))}
        if o.llama.llama_servers else None,
        "settings": settings, "base_sha256": base_sha256, "jobs": {}, "complete": False,
    }
    if o.imatrix is not None:  # provenance: which matrix every quantized type was made with
        record["imatrix"] = {"name": Path(o.imatrix).name, "sha256": sha256_of(Path(o.imatrix))}
    record["base_seal"] = seal({"base_sha256": base_sha256}, f"{digest}:{content}", key)
    job_key = f"{digest}:{content}:{base_sha256}"  # a kept job was made from these very inputs and weights
    timings: dict[str, Any] = {"jobs": {}, "serving": []}
    skipped = []
    for t in type_names:
        kept = _kept_job(previous, out, t, job_key, key)
        if kept is not None:
            record["jobs"][t] = kept
            skipped.append(t)
            say(f"{t}: kept ({files[t]} unchanged since the last run)")
    specs = [JobSpec(t, str(base), str(out / files[t]), str(src), str(target),
                     str(o.prompt.prompts) if o.prompt.prompts else None, o.prompt.max_prompts,
                     o.prompt.max_new_tokens, o.prompt.seed,
                     o.parity_rounds, o.min_top1, o.min_tau,
                     str(o.llama.llama_cpp) if o.llama.llama_cpp else None,
                     str(o.target_gguf) if o.target_gguf and o.llama.llama_cpp else None,  # the τ step's; serving: below
                     o.llama.extra_args if o.llama.llama_cpp else (), imatrix=str(o.imatrix) if o.imatrix else None,
                     imatrix_name=Path(o.imatrix).name if o.imatrix else None, threads=o.llama.threads,
                     llama_cpp_timeout=o.llama.timeout, reasoning=o.prompt.reasoning,
                     chat_template_kwargs=tuple(sorted(o.prompt.chat_template_kwargs.items())),
                     llama_cpp_src=str(o.llama.llama_cpp_src) if o.llama.llama_cpp_src else None)
             for t in type_names if t not in record["jobs"]]
    errors: list[str] = []
    private = [out, claimed.work, src, target, o.prompt.prompts, *o.llama.target_ggufs, o.imatrix, o.llama.llama_cpp,
               *o.llama.llama_servers, o.llama.llama_cpp_src, os.path.expanduser("~")]

    def save() -> None:
        record["jobs"] = {t: record["jobs"][t] for t in type_names if t in record["jobs"]}  # not completion order
        write_text_atomic(out / RECORD, dumps(record, indent=2) + "\n", force=True)

    def done(spec: JobSpec, result: dict | BaseException) -> None:
        if isinstance(result, BaseException):
            errors.append(str(result) if isinstance(result, DFlashError) else
                          f"{spec.type_name}: {type(result).__name__}: {result}")
            say(f"{spec.type_name}: failed: {errors[-1]}")
            return
        timings["jobs"][spec.type_name] = {k: result.pop(k) for k in ("seconds", "worker_pid", "started", "finished")}
        scrub_job(result, private)  # before the seal: what is stored is what is published
        result["sha256"] = sha256_of(Path(spec.out))
        result["seal"] = seal(result, job_key, key)
        record["jobs"][spec.type_name] = result
        save()
        gates = ", ".join(g["gate"] for g in result["gates_failed"]) or "all gates passed"
        tau = result["tau"]["mean"]
        say(f"{spec.type_name}: done (τ {'–' if tau is None else f'{tau:.3f}'}; {gates})")

    save()
    claimed.write_pending([files[s.type_name] for s in specs])  # what a run cut short may leave: ours to remove
    n = o.workers or min(len(specs), os.cpu_count() or 1) or 1
    if specs and ray is not None:
        run_ray(specs, ray, o.ray_gpus_per_job, done, say)
    elif specs and n == 1:
        run_in_process(specs, done, say)
    elif specs:
        run_pool(specs, n, done, say)
    if errors:
        raise DFlashError(errors[0] + (f" (and {len(errors) - 1} more job(s) failed)" if len(errors) > 1 else ""))
    if o.llama.llama_servers:  # every job has finished: the timings run alone, one combination at a time
        from ..accept.serving_only import prepare_prompts, serve_files

        timings["host"] = record["serving"]["host"]

        def served(t: str) -> None:
            job = record["jobs"][t]
            scrub_job(job, private)  # llama-server's log lines name the files it was given
            job.pop("seal", None)
            job["seal"] = seal(job, job_key, key)
            save()

        prepared: list[Any] = []  # the prompts rendered once for every type and build

        plan_of = dict(zip(o.llama.llama_servers, o.serving_plans))

        def measure(runner: Any, drafters: list[Path], llama_server: str, progress: Callable[[str], None]) -> Any:
            if not prepared:
                prepared.append(prepare_prompts(runner, o.prompt.prompts, max_prompts=o.prompt.max_prompts,
                                                max_new_tokens=o.prompt.max_new_tokens, reasoning=o.prompt.reasoning,
                                                chat_template_kwargs=o.prompt.chat_template_kwargs))
            return serve_files(runner, drafters, prepared[0], plan_of[str(llama_server)], progress=progress)

        run_serving(record["jobs"], type_names, {t: out / f for t, f in files.items()}, target, o.llama.llama_servers,
                    measure, timings["serving"], served, say)
    timings["total_seconds"] = round(time.time() - started, 3)
    timings["runner"] = "ray" if o.ray is not None else "in-process" if n == 1 else f"process pool of {n}"
    failed = [(t, g) for t in type_names for g in record["jobs"][t]["gates_failed"]]
    if failed and not o.allow_failures:
        t, g = failed[0]
        raise DFlashError(f"{t}: the {g['gate']} gate failed: {g['why']} — no card written (--allow-failures writes "
                          "it with the row marked)")
    if o.context.levels or o.llama.parallel:  # alone too: after every job and every serving pair
        first = o.llama.llama_servers[:1]  # the sweeps run through the first build, on the first target GGUF
        record.update(measure_sweeps(
            {t: out / files[t] for t in type_names}, target, prompt=o.prompt, context=o.context,
            llama=LlamaCppOptions(llama_servers=first, target_ggufs=o.llama.target_ggufs[:1] if first else (),
                                  threads=o.llama.threads, extra_args=o.llama.extra_args, timeout=o.llama.timeout,
                                  parallel=o.llama.parallel),
            build=build_name(first[0]) if first else None, say=say,
            scrub=lambda m: scrub_paths(m, private)))
    record["recommended"] = recommended(record)
    record["recommended_by"] = "speed-up" if recommended_by_speed(record) is not None else "τ"
    record["complete"] = True
    save()
    drawn = picture(record)
    if drawn is not None:
        write_bytes_atomic(out / PICTURE, drawn, force=True)
    write_text_atomic(out / TIMINGS, dumps(timings, indent=2) + "\n", force=True)
    write_text_atomic(out / CARD, render_card(record), force=True)
    for gone in sorted(ours - set(files.values())):  # a type the last run made that --types no longer lists
        if remove_unrecorded(claimed, {gone}, set()):
            say(f"removed {gone}: its type is no longer in --types, and the folder is what release.json records")
    write_text_atomic(out / SUMS, sha256sums(out, [files[t] for t in type_names] + [CARD, RECORD]
                                             + ([PICTURE] if drawn is not None else [])), force=True)
    claimed.remove_work_folder()
    return ReleaseResult(out, record, [s.type_name for s in specs], skipped)
