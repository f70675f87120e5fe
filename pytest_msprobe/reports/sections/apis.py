"""free_benchmark's section: every API it checked, how far its worst call went past (or how close
it came to) its threshold, plotted on one axis so a clean session still shows its margins."""

from __future__ import annotations

from collections.abc import Mapping

from probes.core.session_tables import ApiRow
from pytest_msprobe.reports.plots import PLOT_MAX_BARS, hbar_plot
from pytest_msprobe.reports.primitives import (
    BLUE,
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


def _api_figure(s: ApiRow) -> tuple[float | None, str, bool]:
    """(worst max_rel / threshold, or None when off the scale; its text; beyond the threshold?)"""
    worst, threshold = s.worst_max_rel, s.threshold
    if not finite(worst):
        return None, f"non-finite ({fmt(worst)})", True
    if not (finite(threshold) and threshold > 0):
        return None, f"max_rel {fmt(worst)} (threshold {fmt(threshold)})", True
    ratio = float(worst) / float(threshold)
    return ratio, f"{fmt(float(worst))}  ({ratio:.3g}\u00d7 threshold)", ratio > 1.0


def _api_order(item: tuple[str, ApiRow]) -> tuple[int, float, str]:
    ratio, _, _ = _api_figure(item[1])
    return (0 if ratio is None else 1, -(ratio or 0.0), item[0])


def apis_section(stats: Mapping[str, ApiRow], ran: bool, unit: str = "test") -> str:
    """The APIs with a flagged or worst figure first (table and plot), then the clean ones."""
    title = "<h2>free_benchmark: worst max_rel per API</h2>"
    risky = sorted(((k, s) for k, s in stats.items() if s.flagged > 0 or s.worst_max_rel is not None), key=_api_order)
    clean = sorted(k for k, s in stats.items() if not (s.flagged > 0 or s.worst_max_rel is not None))
    checked = sum(s.checked for s in stats.values())
    if not stats:
        text = "Nothing flagged: no API was checked." if ran else f"No {unit} ran under the probe."
        return f'<section id="apis">{title}<p class="ok">{esc(text)}</p></section>'
    parts = [title]
    if not risky:
        parts.append(f'<p class="ok">Nothing flagged: {len(stats)} APIs, {checked} calls checked, '
                     "all within their thresholds. Bars: how close each API came, its largest error divided by "
                     "its threshold (log scale); the line is the threshold.</p>")
    else:
        parts.append(f'<p>{len(risky)} of {len(stats)} APIs inconsistent under perturbation '
                     f"({checked} calls checked). Bars: the worst max_rel divided by the API's threshold, and for "
                     "the APIs within their thresholds how close they came (log scale); right of the line is beyond "
                     "the threshold.</p>")
    parts.append(_worst_plot(risky, clean, stats))
    if risky:
        rows = []
        for api, s in risky[:TABLE_MAX_ROWS]:
            ratio, _, beyond = _api_figure(s)
            rows.append((code(api), esc(fmt(s.checked)), esc(fmt(s.flagged)),
                         f'<span class="{"bad" if beyond else ""}">{esc(fmt(s.worst_max_rel))}</span>',
                         esc(fmt(s.threshold)), esc("\u2014" if ratio is None else f"{ratio:.3g}\u00d7"),
                         code(s.first_flagged or "\u2014"),
                         f"{len(s.tests)}<br>{cell_list(s.tests, 2)}"))
        parts.append(table(("API", "calls checked", "inconsistent", "worst max_rel", "threshold", "\u00d7 threshold",
                            "first flagged call", f"{unit}s affected"), rows, "wide"))
        parts.append(more(len(risky) - TABLE_MAX_ROWS, "APIs"))
    if clean:
        parts.append(_closest_table(clean, stats, open_=not risky))
    return '<section id="apis">' + "".join(parts) + "</section>"


def _score(s: ApiRow) -> float:
    """A clean API's closest approach (error / threshold), -1 where no call was checked."""
    return float(s.worst_score) if finite(s.worst_score) else -1.0


def _worst_plot(risky: list[tuple[str, ApiRow]], clean: list[str], stats: Mapping[str, ApiRow]) -> str:
    """One plot of every API's worst figure against its threshold (1 on the axis): the flagged
    APIs' worst max_rel / threshold in red, then the clean APIs' closest approach in blue."""
    entries = []
    for api, s in risky:
        ratio, text, beyond = _api_figure(s)
        entries.append((api, ratio, text, RED if beyond else BLUE))
    # an API whose outputs did not move at all (score 0) has no bar on a log axis: the table lists it
    margins = [(a, _score(stats[a])) for a in clean if _score(stats[a]) > 0]
    for api, score in sorted(margins, key=lambda am: (-am[1], am[0])):
        entries.append((api, score, f"{score:.3g}\u00d7 threshold", BLUE))
    shown = entries[:PLOT_MAX_BARS]
    if not shown:
        return ""
    # non-finite figures are hatched bars across the axis; the threshold line needs a finite one
    lines = [(1.0, "--", "threshold")] if any(v is not None for _, v, _, _ in shown) else []
    plot = hbar_plot(shown, xlabel="worst error / threshold", log=True, lines=lines,
                     alt="worst error per API relative to its threshold")
    if len(entries) > PLOT_MAX_BARS:
        plot += (f'<p class="muted">The plot shows the {PLOT_MAX_BARS} APIs nearest or beyond their thresholds; '
                 f"{len(entries) - PLOT_MAX_BARS} more are in the tables.</p>")
    return plot


def _closest_table(clean: list[str], stats: Mapping[str, ApiRow], open_: bool) -> str:
    """The APIs within their thresholds, closest first: how near each came (its largest error /
    threshold over every checked call), so a clean run still shows its margins."""
    ordered = sorted(clean, key=lambda a: (-_score(stats[a]), a))
    rows = [(code(a), esc(fmt(stats[a].checked)),
             esc("\u2014" if _score(stats[a]) < 0 else f"{_score(stats[a]):.3g}\u00d7"),
             esc(", ".join(map(str, stats[a].dtypes)))) for a in ordered[:TABLE_MAX_ROWS]]
    shown = table(("API", "calls checked", "closest: error / threshold", "dtypes"), rows)
    never = sum(1 for a in clean if not stats[a].checked)
    what = f"{len(clean)} APIs within their thresholds" + (f" ({never} seen but never checked)" if never else "")
    return (f"<details{' open' if open_ else ''}><summary>{what}, closest first</summary>{shown}"
            f"{more(len(clean) - TABLE_MAX_ROWS, 'APIs')}</details>")
