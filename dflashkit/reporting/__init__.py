"""One report model, rendered as terminal text, JSON, Markdown or a self-contained HTML page.

Commands that compare things (``dflash-diff``, ``dflash-parity``, ``dflash-accept``, ``dflash-inspect``) declare
their `Report` — a title, a one-line status, summary fields and a list of sections — and `build` makes it; they never
format output themselves. A section is a `Table` (columns + rows), a `Notes` list or a `BarChart`.

Rows are dicts: the table's columns choose what text/Markdown/HTML show, while JSON carries every
key of every row at full precision (non-finite floats become the strings ``"inf"``, ``"-inf"``,
``"nan"`` so the output stays strict JSON). The HTML page has inline CSS and inline SVG only: no
scripts, no fonts, no URLs, so it renders offline and can be attached to a CI run as is.

The package, one module per concern: `model` (the sections and fields), `values` (how a value is shown),
`report` (`Report`, `verdict`, the JSON form), and one renderer each for `text`, `markdown` and `html_page`, whose
charts `bar_chart` draws as SVG; `declare` (a report declared as its fields and sections, and the one `build` that
evaluates a declaration into a `Report`: every command's report is declared). Everything is importable from
``dflashkit.reporting`` itself.
"""

from ..files import write_text_atomic  # re-exported: reports are written with the one atomic writer
from .bar_chart import LOG_SPAN, PALETTE, ZERO_BAR_PX, bar_chart_svg
from .declare import (ChartSpec, EachSpec, FieldSpec, NotesSpec, ReportSpec, TableSpec, build, build_fields,
                      build_section, build_sections)
from .markdown import markdown_section, markdown_text
from .model import LEVELS, Bar, BarChart, BarGroup, Column, Field, Notes, Section, Table
from .report import FORMATS, Report, verdict
from .values import distinct_labels, format_value, human_size

__all__ = [
    "FORMATS",
    "LEVELS",
    "LOG_SPAN",
    "PALETTE",
    "ZERO_BAR_PX",
    "Bar",
    "BarChart",
    "BarGroup",
    "ChartSpec",
    "Column",
    "EachSpec",
    "Field",
    "FieldSpec",
    "Notes",
    "NotesSpec",
    "Report",
    "ReportSpec",
    "Section",
    "Table",
    "TableSpec",
    "bar_chart_svg",
    "build",
    "build_fields",
    "build_section",
    "build_sections",
    "distinct_labels",
    "format_value",
    "human_size",
    "markdown_section",
    "markdown_text",
    "verdict",
    "write_text_atomic",
]
