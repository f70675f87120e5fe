"""The report's plots, as inline SVG elements (the page needs no file and no script).

Drawn with the pieces of `svg` rather than matplotlib, whose import and first render were most of
what the report cost a session (see docs/performance.md); the sizes, margins, colours and styles
are the ones the matplotlib figures had at 100 dpi, so the page reads as before. Every element a
reader or a test may look for carries a class: ``p-bar`` (``p-off`` for a value off the scale),
``p-ref``, ``p-label``, ``p-value``, ``p-series`` (``p-summary``), ``p-flag``, ``p-legend``,
``p-axes``.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

from probes.grad_probe.direction_rule import SUMMARY_ROW
from pytest_msprobe.reports.primitives import DARK_RED, RED, shorten
from pytest_msprobe.reports.svg import (
    AXIS_PX,
    ID,
    LEGEND_ROW_PX,
    TAB10,
    TICK_PX,
    Axes,
    Canvas,
    Handle,
    circle,
    legend,
    legend_columns,
    linear_ticks,
    log_ticks,
    num,
    points,
    polylines,
    text_width,
    tick_room,
    x_marker,
    xml_text,
)

# Bound of the bars of one plot; the table beside it lists the rest.
PLOT_MAX_BARS = 40

REF_WIDTH = 1.53  # 1.1 pt
SERIES_WIDTH, SUMMARY_WIDTH = 1.67, 2.78  # 1.2 pt, 2 pt
HATCH = (f'<pattern id="{ID}-hatch" patternUnits="userSpaceOnUse" width="7" height="7">'
         f'<rect width="7" height="7" fill="#f3d6d6"/>'
         f'<path d="M-1,1l2,-2M0,7l7,-7M6,8l2,-2" stroke="{DARK_RED}" stroke-width="0.9"/></pattern>')


def hbar_plot(entries: Sequence[tuple[str, float | None, str, str]], *, xlabel: str, log: bool,
              lines: Sequence[tuple[float, str, str]], alt: str) -> str:
    """Horizontal bars, first entry on top. ``entries``: (label, value, value text, colour); a
    value of None (or non-finite) is off the scale and drawn as a hatched bar across the whole
    axis. ``lines``: (x, linestyle, legend label). The value texts sit in a right-hand column, so
    they never overlap the bars or each other."""
    n = len(entries)
    labels = [shorten(str(label)) for label, _, _, _ in entries]
    texts = [str(text) for _, _, text, _ in entries]
    left = 25 + max((text_width(s, TICK_PX) for s in labels), default=0.0)
    right = 25 + max((text_width(s, TICK_PX) for s in texts), default=0.0)
    width = max(1000.0, left + right + 500)
    top, bottom = (40 if lines else 15), 60
    height = 27 * n + top + bottom + 10
    c = Canvas(width, height)
    vals = [v if v is not None and math.isfinite(v) else None for _, v, _, _ in entries]
    values = [v for v in vals if v is not None and (v > 0 or not log)]
    marks = [x for x, _, _ in lines if math.isfinite(x) and (x > 0 or not log)]
    if log:
        span = values + marks or [1.0]
        lo, hi = min(span) / 3.0, max(span) * 3.0
    else:
        lo = min(values + marks + [0.0]) - 0.02
        hi = max(values + marks + [1.0]) + 0.01
    # rows are placed by their index (the first on top), not through a y scale
    ax = Axes(c, left, top, width - right, height - bottom, (lo, hi, log), (0.0, 1.0, False))
    if log:
        major, minor = log_ticks(lo, hi)
        ax.xticks(major, minor, grid="#dddddd", raw=True)
    else:
        ax.xticks(linear_ticks(lo, hi, tick_room(ax.right - ax.left, 3)), grid="#dddddd")
    row = (ax.bottom - ax.top) / max(n, 1)
    x0 = ax.x(lo)
    for i, ((_, _, _, colour), v) in enumerate(zip(entries, vals)):
        y = ax.top + (i + 0.15) * row
        if v is None:
            if HATCH not in c.defs:
                c.defs.append(HATCH)
            c.add(f'<rect class="p-bar p-off" x="{num(x0)}" y="{num(y)}" width="{num(ax.right - x0)}" '
                  f'height="{num(0.7 * row)}" fill="url(#{ID}-hatch)" stroke="{DARK_RED}" stroke-width="1.1"/>')
        else:
            w = ax.x(max(v, lo)) - x0
            c.add(f'<rect class="p-bar" x="{num(x0)}" y="{num(y)}" width="{num(w)}" height="{num(0.7 * row)}" '
                  f'fill="{xml_text(colour)}"/>')
    for x, style, _ in lines:
        if math.isfinite(x) and lo <= x <= hi:
            c.line(ax.x(x), ax.top, ax.x(x), ax.bottom, "#000", REF_WIDTH, style, cls="p-ref")
    ax.spines("lrb")
    for i, (label, text) in enumerate(zip(labels, texts)):
        y = ax.top + (i + 0.5) * row + 0.35 * TICK_PX
        c.text(ax.left - 5, y, label, anchor="end", mono=True, cls="p-label")
        c.text(ax.right + 5, y, text, mono=True, cls="p-value")
    c.text((ax.left + ax.right) / 2, ax.bottom + 38, xlabel, AXIS_PX, "middle")
    if lines:
        entries_ = [(str(label), ("#000", REF_WIDTH, style, "")) for _, style, label in lines]
        _, column = legend_columns([label for label, _ in entries_], width, len(entries_), TICK_PX)
        legend(c, ax.left + 3, ax.top - 30, entries_, len(entries_), column, TICK_PX)
    return c.svg(alt)


def _step_axis(steps: Sequence[int], axes_px: float) -> tuple[float, float, list[tuple[float, str]]]:
    """Steps as the x axis: padded so the end points show, every step ticked when there are few."""
    if not steps:
        return 0.0, 1.0, []
    pad = max(0.3, 0.04 * (max(steps) - min(steps)))
    lo, hi = min(steps) - pad, max(steps) + pad
    if len(steps) <= 20:
        return lo, hi, [(float(s), str(s)) for s in sorted(set(steps))]
    return lo, hi, linear_ticks(lo, hi, tick_room(axes_px, 3), integer=True)


def _legend_room(labels: Sequence[str], width: float, left: float) -> tuple[int, float, float]:
    """Columns, column width and the bottom margin that holds the x axis and the legend."""
    columns, column = legend_columns(labels, width - left - 5)
    rows = math.ceil(max(len(labels), 1) / columns)
    return columns, column, 55 + LEGEND_ROW_PX * rows + 10


def _series(ax: Axes, steps: Sequence[int], ys: Sequence[float], colour: str, line_width: float,
            marker: bool, cls: str) -> str:
    drawn = ""
    for run in polylines(steps, ys):
        at = [(ax.x(x), ax.y(y)) for x, y in run]
        drawn += (f'<polyline points="{points(at)}" fill="none" stroke="{colour}" stroke-width="{line_width}" '
                  'stroke-linejoin="round" stroke-linecap="round"/>')
        if marker:
            drawn += "".join(circle(x, y, colour) for x, y in at)
    return f'<g class="{cls}">{drawn}</g>'


def similarity_plot(steps: Sequence[int], rows: Sequence[tuple[str, Sequence[float], Sequence[int]]],
                    first_step_min: float, alt: str) -> str:
    """One test's similarity-per-step lines; the summary row (if any) is drawn last, black and bold.
    The legend goes under the axes, where it hides no line."""
    flagged: list[tuple[int, float]] = []
    for _, ys, bad in rows:
        at = dict(zip(steps, ys))
        flagged += [(s, at[s]) for s in bad if s in at and math.isfinite(at[s])]
    plain = [r for r in rows if r[0] != SUMMARY_ROW]
    colours = {i: TAB10[i % len(TAB10)] for i in range(len(plain))}
    entries: list[tuple[str, Handle]] = [(f"first-step min {first_step_min:g}", (RED, 1.39, "--", ""))]
    entries += [(shorten(name, 34), (colours[i], SERIES_WIDTH, "-", "o")) for i, (name, _, _) in enumerate(plain)]
    entries += [(shorten(name, 34), ("#000", SUMMARY_WIDTH, "-", "")) for name, _, _ in rows if name == SUMMARY_ROW]
    entries += [("flagged step", (RED, 0.0, "-", "X"))] if flagged else []
    width, left = 620.0, 70.0
    columns, column, bottom = _legend_room([label for label, _ in entries], width, left)
    c = Canvas(width, 300 + bottom)
    values = [v for _, ys, _ in rows for v in ys if math.isfinite(v)]
    # a fixed [0, 1] range would flatten the drops of a few hundredths that the rule is about
    low = max(-1.05, min(values + [first_step_min]) - 0.02)
    high = 1.01 + 0.02 * (1.0 - low)
    xlo, xhi, xticks = _step_axis(steps, width - left - 15)
    ax = Axes(c, left, 12, width - 15, c.height - bottom, (xlo, xhi, False), (low, high, False))
    ax.xticks(xticks)
    gap = ax.yticks(linear_ticks(low, high, tick_room(ax.bottom - ax.top, 2)))
    clip = ax.clip("c")
    y = ax.y(first_step_min)
    drawn = [f'<line class="p-ref" x1="{num(ax.left)}" y1="{num(y)}" x2="{num(ax.right)}" y2="{num(y)}" stroke="{RED}" '
             f'stroke-width="1.39" stroke-dasharray="5.1,2.2"/>']
    drawn += [_series(ax, steps, ys, colours[i], SERIES_WIDTH, True, "p-series") for i, (_, ys, _) in enumerate(plain)]
    drawn += [_series(ax, steps, ys, "#000", SUMMARY_WIDTH, False, "p-series p-summary")
              for name, ys, _ in rows if name == SUMMARY_ROW]
    drawn += [x_marker(ax.x(s), ax.y(v), RED) for s, v in flagged]
    c.add(f'<g{clip}>{"".join(drawn)}</g>')
    ax.spines()
    ax.labels("step", "cosine similarity", gap)
    legend(c, left, ax.bottom + 48, entries, columns, column)
    return c.svg(alt)


def fraction_plot(steps: Sequence[int], panels: Sequence[tuple[str, Sequence[tuple[str, Sequence[float]]]]],
                  alt: str) -> str:
    """Side-by-side panels of fractions (0 to 1) per step, one line per name, the same colour for a
    name in every panel; ``panels``: (y label, [(name, values per step)]). One legend under them."""
    names = list(dict.fromkeys(name for _, lines in panels for name, _ in lines))
    colours = {name: TAB10[i % len(TAB10)] for i, name in enumerate(names)}
    entries: list[tuple[str, Handle]] = [(shorten(name, 34), (colours[name], SERIES_WIDTH, "-", "o")) for name in names]
    k = max(len(panels), 1)
    width, left, right = 340.0 * k + 30, 70.0, 15.0
    columns, column, bottom = _legend_room([label for label, _ in entries], width, left)
    c = Canvas(width, 260 + bottom)
    panel = (width - left - right) / (k + 0.35 * (k - 1))  # matplotlib's wspace=0.35
    for i, (ylabel, lines) in enumerate(panels):
        values = [v for _, ys in lines for v in ys if math.isfinite(v)]
        # a fraction of a few thousandths must not lie flat on the axis, nor a zero look like noise
        top = max(values + [0.01])
        x0 = left + i * 1.35 * panel
        xlo, xhi, xticks = _step_axis(steps, panel)
        ax = Axes(c, x0, 12, x0 + panel, c.height - bottom, (xlo, xhi, False), (-0.02 * top, 1.08 * top, False))
        c.add('<g class="p-axes">')
        ax.xticks(xticks)
        gap = ax.yticks(linear_ticks(-0.02 * top, 1.08 * top, tick_room(ax.bottom - ax.top, 2)))
        clip = ax.clip(f"c{i}")
        c.add(f'<g{clip}>' + "".join(_series(ax, steps, ys, colours[name], SERIES_WIDTH, True, "p-series")
                                      for name, ys in lines) + "</g>")
        ax.spines()
        ax.labels("step", ylabel, gap)
        c.add("</g>")
    legend(c, left, c.height - bottom + 48, entries, columns, column)
    return c.svg(alt)
