"""The report's plots, as ``<img>`` tags holding base64 PNG data URIs (the page needs no file).

matplotlib is imported on the first plot and drawn through its Agg canvas (Figure +
FigureCanvasAgg, never pyplot), so the user's backend and pyplot's global state are untouched.
The figures' margins are computed from the label lengths in monospace characters, not by a layout
engine: as tidy, and about twice as fast on a plot with many labels.
"""

from __future__ import annotations

import base64
import io
import math
from collections.abc import Sequence
from typing import Any

from probes.grad_probe.direction_rule import SUMMARY_ROW
from pytest_msprobe.reports.primitives import DARK_RED, RED, esc, shorten

# Bound of the bars of one plot; the table beside it lists the rest.
PLOT_MAX_BARS = 40

# DejaVu Sans Mono (matplotlib's bundled monospace) is 0.6 em wide: at 8 pt, 4.8 pt a character.
MONO_FONT = {"family": "monospace", "size": 8}
MONO_CHAR_IN = 0.6 * 8 / 72


def plot_text(text: str) -> str:
    """A name as matplotlib must get it to draw it literally: every ``$`` escaped (a ``$…$`` pair
    is mathtext, and a malformed one raises and would cost the whole report), and a leading ``_``
    kept off the first character (legends drop such labels: torch.compile's ``_orig_mod.``)."""
    text = text.replace("$", r"\$")
    return " " + text if text.startswith("_") else text


def figure(width_in: float, height_in: float, margins_in: tuple[float, float, float, float]) -> tuple[Any, Any]:
    """A figure whose axes sit inside fixed margins (left, right, top, bottom; inches)."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    fig = Figure(figsize=(width_in, height_in), dpi=100)
    left, right, top, bottom = margins_in
    fig.subplots_adjust(left=left / width_in, right=1 - right / width_in, top=1 - top / height_in,
                        bottom=bottom / height_in)
    return fig, FigureCanvasAgg(fig)


def png_img(fig: Any, canvas: Any, alt: str) -> str:
    """The figure as an ``<img>`` with its pixel size, so the page lays out before it decodes."""
    buf = io.BytesIO()
    canvas.print_png(buf)
    data = base64.b64encode(buf.getvalue()).decode("ascii")
    w, h = (int(round(v)) for v in fig.get_size_inches() * fig.dpi)
    return f'<img class="plot" src="data:image/png;base64,{data}" width="{w}" height="{h}" alt="{esc(alt)}">'


def hbar_plot(entries: Sequence[tuple[str, float | None, str, str]], *, xlabel: str, log: bool,
              lines: Sequence[tuple[float, str, str]], alt: str) -> str:
    """Horizontal bars, first entry on top. ``entries``: (label, value, value text, colour); a
    value of None is off the scale (non-finite) and drawn as a hatched bar across the whole axis.
    The value texts sit in a right-hand column (a twin axis' tick labels), so they never overlap
    the bars or each other."""
    n = len(entries)
    labels = [plot_text(shorten(label)) for label, _, _, _ in entries]
    texts = [plot_text(text) for _, _, text, _ in entries]
    left_in = 0.25 + MONO_CHAR_IN * max(map(len, labels), default=0)
    right_in = 0.25 + MONO_CHAR_IN * max(map(len, texts), default=0)
    width_in = max(10.0, left_in + right_in + 5.0)
    top_in, bottom_in = (0.4 if lines else 0.15), 0.6
    fig, canvas = figure(width_in, 0.27 * n + top_in + bottom_in + 0.1, (left_in, right_in, top_in, bottom_in))
    ax = fig.add_subplot(1, 1, 1)
    values = [v for _, v, _, _ in entries if v is not None and (v > 0 or not log)]
    marks = [x for x, _, _ in lines]
    if log:
        span = values + marks or [1.0]
        lo, hi = min(span) / 3.0, max(span) * 3.0
        ax.set_xscale("log")
    else:
        lo = min(values + marks + [0.0]) - 0.02
        hi = max(values + marks + [1.0]) + 0.01
    on = [(y, v, colour) for y, (_, v, _, colour) in enumerate(entries) if v is not None]
    off = [y for y, (_, v, _, _) in enumerate(entries) if v is None]
    if on:
        ax.barh([y for y, _, _ in on], [max(v, lo) - lo for _, v, _ in on], left=lo,
                color=[c for _, _, c in on], height=0.7)
    if off:
        ax.barh(off, [hi - lo] * len(off), left=lo, color="#f3d6d6", edgecolor=DARK_RED, hatch="///",
                height=0.7, linewidth=0.8)
    for x, style, label in lines:
        ax.axvline(x, color="black", linestyle=style, linewidth=1.1, label=plot_text(label))
    ax.set_xlim(lo, hi)
    ys = list(range(n))
    for axis, tick_labels in ((ax, labels), (ax.twinx(), texts)):
        axis.set_ylim(n - 0.5, -0.5)
        axis.set_yticks(ys)
        axis.set_yticklabels(tick_labels, fontdict=MONO_FONT)
        axis.tick_params(axis="y", length=0)
        axis.spines["top"].set_visible(False)
    ax.set_xlabel(xlabel, fontsize=9)
    ax.tick_params(axis="x", labelsize=8)
    ax.grid(axis="x", color="#dddddd", linewidth=0.6)
    ax.set_axisbelow(True)
    if lines:
        ax.legend(loc="lower left", bbox_to_anchor=(0.0, 1.0), ncol=len(lines), frameon=False, fontsize=8,
                  borderaxespad=0.2)
    return png_img(fig, canvas, alt)


def _step_axis(ax: Any, steps: Sequence[int]) -> None:
    """Steps as the x axis: padded so the end points show, every step ticked when there are few."""
    if steps:
        pad = max(0.3, 0.04 * (max(steps) - min(steps)))
        ax.set_xlim(min(steps) - pad, max(steps) + pad)
        if len(steps) <= 20:
            ax.set_xticks(list(steps))
    ax.set_xlabel("step", fontsize=9)


def similarity_plot(steps: Sequence[int], rows: Sequence[tuple[str, Sequence[float], Sequence[int]]],
                    first_step_min: float, alt: str) -> str:
    """One test's similarity-per-step lines; the summary row (if any) is drawn last, black and bold.
    The legend goes under the axes, where it hides no line."""
    entries = len(rows) + 1 + any(bad for _, _, bad in rows)
    legend_rows = math.ceil(entries / 3)
    bottom_in = 0.55 + 0.17 * legend_rows + 0.1
    fig, canvas = figure(6.2, 3.0 + bottom_in, (0.7, 0.15, 0.12, bottom_in))
    ax = fig.add_subplot(1, 1, 1)
    values = [v for _, ys, _ in rows for v in ys if math.isfinite(v)]
    # a fixed [0, 1] range would flatten the drops of a few hundredths that the rule is about
    low = max(-1.05, min(values + [first_step_min]) - 0.02)
    ax.set_ylim(low, 1.01 + 0.02 * (1.0 - low))
    ax.axhline(first_step_min, color=RED, linestyle="--", linewidth=1, label=f"first-step min {first_step_min:g}")
    flagged_x: list[int] = []
    flagged_y: list[float] = []
    for name, ys, bad in rows:
        style = ({"color": "black", "linewidth": 2.0, "zorder": 3} if name == SUMMARY_ROW
                 else {"linewidth": 1.2, "marker": "o", "markersize": 3})
        ax.plot(steps, ys, label=plot_text(shorten(name, 34)), **style)
        at = dict(zip(steps, ys))
        for s in bad:
            if s in at and math.isfinite(at[s]):
                flagged_x.append(s)
                flagged_y.append(at[s])
    if flagged_x:
        ax.plot(flagged_x, flagged_y, linestyle="none", marker="X", color=RED, markersize=10,
                markeredgecolor="white", markeredgewidth=0.8, label="flagged step", zorder=4)
    _step_axis(ax, steps)
    ax.set_ylabel("cosine similarity", fontsize=9)
    ax.tick_params(labelsize=8)
    ax.grid(color="#e5e5e5", linewidth=0.6)
    handles, labels = ax.get_legend_handles_labels()
    fig.legend(handles, labels, loc="lower left", bbox_to_anchor=(0.7 / 6.2, 0.02), ncol=3, fontsize=7,
               frameon=False, handlelength=1.8, columnspacing=1.2)
    return png_img(fig, canvas, alt)


def fraction_plot(steps: Sequence[int], panels: Sequence[tuple[str, Sequence[tuple[str, Sequence[float]]]]],
                  alt: str) -> str:
    """Side-by-side panels of fractions (0 to 1) per step, one line per name, the same colour for a
    name in every panel; ``panels``: (y label, [(name, values per step)]). One legend under them."""
    names = list(dict.fromkeys(name for _, lines in panels for name, _ in lines))
    legend_rows = math.ceil(max(len(names), 1) / 3)
    bottom_in = 0.55 + 0.17 * legend_rows + 0.1
    width_in = 3.4 * len(panels) + 0.3
    fig, canvas = figure(width_in, 2.6 + bottom_in, (0.7, 0.15, 0.12, bottom_in))
    fig.subplots_adjust(wspace=0.35)
    colours = {name: f"C{i % 10}" for i, name in enumerate(names)}
    for i, (ylabel, lines) in enumerate(panels):
        ax = fig.add_subplot(1, len(panels), i + 1)
        values = [v for _, ys in lines for v in ys if math.isfinite(v)]
        top = max(values + [0.0])
        # a fraction of a few thousandths must not lie flat on the axis, nor a zero look like noise
        top = max(top, 0.01)
        ax.set_ylim(-0.02 * top, 1.08 * top)
        for name, ys in lines:
            ax.plot(steps, ys, color=colours[name], linewidth=1.2, marker="o", markersize=3,
                    label=plot_text(shorten(name, 34)) if i == 0 else None)
        _step_axis(ax, steps)
        ax.set_ylabel(ylabel, fontsize=9)
        ax.tick_params(labelsize=8)
        ax.grid(color="#e5e5e5", linewidth=0.6)
    handles, labels = fig.axes[0].get_legend_handles_labels() if fig.axes else ([], [])
    fig.legend(handles, labels, loc="lower left", bbox_to_anchor=(0.7 / width_in, 0.02), ncol=3, fontsize=7,
               frameon=False, handlelength=1.8, columnspacing=1.2)
    return png_img(fig, canvas, alt)
