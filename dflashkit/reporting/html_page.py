"""A report's sections as HTML: the page's inline CSS and each section as a ``<section>`` (a chart through
`bar_chart`).
"""

from __future__ import annotations

import html

from .bar_chart import bar_chart_svg
from .model import BarChart, Notes, Section, Table
from .values import _cells, _is_number

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
