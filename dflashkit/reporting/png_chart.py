"""A line chart as PNG bytes — deterministic, so ``dflash-release --check`` can draw it again from the record and
compare the bytes (an edited figure in the picture is found like one in the card).

Hand-written rather than matplotlib: matplotlib is not a dependency of dflashkit, and its PNG bytes change with its
version, fonts and backend; here the same figures always give the same bytes (numpy draws, ``zlib`` level 9 packs,
a 5×7 bitmap font writes the labels in capitals). One chart = one or more panels stacked (τ, speed-up), each with
its y ticks, the shared categorical x axis (the context levels) and one polyline with markers per series.
"""

from __future__ import annotations

import math
import struct
import zlib
from dataclasses import dataclass
from typing import Sequence

import numpy as np

# 5×7 capitals, digits and a few signs: 7 rows of 5 bits each, the top row first
_FONT = {
    "0": (14, 17, 19, 21, 25, 17, 14), "1": (4, 12, 4, 4, 4, 4, 14), "2": (14, 17, 1, 2, 4, 8, 31),
    "3": (31, 2, 4, 2, 1, 17, 14), "4": (2, 6, 10, 18, 31, 2, 2), "5": (31, 16, 30, 1, 1, 17, 14),
    "6": (6, 8, 16, 30, 17, 17, 14), "7": (31, 1, 2, 4, 8, 8, 8), "8": (14, 17, 17, 14, 17, 17, 14),
    "9": (14, 17, 17, 15, 1, 2, 12), "A": (14, 17, 17, 31, 17, 17, 17), "B": (30, 17, 17, 30, 17, 17, 30),
    "C": (14, 17, 16, 16, 16, 17, 14), "D": (28, 18, 17, 17, 17, 18, 28), "E": (31, 16, 16, 30, 16, 16, 31),
    "F": (31, 16, 16, 30, 16, 16, 16), "G": (14, 17, 16, 23, 17, 17, 15), "H": (17, 17, 17, 31, 17, 17, 17),
    "I": (14, 4, 4, 4, 4, 4, 14), "J": (7, 2, 2, 2, 2, 18, 12), "K": (17, 18, 20, 24, 20, 18, 17),
    "L": (16, 16, 16, 16, 16, 16, 31), "M": (17, 27, 21, 21, 17, 17, 17), "N": (17, 17, 25, 21, 19, 17, 17),
    "O": (14, 17, 17, 17, 17, 17, 14), "P": (30, 17, 17, 30, 16, 16, 16), "Q": (14, 17, 17, 17, 21, 18, 13),
    "R": (30, 17, 17, 30, 20, 18, 17), "S": (15, 16, 16, 14, 1, 1, 30), "T": (31, 4, 4, 4, 4, 4, 4),
    "U": (17, 17, 17, 17, 17, 17, 14), "V": (17, 17, 17, 17, 17, 10, 4), "W": (17, 17, 17, 21, 21, 21, 10),
    "X": (17, 17, 10, 4, 10, 17, 17), "Y": (17, 17, 10, 4, 4, 4, 4), "Z": (31, 1, 2, 4, 8, 16, 31),
    ".": (0, 0, 0, 0, 0, 12, 12), "-": (0, 0, 0, 31, 0, 0, 0), "_": (0, 0, 0, 0, 0, 0, 31),
    ":": (0, 12, 12, 0, 12, 12, 0), "/": (1, 1, 2, 4, 8, 16, 16), "%": (24, 25, 2, 4, 8, 19, 3),
    "(": (2, 4, 8, 8, 8, 4, 2), ")": (8, 4, 2, 2, 2, 4, 8), ",": (0, 0, 0, 0, 12, 4, 8),
    "×": (0, 17, 10, 4, 10, 17, 0), " ": (0,) * 7, "?": (14, 17, 1, 2, 4, 0, 4),
}
#: the reporting palette's first colours (RGB)
COLOURS = ((78, 121, 167), (242, 142, 43), (225, 87, 89), (118, 183, 178), (89, 161, 79), (237, 201, 72),
           (176, 122, 161), (255, 157, 167), (156, 117, 95), (186, 176, 172))
INK, GRID, WHITE = (40, 40, 40), (225, 225, 225), (255, 255, 255)


@dataclass(frozen=True)
class Series:
    label: str
    values: Sequence[float | None]  # one per x position; None or non-finite: no point


@dataclass(frozen=True)
class Panel:
    title: str
    series: Sequence[Series]
    reference: float | None = None  # a dashed horizontal line (speed-up 1)


class _Canvas:
    def __init__(self, width: int, height: int) -> None:
        self.px = np.full((height, width, 3), 255, dtype=np.uint8)

    def rect(self, x0: int, y0: int, x1: int, y1: int, colour: tuple[int, int, int]) -> None:
        h, w = self.px.shape[:2]
        x0, x1, y0, y1 = max(0, min(x0, x1)), min(w, max(x0, x1)), max(0, min(y0, y1)), min(h, max(y0, y1))
        if x1 > x0 and y1 > y0:
            self.px[y0:y1, x0:x1] = colour

    def line(self, x0: float, y0: float, x1: float, y1: float, colour: tuple[int, int, int], width: int = 2,
             dash: int = 0) -> None:
        steps = int(max(abs(x1 - x0), abs(y1 - y0))) + 1
        for i in range(steps + 1):
            if dash and (i // dash) % 2:
                continue
            x = round(x0 + (x1 - x0) * i / steps)
            y = round(y0 + (y1 - y0) * i / steps)
            self.rect(x - width // 2, y - width // 2, x - width // 2 + width, y - width // 2 + width, colour)

    def text(self, x: int, y: int, s: str, colour: tuple[int, int, int] = INK, scale: int = 1) -> int:
        """Capitals at (x, y) (top left); returns the x after the last character."""
        for ch in s.upper():
            rows = _FONT.get(ch, _FONT["?"])
            for r, bits in enumerate(rows):
                for c in range(5):
                    if bits >> (4 - c) & 1:
                        self.rect(x + c * scale, y + r * scale, x + (c + 1) * scale, y + (r + 1) * scale, colour)
            x += 6 * scale
        return x

    def png(self) -> bytes:
        h, w = self.px.shape[:2]
        raw = b"".join(b"\x00" + self.px[y].tobytes() for y in range(h))

        def chunk(kind: bytes, data: bytes) -> bytes:
            return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data) & 0xFFFFFFFF)

        return (b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", struct.pack(">IIBBBBB", w, h, 8, 2, 0, 0, 0))
                + chunk(b"IDAT", zlib.compress(raw, 9)) + chunk(b"IEND", b""))


def _nice_top(value: float) -> float:
    """The axis top: 1, 2, 2.5 or 5 × a power of ten at or above ``value``."""
    if not value > 0 or not math.isfinite(value):
        return 1.0
    power = 10 ** math.floor(math.log10(value))
    return next(m * power for m in (1, 2, 2.5, 5, 10) if m * power >= value)


def line_chart_png(x_labels: Sequence[str], panels: Sequence[Panel], x_title: str, *, width: int = 720,
                   panel_height: int = 260) -> bytes:
    """Panels stacked, sharing the categorical x axis ``x_labels``; a legend of every series label under them."""
    labels = list(dict.fromkeys(s.label for p in panels for s in p.series))
    colour = {label: COLOURS[i % len(COLOURS)] for i, label in enumerate(labels)}
    legend_rows = math.ceil(len(labels) / 3)
    height = len(panels) * panel_height + 56 + 16 * legend_rows
    canvas = _Canvas(width, height)
    left, right = 60, width - 20
    n = len(x_labels)

    def x_at(i: int) -> float:
        return left + 20 + (right - left - 40) * (i / (n - 1) if n > 1 else 0.5)

    for k, panel in enumerate(panels):
        top, bottom = k * panel_height + 24, (k + 1) * panel_height - 10
        values = [v for s in panel.series for v in s.values if v is not None and math.isfinite(v)]
        y_top = _nice_top(max(values + [panel.reference or 0.0, 1e-9]))

        def y_at(v: float) -> float:
            return bottom - (bottom - top) * v / y_top

        canvas.text(left, top - 18, panel.title)
        for t in range(6):  # the top is 1, 2, 2.5 or 5 × 10^k: fifths of it are round numbers
            y = y_at(y_top * t / 5)
            canvas.line(left, y, right, y, GRID, 1)
            tick = f"{y_top * t / 5:.2f}".rstrip("0").rstrip(".")
            canvas.text(left - 8 - 6 * len(tick), int(y) - 3, tick)
        canvas.line(left, top, left, bottom, INK, 1)
        canvas.line(left, bottom, right, bottom, INK, 1)
        if panel.reference is not None:
            canvas.line(left, y_at(panel.reference), right, y_at(panel.reference), INK, 1, dash=4)
        for i, label in enumerate(x_labels):
            canvas.line(x_at(i), bottom, x_at(i), bottom + 4, INK, 1)
            if k == len(panels) - 1:
                canvas.text(int(x_at(i)) - 3 * len(label), bottom + 8, label)
        for s in panel.series:
            points = [(x_at(i), y_at(v)) for i, v in enumerate(s.values) if v is not None and math.isfinite(v)]
            for (xa, ya), (xb, yb) in zip(points, points[1:]):
                canvas.line(xa, ya, xb, yb, colour[s.label], 2)
            for x, y in points:
                canvas.rect(int(x) - 3, int(y) - 3, int(x) + 4, int(y) + 4, colour[s.label])
    base = len(panels) * panel_height + 18
    canvas.text((left + right) // 2 - 3 * len(x_title), base + 4, x_title)
    base += 14
    for i, label in enumerate(labels):
        x, y = left + (i % 3) * ((right - left) // 3), base + 14 + 16 * (i // 3)
        canvas.rect(x, y, x + 10, y + 7, colour[label])
        canvas.text(x + 16, y, label[:28])
    return canvas.png()
