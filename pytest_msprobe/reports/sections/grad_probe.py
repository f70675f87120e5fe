"""grad_probe's sections: the parameters whose gradients went non-finite, and the gradient
direction similarities of golden comparisons, one plot per comparison with its flagged steps."""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

from probes.core.session_tables import ParamRow
from probes.core.thresholds import DIRECTION_FIRST_STEP_MIN, DIRECTION_MAX_DROP
from probes.grad_probe.direction_rule import SUMMARY_ROW, Flag, flag_series
from pytest_msprobe.reports.plots import similarity_plot
from pytest_msprobe.reports.primitives import (
    TABLE_MAX_ROWS,
    as_list,
    badge,
    cell_list,
    code,
    esc,
    finite,
    fmt,
    mapping,
    more,
    table,
)

# Bounds of the per-test plots of a grad_probe section: plots shown, lines drawn in one, flags listed.
SIMILARITY_MAX_PLOTS = 24
SIMILARITY_MAX_LINES = 8
FLAGS_LISTED = 8


def params_section(params: Mapping[str, ParamRow], ran: bool, unit: str = "test") -> str:
    """The parameters with non-finite gradients, most steps first, with their first finding."""
    title = "<h2>grad_probe: non-finite gradients</h2>"
    if not params:
        text = "Nothing flagged: every monitored gradient stayed finite." if ran else f"No {unit} ran under the probe."
        return f'<section id="params">{title}<p class="ok">{esc(text)}</p></section>'
    items = sorted(params.items(), key=lambda kv: (-kv[1].nonfinite_steps, kv[0]))
    rows = [(code(p), esc(fmt(t.nonfinite_steps)), esc(t.first or "\u2014"), f"{len(t.tests)}<br>{cell_list(t.tests, 2)}")
            for p, t in items[:TABLE_MAX_ROWS]]
    return (f'<section id="params">{title}<p>{len(items)} parameter(s) with non-finite gradients.</p>'
            + table(("parameter", "non-finite steps", "first", f"{unit}s affected"), rows, "wide")
            + more(len(items) - TABLE_MAX_ROWS, "parameters") + "</section>")


def _series(values: Any, n: int) -> list[float]:
    """`n` values per step as floats, NaN where a value is missing or not a number (a gap)."""
    out = [float(v) if finite(v) else math.nan for v in as_list(values)[:n]]
    return out + [math.nan] * (n - len(out))


def _similarity_figure(nodeid: str, entry: Mapping[str, Any]) -> tuple[bool, str]:
    steps = [int(s) for s in as_list(entry.get("steps")) if finite(s)]
    fsm = entry.get("first_step_min", DIRECTION_FIRST_STEP_MIN)
    fsm = float(fsm) if finite(fsm) else DIRECTION_FIRST_STEP_MIN
    drop = entry.get("max_drop", DIRECTION_MAX_DROP)
    drop = float(drop) if finite(drop) else DIRECTION_MAX_DROP
    n = len(steps)
    rows: list[tuple[str, list[float], list[Flag]]] = []
    for name, values in mapping(entry.get("params")).items():
        ys = _series(values, n)
        rows.append((str(name), ys, flag_series(str(name), zip(steps, (None if math.isnan(y) else y for y in ys)),
                                                  fsm, drop)))
    # parameters that were flagged first, then the lowest ones: the lines worth seeing
    rows.sort(key=lambda r: (not r[2], min((y for y in r[1] if math.isfinite(y)), default=2.0), r[0]))
    drawn = rows[:SIMILARITY_MAX_LINES]
    summary = entry.get("summary")
    if summary is not None:
        ys = _series(summary, n)
        flags = flag_series(SUMMARY_ROW, zip(steps, (None if math.isnan(y) else y for y in ys)), fsm, drop)
        drawn.append((SUMMARY_ROW, ys, flags))
        rows.append((SUMMARY_ROW, ys, flags))
    all_flags = sorted((f for _, _, fl in rows for f in fl), key=lambda f: (f.step, f.param))
    flagged_steps = sorted({f.step for f in all_flags})
    status = (badge(f"flagged at step {', '.join(map(str, flagged_steps))}", "bad") if flagged_steps
              else badge("directions close", "good"))
    if n and drawn:
        plot = similarity_plot(steps, [(name, ys, [f.step for f in fl]) for name, ys, fl in drawn], fsm,
                               alt=f"gradient similarity per step: {nodeid}")
    else:
        plot = '<p class="muted">no similarity values</p>'
    notes = []
    if len(rows) - (summary is not None) > SIMILARITY_MAX_LINES:
        notes.append(f'<p class="muted">{SIMILARITY_MAX_LINES} of {len(rows) - (summary is not None)} parameters '
                     "drawn (flagged and lowest first).</p>")
    if all_flags:
        items = "".join(f"<li>step {f.step} \u00b7 {code(f.param)}: {esc(f.describe(fsm, drop))}</li>"
                        for f in all_flags[:FLAGS_LISTED])
        rest = f"<li class=\"muted\">+{len(all_flags) - FLAGS_LISTED} more</li>" if len(all_flags) > FLAGS_LISTED else ""
        notes.append(f'<ul class="flags">{items}{rest}</ul>')
    html_ = (f'<figure class="sim"><figcaption>{code(nodeid)} {status}</figcaption>{plot}'
             + "".join(notes) + "</figure>")
    return bool(all_flags), html_


def similarities_section(similarities: Mapping[str, Any]) -> str:
    """One plot per gradient comparison (a golden check's), the flagged comparisons first."""
    title = "<h2>grad_probe: gradient direction similarity per step</h2>"
    if not similarities:
        return f'<section id="similarities">{title}<p class="muted">No gradient comparison in this session.</p></section>'
    figures = [(str(k), *_similarity_figure(str(k), mapping(v))) for k, v in similarities.items()]
    figures.sort(key=lambda f: (not f[1], f[0]))
    flagged = sum(1 for f in figures if f[1])
    rule = (f"Rule (defaults; a comparison may set its own): a similarity below {DIRECTION_FIRST_STEP_MIN} at the "
            f"first compared step, or a drop of more than {DIRECTION_MAX_DROP} from one compared step to the next, "
            "flags the step.")
    summary = (f'<p><span class="{"bad" if flagged else "ok"}">{flagged} of {len(figures)} comparison(s) '
               f"flagged.</span> {esc(rule)}</p>")
    grid = "".join(h for _, _, h in figures[:SIMILARITY_MAX_PLOTS])
    return (f'<section id="similarities">{title}{summary}<div class="grid">{grid}</div>'
            + more(len(figures) - SIMILARITY_MAX_PLOTS, "comparisons") + "</section>")
