"""The measuring settings ``dflash-accept`` and ``dflash-release`` share, each concern one frozen value: which
prompts and how long (`PromptOptions`), and llama.cpp — the builds, the target as a GGUF, the sweep, the extra
arguments, threads and time bound (`LlamaCppOptions`). The command lines define these options once
(`dflashkit.cli.common.prompt_options` / ``llama_cpp_options``) and pass the values; `run_acceptance` and
`dflashkit.release.release` take them as they are.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import Any, Mapping

#: the new tokens per prompt when nothing says otherwise, in every command that measures τ
DEFAULT_MAX_NEW_TOKENS = 128
#: the longest one llama.cpp run, server start or request may take (--llama-cpp-timeout)
DEFAULT_LLAMA_CPP_TIMEOUT_S = 600.0


@dataclass(frozen=True)
class PromptOptions:
    """The prompts every τ and speed-up is measured on, and how they are rendered."""

    prompts: str | os.PathLike | None = None  # a JSONL file; None: the built-in set
    max_prompts: int | None = None
    max_new_tokens: int = DEFAULT_MAX_NEW_TOKENS
    seed: int = 0
    reasoning: str | None = None
    chat_template_kwargs: Mapping[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class ContextOptions:
    """``--context N[,N…]`` and its source ``--context-file``: the lengths of long context each prompt is measured
    after (`dflashkit.sweeps.parse_context_levels`; empty: none, the prompts as they are)."""

    levels: tuple[int, ...] = ()
    file: str | None = None


@dataclass(frozen=True)
class LlamaCppOptions:
    """llama.cpp, where it is asked for: ``llama_cpp`` (llama-speculative-simple: τ in llama.cpp) and
    ``llama_servers`` (llama-server builds: speed-up), the target GGUFs, the n-max × draft-cache sweep
    (empty: the defaults), and what every llama.cpp process gets."""

    llama_cpp: str | None = None
    llama_servers: tuple[str, ...] = ()
    target_ggufs: tuple[str, ...] = ()
    llama_cpp_src: str | None = None
    draft_n_max: tuple[int, ...] = ()
    draft_cache_types: tuple[str, ...] = ()
    extra_args: tuple[str, ...] = ()
    timeout: float = DEFAULT_LLAMA_CPP_TIMEOUT_S
    threads: int = 1
    parallel: tuple[int, ...] = ()  # --parallel: llama-server's -np and as many concurrent requests, per level
