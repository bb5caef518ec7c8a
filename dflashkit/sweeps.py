"""The levels a measurement sweeps: context lengths (``--context``) and concurrent requests (``--parallel``).

Both are lists ``N[,N…]`` given on the command line of ``dflash-accept``, ``dflash-parity`` and ``dflash-release``
and parsed here, once, for all of them (no torch: the command lines import this at start-up). A context length is a
token count, ``4k`` = 4096 (llama.cpp's ``-c`` reads it so too) and ``1M`` = 1048576, in ASCII digits (a regular
expression's digit class and int() take '١٢٨' for 128); every level is bounded before anything is allocated for it:
by `MAX_CONTEXT_TOKENS` here, by the target's context when the target is loaded.
"""

from __future__ import annotations

import re

from .errors import UsageError

#: the longest context a level may ask for (1 Mi tokens, ``1M``: past every target's context in circulation)
MAX_CONTEXT_TOKENS = 1 << 20
#: the most context levels one run measures (each is a full pass over the prompts for every drafter)
MAX_CONTEXT_LEVELS = 16
#: the most concurrent requests one level may ask for (llama-server's -np; each slot holds a context)
MAX_PARALLEL = 64
#: the most parallel levels one run measures
MAX_PARALLEL_LEVELS = 8

_LEVEL = re.compile(r"0*([0-9]{1,9})([kKmM]?)")  # (leading zeros are no part of the count's size)
_SCALE = {"": 1, "k": 1 << 10, "m": 1 << 20}


def _levels(text: str, option: str, *, maximum: int, max_levels: int, minimum: int, suffix: bool) -> tuple[int, ...]:
    if not isinstance(text, str) or not text.strip():
        raise UsageError(f"{option}: give a list of counts such as {'0,1k,4k' if suffix else '1,2,4'}")
    values: list[int] = []
    for part in text.split(","):
        item = part.strip()
        match = _LEVEL.fullmatch(item)
        if match is None or (match.group(2) and not suffix):
            shown = repr(item[:40]) if item.isprintable() else ascii(item[:40])
            raise UsageError(f"{option} {shown}: not a count — give whole numbers"
                             + (" (4k = 4096)" if suffix else "") + " separated by commas")
        value = int(match.group(1)) * _SCALE[match.group(2).lower()]
        if not minimum <= value <= maximum:
            raise UsageError(f"{option} {item}: must be {minimum}..{maximum:,}")
        if value in values:
            raise UsageError(f"{option} {item}: given twice")
        values.append(value)
        if len(values) > max_levels:
            raise UsageError(f"{option}: at most {max_levels} levels in one run")
    return tuple(sorted(values))


def parse_context_levels(text: str) -> tuple[int, ...]:
    """``--context 0,512,4k,1M`` → (0, 512, 4096, 1048576): tokens of long context before each prompt, ascending."""
    return _levels(text, "--context", maximum=MAX_CONTEXT_TOKENS, max_levels=MAX_CONTEXT_LEVELS, minimum=0,
                   suffix=True)


def parse_parallel_levels(text: str) -> tuple[int, ...]:
    """``--parallel 1,2,4`` → (1, 2, 4): llama-server's ``-np`` and as many concurrent requests, ascending."""
    return _levels(text, "--parallel", maximum=MAX_PARALLEL, max_levels=MAX_PARALLEL_LEVELS, minimum=1,
                   suffix=False)


def level_label(tokens: int) -> str:
    """4096 → ``4k``, 1048576 → ``1M``, 1536 → ``1536``: how a context level is shown (the way it may be given)."""
    if tokens and tokens % (1 << 20) == 0:
        return f"{tokens >> 20}M"
    return f"{tokens >> 10}k" if tokens and tokens % 1024 == 0 else str(tokens)
