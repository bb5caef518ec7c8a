"""User-facing errors.

Every error a user can cause is raised as one of these with a one-line message that names the
file, tensor or key involved and, when there is one, the fix. The CLI prints the message and
exits with ``exit_code`` (1 for bad input, 2 for usage); tracebacks only with ``--debug``.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any


class DFlashError(Exception):
    """Bad input (a file, a config value, a tensor): exit code 1."""

    exit_code = 1


class UsageError(DFlashError):
    """The command line itself is wrong (conflicting or missing options): exit code 2."""

    exit_code = 2


class FormatError(DFlashError):
    """A file is malformed. ``check_id`` is a stable id (``gguf.truncated``, ``safetensors.dtype`` ...)
    that ``dflash-inspect`` reports; ``values`` holds the numbers involved."""

    def __init__(self, path: "str | os.PathLike[str]", check_id: str, message: str, **values: "Any") -> None:
        self.path = Path(path)
        self.check_id = check_id
        self.detail = message
        self.values = values
        super().__init__(f"{self.path}: {message}")
