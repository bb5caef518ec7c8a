"""Check registry and the per-file context every check receives.

A check is a function ``(ctx: InspectContext) -> Iterable[Finding]`` registered with
:func:`register_check`. Add drafter-metadata, dialect or target checks in a new module of this
package: every submodule of ``dflashkit.inspect`` is imported before a run, so registering is
all it takes, with no edit to the core loop::

    from dflashkit.inspect.checks import InspectContext, register_check
    from dflashkit.inspect.findings import Finding, warning

    @register_check("drafter.block_size", kinds=("gguf",), order=200)
    def check_block_size(ctx: InspectContext) -> Iterable[Finding]:
        if ctx.gguf.get("dflash.block_size") is None:
            yield warning("drafter.block_size", f"{ctx.path}: no dflash.block_size key — ...")

Checks run in ``(order, name)`` order; structure checks use order < 100. A check may add keys to
``ctx.summary`` (e.g. ``dialect``) and read ``ctx.findings`` (everything reported so far, for
example to skip itself when the structure is already broken). By default a check only runs when
the file opened (``ctx.gguf`` / ``ctx.checkpoint`` set); pass ``needs_open=False`` otherwise.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from dflashkit.inspect.findings import Finding, Severity
from dflashkit.io.gguf_reader import GGUFFile
from dflashkit.io.safetensors_reader import SafetensorsCheckpoint

KINDS = ("gguf", "safetensors")


@dataclass
class InspectContext:
    path: Path
    kind: str  # "gguf" | "safetensors" | "unknown" | "missing"
    gguf: GGUFFile | None = None
    checkpoint: SafetensorsCheckpoint | None = None
    target: str | None = None  # --target (target model to check a drafter against)
    expect: str | None = None  # --expect (expected dialect / profile)
    strict: bool = False
    summary: dict[str, Any] = field(default_factory=dict)
    findings: list[Finding] = field(default_factory=list)
    cache: dict[str, Any] = field(default_factory=dict)  # scratch shared by checks (e.g. an opened target)

    @property
    def opened(self) -> bool:
        return self.gguf is not None or self.checkpoint is not None

    def has_errors(self, prefix: str = "") -> bool:
        return any(f.severity is Severity.ERROR and f.id.startswith(prefix) for f in self.findings)

    def close(self) -> None:
        for f in (self.gguf, self.checkpoint):
            if f is not None:
                f.close()
        for v in self.cache.values():
            close = getattr(v, "close", None)
            if callable(close):
                close()


CheckFn = Callable[[InspectContext], Iterable[Finding]]


@dataclass(frozen=True)
class Check:
    name: str
    fn: CheckFn
    kinds: frozenset[str]
    order: int = 100
    needs_open: bool = True


_REGISTRY: dict[str, Check] = {}


def register_check(
    name: str, *, kinds: Iterable[str] = KINDS, order: int = 100, needs_open: bool = True
) -> Callable[[CheckFn], CheckFn]:
    """Decorator adding a check; re-registering a name replaces it (safe on module reload)."""

    def deco(fn: CheckFn) -> CheckFn:
        _REGISTRY[name] = Check(name, fn, frozenset(kinds), order, needs_open)
        return fn

    return deco


def registered_checks(kind: str | None = None) -> list[Check]:
    checks = [c for c in _REGISTRY.values() if kind is None or kind in c.kinds]
    return sorted(checks, key=lambda c: (c.order, c.name))
