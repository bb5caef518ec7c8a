"""Audit rows of the rope area (docs/causality.md): see `dflashkit.divergences`."""

from __future__ import annotations

from . import Rule

RULES: list[Rule] = []
