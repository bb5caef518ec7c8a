"""What ``dflash-release`` checks of its arguments before any work: the types, the numbers, the llama-server builds."""

from __future__ import annotations

import math
import os
from typing import TYPE_CHECKING, Any, Sequence

from ..errors import UsageError
from ..filetypes import ALL_FILE_TYPES
from .schema import MAX_RELEASE_PROMPTS
from .serving_record import build_name

if TYPE_CHECKING:
    from ..accept.serving_plan import ServingPlan

MAX_SEED = 2**63 - 1


def release_types() -> tuple[str, ...]:
    from ..quantize.policy import PRESETS

    return (*(n for n, ft in ALL_FILE_TYPES.items() if ft.quantize_target), *PRESETS)


def parse_types(types: str | Sequence[str]) -> list[str]:
    """``bf16,q8_0,…`` → llama.cpp's spellings, in order, each once; an unknown type is a usage error."""
    names = [t.strip() for t in (types.split(",") if isinstance(types, str) else types) if t.strip()]
    known = release_types()
    out: list[str] = []
    from ..filetypes import FILE_TYPE_ALIASES

    for n in names:
        up = FILE_TYPE_ALIASES.get(n.upper(), n.upper())  # llama-quantize's aliases: Q3_K is Q3_K_M
        if up not in known:
            raise UsageError(f"--types {n}: not a release type — choose from {', '.join(known)}")
        if up not in out:
            out.append(up)
    if not out:
        raise UsageError("--types: give at least one type")
    return out


def _check_arguments(seed: int, workers: int | None, max_prompts: int | None, ray_timeout: float) -> None:
    if isinstance(seed, bool) or not isinstance(seed, int) or not 0 <= seed <= MAX_SEED:
        raise UsageError(f"--seed {seed}: give an integer from 0 to {MAX_SEED}")
    if workers is not None and workers < 1:
        raise UsageError(f"--jobs {workers}: give at least 1")
    if max_prompts is not None and not 1 <= max_prompts <= MAX_RELEASE_PROMPTS:
        raise UsageError(f"--max-prompts {max_prompts}: a release measures 1 to {MAX_RELEASE_PROMPTS} prompts")
    if not (isinstance(ray_timeout, (int, float)) and math.isfinite(ray_timeout) and ray_timeout > 0):
        raise UsageError(f"--ray-timeout {ray_timeout!r}: give a positive number of seconds")


def serving_plans(llama_servers: Sequence[str | os.PathLike], target_ggufs: Sequence[str],
                  draft_n_max: Sequence[int], draft_cache_types: Sequence[str], src: Any, *, max_new_tokens: int,
                  seed: int, threads: int, extra_args: Sequence[str],
                  timeout: float) -> tuple[tuple[str, ...], tuple[ServingPlan, ...]]:
    """The ``--llama-server`` builds as a tuple and each build's serving plan (`accept.serving_plan.plan_serving`:
    a target GGUF, a llama-server in the folder, an n-max the drafter can draft, …), checked before any work; and
    builds the card can tell apart."""
    servers = tuple(str(b) for b in llama_servers)
    if not servers:
        if draft_n_max or draft_cache_types:
            raise UsageError("--draft-n-max / --draft-cache-type are how llama-server serves the files: give "
                             "--llama-server BIN_DIR too")
        return servers, ()
    from ..accept.run import _block_size
    from ..accept.serving_plan import plan_serving
    from ..llama_cpp.server import find_server

    names: dict[str, str] = {}
    binaries: dict[str, str] = {}
    for b in servers:
        real = os.path.realpath(find_server(b))  # a build given twice (a link to it) is one build
        if real in binaries:
            raise UsageError(f"--llama-server {b}: the same llama-server as --llama-server {binaries[real]} (a link "
                             "to the same build) — give each build once")
        binaries[real] = b
        n = build_name(b) or b
        if n in names:
            raise UsageError(f"--llama-server {b}: the card would name it {n}, as it names {names[n]} — give the "
                             "builds folders of different names")
        names[n] = b
    # every file of the release drafts as its source does: its block size bounds an n-max (opened only for one)
    drafter = [(str(src), _block_size(src) if draft_n_max else 0)]
    plans = tuple(plan_serving(drafter, llama_server=b, target_ggufs=target_ggufs, draft_n_max=draft_n_max,
                               draft_cache_types=draft_cache_types, max_new_tokens=max_new_tokens, seed=seed,
                               threads=threads, llama_cpp_args=extra_args, timeout=timeout) for b in servers)
    return servers, plans
