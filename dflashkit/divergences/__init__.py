"""Every rule, past per-layer causality (`dflashkit.causality`), where llama.cpp runs a drafter's GGUF otherwise than
the checkpoint's reference runs the checkpoint — one table, read by every command.

A `Rule` looks at a checkpoint (its `DrafterSpec` as the reference reads it, and its HF config) and says, in one
phrase, what the reference runs and what llama.cpp will run from the GGUF dflashkit writes; None where the two
agree. ``dflash-convert`` to the llama.cpp dialect warns with each (``--strict`` refuses), ``dflash-parity`` and
``dflash-accept`` name them as likely causes when an HF checkpoint is compared with a llama.cpp GGUF, and the runtime
runs a llama.cpp GGUF by llama.cpp's rule (``RuntimeConfig.llama_cpp_rules``) — so the loss is measured, not
assumed. The audit these rows come from is docs/causality.md; each area keeps its rows in its own module.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Mapping


@dataclass(frozen=True)
class Rule:
    """One row of the audit: ``field`` the config field (or fields) it reads; ``check(spec, config)`` → the phrase
    "the reference …; llama.cpp …", or None."""

    id: str
    field: str
    check: Callable[[Any, Mapping[str, Any] | None], str | None]
    #: the row is a difference of the file from llama.cpp's own converter's (or of a reader of the config), not of
    #: the GGUF from the checkpoint as dflashkit's runtime runs it: never a cause of a parity or τ gap
    converter_only: bool = False


@dataclass(frozen=True)
class Divergence:
    rule: Rule
    text: str

    def line(self) -> str:
        return f"{self.rule.field}: {self.text}"


def rules() -> list[Rule]:
    """Every rule, in the order of the audit table (the area modules, imported here: no module names a family)."""
    from . import heads, rope, windows

    return [*rope.RULES, *windows.RULES, *heads.RULES]


class _FamilyRules:
    """A `DrafterSpec` seen with its family's reference rules (a runtime spec carries them; a converter's spec does
    not): ``window_from_anchor``."""

    def __init__(self, spec: Any, family: Any) -> None:
        self._spec, self.window_from_anchor = spec, bool(getattr(family, "window_from_anchor", False))

    def __getattr__(self, name: str) -> Any:
        return getattr(self._spec, name)


def divergences(spec: Any, config: Mapping[str, Any] | None, family: Any = None) -> list[Divergence]:
    """Where llama.cpp will run the GGUF of this checkpoint otherwise than its reference runs the checkpoint
    (``family``: the checkpoint's, where ``spec`` does not carry its rules)."""
    if family is not None and not hasattr(spec, "window_from_anchor"):
        spec = _FamilyRules(spec, family)
    out = []
    for rule in rules():
        text = rule.check(spec, config)
        if text:
            out.append(Divergence(rule, text))
    return out


def divergence_causes(reference: Any, candidate: Any, config: Mapping[str, Any] | None = None) -> list[str]:
    """As likely causes of a gap: the divergences of ``reference`` (an HF checkpoint's runtime spec) where
    ``candidate`` is run by llama.cpp's rules (a llama.cpp GGUF)."""
    if getattr(reference, "llama_cpp_rules", False) or not getattr(candidate, "llama_cpp_rules", False):
        return []
    return [d.line() for d in divergences(reference, config) if not d.rule.converter_only]


def hf_config(path: Any) -> Mapping[str, Any] | None:
    """An HF checkpoint's config.json (None for a GGUF or an unreadable directory: the rules then read the spec)."""
    import os

    from ..errors import DFlashError
    from ..spec import read_config_json

    if not os.path.isdir(path):
        return None
    try:
        return read_config_json(path)
    except DFlashError:
        return None
