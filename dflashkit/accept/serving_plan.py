"""The serving plan: every llama-server option of a measurement checked once, before any work, and carried as one
value (`ServingPlan`) to what measures — ``dflash-accept --llama-server / --server-url`` (`run_acceptance`), a
release's serving step (one plan per ``--llama-server`` build, made when its arguments are read) and
`serve_files`. `measure_serving` given a plan checks nothing again; each check's message exists here once.

The prompts a plan is measured on are prepared once too (`serving_only.prepare_prompts`).
"""

from __future__ import annotations

import os
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Sequence

from ..errors import DFlashError, UsageError
from ..llama_cpp import check_extra_args
from ..llama_cpp.http import same_server
from ..llama_cpp.server import REQUEST_TIMEOUT_S, RemoteServer, find_server


@dataclass(frozen=True)
class ServingPlan:
    """What a serving measurement runs, checked (`plan_serving`): where the servers come from (a build's bin/ folder
    that dflashkit starts, or a running server and its target alone), on which target GGUFs, with which draft
    n-max and draft KV cache types, how long the replies, the seed, the threads and extra arguments of every
    llama.cpp process, the timeout of each start and request, and the ``-np`` levels of the concurrency sweep."""

    llama_server: str | None = None
    server_url: str | None = None
    baseline_url: str | None = None
    target_ggufs: tuple[str, ...] = ()
    draft_n_max: tuple[int | None, ...] = (None,)
    draft_cache_types: tuple[str | None, ...] = (None,)
    max_new_tokens: int = 128
    seed: int = 0
    threads: int = 1
    extra_args: tuple[str, ...] = ()
    timeout: float = REQUEST_TIMEOUT_S
    parallel: tuple[int, ...] = ()

    def on_targets(self, target_ggufs: Sequence[str | os.PathLike]) -> "ServingPlan":
        """The plan on target GGUFs made after it was checked (llama.cpp's converter writes the target's)."""
        return replace(self, target_ggufs=tuple(str(g) for g in target_ggufs))


def check_target_ggufs(target_ggufs: Sequence[Any], needed_by: str | None = "--llama-server",
                       alternative: str = "repeat it to sweep quantized targets") -> None:
    """The target GGUFs a llama.cpp measurement runs on, each a file; ``needed_by`` (an option) needs at least one,
    unless None (the caller has another way to a target GGUF: say it as ``alternative``)."""
    for g in target_ggufs:
        if not Path(g).is_file():
            raise UsageError(f"--target-gguf {g}: no such file")
    if not target_ggufs and needed_by is not None:
        raise UsageError(f"{needed_by} needs the target as a GGUF: pass --target-gguf FILE ({alternative})")


def check_n_max_fits(drafters: Sequence[tuple[str, int]], draft_n_max: Sequence[int | None]) -> None:
    """An n-max above what a drafter drafts a round (its block − 1) is a usage error: llama.cpp clamps it there, so
    the figure would be labelled with an n-max that never ran. ``drafters``: (path, block size)."""
    for n in draft_n_max:
        for path, block in drafters:
            if n is not None and n > block - 1 and _clamps_n_max(path):
                raise UsageError(f"--draft-n-max {n}: {Path(path).name} drafts at most {block - 1} tokens a round "
                                 f"(block size {block}; llama.cpp clamps n-max there) — give at most {block - 1}")


def _clamps_n_max(path: str) -> bool:
    """Whether llama.cpp clamps a drafter's n-max to its block (DFlash; a chain drafter such as EAGLE-3: no)."""
    from ..drafters import open_drafter

    try:
        with open_drafter(path) as d:
            return d.family is None or d.family.clamps_n_max
    except (DFlashError, OSError):  # a file that cannot be read is reported by the command that reads it
        return True


def check_parallel_served(parallel: Sequence[int], llama_server: Any, server_url: str | None = None) -> tuple[int, ...]:
    """The ``--parallel`` levels, bounded (`sweep.check_parallel_levels`); they need servers dflashkit starts
    (``-np`` is set where a server starts)."""
    if not parallel:
        return ()
    from .sweep import check_parallel_levels

    levels = tuple(check_parallel_levels(parallel))
    if not llama_server:
        raise UsageError("--parallel starts llama-server with -np N for each level: pass --llama-server BIN_DIR"
                         + (" (a server at --server-url keeps the slots it was started with)" if server_url else ""))
    return levels


def plan_serving(
    drafters: Sequence[tuple[str, int]],
    *,
    llama_server: str | os.PathLike | None = None,
    server_url: str | None = None,
    baseline_url: str | None = None,
    target_ggufs: Sequence[str | os.PathLike] = (),
    draft_n_max: Sequence[int | None] = (None,),
    draft_cache_types: Sequence[str | None] = (None,),
    max_new_tokens: int = 128,
    seed: int = 0,
    threads: int = 1,
    llama_cpp_args: Sequence[str] = (),
    timeout: float = REQUEST_TIMEOUT_S,
    parallel: Sequence[int] = (),
    target_ggufs_later: bool = False,
) -> ServingPlan:
    """Check every serving option once (usage errors, before any work) and return them as one `ServingPlan`.

    ``drafters``: (path, block size) of what will be served, for the n-max bound. ``target_ggufs_later``: the
    caller makes the target's GGUF itself when none is given (`ServingPlan.on_targets`). A running server (and the
    target alone beside it) is asked for its health now, so a mistyped URL is said before minutes of other work."""
    if llama_server is not None and server_url is not None:
        raise UsageError("--llama-server starts its own servers, --server-url asks a running one: give one of them")
    if baseline_url is not None and server_url is None:
        raise UsageError("--baseline-url is the target alone beside --server-url URL: pass --server-url too")
    draft_n_max, draft_cache_types = tuple(draft_n_max) or (None,), tuple(draft_cache_types) or (None,)
    parallel = check_parallel_served(parallel, llama_server, server_url)
    if llama_server is None and server_url is None:
        raise UsageError("give one of --llama-server BIN_DIR (dflashkit starts the servers) or --server-url URL")
    if server_url is not None and draft_n_max + draft_cache_types != (None, None):
        raise UsageError("--draft-n-max / --draft-cache-type are set where the server starts: with --server-url they "
                         "are the running server's own")
    if max_new_tokens < 3:
        raise UsageError(f"--max-new-tokens {max_new_tokens}: llama-server drafts only with 2 tokens still to "
                         "generate after the first — give at least 3")
    if not drafters:
        raise UsageError("give at least one drafter to measure through llama-server")
    check_n_max_fits(drafters, draft_n_max)
    extra_args = tuple(check_extra_args(llama_cpp_args))
    if llama_server is not None:
        find_server(llama_server)
        check_target_ggufs(target_ggufs, None if target_ggufs_later else "--llama-server")
    else:
        assert server_url is not None
        if extra_args:
            raise UsageError("--llama-cpp-arg goes to the llama.cpp processes dflashkit starts; --server-url "
                             "asks a running server (pass the arguments where you start it)")
        if baseline_url is not None and same_server(server_url, baseline_url):
            raise UsageError(f"--baseline-url {baseline_url} is the server of --server-url {server_url}: the "
                             "target alone must be a second server, started without -md")
        RemoteServer(server_url, request_timeout=float(timeout))
        if baseline_url is not None:
            RemoteServer(baseline_url, label=f"target alone {baseline_url}", request_timeout=float(timeout))
    return ServingPlan(str(llama_server) if llama_server is not None else None, server_url, baseline_url,
                       tuple(str(g) for g in target_ggufs), draft_n_max, draft_cache_types, max_new_tokens, seed,
                       threads, extra_args, float(timeout), tuple(parallel))
