"""grad_probe's FP8 health section: per optimizer and FP8 format, the fraction of each
parameter's gradient that would underflow or saturate at its tensorwise amax scale, per step,
the parameters that lose the most first. Absent unless grad_probe ran with fp8_health."""

from __future__ import annotations

import math
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from probes.grad_probe.stats import FP8_HEALTH_FIGURES
from pytest_msprobe.reports.fp8_health import Fp8Health, read_session
from pytest_msprobe.reports.plots import fraction_plot
from pytest_msprobe.reports.primitives import (
    CELL_LIST_MAX,
    TABLE_MAX_ROWS,
    badge,
    code,
    esc,
    fmt,
    href,
    link_text,
    more,
    shorten,
    table,
)
from pytest_msprobe.reports.sections.grad_probe import SIMILARITY_MAX_LINES, SIMILARITY_MAX_PLOTS


def _peak(values: list[float], steps: list[int]) -> str:
    """The largest value and its step, "0.75 (step 2)"; a dash where no step has one."""
    at = [(v, s) for v, s in zip(values, steps) if math.isfinite(v)]
    if not at:
        return "\u2014"
    v, s = max(at, key=lambda vs: (vs[0], -vs[1]))
    return f"{fmt(v)} (step {s})"


def _figure(h: Fp8Health, params: list[str], base: Path) -> str:
    status = badge(f"up to {fmt(h.worst())} of a gradient lost", "warn")
    drawn = params[:SIMILARITY_MAX_LINES]
    panels = [(f"{figure} fraction", [(p, h.params[p].get(figure, [])) for p in drawn]) for figure in FP8_HEALTH_FIGURES]
    plot = fraction_plot(h.steps, panels, alt=f"FP8 health per step: {h.test} {h.format}")
    note = (f'<p class="muted">{len(drawn)} of {len(params)} parameters drawn (the most lost first).</p>'
            if len(params) > len(drawn) else "")
    folder = f'<a href="{href(h.folder, base)}">{esc(shorten(link_text(h.folder, base), 80))}</a>'
    return (f'<figure class="sim"><figcaption>{code(h.test)} {code(h.format)} {status}<br>'
            f'<span class="muted">{folder}</span></figcaption>{plot}{note}</figure>')


def fp8_section(tests: Mapping[str, Any], base: Path, unit: str = "test") -> str:
    """The plots (bounded, the worst optimizers and formats first) and a table of every
    parameter's peak fractions; "" where no dump has FP8 health columns."""
    found = [h for h in read_session(tests) if h.params and h.steps]
    if not found:
        return ""
    found.sort(key=lambda h: (-h.worst(), h.test, str(h.folder), h.format))
    order = {id(h): sorted(h.params, key=lambda p: (-h.lost(p), p)) for h in found}
    title = "<h2>grad_probe: FP8 health of the gradients per step</h2>"
    intro = ("<p>The fraction of each gradient's elements that would underflow to zero or saturate if cast to "
             "the FP8 format at its tensorwise amax scale (grad_probe.fp8_health), per step; over ranks, the "
             f"worst rank. {len(found)} optimizer \u00d7 format series in "
             f"{len({h.test for h in found})} {esc(unit)}(s), the parameters that lose the most first.</p>")
    lossy = [h for h in found if h.worst() > 0]
    grid = "".join(_figure(h, order[id(h)], base) for h in lossy[:SIMILARITY_MAX_PLOTS])
    clean = [h for h in found if h.worst() <= 0]
    if clean:  # flat lines at 0 would take the room of the plots worth reading
        names = ", ".join(f"{code(h.test)} {code(h.format)}" for h in clean[:CELL_LIST_MAX])
        rest = f" and {len(clean) - CELL_LIST_MAX} more" if len(clean) > CELL_LIST_MAX else ""
        grid_note = (f'<p class="ok">{len(clean)} series lose no element at any step ({names}{rest}); '
                     "their figures are in the table.</p>")
    else:
        grid_note = ""
    rows = sorted(((h.lost(p), h, p) for h in found for p in order[id(h)]),
                  key=lambda r: (-r[0], r[1].test, r[2], r[1].format))
    cells = [(code(p), code(h.format), code(h.test))
             + tuple(esc(_peak(h.params[p].get(figure, []), h.steps)) for figure in FP8_HEALTH_FIGURES)
             for _, h, p in rows[:TABLE_MAX_ROWS]]
    listed = table(("parameter", "format", unit) + tuple(f"largest {f} (step)" for f in FP8_HEALTH_FIGURES), cells,
                   "wide")
    return (f'<section id="fp8">{title}{intro}' + (f'<div class="grid">{grid}</div>' if grid else "")
            + more(len(lossy) - SIMILARITY_MAX_PLOTS, "series") + grid_note
            + f"<details{'' if grid else ' open'}><summary>{len(rows)} parameter \u00d7 format figures, the most lost first</summary>{listed}"
            + more(len(rows) - TABLE_MAX_ROWS, "parameters") + "</details></section>")
