"""A `BarChart` as inline SVG: its palette, its y axis (linear with round ticks, or log by decades), its bars.

The one drawing in the HTML page; no scripts, fonts or URLs, so the page renders offline.
"""

from __future__ import annotations

import html
import math

from .model import BarChart
from .values import format_value

#: chart series colours, cycled: 15 picked greedily from Kelly's and Tableau's sets for the largest smallest
#: CIE76 distance (37; Tableau 20's first 15 had 18), away from the red of flagged bars and from white — a
#: DFlash layer's 15 tensor series stay tellable apart
PALETTE = (
    "#0067a5", "#dcd300", "#ff00ff", "#882d17", "#008856", "#000080", "#e377c2", "#00ffff",
    "#ff7f0e", "#222222", "#c2b280", "#00aa00", "#a0cbe8", "#f99379", "#808000",
)


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
