"""A report's sections as Markdown: tables, lists, and every string a file may hold made inert (`_md`).

`markdown_section` is public: a model card's table is rendered the same way as every report's.
"""

from __future__ import annotations

import html

from ..bounds import one_line
from .model import BarChart, Notes, Section, Table
from .values import _cells, _is_number


def _md(text: str) -> str:
    """A cell or a line of Markdown from any string a file may hold: control characters shown escaped, HTML
    escaped (no raw <script> or <img onerror>), link and image syntax ([...](...), <scheme:...>) neutralised,
    table pipes escaped, one line."""
    text = one_line(str(text).replace("\n", " "))
    text = html.escape(text, quote=False)
    for ch in ("\\", "[", "]", "|"):  # no [text](url), ![img](url) or [ref]: the brackets are literal
        text = text.replace(ch, "\\" + ch) if ch != "\\" else text.replace("\\", "\\\\")
    return text


def markdown_text(text: str) -> str:
    """Any string from input as inert Markdown text on one line (`_md`): what a model card says of a name."""
    return _md(text)


def markdown_section(s: Section) -> list[str]:
    """One section as Markdown lines: the same rendering every report's Markdown uses (a model card's table too)."""
    return _md_section(s)


def _md_section(s: Section) -> list[str]:
    icon = {"error": " ❌", "warning": " ⚠️"}.get(s.level, "")
    if isinstance(s, BarChart):
        return [f"### {_md(s.title)}", "", f"_{len(s.bars)} bars in {len(s.groups)} groups: see the HTML report._"]
    count = len(s.rows) if isinstance(s, Table) else len(s.items)
    if count == 0:
        return [f"- **{_md(s.title)}**: {_md(s.empty)}"]
    out = [f"### {_md(s.title)}{icon}", ""]
    if s.note:
        out += [_md(s.note), ""]
    if isinstance(s, Notes):
        return out + [f"- {_md(item)}" for item in s.items]
    numeric = [all(_is_number(row.get(c.key)) or row.get(c.key) is None for row in s.rows) for c in s.columns]
    out.append("| " + " | ".join(_md(c.header) for c in s.columns) + " |")
    out.append("|" + "|".join("---:" if n else "---" for n in numeric) + "|")
    for i, r in enumerate(_cells(s)):
        cells = [_md(v) for v in r]
        if i in s.flagged:
            cells[0] = f"**{cells[0]}**"
        out.append("| " + " | ".join(cells) + " |")
    return out
