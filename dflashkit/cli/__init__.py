"""Command-line entry points, one module per command. Thin: parse, call the library, print.

Errors: one line on stderr, exit 1 for bad input and 2 for usage; ``--debug`` shows the traceback (`common`).
``dflashkit.cli:<name>_command`` is each console script's entry point. A command's module is imported when its
name is first asked for: a console script imports ``dflashkit.cli`` and takes one name, and importing every
command (release, accept, … for ``dflash-convert``) cost 0.4 s of each command's start-up.
"""

from __future__ import annotations

import importlib
from typing import Any

__all__ = ["accept_command", "convert_command", "diff_command", "imatrix_command", "inspect_command",
           "parity_command", "quantize_command", "release_command"]


def __getattr__(name: str) -> Any:
    if name in __all__:
        return getattr(importlib.import_module(f".{name.removesuffix('_command')}", __name__), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted([*globals(), *__all__])
