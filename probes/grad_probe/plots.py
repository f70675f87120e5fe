"""similarities_picture/{name}_similarities.png: one line plot per similarities.csv row.

Same picture as msprobe (640x480 px, x = steps, y = similarities, title ``{name}_similarities``),
plus a fixed y-range [0, 1.05], a dashed line at the first-step threshold and red crosses on
flagged steps. matplotlib is imported on first use and drawn through its Agg canvas directly, so
the user's pyplot backend is never changed.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path

from probes.grad_probe.csv_format import file_name_for_param
from probes.grad_probe.direction_rule import FIRST_STEP_MIN

PICTURE_DIR = "similarities_picture"
Y_LIMITS = (0.0, 1.05)
FIGSIZE = (6.4, 4.8)
DPI = 100



def picture_filename(name: str) -> str:
    """``{name}_similarities.png``; characters outside [A-Za-z0-9_.-] are percent-encoded."""
    return f"{file_name_for_param(name)}_similarities.png"


def plot_similarities(out_dir: str | Path, steps: Sequence[int], rows: Mapping[str, Sequence[float | None]],
                      threshold: float = FIRST_STEP_MIN, flagged: Mapping[str, Iterable[int]] | None = None,
                      progress=None) -> list[Path]:
    """Write one PNG per row into ``out_dir/similarities_picture``; returns the paths written.

    ``rows`` maps a row name to one value per step (None = no value, drawn as a gap).
    ``progress`` is an optional wrapper ``progress(iterable, total, desc)``.
    Raises ImportError when matplotlib is not installed.
    """
    import numpy as np
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure
    from PIL import Image

    pic_dir = Path(out_dir) / PICTURE_DIR
    pic_dir.mkdir(parents=True, exist_ok=True)
    xs = list(steps)
    flagged = flagged or {}
    # One figure: the frame (axes, ticks, labels, threshold line) is rendered once; for each row only
    # the data line, the flagged markers, the title and the legend are drawn over a copy of it.
    fig = Figure(figsize=FIGSIZE, dpi=DPI)
    canvas = FigureCanvasAgg(fig)
    ax = fig.add_subplot(1, 1, 1)
    ax.axhline(threshold, linestyle="--", color="red", linewidth=1, label=f"threshold {threshold}")
    (line,) = ax.plot(xs, [math.nan] * len(xs), marker="o", markersize=3, animated=True, clip_on=False)
    (marks,) = ax.plot([], [], linestyle="none", marker="x", color="red", markersize=8, label="flagged", clip_on=False,
                       animated=True)
    ax.set_ylim(*Y_LIMITS)
    if xs:
        pad = max(0.5, 0.05 * (max(xs) - min(xs)))
        ax.set_xlim(min(xs) - pad, max(xs) + pad)
    ax.set_xlabel("steps")
    ax.set_ylabel("similarities")
    ax.set_title("")
    if len(xs) <= 20:
        ax.set_xticks(xs)
    legend = ax.legend(loc="lower left", fontsize="small")
    legend.set_animated(True)
    ax.title.set_animated(True)
    canvas.draw()
    background = canvas.copy_from_bbox(fig.bbox)
    idx = {s: i for i, s in enumerate(xs)}
    items: Iterable = rows.items()
    if progress is not None:
        items = progress(items, len(rows), "save similarities (by param)")
    written = []
    for name, values in items:
        ys = [math.nan if v is None else float(v) for v in values]
        line.set_ydata(ys)
        bad = sorted(set(flagged.get(name, ())) & idx.keys())
        marks.set_data(bad, [ys[idx[s]] for s in bad])
        ax.title.set_text(f"{name}_similarities")
        canvas.restore_region(background)
        for artist in (line, marks, legend, ax.title):
            fig.draw_artist(artist)
        path = pic_dir / picture_filename(name)
        Image.fromarray(np.asarray(canvas.buffer_rgba())).save(path, format="png")
        written.append(path)
    return written
