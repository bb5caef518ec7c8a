"""The shared report model: one Report rendered as text, JSON, Markdown and self-contained HTML."""

from __future__ import annotations

import json
import math
import os
import re
from html.parser import HTMLParser

import pytest

from dflashkit.errors import DFlashError
from dflashkit.reporting import (
    Bar,
    BarChart,
    BarGroup,
    Column,
    Field,
    Notes,
    Report,
    Table,
    format_value,
    write_text_atomic,
)


def _report() -> Report:
    rows = [
        {"name": "layers.0.mlp.down_proj.weight", "shape": [64, 128], "rel": 0.1 + 0.2, "snr": math.inf, "extra": 7},
        {"name": "norm.weight", "shape": [64], "rel": 0.0, "snr": 12.5, "extra": None},
    ]
    return Report(
        title="demo <report>",
        status="1 tensor over the threshold",
        level="error",
        summary=[Field("tensors", 2), Field("max rel", 0.30000000000000004, ".3g", key="max_rel")],
        sections=[
            Table("Tensors", [Column("name", "tensor"), Column("shape", "shape", "shape"), Column("rel", "rel", ".3g"),
                              Column("snr", "SNR", ".1f")], rows, flagged={0}),
            Table("Missing", [Column("name", "tensor")], [], level="error", empty="nothing missing"),
            Notes("Notes", ["a <b> & c", "x|y"]),
            BarChart("Errors", [BarGroup("global", [Bar("norm.weight", 0.0, "norm")]),
                                BarGroup("layer 0", [Bar("down", 0.3, "ffn_down", flagged=True), Bar("up", 0.1, "ffn_up")])],
                     value_label="rel", reference=0.2, reference_label="threshold 0.2"),
        ],
    )


class _Tags(HTMLParser):
    def __init__(self) -> None:
        super().__init__()
        self.tags: list[tuple[str, dict[str, str | None]]] = []

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        self.tags.append((tag, dict(attrs)))


def test_format_value() -> None:
    assert format_value(None) == "-"
    assert format_value(True) == "yes"
    assert format_value([64, 128], "shape") == "64×128"
    assert format_value([], "shape") == "scalar"
    assert format_value([0.123456, -1.0], ".3g") == "[0.123, -1]"
    assert format_value(math.inf, ".3g") == "inf"
    assert format_value(-math.inf) == "-inf"
    assert format_value(math.nan, ".1f") == "nan"
    assert format_value(0.0123, "pct") == "1.23%"
    assert format_value(3, ".2f") == "3.00"
    assert format_value("abc", ".3g") == "abc"


def test_json_keeps_every_number_at_full_precision() -> None:
    data = json.loads(_report().to_json())
    assert data["status"] == "1 tensor over the threshold" and data["level"] == "error"
    assert data["summary"] == {"tensors": 2, "max_rel": 0.30000000000000004}
    tensors = data["sections"][0]
    assert tensors["id"] == "tensors" and tensors["type"] == "table" and tensors["flagged"] == [0]
    # every key of every row, also those no column shows; non-finite floats as strings (strict JSON)
    assert tensors["rows"][0] == {"name": "layers.0.mlp.down_proj.weight", "shape": [64, 128],
                                  "rel": 0.30000000000000004, "snr": "inf", "extra": 7}
    assert data["sections"][1]["rows"] == []
    assert data["sections"][2]["items"] == ["a <b> & c", "x|y"]
    chart = data["sections"][3]
    assert chart["type"] == "bar_chart" and chart["reference"] == 0.2
    assert [len(g["bars"]) for g in chart["groups"]] == [1, 2]


def test_text() -> None:
    text = _report().to_text()
    lines = text.splitlines()
    assert lines[0] == "demo <report>" and lines[1] == "FAIL: 1 tensor over the threshold"
    assert "  max rel  0.3" in lines
    row = next(line for line in lines if "down_proj" in line)
    assert row.startswith("! ") and "64×128" in row and "inf" in row  # flagged row marked
    assert "Missing: nothing missing" in lines
    assert "  - a <b> & c" in lines
    assert "Errors: 3 bars in 2 groups (shown with --format html)" in lines
    # numbers right-aligned under their header
    header = next(line for line in lines if "SNR" in line)
    assert header.index("SNR") + 3 == row.index("inf") + 3


def test_markdown() -> None:
    md = _report().to_markdown()
    assert md.startswith("## demo &lt;report&gt;\n\n**1 tensor over the threshold**")  # HTML escaped (issue 26)
    assert "| tensor | shape | rel | SNR |" in md
    assert "|---|---|---:|---:|" in md
    assert "| **layers.0.mlp.down_proj.weight** | 64×128 | 0.3 | inf |" in md
    assert "- **Missing**: nothing missing" in md
    assert "- x\\|y" in md  # pipes escaped


def test_html_is_self_contained_and_escaped() -> None:
    page = _report().to_html()
    assert page.startswith("<!DOCTYPE html>")
    assert "demo &lt;report&gt;" in page and "a &lt;b&gt; &amp; c" in page
    assert not re.search(r"https?://|<script|<link|@import|url\(", page)
    p = _Tags()
    p.feed(page)
    assert not any("src" in attrs or "href" in attrs for _, attrs in p.tags)
    svgs = [a for t, a in p.tags if t == "svg"]
    assert len(svgs) == 1
    bars = [a for t, a in p.tags if t == "rect" and a.get("class") == "bar"]
    assert len(bars) == 3
    heights = [float(a["height"]) for a in bars]
    assert heights[0] == 5.0 and bars[0]["fill"] == "#ffffff"  # a zero: an outlined stub, there to point at
    assert heights[1] == pytest.approx(3 * heights[2], rel=1e-3)  # linear scale
    assert bars[1].get("stroke") == "#c00000"  # flagged bar outlined
    assert [a for t, a in p.tags if t == "line" and a.get("class") == "reference"]
    flagged_rows = [a for t, a in p.tags if t == "tr" and a.get("class") == "flag"]
    assert len(flagged_rows) == 1
    # one colour per series, shared across groups
    assert len({a["fill"] for a in bars[1:]}) == 2 and bars[0]["stroke"] not in {a["fill"] for a in bars[1:]}


def test_render_dispatch() -> None:
    r = _report()
    assert r.render("json") == r.to_json()
    with pytest.raises(DFlashError, match="unknown report format 'pdf'"):
        r.render("pdf")
    assert r.section("missing").title == "Missing"


def test_write_text_atomic(tmp_path) -> None:
    out = tmp_path / "r.html"
    write_text_atomic(out, "one")
    assert out.read_text() == "one"
    mask = os.umask(0)
    os.umask(mask)
    assert out.stat().st_mode & 0o777 == 0o666 & ~mask  # an ordinary file, not mkstemp's 0600
    with pytest.raises(DFlashError, match="already exists — pass --force"):
        write_text_atomic(out, "two")
    assert out.read_text() == "one"
    write_text_atomic(out, "two", force=True)
    assert out.read_text() == "two"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["r.html"]  # no temporary left
    with pytest.raises(DFlashError, match="does not exist"):
        write_text_atomic(tmp_path / "nope" / "r.html", "x")


# ---------------------------------------------------------------------------------------------
# Strings from files reach the terminal and Markdown defanged
# ---------------------------------------------------------------------------------------------

HOSTILE = "blk.0\x1b]0;pwned\x07\x1b[2J<script>alert(1)</script>\n[click](javascript:alert(1)) ![x](http://e/x.png) <img src=x onerror=alert(1)>"


def _hostile_report():
    from dflashkit.reporting import Column, Field, Notes, Report, Table

    return Report(f"title {HOSTILE}", f"status {HOSTILE}", "warning", [Field("name", HOSTILE, key="name")],
                  [Table("tensors", [Column("name", "name")], [{"name": HOSTILE}], id="t", note=HOSTILE),
                   Notes("notes", [HOSTILE], id="n")])


def test_text_output_escapes_control_characters_from_files() -> None:
    text = _hostile_report().to_text()
    assert "\x1b" not in text and "\x07" not in text
    assert "\\x1b]0;pwned\\x07\\x1b[2J" in text
    # a newline inside a name cannot start a report line of its own
    assert not any(line.startswith("[click]") for line in text.splitlines())


def test_markdown_output_keeps_no_html_and_no_links_from_files() -> None:
    md = _hostile_report().to_markdown()
    assert "\x1b" not in md and "<script" not in md and "<img" not in md
    assert re.search(r"(?<!\\)\]\(", md) is None  # every ](...) has its bracket escaped: no link, no image
    assert "![x](" not in md and "[click](" not in md
    assert "&lt;script&gt;" in md and "\\[click\\](javascript:alert(1))" in md


def test_html_output_escapes_too() -> None:
    page = _hostile_report().to_html()
    assert "<script>alert" not in page and "<img src=x" not in page


def _cie76(a: str, b: str) -> float:
    import math

    def lab(h: str) -> tuple[float, float, float]:
        lin = [((c + 0.055) / 1.055) ** 2.4 if c > 0.04045 else c / 12.92
               for c in (int(h[i:i + 2], 16) / 255 for i in (1, 3, 5))]
        x = (lin[0] * 0.4124 + lin[1] * 0.3576 + lin[2] * 0.1805) / 0.95047
        y = lin[0] * 0.2126 + lin[1] * 0.7152 + lin[2] * 0.0722
        z = (lin[0] * 0.0193 + lin[1] * 0.1192 + lin[2] * 0.9505) / 1.08883
        f = [v ** (1 / 3) if v > 0.008856 else 7.787 * v + 16 / 116 for v in (x, y, z)]
        return 116 * f[1] - 16, 500 * (f[0] - f[1]), 200 * (f[1] - f[2])

    return math.dist(lab(a), lab(b))


def test_chart_series_colours_are_far_apart() -> None:
    # a layer has 15 tensor series: each pair of colours, and each colour and the flag red, differ clearly (CIE76)
    from itertools import combinations

    from dflashkit.reporting import PALETTE

    assert len(PALETTE) >= 15
    assert min(_cie76(a, b) for a, b in combinations(PALETTE[:15], 2)) > 30
    assert min(_cie76(a, "#c00000") for a in PALETTE) > 30


def test_html_pairs_do_not_wrap() -> None:
    # paired values (a range, "mean / p99") are one cell that never breaks across lines
    from dflashkit.reporting import Column, Report, Table

    report = Report("t", "s", "ok", [], [Table("T", [Column("r", "range", ".3g")], [{"r": (-0.157, 0.144)}], id="t")])
    page = report.to_html()
    assert '<td class="pair">-0.157 / 0.144</td>' in page and "td.pair{white-space:nowrap" in page


def _bars_and_texts(chart: BarChart) -> tuple[list[dict], list[str], str]:
    from dflashkit.reporting import bar_chart_svg

    svg = bar_chart_svg(chart)
    p = _Tags()
    p.feed(svg)
    bars = [a for t, a in p.tags if t == "rect" and a.get("class") == "bar"]
    return bars, re.findall(r"<text[^>]*>([^<]*)</text>", svg), svg


def test_values_spanning_decades_get_a_log_axis() -> None:
    # a norm's 1e-6 beside a Q4_K's 0.1 is a readable bar a decade tall (not a 1 px sliver); an identical tensor
    # (0) is a 5 px outlined stub, apart from it
    chart = BarChart("E", [BarGroup("layer 0", [Bar("norm", 1e-6, "n"), Bar("same", 0.0, "s"), Bar("q", 3e-2, "q"),
                                                Bar("w", 0.1, "w")])], value_label="rel")
    bars, texts, _ = _bars_and_texts(chart)
    heights = [float(a["height"]) for a in bars]
    decades = 6  # 1e-7 (a decade below the smallest) … 1e-1
    assert heights == pytest.approx([260 / decades, 5.0, 260 * (math.log10(3e-2) + 7) / decades, 260], abs=0.06)
    assert texts[:7] == ["1e-07", "1e-06", "1e-05", "0.0001", "0.001", "0.01", "0.1"]
    assert "rel (log scale)" in texts
    # within two decades the axis stays linear, and a chart can ask for linear whatever its values
    linear = BarChart("E", [BarGroup("g", [Bar("a", 0.01, "a"), Bar("b", 0.5, "b")])], value_label="rel")
    assert [float(a["height"]) for a in _bars_and_texts(linear)[0]] == pytest.approx([5.2, 260])
    chart.scale = "linear"
    assert [float(a["height"]) for a in _bars_and_texts(chart)[0]] == pytest.approx([1.0, 5.0, 78.0, 260.0])


def test_bar_tags_are_written_under_their_bars() -> None:
    chart = BarChart("E", [BarGroup("layer 0", [Bar("a", 0.1, "a", tag="Q4_K"), Bar("b", 0.2, "b", tag="F32")]),
                           BarGroup("layer 1", [Bar("c", 0.3, "a", tag="<Q6_K>")])])
    bars, _, svg = _bars_and_texts(chart)
    tags = re.findall(r'<text class="tag" transform="translate\(([\d.]+) [\d.]+\) rotate\(-90\)"[^>]*>([^<]*)</text>',
                      svg)
    assert [t for _, t in tags] == ["Q4_K", "F32", "&lt;Q6_K&gt;"]
    centres = [float(a["x"]) + float(a["width"]) / 2 for a in bars]
    assert [float(x) - 3 for x, _ in tags] == pytest.approx(centres)  # each under its own bar


def test_text_headers_from_input_are_defanged() -> None:
    # a drafter path or prompt id becomes a column header ("τ <name>"): an OSC title sequence, CR or LF in it
    # must not reach the terminal
    name = "evil\x1b]0;pwned\x07\r\nname"
    t = Table("τ per prompt", [Column("prompt", "prompt"), Column("tau_0", f"τ {name}", ".2f")],
              [{"prompt": "p\x1b[2J", "tau_0": 3.0}])
    text = Report("r", "ok", sections=[t]).to_text()
    assert "\x1b" not in text and "\r" not in text and "\x07" not in text
    header = next(line for line in text.splitlines() if "prompt" in line and "τ evil" in line)
    assert "τ evil\\x1b]0;pwned\\x07\\r\\nname" in header
