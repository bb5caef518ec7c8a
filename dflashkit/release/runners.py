"""Where a release's jobs run: in this process, in a local process pool, or as Ray tasks — each bounded and each
leaving nothing behind.

- **Pool.** Spawned workers ignore Ctrl-C (the terminal sends it to the whole process group: the main process
  alone decides) and die with the main process (``PR_SET_PDEATHSIG``), even when it is killed outright. On Ctrl-C,
  TERM or HUP the main process kills every worker at once (SIGKILL: a job has nothing to save, its file is written
  atomically) and reaps them before the caller cleans OUTDIR, so no job can publish a file after the clean-up.
- **Ray.** An existing engine (``dflashkit[ray]``) schedules the jobs; dflashkit only bounds it: an address that
  does not answer, Ray's own errors and a resource request the cluster cannot meet are one-line errors within
  ``--ray-timeout`` (a probe task with the jobs' resources must start in that time); a local cluster runs in a
  temporary folder of this run (short enough for Ray's socket paths) that is removed with it.
"""

from __future__ import annotations

import concurrent.futures
import logging
import math
import multiprocessing
import os
import signal
import socket
import tempfile
from typing import Any, Callable, Sequence

from ..errors import DFlashError, UsageError
from ..files.tempdirs import make_temp_dir, remove_temp_dir
from .jobs import JobSpec, run_job

Done = Callable[[JobSpec, "dict | BaseException"], None]
DEFAULT_RAY_TIMEOUT_S = 180.0
#: Ray's longest socket path under its temp folder: ``/session_<date>_<time>_<usec>_<pid>/sockets/plasma_store``
#: (``session_2026-11-27_03-38-43_325341_1179300`` is 42 characters with a 7-digit PID)
_RAY_SOCKET_TAIL = 64
_UNIX_PATH_MAX = 107


def _worker_init() -> None:  # runs in each spawned worker
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the main process handles Ctrl-C for the whole group
    from ..llama_cpp.process import _PRCTL

    if _PRCTL is not None:
        _PRCTL(1, signal.SIGKILL)  # PR_SET_PDEATHSIG: killed with the main process, even by SIGKILL


def _probe() -> int:  # a Ray task with the jobs' resources: the cluster can start one
    return os.getpid()


def kill_workers() -> None:
    """Kill every worker process of this process's pools and reap them (they hold nothing worth a grace period)."""
    children = multiprocessing.active_children()
    for p in children:
        try:
            p.kill()
        except (OSError, ValueError):
            pass
    for p in children:
        p.join(timeout=5)


def run_in_process(specs: Sequence[JobSpec], done: Done, say: Callable[[str], None]) -> None:
    for s in specs:
        say(f"{s.type_name}: started")
        try:
            result: dict | BaseException = run_job(s)
        except DFlashError as exc:
            result = exc
        done(s, result)


def _quiet_resource_tracker() -> None:
    """Start multiprocessing's resource tracker with its stderr on /dev/null. After an interrupt the main process
    exits at once (`cli.common`), before the pool's queues are collected; the tracker then unlinks their semaphores
    itself — and would print a multi-line "leaked semaphore objects" warning on the user's terminal about it."""
    from multiprocessing import resource_tracker

    saved = os.dup(2)
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, 2)
        os.close(devnull)
        resource_tracker.ensure_running()
    finally:
        os.dup2(saved, 2)
        os.close(saved)


def run_pool(specs: Sequence[JobSpec], workers: int, done: Done, say: Callable[[str], None]) -> None:
    _quiet_resource_tracker()
    # spawn: a forked torch process can deadlock on the parent's thread pools
    pool = concurrent.futures.ProcessPoolExecutor(max_workers=workers, initializer=_worker_init,
                                                  mp_context=multiprocessing.get_context("spawn"))
    try:
        futures = {}
        for s in specs:
            say(f"{s.type_name}: started (process pool of {workers})")
            futures[pool.submit(run_job, s)] = s
        for fut in concurrent.futures.as_completed(futures):
            exc = fut.exception()
            done(futures[fut], exc if exc is not None else fut.result())
    except BaseException:
        kill_workers()  # at once: waiting for running jobs took 18 s after a Ctrl-C
        # with the workers gone this returns at once, and drops the pool's queues: their semaphores are unlinked
        # here, not reported as leaked by multiprocessing's resource tracker after we exit
        pool.shutdown(wait=True, cancel_futures=True)
        raise
    pool.shutdown(wait=True)


def _ray_temp_dir() -> str:
    """A temporary folder of this run for a local Ray cluster, short enough for Ray's socket paths."""
    for base in (tempfile.gettempdir(), "/tmp"):
        if len(base) + len("/dflashkit-ray-0000000-xxxxxxxx") + _RAY_SOCKET_TAIL <= _UNIX_PATH_MAX:
            return make_temp_dir("ray", base=base)
    raise UsageError(f"TMPDIR {tempfile.gettempdir()} is too long for Ray's socket paths ({_UNIX_PATH_MAX} bytes at "
                     "most): set TMPDIR to a shorter folder for --ray")


def _probe_address(address: str, timeout: float) -> None:
    """``host:port``: something must listen there before Ray is asked (Ray retries a dead address for minutes)."""
    host, sep, port = address.rpartition(":")
    if not sep or not port.isdigit() or not host:
        return  # not host:port ("auto", a ray:// URL): Ray's own answer, made one line
    try:
        with socket.create_connection((host.strip("[]"), int(port)), timeout=min(timeout, 10.0)):
            pass
    except OSError as exc:
        raise DFlashError(f"--ray {address}: no Ray cluster answers there ({exc.strerror or exc}) — start one "
                          "(ray start --head) or give its address") from None


def connect_ray(address: str, gpus: float, timeout: float) -> tuple[Any, str | None]:
    """Ray connected (or a local cluster started in a folder of this run, returned for its removal), every failure
    one line within ``timeout``; then a probe with the jobs' resources must start within ``timeout`` too."""
    try:
        import ray
    except ImportError:
        raise UsageError("--ray needs Ray: pip install 'dflashkit[ray]'") from None
    if not (isinstance(gpus, (int, float)) and math.isfinite(gpus) and gpus >= 0):
        raise UsageError(f"--ray-gpus-per-job {gpus!r}: give a finite number of GPUs, 0 or more")
    temp_dir = None
    if not ray.is_initialized():
        local = address in ("", "local")
        if not local:
            _probe_address(address, timeout)
        else:
            temp_dir = _ray_temp_dir()
        kwargs: dict[str, Any] = {"include_dashboard": False, "log_to_driver": False, "configure_logging": True,
                                  "logging_level": logging.ERROR}
        if temp_dir is not None:
            kwargs["_temp_dir"] = temp_dir
        try:
            ray.init(address=None if local else address, **kwargs)
        except Exception as exc:  # Ray's own errors, one line
            if temp_dir is not None:
                remove_temp_dir(temp_dir)
            first = (str(exc).splitlines() or [type(exc).__name__])[0][:300]
            raise DFlashError(f"--ray {address or 'local'}: Ray could not start or connect ({type(exc).__name__}: "
                              f"{first})") from None
    try:
        have = ray.cluster_resources()
        if temp_dir is not None and gpus > have.get("GPU", 0.0):  # a local cluster's resources are all it has
            raise DFlashError(f"--ray-gpus-per-job {gpus:g}: the Ray cluster has {have.get('GPU', 0.0):g} GPU(s) "
                              f"(its resources: {have.get('CPU', 0.0):g} CPU) — lower it, or give a cluster with GPUs")
        probe = ray.remote(num_cpus=1, num_gpus=gpus, max_retries=0)(_probe).remote()
        try:
            ray.get(probe, timeout=timeout)
        except ray.exceptions.GetTimeoutError:
            ray.cancel(probe, force=True)
            raise DFlashError(f"the Ray cluster did not start a task with 1 CPU and {gpus:g} GPU within "
                              f"--ray-timeout {timeout:g} s (its resources: {have.get('CPU', 0.0):g} CPU, "
                              f"{have.get('GPU', 0.0):g} GPU)") from None
    except BaseException:
        disconnect_ray(temp_dir)
        raise
    return ray, temp_dir


def disconnect_ray(temp_dir: str | None) -> None:
    """Disconnect (a local cluster: stop it and remove its folder). Only what this run started is stopped."""
    try:
        import ray

        if temp_dir is not None and ray.is_initialized():
            ray.shutdown()
    finally:
        if temp_dir is not None:
            remove_temp_dir(temp_dir)


def run_ray(specs: Sequence[JobSpec], connection: tuple[Any, str | None], gpus: float, done: Done,
            say: Callable[[str], None]) -> None:
    """The jobs as Ray tasks on a `connect_ray` connection (its owner ends it)."""
    ray, _ = connection
    task = ray.remote(num_cpus=1, num_gpus=gpus, max_retries=0)(run_job)
    pending = {}
    for s in specs:
        say(f"{s.type_name}: started (Ray task)")
        pending[task.remote(s)] = s
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
            except ray.exceptions.RayError as exc:  # a worker lost, the cluster gone: one line
                done(spec, DFlashError(f"{spec.type_name}: Ray: {type(exc).__name__}: "
                                       f"{(str(exc).splitlines() or [''])[0][:300]}"))
    except BaseException:
        for ref in pending:
            ray.cancel(ref, force=True)
        raise
