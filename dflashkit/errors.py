"""User-facing errors.

Every error a user can cause is raised as one of these with a one-line message that names the
file, tensor or key involved and, when there is one, the fix. The CLI prints the message and
exits with ``exit_code`` (1 for bad input, 2 for usage); tracebacks only with ``--debug``.
"""

from __future__ import annotations


class DFlashError(Exception):
    """Bad input (a file, a config value, a tensor): exit code 1."""

    exit_code = 1


class UsageError(DFlashError):
    """The command line itself is wrong (conflicting or missing options): exit code 2."""

    exit_code = 2
