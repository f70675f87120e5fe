"""The pieces the report's plots are drawn with: inline SVG written as text.

The report is written at the end of every session; matplotlib's import and first render cost
~0.6 s of it, which was most of what a suite of small tests paid for the report. The plots are a
few rectangles, lines and labels, so they are written directly: no import, a few milliseconds.

Text widths are estimated, not measured (0.6 em a character, right for monospace and on the
wide side for sans): margins are sized from them, and every label is anchored at the axes so that
a wider font grows away from the plot, never onto it. Every string goes through `xml_text`: names
come from user code, and the page is parsed as HTML while tests parse each plot as XML.
"""

from __future__ import annotations

import hashlib
import html
import math
import re
from collections.abc import Iterable, Sequence

# matplotlib's default colour cycle (tab10), so a plot's colours read as before
TAB10 = ("#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b", "#e377c2", "#7f7f7f", "#bcbd22",
         "#17becf")
MONO = '"DejaVu Sans Mono",Menlo,Consolas,monospace'
SANS = '"DejaVu Sans",Helvetica,Arial,sans-serif'
# px, matplotlib's sizes at 100 dpi (ticks 8 pt, axis labels 9 pt, legends 7 pt): the page keeps its layout
TICK_PX, AXIS_PX, LEGEND_PX = 11.0, 12.5, 10.0
CHAR_EM = 0.6
SPINE, GRID = "#000000", "#e5e5e5"
# matplotlib's dash patterns per linestyle, in units of the line's width
DASHES = {"--": (3.7, 1.6), ":": (1.0, 1.65), "-.": (6.4, 1.6, 1.0, 1.6)}
MINUS = "\u2212"
# a legend entry's look: (colour, line width, linestyle, marker: "", "o" or "X")
Handle = tuple[str, float, str, str]
HANDLE_PX, LEGEND_ROW_PX = 25.0, 17.0
# an id's stand-in until the plot is complete: NUL never survives `xml_text`, so no label holds it
ID = "\x00"

# characters XML 1.0 forbids even escaped (an XML parser, and so a test, would reject the plot)
_NOT_XML = re.compile("[\x00-\x08\x0b\x0c\x0e-\x1f\ufffe\uffff\ud800-\udfff]")
# spaces SVG text would collapse (a run, or one at either end): no-break spaces keep them, as
# Chromium honours neither xml:space nor white-space there
_SPACES = re.compile(r"(?<= ) |^ | $")


def xml_text(value: object) -> str:
    return html.escape(_NOT_XML.sub("\ufffd", str(value)), quote=True)


def text_width(text: str, size: float) -> float:
    return CHAR_EM * size * len(text)


def num(v: float) -> str:
    """A coordinate: a tenth of a pixel is finer than any screen shows."""
    s = f"{v:.1f}"
    return s[:-2] if s.endswith(".0") else s


def dash(style: str, width: float) -> str:
    pattern = DASHES.get(style)
    return f' stroke-dasharray="{",".join(num(d * width) for d in pattern)}"' if pattern else ""


class Scale:
    """Data onto pixels: [lo, hi] onto [a, b], linear or log10 (where lo and hi must be > 0)."""

    def __init__(self, lo: float, hi: float, a: float, b: float, log: bool = False):
        if log:
            lo, hi = math.log10(lo), math.log10(hi)
        if not hi > lo:  # one value only: a span around it, not a division by zero
            lo, hi = lo - 0.5, hi + 0.5
        self.lo, self.hi, self.a, self.b, self.log = lo, hi, a, b, log

    def __call__(self, v: float) -> float:
        t = math.log10(v) if self.log else v
        return self.a + (t - self.lo) / (self.hi - self.lo) * (self.b - self.a)


def tick_room(length_px: float, label_em: float) -> int:
    """How many intervals an axis has room for, as matplotlib's "auto" count: a tick label's
    size times `label_em` (2 on a y axis, 3 on an x axis) each, at most 9."""
    return max(1, min(9, int(length_px * 0.72 // (label_em * 8))))


def linear_ticks(lo: float, hi: float, bins: int, integer: bool = False) -> list[tuple[float, str]]:
    """Round ticks (1, 2, 2.5 or 5 times a power of ten apart), the closest that leave at most
    `bins` intervals, labelled with as many decimals as their step needs."""
    raw = (hi - lo) / max(bins, 1)
    if not raw > 0:
        return [(lo, f"{lo:g}".replace("-", MINUS))]
    mag = 10.0 ** math.floor(math.log10(raw))
    step = next(m * mag for m in (1.0, 2.0, 2.5, 5.0, 10.0) if m * mag >= raw * (1 - 1e-9))
    if integer:
        step = max(1.0, round(step))
    decimals = 0
    while decimals < 12 and abs(round(step, decimals) - step) > step * 1e-6:
        decimals += 1
    first, last = math.ceil(lo / step - 1e-9), math.floor(hi / step + 1e-9)
    ticks = []
    for k in range(first, last + 1):
        v = round(k * step, 12) + 0.0  # + 0.0: no "-0"
        ticks.append((v, f"{v:.{decimals}f}".replace("-", MINUS)))
    return ticks


def _power(mantissa: int, k: int) -> str:
    """10^k as matplotlib writes it (a raised exponent), "2×10^k" for a minor tick."""
    exp = f'<tspan dy="-5" font-size="{num(TICK_PX * 0.75)}">{str(k).replace("-", MINUS)}</tspan>'
    return (f"{mantissa}\u00d7" if mantissa != 1 else "") + "10" + exp


def log_ticks(lo: float, hi: float) -> tuple[list[tuple[float, str]], list[float]]:
    """Labelled decades (every few when there are many) and unlabelled 2..9 minor ticks; where
    fewer than two decades fall in range, the 2s and 5s are labelled too. Labels are SVG text."""
    k0, k1 = math.ceil(math.log10(lo) - 1e-9), math.floor(math.log10(hi) + 1e-9)
    stride = max(1, math.ceil((k1 - k0 + 1) / 9))
    major = [(10.0 ** k, _power(1, k)) for k in range(k0, k1 + 1) if k % stride == 0]
    minor = [(m * 10.0 ** k, m, k) for k in range(k0 - 1, k1 + 1) for m in range(2, 10)
             if lo <= m * 10.0 ** k <= hi] if stride == 1 else []
    if len(major) < 2:
        major += [(v, _power(m, k)) for v, m, k in minor if m in (2, 5)]
        major.sort()
    labelled = {v for v, _ in major}
    return major, [v for v, _, _ in minor if v not in labelled]


class Canvas:
    """One plot's elements in drawing order; `svg` wraps them in the root element."""

    def __init__(self, width: float, height: float):
        self.width, self.height = math.ceil(width), math.ceil(height)
        self.defs: list[str] = []
        self.parts: list[str] = []

    def add(self, element: str) -> None:
        self.parts.append(element)

    def line(self, x1: float, y1: float, x2: float, y2: float, colour: str = SPINE, width: float = 1.1,
             style: str = "-", cls: str = "") -> None:
        klass = f' class="{cls}"' if cls else ""
        self.add(f'<line{klass} x1="{num(x1)}" y1="{num(y1)}" x2="{num(x2)}" y2="{num(y2)}" stroke="{colour}" '
                 f'stroke-width="{width:g}"{dash(style, width)}/>')

    def text(self, x: float, y: float, text: str, size: float = TICK_PX, anchor: str = "start", *,
             mono: bool = False, rotate: bool = False, cls: str = "", raw: bool = False) -> None:
        """`text` is escaped here unless `raw` (tick labels with a raised exponent)."""
        attrs = f' class="{cls}"' if cls else ""
        attrs += f' text-anchor="{anchor}"' if anchor != "start" else ""
        attrs += f' font-family="{xml_text(MONO)}"' if mono else ""
        attrs += f' transform="rotate(-90 {num(x)} {num(y)})"' if rotate else ""
        body = text if raw else xml_text(_SPACES.sub("\u00a0", text))
        self.add(f'<text x="{num(x)}" y="{num(y)}" font-size="{num(size)}"{attrs}>{body}</text>')

    def svg(self, alt: str) -> str:
        """The plot as an inline ``<svg>`` (role img, labelled by `alt`) with its pixel size, so the
        page lays out as it did with the PNGs. Ids are derived from the content: each plot's own on
        a page of many, and the same page for the same summary."""
        body = "".join(self.defs and ["<defs>", *self.defs, "</defs>"]) + "".join(self.parts)
        ident = "msp" + hashlib.sha1(f"{alt}\n{body}".encode("utf-8", "surrogatepass")).hexdigest()[:10]
        label = xml_text(alt)
        return (f'<svg class="plot" xmlns="http://www.w3.org/2000/svg" width="{self.width}" height="{self.height}" '
                f'viewBox="0 0 {self.width} {self.height}" role="img" aria-label="{label}" '
                f'font-family="{xml_text(SANS)}" fill="#000"><title>{label}</title>'
                f'<rect width="100%" height="100%" fill="#fff"/>{body.replace(ID, ident)}</svg>')


class Axes:
    """A plot area on a canvas: its box in pixels, its scales, and the lines around and across it."""

    def __init__(self, canvas: Canvas, left: float, top: float, right: float, bottom: float,
                 x: tuple[float, float, bool], y: tuple[float, float, bool]):
        self.c = canvas
        self.left, self.top, self.right, self.bottom = left, top, right, bottom
        self.x = Scale(x[0], x[1], left, right, x[2])
        self.y = Scale(y[0], y[1], bottom, top, y[2])

    def clip(self, key: str) -> str:
        """A clip path of this box: what is drawn in it may not spill over the labels."""
        self.c.defs.append(f'<clipPath id="{ID}-{key}"><rect x="{num(self.left)}" y="{num(self.top)}" '
                           f'width="{num(self.right - self.left)}" height="{num(self.bottom - self.top)}"/></clipPath>')
        return f' clip-path="url(#{ID}-{key})"'

    def xticks(self, ticks: Sequence[tuple[float, str]], minor: Iterable[float] = (), grid: str = GRID,
               raw: bool = False) -> None:
        for v in minor:
            self.c.line(self.x(v), self.bottom, self.x(v), self.bottom + 2.8, width=0.83)
        for v, label in ticks:
            px = self.x(v)
            if grid:
                self.c.line(px, self.top, px, self.bottom, grid, 0.83)
            self.c.line(px, self.bottom, px, self.bottom + 4.9)
            self.c.text(px, self.bottom + 18.5, label, anchor="middle", raw=raw)

    def yticks(self, ticks: Sequence[tuple[float, str]], grid: str = GRID) -> float:
        """Ticks and labels on the left; the labels' width, for the axis label beyond them."""
        for v, label in ticks:
            py = self.y(v)
            if grid:
                self.c.line(self.left, py, self.right, py, grid, 0.83)
            self.c.line(self.left - 4.9, py, self.left, py)
            self.c.text(self.left - 8.4, py + 0.35 * TICK_PX, label, anchor="end")
        return max((text_width(label, TICK_PX) for _, label in ticks), default=0.0)

    def spines(self, sides: str = "lrtb") -> None:
        for side, (x1, y1, x2, y2) in {"l": (self.left, self.top, self.left, self.bottom),
                                       "r": (self.right, self.top, self.right, self.bottom),
                                       "t": (self.left, self.top, self.right, self.top),
                                       "b": (self.left, self.bottom, self.right, self.bottom)}.items():
            if side in sides:
                self.c.line(x1, y1, x2, y2, width=1.1)

    def labels(self, xlabel: str, ylabel: str = "", ylabel_gap: float = 0.0) -> None:
        self.c.text((self.left + self.right) / 2, self.bottom + 38, xlabel, AXIS_PX, "middle")
        if ylabel:
            self.c.text(self.left - ylabel_gap - 14, (self.top + self.bottom) / 2, ylabel, AXIS_PX, "middle",
                        rotate=True)


def polylines(xs: Sequence[float], ys: Sequence[float]) -> list[list[tuple[float, float]]]:
    """Runs of finite points: a non-finite value breaks the line, as matplotlib draws it."""
    runs: list[list[tuple[float, float]]] = [[]]
    for x, y in zip(xs, ys):
        if isinstance(y, (int, float)) and math.isfinite(y):
            runs[-1].append((x, y))
        elif runs[-1]:
            runs.append([])
    return [r for r in runs if r]


def points(run: Sequence[tuple[float, float]]) -> str:
    return " ".join(f"{num(x)},{num(y)}" for x, y in run)


def x_marker(x: float, y: float, colour: str, size: float = 13.9, cls: str = "p-flag") -> str:
    """matplotlib's "X" marker: a thick cross with a white edge, so it stands out on its line."""
    h = size * 0.36
    d = f"M{num(x - h)},{num(y - h)}L{num(x + h)},{num(y + h)}M{num(x - h)},{num(y + h)}L{num(x + h)},{num(y - h)}"
    return (f'<path class="{cls}" d="{d}" stroke="#fff" stroke-width="5.6" fill="none"/>'
            f'<path d="{d}" stroke="{colour}" stroke-width="3.6" fill="none"/>')


def circle(x: float, y: float, colour: str, r: float = 2.1) -> str:
    return f'<circle cx="{num(x)}" cy="{num(y)}" r="{r}" fill="{colour}"/>'


def legend_columns(labels: Sequence[str], width: float, max_cols: int = 3,
                   size: float = LEGEND_PX) -> tuple[int, float]:
    """Columns and column width of a legend under a plot: up to `max_cols` columns of the widest
    entry that fit in `width` (entries never overlap: the legend grows downward instead)."""
    widest = max((text_width(s, size) for s in labels), default=0.0) + HANDLE_PX + 6 + 14
    return max(1, min(max_cols, len(labels), int(width // widest))), widest


def legend(canvas: Canvas, x: float, top: float, entries: Sequence[tuple[str, Handle]], columns: int,
           column_px: float, size: float = LEGEND_PX) -> None:
    """Entries row by row, each a handle (a short line and/or a marker) and its label."""
    for i, (label, (colour, width, style, marker)) in enumerate(entries):
        row, col = divmod(i, columns)
        x0, mid = x + col * column_px, top + row * LEGEND_ROW_PX + LEGEND_ROW_PX / 2
        if width > 0:
            canvas.line(x0, mid, x0 + HANDLE_PX, mid, colour, width, style)
        if marker == "o":
            canvas.add(circle(x0 + HANDLE_PX / 2, mid, colour))
        elif marker == "X":
            canvas.add(x_marker(x0 + HANDLE_PX / 2, mid, colour, 11.0, "p-key"))
        canvas.text(x0 + HANDLE_PX + 6, mid + 0.35 * size, label, size, cls="p-legend")
