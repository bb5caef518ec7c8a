"""How one value is shown: a table cell or a summary field (`format_value`), a byte count (`human_size`), and the
labels that tell paths apart (`distinct_labels`).

Shared by the text, Markdown and HTML renderers (a table's cells are formatted once, here); JSON never goes through
here (it carries every value at full precision).
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

from ..bounds import one_line
from .model import Table


def format_value(value: Any, fmt: str = "") -> str:
    """Human form of one cell; JSON never goes through here."""
    if value is None:
        return "-"
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, tuple):  # paired values, as in a "mean / p99 / max" label
        if fmt == "shape":
            return "×".join(str(v) for v in value) if value else "scalar"
        return " / ".join(format_value(v, fmt) for v in value)
    if isinstance(value, list):
        if fmt == "shape":
            return "×".join(str(v) for v in value) if value else "scalar"
        return "[" + ", ".join(format_value(v, fmt) for v in value) + "]"
    if isinstance(value, float) and not math.isfinite(value):
        return "nan" if math.isnan(value) else ("inf" if value > 0 else "-inf")
    if fmt == "pct" and isinstance(value, (int, float)):
        return f"{value * 100:.3g}%"
    if fmt and isinstance(value, (int, float)):
        return format(value, fmt)
    return str(value)


def human_size(n: int | None) -> str:
    """A byte count for people: ``512 B``, ``1.50 KiB``, ... (``?`` when unknown)."""
    if n is None:
        return "?"
    size = float(n)
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if size < 1024 or unit == "TiB":
            return f"{int(size)} B" if unit == "B" else f"{size:.2f} {unit}"
        size /= 1024
    raise AssertionError("unreachable")


def _one_line(text: Any) -> str:
    return one_line(str(text))


def _is_number(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool)


def _cells(t: Table) -> list[list[str]]:
    return [[_one_line(format_value(row.get(c.key), c.fmt)) for c in t.columns] for row in t.rows]


def distinct_labels(paths: list[str]) -> list[str]:
    """Per path, its shortest tail of path components that no other path shares (``a/d.gguf`` and ``b/d.gguf``,
    not ``d.gguf`` twice): two drafters of one file name are told apart in every table and chart."""
    parts = [Path(p).parts or (p,) for p in paths]
    out = []
    for i, own in enumerate(parts):
        for k in range(1, len(own) + 1):
            tail = own[-k:]
            if all(other[-k:] != tail for j, other in enumerate(parts) if j != i):
                break
        out.append(str(Path(*tail)) if tail else paths[i])
    return out
