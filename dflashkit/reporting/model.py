"""The report model's parts: the sections a report holds (`Table`, `Notes`, `BarChart` of `BarGroup` / `Bar`) and
its summary `Field`.

Plain dataclasses, no rendering: every renderer (`text`, `markdown`, `html_page`, `bar_chart`, and the JSON form in
`report`) reads them, so they sit below all of them.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any, Union

#: section/status levels, mildest first
LEVELS = ("ok", "info", "warning", "error")


def _slug(title: str) -> str:
    return re.sub(r"[^a-z0-9]+", "_", title.lower()).strip("_")


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
