"""Reports declared, and the one builder that evaluates a declaration into a `Report`.

A report is a `ReportSpec`: its title, its status, its summary fields (`FieldSpec`) and its sections in order
(`TableSpec`, `NotesSpec`, `ChartSpec`, and `EachSpec` for sections repeated per item), each saying where its values
come from. `build` evaluates it against a context — the result it reports, usually with what the report computes
once (verdicts, failures) beside it — and returns the `Report`, which renders to text, JSON, Markdown and HTML like
any other.

Where a part depends on the run it is a function of the context: a title, note, level, empty text, the columns,
a chart's reference and labels may each be a constant or such a function; field values, rows, flagged rows, note
items and chart groups are always functions. ``when`` (a function of the context) leaves a field or a section out
where it is false. The per-row logic lives in small named functions next to each declaration.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Iterable, Sequence, TypeVar, Union

from .model import BarChart, BarGroup, Column, Field, Notes, Section, Table
from .report import Report

_T = TypeVar("_T")
#: a part of a declaration: a constant, or a function of the context that gives it
Of = Union[_T, Callable[[Any], _T]]
When = Union[Callable[[Any], bool], None]


def _of(value: Any, ctx: Any) -> Any:
    return value(ctx) if callable(value) else value


def _shown(when: When, ctx: Any) -> bool:
    return when is None or bool(when(ctx))


@dataclass(frozen=True)
class FieldSpec:
    """One summary field: ``value(ctx)`` shown with ``fmt``; its JSON key ``key`` (or the label's slug)."""

    label: str
    value: Callable[[Any], Any]
    fmt: str = ""
    key: str = ""
    when: When = None


@dataclass(frozen=True)
class TableSpec:
    """A table: ``rows(ctx)`` (dicts: JSON carries every key, the columns choose what the other formats show);
    ``flagged(ctx)`` the indexes of the rows to highlight."""

    title: Of[str]
    columns: Of[Sequence[Column]]
    rows: Callable[[Any], list[dict[str, Any]]]
    id: str = ""
    level: Of[str] = "info"
    note: Of[str] = ""
    empty: Of[str] = "none"
    flagged: Callable[[Any], Iterable[int]] | None = None
    when: When = None


@dataclass(frozen=True)
class NotesSpec:
    """A list of lines: ``items(ctx)``."""

    title: Of[str]
    items: Callable[[Any], list[str]]
    id: str = ""
    level: Of[str] = "info"
    note: Of[str] = ""
    empty: Of[str] = "none"
    when: When = None


@dataclass(frozen=True)
class ChartSpec:
    """A bar chart: ``groups(ctx)`` (`BarGroup` of `Bar`), an optional reference line."""

    title: Of[str]
    groups: Callable[[Any], list[BarGroup]]
    value_label: Of[str] = ""
    reference: Of[float | None] = None
    reference_label: Of[str] = ""
    id: str = ""
    level: Of[str] = "info"
    note: Of[str] = ""
    scale: str = "auto"
    when: When = None


@dataclass(frozen=True)
class EachSpec:
    """``sections`` once per item of ``each(ctx)``, each evaluated with the item as its context: a file's tables per
    file, or a part of a report with a context of its own (a list of zero or one)."""

    each: Callable[[Any], Iterable[Any]]
    sections: Sequence["SectionSpec"]
    when: When = None


SectionSpec = Union[TableSpec, NotesSpec, ChartSpec, EachSpec]


@dataclass(frozen=True)
class ReportSpec:
    """A whole report: ``status(ctx)`` gives (status line, level), as `verdict` does."""

    title: Of[str]
    status: Callable[[Any], tuple[str, str]]
    fields: Sequence[FieldSpec] = ()
    sections: Sequence[SectionSpec] = ()


def build(spec: ReportSpec, ctx: Any) -> Report:
    """The one builder: the declaration ``spec`` evaluated against ``ctx``."""
    status, level = spec.status(ctx)
    return Report(_of(spec.title, ctx), status, level, build_fields(spec.fields, ctx),
                  build_sections(spec.sections, ctx))


def build_fields(specs: Sequence[FieldSpec], ctx: Any) -> list[Field]:
    return [Field(f.label, f.value(ctx), f.fmt, f.key) for f in specs if _shown(f.when, ctx)]


def build_sections(specs: Sequence[SectionSpec], ctx: Any) -> list[Section]:
    """The sections of ``specs`` that ``ctx`` shows, in order (an `EachSpec` expanded in place)."""
    out: list[Section] = []
    for s in specs:
        if not _shown(s.when, ctx):
            continue
        if isinstance(s, EachSpec):
            for item in s.each(ctx):
                out += build_sections(s.sections, item)
        else:
            out.append(build_section(s, ctx))
    return out


def build_section(s: TableSpec | NotesSpec | ChartSpec, ctx: Any) -> Section:
    """One section (its ``when`` is the caller's): a model card's table is built alone."""
    if isinstance(s, TableSpec):
        return Table(_of(s.title, ctx), list(_of(s.columns, ctx)), s.rows(ctx), level=_of(s.level, ctx),
                     note=_of(s.note, ctx), empty=_of(s.empty, ctx),
                     flagged=set(s.flagged(ctx)) if s.flagged is not None else set(), id=s.id)
    if isinstance(s, NotesSpec):
        return Notes(_of(s.title, ctx), s.items(ctx), level=_of(s.level, ctx), note=_of(s.note, ctx),
                     empty=_of(s.empty, ctx), id=s.id)
    return BarChart(_of(s.title, ctx), s.groups(ctx), value_label=_of(s.value_label, ctx),
                    reference=_of(s.reference, ctx), reference_label=_of(s.reference_label, ctx),
                    level=_of(s.level, ctx), note=_of(s.note, ctx), id=s.id, scale=s.scale)
