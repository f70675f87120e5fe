"""online_dispatch's section: every op compared with its reference, the failing ones first and
plotted by their worst cosine, so a clean session shows what it compared."""

from __future__ import annotations

from collections.abc import Mapping

from probes.core.dispatch_metrics import COS_MAX_THRESHOLD, COS_THRESHOLD
from probes.core.session_tables import OpRow
from pytest_msprobe.reports.plots import PLOT_MAX_BARS, hbar_plot
from pytest_msprobe.reports.primitives import (
    RED,
    TABLE_MAX_ROWS,
    cell_list,
    code,
    esc,
    finite,
    fmt,
    more,
    table,
)


def _cosine_figure(op: OpRow) -> tuple[float | None, str]:
    cos, err = op.worst_cosine, op.worst_max_abs_err
    text = f"cos {fmt(cos)}, max abs err {fmt(err)}"
    return (float(cos) if finite(cos) else None), text


def ops_section(stats: Mapping[str, OpRow], ran: bool, unit: str = "test", compared: int | None = None) -> str:
    """Every op compared, with its calls (the failing ones first, plotted), so a clean session
    shows what it compared. ``compared``: the session's op calls compared (its account), which a
    summary holds even where the tool did not count calls per op."""
    title = "<h2>online_dispatch: ops that disagree with the reference</h2>"
    failing = sorted(((k, s) for k, s in stats.items() if s.failed > 0),
                     key=lambda kv: (_cosine_figure(kv[1])[0] is not None, _cosine_figure(kv[1])[0] or 0.0, kv[0]))
    per_op = bool(stats) and all(s.compared is not None for s in stats.values())
    total = compared if compared is not None else sum(s.compared or 0 for s in stats.values())
    unknown = "" if per_op else " (this online_dispatch does not count the calls of each op)"
    if not stats and not total:
        text = "Nothing flagged: no op was compared." if ran else f"No {unit} ran under the probe."
        return f'<section id="ops">{title}<p class="ok">{esc(text)}</p></section>'
    parts = [title]
    if not failing:
        ops = f" ({len(stats)} ops)" if per_op else ""
        parts.append(f'<p class="ok">{esc(f"Nothing flagged: {total} op calls compared{ops}, all within the rule{unknown}.")}</p>')
    else:
        parts.append(f"<p>{len(failing)} of {len(stats)} ops failed the comparison ({total} calls compared{esc(unknown)}). "
                     f"Rule: cosine &lt; {COS_THRESHOLD} with a large max abs error, or cosine &lt; {COS_MAX_THRESHOLD}, "
                     "or a max abs error above its limit.</p>")
        entries = [(op, cos, text, RED) for op, s in failing[:PLOT_MAX_BARS] for cos, text in [_cosine_figure(s)]]
        parts.append(hbar_plot(entries, xlabel="worst cosine similarity to the reference", log=False,
                               lines=[(COS_THRESHOLD, "--", f"cosine {COS_THRESHOLD}"),
                                      (COS_MAX_THRESHOLD, ":", f"cosine {COS_MAX_THRESHOLD}")],
                               alt="worst cosine per failing op"))
        if len(failing) > PLOT_MAX_BARS:
            parts.append(f'<p class="muted">The plot shows the {PLOT_MAX_BARS} worst ops; '
                         f"{len(failing) - PLOT_MAX_BARS} more are in the table.</p>")
    clean = sorted(((k, s) for k, s in stats.items() if not s.failed), key=lambda kv: (-(kv[1].compared or 0), kv[0]))
    rows = [(code(op), esc(fmt(s.compared)), esc(fmt(s.failed)), esc(fmt(s.worst_cosine)),
             esc(fmt(s.worst_max_abs_err)), f"{len(s.tests)}<br>{cell_list(s.tests, 2)}")
            for op, s in (failing + clean)[:TABLE_MAX_ROWS]]
    if rows:
        shown = table(("op", "calls compared", "failed", "worst cosine", "worst max abs err", f"{unit}s affected"),
                      rows, "wide")
        if failing:
            parts.append(shown)
        else:
            parts.append(f"<details><summary>{len(stats)} ops compared, most calls first</summary>{shown}</details>")
        parts.append(more(len(failing) + len(clean) - TABLE_MAX_ROWS, "ops"))
    return '<section id="ops">' + "".join(parts) + "</section>"
