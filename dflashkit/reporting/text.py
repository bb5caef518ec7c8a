"""A report's sections as terminal text: aligned columns, flagged rows marked ``!``, every cell on one line."""

from __future__ import annotations

from typing import Sequence

from .model import BarChart, Notes, Section, Table
from .values import _cells, _is_number, _one_line

_LEVEL_MARK = {"ok": "OK: ", "info": "", "warning": "WARNING: ", "error": "FAIL: "}


def _text_section(s: Section) -> list[str]:
    mark = {"error": " [!]", "warning": " [warning]"}.get(s.level, "")
    if isinstance(s, BarChart):
        n = len(s.bars)
        return [f"{s.title}{mark}: {n} bars in {len(s.groups)} groups (shown with --format html)"]
    count = len(s.rows) if isinstance(s, Table) else len(s.items)
    if count == 0:
        return [f"{_one_line(s.title)}: {_one_line(s.empty)}"]
    out = [f"{_one_line(s.title)} ({count}){mark}"]
    if s.note:
        out.append(f"  {_one_line(s.note)}")
    if isinstance(s, Notes):
        return out + [f"  - {_one_line(item)}" for item in s.items]
    cells = _cells(s)
    headers = [_one_line(c.header) for c in s.columns]  # a header may carry a file's or a prompt's name
    widths = [max(len(h), *(len(r[i]) for r in cells)) for i, h in enumerate(headers)]
    numeric = [all(_is_number(row.get(c.key)) or row.get(c.key) is None for row in s.rows) for c in s.columns]

    def line(values: Sequence[str], flag: str) -> str:
        padded = [v.rjust(w) if num else v.ljust(w) for v, w, num in zip(values, widths, numeric)]
        return f"{flag} " + "  ".join(padded).rstrip()

    out.append(line(headers, " "))
    out.append(line(["-" * w for w in widths], " "))
    out += [line(r, "!" if i in s.flagged else " ") for i, r in enumerate(cells)]
    return out
