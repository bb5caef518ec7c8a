"""dflashkit.inspect: the library behind ``dflash-inspect``.

:func:`inspect_paths` opens each path with the hardened readers, turns every structural problem
into a :class:`Finding`, then runs every registered check (see :mod:`dflashkit.inspect.checks`).
It never raises for a bad file: whatever the bytes, the result is a report with findings.
"""

from __future__ import annotations

import importlib
import os
import pkgutil
from collections.abc import Sequence
from pathlib import Path

from dflashkit.errors import UsageError
from dflashkit.families import folder_modules
from dflashkit.inspect.checks import Check, InspectContext, register_check, registered_checks
from dflashkit.inspect.findings import Finding, Severity
from dflashkit.inspect.report import FileReport, InspectReport

__all__ = [
    "Check",
    "FileReport",
    "Finding",
    "InspectContext",
    "InspectReport",
    "Severity",
    "inspect_path",
    "inspect_paths",
    "register_check",
    "registered_checks",
]

_loaded = False


def load_checks() -> None:
    """Import every submodule once so their @register_check decorators run (new check modules
    dropped into this package are picked up without editing this file), and every family's ``checks``."""
    global _loaded
    if _loaded:
        return
    for mod in pkgutil.iter_modules(__path__):
        importlib.import_module(f"{__name__}.{mod.name}")
    for name in folder_modules("checks"):
        importlib.import_module(name)
    _loaded = True


def _internal_error(path: Path, where: str, exc: BaseException) -> Finding:
    # A bug in a check must not hide the other findings or crash the run; it still fails the file.
    return Finding(
        "inspect.internal_error",
        Severity.ERROR,
        f"{path}: internal error in {where}: {type(exc).__name__}: {str(exc).splitlines()[0][:200] if str(exc) else ''} "
        "— please report this bug with the file",
        {"file": str(path), "where": where, "exception": type(exc).__name__},
    )


def inspect_path(
    path: str | os.PathLike[str], *, strict: bool = False, target: str | None = None, expect: str | None = None
) -> FileReport:
    """Inspect one GGUF file, safetensors file or checkpoint directory."""
    from dflashkit.inspect.structure import open_context

    load_checks()
    p = Path(path)
    try:
        ctx = open_context(p, strict=strict, target=target, expect=expect)
    except Exception as exc:  # noqa: BLE001 - reported as a finding, see _internal_error
        return FileReport(str(p), "unknown", {"file": str(p)}, [_internal_error(p, "opening the file", exc)])
    try:
        for check in registered_checks(ctx.kind):
            if check.needs_open and not ctx.opened:
                continue
            try:
                ctx.findings.extend(check.fn(ctx))
            except Exception as exc:  # noqa: BLE001
                ctx.findings.append(_internal_error(p, f"check {check.name}", exc))
    finally:
        ctx.close()
    return FileReport(str(p), ctx.kind, ctx.summary, ctx.findings)


def inspect_paths(
    paths: Sequence[str | os.PathLike[str]],
    *,
    strict: bool = False,
    target: str | None = None,
    expect: str | None = None,
) -> InspectReport:
    """Inspect many files in one call. ``strict`` makes warnings fail ``exit_code()``.
    ``target`` / ``expect`` are handed to the checks (only structural checks exist so far)."""
    if not paths:
        raise UsageError("dflash-inspect: no files given — pass one or more .gguf files or checkpoint directories")
    return InspectReport([inspect_path(p, strict=strict, target=target, expect=expect) for p in paths], strict=strict)
