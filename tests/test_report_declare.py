"""reporting.declare: a report declared as its fields and sections, evaluated by the one `build` — conditional fields
and sections, callable titles / notes / levels, flagged rows, sections repeated per item — rendered exactly."""

from __future__ import annotations

import json
from dataclasses import FrozenInstanceError, dataclass, field

import pytest

from dflashkit.reporting import (Bar, BarChart, BarGroup, ChartSpec, Column, EachSpec, FieldSpec, NotesSpec,
                                 ReportSpec, TableSpec, build, build_section, verdict)


@dataclass
class Run:
    name: str
    scores: dict[str, float]
    limit: float | None = None
    notes: list[str] = field(default_factory=list)


def _over(r: Run) -> list[str]:
    return [k for k, v in r.scores.items() if r.limit is not None and v > r.limit]


SPEC = ReportSpec(
    title=lambda r: f"demo: {r.name}",
    status=lambda r: verdict([f"{k} over {r.limit:g}" for k in _over(r)], None, f"{len(r.scores)} scores"),
    fields=(FieldSpec("scores", lambda r: len(r.scores), key="n"),
            FieldSpec("limit", lambda r: r.limit, ".2f", when=lambda r: r.limit is not None)),
    sections=(
        TableSpec("Scores", [Column("name", "name"), Column("value", "value", ".3f")],
                  lambda r: [{"name": k, "value": v, "raw": v} for k, v in r.scores.items()], id="scores",
                  level=lambda r: "error" if _over(r) else "info",
                  flagged=lambda r: {i for i, k in enumerate(r.scores) if k in _over(r)},
                  note=lambda r: f"limit {r.limit:g}" if r.limit is not None else ""),
        NotesSpec("Notes", lambda r: r.notes, id="notes", when=lambda r: bool(r.notes)),
        EachSpec(lambda r: [n for n in r.notes if n.startswith("!")],  # one section per loud note, its own context
                 (NotesSpec(lambda n: f"About {n}", lambda n: [n[1:]], level="warning"),)),
    ),
)


def test_a_declared_report_with_a_flagged_row_and_every_section() -> None:
    report = build(SPEC, Run("a", {"x": 0.5, "y": 1.25}, limit=1.0, notes=["!loud", "quiet"]))
    assert report.to_text() == """\
demo: a
FAIL: y over 1

  scores  2
  limit   1.00

Scores (2) [!]
  limit 1
  name  value
  ----  -----
  x     0.500
! y     1.250

Notes (2)
  - !loud
  - quiet

About !loud (1) [warning]
  - loud
"""
    assert json.loads(report.to_json()) == {
        "title": "demo: a", "status": "y over 1", "level": "error", "summary": {"n": 2, "limit": 1.0},
        "sections": [
            {"id": "scores", "title": "Scores", "level": "error", "note": "limit 1", "type": "table",
             "columns": [{"key": "name", "header": "name"}, {"key": "value", "header": "value"}],
             "rows": [{"name": "x", "value": 0.5, "raw": 0.5}, {"name": "y", "value": 1.25, "raw": 1.25}],
             "flagged": [1]},
            {"id": "notes", "title": "Notes", "level": "info", "note": "", "type": "notes",
             "items": ["!loud", "quiet"]},
            {"id": "about_loud", "title": "About !loud", "level": "warning", "note": "", "type": "notes",
             "items": ["loud"]},
        ],
    }


def test_what_a_run_does_not_show_is_left_out() -> None:
    report = build(SPEC, Run("b", {"x": 0.5}))
    assert report.to_text() == """\
demo: b
OK: 1 scores

  scores  1

Scores (1)
  name  value
  ----  -----
  x     0.500
"""
    doc = json.loads(report.to_json())
    assert doc["summary"] == {"n": 1} and [s["id"] for s in doc["sections"]] == ["scores"]
    assert doc["sections"][0]["level"] == "info" and doc["sections"][0]["flagged"] == []
    assert report.to_json() == json.dumps(report.to_dict(), indent=2) + "\n"


def test_a_chart_and_a_section_built_alone() -> None:
    chart = build_section(ChartSpec(lambda r: f"{r.name} chart", lambda r: [BarGroup(k, [Bar(k, v)])
                                                                             for k, v in r.scores.items()],
                                    reference=lambda r: r.limit, reference_label="limit", scale="linear"),
                          Run("c", {"x": 2.0}, limit=1.5))
    assert isinstance(chart, BarChart) and chart.id == "c_chart" and chart.reference == 1.5
    assert [b.value for b in chart.bars] == [2.0] and chart.scale == "linear"
    table = build_section(SPEC.sections[0], Run("d", {}))
    assert table.rows == [] and table.flagged == set() and table.level == "info"
    assert build(ReportSpec("t", lambda r: ("s", "info"), sections=(SPEC.sections[0],)), Run("d", {})).to_text() \
        == "t\ns\n\n\nScores: none\n"  # no summary fields: the renderer's blank line, then the section's
    with pytest.raises(FrozenInstanceError):
        SPEC.fields[0].label = "x"  # type: ignore[misc]
