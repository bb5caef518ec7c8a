"""One report model, rendered as terminal text, JSON, Markdown or a self-contained HTML page.

Commands that compare things (``dflash-diff``, later ``dflash-parity`` and ``dflash-accept``) build a
`Report` — a title, a one-line status, summary fields and a list of sections — and never format
output themselves. A section is a `Table` (columns + rows), a `Notes` list or a `BarChart`.

Rows are dicts: the table's columns choose what text/Markdown/HTML show, while JSON carries every
key of every row at full precision (non-finite floats become the strings ``"inf"``, ``"-inf"``,
``"nan"`` so the output stays strict JSON). The HTML page has inline CSS and inline SVG only: no
scripts, no fonts, no URLs, so it renders offline and can be attached to a CI run as is.
"""

from __future__ import annotations

import html
import json
import math
import re
from pathlib import Path
from dataclasses import dataclass, field
from typing import Any, Sequence, Union

from .errors import DFlashError
from .bounds import one_line
from .files import write_text_atomic  # noqa: F401 (re-exported: reports are written with the one atomic writer)

#: section/status levels, mildest first
LEVELS = ("ok", "info", "warning", "error")
FORMATS = ("text", "json", "markdown", "html")


def _slug(title: str) -> str:
    return re.sub(r"[^a-z0-9]+", "_", title.lower()).strip("_")


# --------------------------------------------------------------------------------------------
# Model
# --------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Column:
    """One displayed column. ``fmt``: a format spec for numbers (".4g"), "shape" (64×128) or
    "pct" (a ratio shown as a percentage); lists are formatted element by element."""

    key: str
    header: str
    fmt: str = ""


@dataclass
class Table:
    title: str
    columns: list[Column]
    rows: list[dict[str, Any]]
    level: str = "info"
    note: str = ""
    empty: str = "none"  # shown instead of an empty table
    flagged: set[int] = field(default_factory=set)  # row indexes to highlight (e.g. over a threshold)
    id: str = ""

    def __post_init__(self) -> None:
        self.id = self.id or _slug(self.title)


@dataclass
class Notes:
    title: str
    items: list[str]
    level: str = "info"
    note: str = ""
    empty: str = "none"
    id: str = ""

    def __post_init__(self) -> None:
        self.id = self.id or _slug(self.title)


@dataclass(frozen=True)
class Bar:
    label: str  # shown as the tooltip (full name)
    value: float
    series: str = ""  # bars of one series share a colour across groups (e.g. "ffn_down")
    flagged: bool = False
    tag: str = ""  # a few characters written under the bar (e.g. its tensor type)


@dataclass(frozen=True)
class BarGroup:
    label: str
    bars: list[Bar]


@dataclass
class BarChart:
    """Vertical bars in groups (e.g. one group per layer), coloured by series."""

    title: str
    groups: list[BarGroup]
    value_label: str = ""
    reference: float | None = None  # drawn as a dashed line (e.g. a threshold)
    reference_label: str = ""
    level: str = "info"
    note: str = ""
    id: str = ""
    scale: str = "auto"  # "auto": a log axis when nonzero values span more than LOG_SPAN; "linear": always linear

    def __post_init__(self) -> None:
        self.id = self.id or _slug(self.title)

    @property
    def bars(self) -> list[Bar]:
        return [b for g in self.groups for b in g.bars]


Section = Union[Table, Notes, BarChart]


@dataclass(frozen=True)
class Field:
    label: str
    value: Any
    fmt: str = ""
    key: str = ""

    @property
    def json_key(self) -> str:
        return self.key or _slug(self.label)


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
        previous_empty = False
        for s in self.sections:
            lines = _text_section(s)
            empty = len(lines) == 1  # "Title: none" — runs of them are kept together
            if not (empty and previous_empty):
                out.append("")
            out.extend(lines)
            previous_empty = empty
        return "\n".join(out).rstrip() + "\n"

    # ---- Markdown ---------------------------------------------------------------------------
    def to_markdown(self) -> str:
        out = [f"## {_md(self.title)}", "", f"**{_md(self.status)}**", ""]
        out += [f"- **{_md(f.label)}**: {_md(format_value(f.value, f.fmt))}" for f in self.summary]
        previous_empty = False
        for s in self.sections:
            lines = _md_section(s)
            empty = len(lines) == 1
            if not (empty and previous_empty):
                out.append("")
            out.extend(lines)
            previous_empty = empty
        return "\n".join(out).rstrip() + "\n"

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


# --------------------------------------------------------------------------------------------
# Values
# --------------------------------------------------------------------------------------------


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


# --------------------------------------------------------------------------------------------
# Text
# --------------------------------------------------------------------------------------------

_LEVEL_MARK = {"ok": "OK: ", "info": "", "warning": "WARNING: ", "error": "FAIL: "}


def _one_line(text: Any) -> str:
    return one_line(str(text))


def _is_number(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool)


def _cells(t: Table) -> list[list[str]]:
    return [[_one_line(format_value(row.get(c.key), c.fmt)) for c in t.columns] for row in t.rows]


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


# --------------------------------------------------------------------------------------------
# Markdown
# --------------------------------------------------------------------------------------------


def _md(text: str) -> str:
    """A cell or a line of Markdown from any string a file may hold: control characters shown escaped, HTML
    escaped (no raw <script> or <img onerror>), link and image syntax ([...](...), <scheme:...>) neutralised,
    table pipes escaped, one line."""
    text = one_line(str(text).replace("\n", " "))
    text = html.escape(text, quote=False)
    for ch in ("\\", "[", "]", "|"):  # no [text](url), ![img](url) or [ref]: the brackets are literal
        text = text.replace(ch, "\\" + ch) if ch != "\\" else text.replace("\\", "\\\\")
    return text


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


# --------------------------------------------------------------------------------------------
# HTML
# --------------------------------------------------------------------------------------------

_CSS = """
body{font:14px/1.4 system-ui,-apple-system,"Segoe UI",sans-serif;margin:24px;color:#222;background:#fff}
h1{font-size:20px;margin:0 0 8px}h2{font-size:16px;margin:24px 0 6px}
.status{display:inline-block;padding:4px 10px;border-radius:4px;font-weight:600}
.status.ok{background:#e3f4e3;color:#1d5e1d}.status.info{background:#e8eef8}
.status.warning{background:#fff3cd;color:#6b5000}.status.error{background:#fbe0e0;color:#8a1010}
h2.error{color:#a01010}h2.warning{color:#8a6a00}
table{border-collapse:collapse;margin:4px 0 8px}th,td{padding:2px 8px;border-bottom:1px solid #e4e4e4;text-align:left}
td.num{text-align:right;font-variant-numeric:tabular-nums}th{background:#f4f4f4}
tr.flag td{background:#fde2e2}table.summary th{background:none;font-weight:600}
.note{color:#555;margin:2px 0 6px}.empty{color:#555;margin:4px 0}.empty b{color:#222}
th{white-space:nowrap}td.pair{white-space:nowrap;font-variant-numeric:tabular-nums}
.chart{overflow-x:auto;border:1px solid #e4e4e4;padding:8px}
.legend span{display:inline-block;margin:2px 10px 2px 0;font-size:12px}
.legend i{display:inline-block;width:10px;height:10px;margin-right:4px;vertical-align:middle}
"""

#: chart series colours, cycled: 15 picked greedily from Kelly's and Tableau's sets for the largest smallest
#: CIE76 distance (37; Tableau 20's first 15 had 18), away from the red of flagged bars and from white — a
#: DFlash layer's 15 tensor series stay tellable apart
PALETTE = (
    "#0067a5", "#dcd300", "#ff00ff", "#882d17", "#008856", "#000080", "#e377c2", "#00ffff",
    "#ff7f0e", "#222222", "#c2b280", "#00aa00", "#a0cbe8", "#f99379", "#808000",
)


def _html_section(s: Section) -> str:
    e = html.escape
    count = len(s.bars) if isinstance(s, BarChart) else len(s.rows) if isinstance(s, Table) else len(s.items)
    if count == 0:  # one compact line: a list of "none"s should not push the content down
        return f'<p class="empty" id="{e(s.id)}"><b>{e(s.title)}</b>: {e(getattr(s, "empty", "nothing to plot"))}</p>'
    level = s.level
    out = [f'<section id="{e(s.id)}"><h2 class="{e(level)}">{e(s.title)}'
           + ("" if isinstance(s, BarChart) else f" ({count})") + "</h2>"]
    if s.note:
        out.append(f'<p class="note">{e(s.note)}</p>')
    if isinstance(s, BarChart):
        out.append(bar_chart_svg(s))
    elif isinstance(s, Notes):
        out.append("<ul>" + "".join(f"<li>{e(i)}</li>" for i in s.items) + "</ul>")
    else:
        out.append("<table><tr>" + "".join(f"<th>{e(c.header)}</th>" for c in s.columns) + "</tr>")
        for i, (row, cells) in enumerate(zip(s.rows, _cells(s))):
            tds = "".join(
                f'<td class="num">{e(v)}</td>' if _is_number(row.get(c.key))
                else f'<td class="pair">{e(v)}</td>' if isinstance(row.get(c.key), tuple) else f"<td>{e(v)}</td>"
                for c, v in zip(s.columns, cells)
            )
            out.append(f'<tr class="flag">{tds}</tr>' if i in s.flagged else f"<tr>{tds}</tr>")
        out.append("</table>")
    out.append("</section>")
    return "\n".join(out)


def _nice_step(v: float) -> float:
    """Smallest 1/2/5 × 10^k at or above v."""
    exp = math.floor(math.log10(v))
    for m in (1, 2, 5):
        if m * 10**exp >= v * (1 - 1e-12):
            return m * 10**exp
    return 10.0 ** (exp + 1)


def _axis(vmax: float, n: int = 5) -> tuple[float, float]:
    """(top, step) of a y axis with about ``n`` round ticks covering [0, vmax]."""
    if not vmax > 0:
        return 1.0, 0.25
    step = _nice_step(vmax / n)
    return step * math.ceil(vmax / step * (1 - 1e-12)), step


#: a zero's bar: an outlined stub this tall (a 1 px line could not be seen or pointed at)
ZERO_BAR_PX = 5.0
#: nonzero values spanning more than this ratio get a log axis (a norm's 1e-6 next to a Q4_K's 3e-2 would be a
#: sliver on a linear one)
LOG_SPAN = 100.0


def _log_axis(values: list[float]) -> tuple[float, float] | None:
    """(lowest, highest) decade exponents of a log axis for ``values``, or None when a linear axis shows them."""
    positive = [v for v in values if v > 0 and math.isfinite(v)]
    if not positive or max(positive) / min(positive) <= LOG_SPAN:
        return None
    # one decade below the smallest value: it stands a decade tall, apart from a zero (1 px)
    return math.floor(math.log10(min(positive))) - 1, math.ceil(math.log10(max(positive)) - 1e-12)


def bar_chart_svg(chart: BarChart) -> str:
    """Inline SVG (no xmlns URL needed inside HTML) + an HTML legend for the series colours. Values spanning more
    than `LOG_SPAN` get a log axis (decade ticks); a zero is an outlined stub (`ZERO_BAR_PX`); bar tags are written
    under the bars."""
    e = html.escape
    gap, group_gap = 2, 18
    bar_w = max(6, min(28, 900 // max(1, len(chart.bars)) - gap))  # few bars: wider, many: narrower
    tag_h = 6 + 6 * max((len(b.tag) for b in chart.bars), default=0)  # rotated 9 px text: ~6 px a character
    left, right, top, plot_h = 70, 100, 24, 260  # right margin: the reference label
    bottom = 30 + tag_h
    finite = [b.value for b in chart.bars if math.isfinite(b.value)]
    log = _log_axis(finite + ([chart.reference] if chart.reference else [])) if chart.scale == "auto" else None
    if log is None:
        top_value, step = _axis(max(finite + [chart.reference or 0.0, 0.0]))
        ticks = [step * i for i in range(round(top_value / step) + 1)]
    else:
        low, high = log
        top_value = 10.0 ** high
        ticks = [10.0 ** k for k in range(low, high + 1)]
    colours: dict[str, str] = {}
    for b in chart.bars:
        colours.setdefault(b.series, PALETTE[len(colours) % len(PALETTE)])

    def y(v: float) -> float:
        v = top_value if not math.isfinite(v) else min(max(v, 0.0), top_value)
        if log is None:
            return top + plot_h * (1 - v / top_value)
        if v <= 0:
            return top + plot_h
        low, high = log
        return top + plot_h * (1 - max(0.0, math.log10(v) - low) / (high - low))

    width = left + right + sum(len(g.bars) * (bar_w + gap) + group_gap for g in chart.groups)
    height = top + plot_h + bottom
    # the chart fills the page's width (the viewBox scales it), never smaller than its bars need
    svg = [f'<svg class="bar-chart" width="100%" style="min-width:{width}px" viewBox="0 0 {width} {height}" '
           f'role="img" font-family="sans-serif" font-size="11">']
    for v in ticks:  # y grid + tick labels
        svg.append(f'<line x1="{left}" x2="{width - right}" y1="{y(v):.1f}" y2="{y(v):.1f}" stroke="#e6e6e6"/>')
        svg.append(f'<text x="{left - 6}" y="{y(v) + 4:.1f}" text-anchor="end">{v:.3g}</text>')
    svg.append(f'<text transform="translate(14 {top + plot_h / 2}) rotate(-90)" text-anchor="middle">'
               f"{e(chart.value_label + (' (log scale)' if log else ''))}</text>")
    x = left + group_gap / 2
    for g in chart.groups:
        start = x
        for b in g.bars:
            fill = "#c00000" if not math.isfinite(b.value) else colours[b.series]
            stroke = ' stroke="#c00000" stroke-width="2"' if b.flagged else ""
            h = max(1.0, top + plot_h - y(b.value))
            if b.value == 0:  # an outlined stub, tall enough to point at: the tensor is there, and equal
                h, fill, stroke = ZERO_BAR_PX, "#ffffff", stroke or f' stroke="{fill}"'
            svg.append(
                f'<rect class="bar" x="{x:.1f}" y="{top + plot_h - h:.1f}" width="{bar_w}" '
                f'height="{h:.1f}" fill="{fill}"{stroke}>'
                f"<title>{e(b.label)}: {e(format_value(b.value, '.4g'))}</title></rect>"
            )
            if b.tag:
                cx, ty = x + bar_w / 2 + 3, top + plot_h + 4
                svg.append(f'<text class="tag" transform="translate({cx:.1f} {ty}) rotate(-90)" text-anchor="end" '
                           f'font-size="9" fill="#444">{e(b.tag)}</text>')
            x += bar_w + gap
        mid = (start + x - gap) / 2
        svg.append(f'<text x="{mid:.1f}" y="{top + plot_h + tag_h + 16}" text-anchor="middle">{e(g.label)}</text>')
        svg.append(f'<line x1="{x + group_gap / 2 - 1:.1f}" x2="{x + group_gap / 2 - 1:.1f}" y1="{top}" '
                   f'y2="{top + plot_h}" stroke="#f0f0f0"/>')
        x += group_gap
    svg.append(f'<line x1="{left}" x2="{width - right}" y1="{top + plot_h}" y2="{top + plot_h}" stroke="#888"/>')
    if chart.reference is not None and chart.reference <= top_value:
        ry = y(chart.reference)
        svg.append(f'<line class="reference" x1="{left}" x2="{width - right}" y1="{ry:.1f}" y2="{ry:.1f}" '
                   'stroke="#c00000" stroke-dasharray="6 4"/>')
        svg.append(f'<text x="{width - right + 4}" y="{ry + 4:.1f}" fill="#c00000">{e(chart.reference_label)}</text>')
    svg.append("</svg>")
    legend = "".join(f'<span><i style="background:{c}"></i>{e(s)}</span>' for s, c in colours.items() if s)
    return f'<div class="chart">{"".join(svg)}</div><div class="legend">{legend}</div>'


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
