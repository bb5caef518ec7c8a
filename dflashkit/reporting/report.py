"""`Report`: a title, a one-line status, summary fields and sections, rendered in each of `FORMATS`; `verdict`, the
status every command derives the same way; and the report's JSON form (strict JSON, every row key at full precision).
"""

from __future__ import annotations

import html
import json
import math
from dataclasses import dataclass, field
from typing import Any, Callable, Sequence

from ..errors import DFlashError
from .html_page import _CSS, _html_section
from .markdown import _md, _md_section
from .model import Field, Notes, Section, Table
from .text import _LEVEL_MARK, _text_section
from .values import _one_line, format_value

FORMATS = ("text", "json", "markdown", "html")


def verdict(failures: Sequence[str], warnings: str | None, headline: str, ok_level: str = "ok") -> tuple[str, str]:
    """The one-line status of a report and its level, the same way in every command: the failures (error), else the
    headline with what deserves a look (warning), else the headline."""
    if failures:
        return "; ".join(failures), "error"
    if warnings:
        return warnings, "warning"
    return headline, ok_level


@dataclass
class Report:
    title: str
    status: str  # one line: the verdict
    level: str = "ok"  # of the status: ok | info | warning | error
    summary: list[Field] = field(default_factory=list)
    sections: list[Section] = field(default_factory=list)

    def section(self, id: str) -> Section:
        for s in self.sections:
            if s.id == id:
                return s
        raise KeyError(id)

    def render(self, fmt: str) -> str:
        renderers = {"text": self.to_text, "json": self.to_json, "markdown": self.to_markdown, "html": self.to_html}
        try:
            return renderers[fmt]()
        except KeyError:
            raise DFlashError(f"unknown report format '{fmt}' (known: {', '.join(FORMATS)})") from None

    # ---- JSON -------------------------------------------------------------------------------
    def to_dict(self) -> dict[str, Any]:
        return _jsonable(
            {
                "title": self.title,
                "status": self.status,
                "level": self.level,
                "summary": {f.json_key: f.value for f in self.summary},
                "sections": [_section_dict(s) for s in self.sections],
            }
        )

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), indent=2, allow_nan=False) + "\n"

    # ---- text -------------------------------------------------------------------------------
    def to_text(self) -> str:
        out = [_one_line(self.title), f"{_LEVEL_MARK[self.level]}{_one_line(self.status)}", ""]
        width = max((len(f.label) for f in self.summary), default=0)
        out += [f"  {f.label.ljust(width)}  {_one_line(format_value(f.value, f.fmt))}" for f in self.summary]
        return _joined(out, self.sections, _text_section)

    # ---- Markdown ---------------------------------------------------------------------------
    def to_markdown(self) -> str:
        out = [f"## {_md(self.title)}", "", f"**{_md(self.status)}**", ""]
        out += [f"- **{_md(f.label)}**: {_md(format_value(f.value, f.fmt))}" for f in self.summary]
        return _joined(out, self.sections, _md_section)

    # ---- HTML -------------------------------------------------------------------------------
    def to_html(self) -> str:
        e = html.escape
        parts = [
            "<!DOCTYPE html>",
            '<html lang="en"><head><meta charset="utf-8">',
            f"<title>{e(self.title)}</title>",
            f"<style>{_CSS}</style></head><body>",
            f"<h1>{e(self.title)}</h1>",
            f'<p class="status {e(self.level)}">{e(self.status)}</p>',
        ]
        if self.summary:
            parts.append('<table class="summary">')
            parts += [
                f"<tr><th>{e(f.label)}</th><td>{e(format_value(f.value, f.fmt))}</td></tr>" for f in self.summary
            ]
            parts.append("</table>")
        for s in self.sections:
            parts.append(_html_section(s))
        parts.append("</body></html>")
        return "\n".join(parts) + "\n"


def _joined(head: list[str], sections: Sequence[Section], render: Callable[[Section], list[str]]) -> str:
    """``head`` and each section's lines, a blank line before each section except within a run of empty ones (one
    line, "Title: none": kept together)."""
    out = list(head)
    previous_empty = False
    for s in sections:
        lines = render(s)
        empty = len(lines) == 1
        if not (empty and previous_empty):
            out.append("")
        out.extend(lines)
        previous_empty = empty
    return "\n".join(out).rstrip() + "\n"


def _jsonable(value: Any) -> Any:
    if isinstance(value, dict):
        return {str(k): _jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple, set, frozenset)):
        items = sorted(value) if isinstance(value, (set, frozenset)) else value
        return [_jsonable(v) for v in items]
    if hasattr(value, "tolist") and not hasattr(value, "item"):  # a GGUF numeric array
        return [_jsonable(v) for v in value.tolist()]
    if hasattr(value, "item") and callable(value.item):  # numpy scalar
        value = value.item()
    if isinstance(value, float) and not math.isfinite(value):
        return "nan" if math.isnan(value) else ("inf" if value > 0 else "-inf")
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    return str(value)


def _section_dict(s: Section) -> dict[str, Any]:
    base = {"id": s.id, "title": s.title, "level": s.level, "note": s.note}
    if isinstance(s, Table):
        return {
            **base,
            "type": "table",
            "columns": [{"key": c.key, "header": c.header} for c in s.columns],
            "rows": s.rows,
            "flagged": sorted(s.flagged),
        }
    if isinstance(s, Notes):
        return {**base, "type": "notes", "items": s.items}
    return {
        **base,
        "type": "bar_chart",
        "value_label": s.value_label,
        "reference": s.reference,
        "groups": [
            {"label": g.label, "bars": [{"label": b.label, "value": b.value, "series": b.series} for b in g.bars]}
            for g in s.groups
        ],
    }
