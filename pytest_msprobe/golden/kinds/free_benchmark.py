"""The free_benchmark golden: per API, the worst max_rel of its inconsistent calls and how many
calls were checked and flagged, stored in ``apis.csv``
(``api,worst_max_rel,dtypes,threshold,checked,flagged``).

A run regresses when an API flagged in the golden grows beyond :func:`fb_bound`, when a verdict word
appears or changes, or when an API clean in (or absent from) the golden is flagged now.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from probes.core.errors import ConfigError
from pytest_msprobe.golden.kinds.cells import Figure, csv_bytes, jsonable, parse_figure, read_table, shown
from pytest_msprobe.golden.kinds.kind import Category, Comparison, Failure, Kind, non_negative

# a figure regresses when it exceeds golden + max(FB_MARGIN * |golden|, FB_MARGIN_ABS)
FB_MARGIN = 0.10
FB_MARGIN_ABS = 1e-4


@dataclass(frozen=True)
class FbEntry:
    worst_max_rel: Figure  # None: no inconsistent call recorded a figure
    dtypes: str
    threshold: float | None
    checked: int
    flagged: int


FB_FILE = "apis.csv"
FB_HEADER = ["api", "worst_max_rel", "dtypes", "threshold", "checked", "flagged"]


def snapshot(apis: Any) -> dict[str, FbEntry]:
    """From the free_benchmark per-test result's ``apis`` (api -> {"checked", "flagged",
    "worst_max_rel", "threshold", "dtypes" or "dtype", ...})."""
    if not isinstance(apis, Mapping):
        raise ConfigError("apis", apis, "a dict api name -> {'checked', 'flagged', 'worst_max_rel', 'threshold', ...}")
    out: dict[str, FbEntry] = {}
    for api, s in apis.items():
        if not isinstance(api, str) or not isinstance(s, Mapping):
            raise ConfigError(f"apis[{api!r}]", s, "a dict with 'checked', 'flagged', 'worst_max_rel', 'threshold'")
        dtypes = s.get("dtypes", s.get("dtype", ""))
        if isinstance(dtypes, (list, tuple, set)):
            dtypes = "|".join(sorted(str(d) for d in dtypes))
        threshold = parse_figure(s.get("threshold"))
        out[api] = FbEntry(parse_figure(s.get("worst_max_rel")), str(dtypes or ""),
                           threshold if isinstance(threshold, float) else None,
                           int(s.get("checked") or 0), int(s.get("flagged") or 0))
    return out


def render(snapshot: dict[str, FbEntry]) -> dict[str, bytes]:
    rows = [[api, e.worst_max_rel, e.dtypes, e.threshold, e.checked, e.flagged] for api, e in sorted(snapshot.items())]
    return {FB_FILE: csv_bytes(FB_HEADER, rows)}


def load(folder: Path) -> dict[str, FbEntry]:
    out: dict[str, FbEntry] = {}
    for row in read_table(folder / FB_FILE, FB_HEADER):
        threshold = parse_figure(row["threshold"])
        out[row["api"]] = FbEntry(parse_figure(row["worst_max_rel"]), row["dtypes"],
                                  threshold if isinstance(threshold, float) else None,
                                  int(row["checked"] or 0), int(row["flagged"] or 0))
    return out


def fb_bound(golden: float, margin: float = FB_MARGIN, margin_abs: float = FB_MARGIN_ABS) -> float:
    """THE margin rule: the largest max_rel still accepted against a golden figure."""
    return golden + max(margin * abs(golden), margin_abs)


def _verdict(figure: Figure) -> str | None:
    """The string verdict of a figure (a NaN max_rel counts as the verdict "nan"), else None."""
    if isinstance(figure, str):
        return figure
    if isinstance(figure, float) and math.isnan(figure):
        return "nan"
    return None


def compare(golden: dict[str, FbEntry], now: dict[str, FbEntry], margin: float = FB_MARGIN,
               margin_abs: float = FB_MARGIN_ABS) -> Comparison:
    failures: list[Failure] = []
    improved: list[str] = []
    unseen: list[str] = []
    new_clean: list[str] = []
    retyped: list[str] = []
    data: dict[str, Any] = {}
    rule = f"golden + max({margin:g} x golden, {margin_abs:g})"
    for api in sorted(set(golden) | set(now)):
        g, c = golden.get(api), now.get(api)
        data[api] = {"golden": jsonable(g.worst_max_rel) if g else None,
                     "now": jsonable(c.worst_max_rel) if c else None, "allowed": None}
        if c is None or (c.checked == 0 and c.flagged == 0 and g is not None and g.checked > 0):
            unseen.append(api)
            continue
        if g is not None and g.dtypes and c.dtypes and g.dtypes != c.dtypes:
            retyped.append(f"{api} {g.dtypes} -> {c.dtypes}")
        g_flagged = g is not None and g.flagged > 0  # a figure of a clean golden API does not license growth
        if c.flagged == 0:
            if g is None:
                new_clean.append(api)
            elif g_flagged:
                improved.append(f"{api} {shown(g.worst_max_rel)} -> clean")
            continue
        fig = c.worst_max_rel
        if not g_flagged:
            thr = c.threshold
            if _verdict(fig) or fig is None:
                category, sev = Category.VERDICT, 0.0
            else:
                category, sev = Category.FIGURE, fig / thr if thr else fig
            where = "not in the golden" if g is None else f"checked clean in the golden ({g.checked} calls)"
            bound = f"threshold {shown(thr)}" if thr is not None else "no inconsistent call"
            figure = "no max_rel figure" if fig is None else f"max_rel {shown(fig)}"
            failures.append(Failure(api, "newly_flagged", f"{api}: newly flagged, {figure} (allowed: "
                                    f"{bound}; {where}; {c.flagged} of {c.checked} calls inconsistent)", category,
                                    sev, None, fig, thr))
            continue
        gf = g.worst_max_rel
        gv, cv = _verdict(gf), _verdict(fig)
        if fig is None or gf is None:
            continue  # flagged in both without a figure (to_cpu): nothing to measure
        if gv is not None:
            if cv is None:
                improved.append(f"{api} {gv} -> max_rel {shown(fig)}")
            elif cv != gv:
                failures.append(Failure(api, "verdict_changed", f"{api}: verdict {cv} where the golden had {gv}",
                                        Category.VERDICT, 0.0, gv, cv, gv))
            continue
        bound_v = fb_bound(gf, margin, margin_abs)
        data[api]["allowed"] = jsonable(bound_v)
        if cv is not None:
            failures.append(Failure(api, "verdict", f"{api}: {cv} where the golden had max_rel {shown(gf)} "
                                    f"(allowed <= {shown(bound_v)})", Category.VERDICT, 0.0, gf, cv, bound_v))
        elif fig > bound_v:
            failures.append(Failure(api, "max_rel_grew", f"{api}: max_rel {shown(fig)} > allowed {shown(bound_v)} "
                                    f"(golden {shown(gf)}, +{(fig - gf) / gf * 100 if gf else math.inf:.0f}%; "
                                    f"{c.flagged} of {c.checked} calls inconsistent)", Category.FIGURE,
                                    fig / bound_v if bound_v else math.inf, gf, fig, bound_v))
        elif fig < gf - max(margin * abs(gf), margin_abs):
            improved.append(f"{api} max_rel {shown(gf)} -> {shown(fig)}")
    info = []
    if improved:
        info.append(f"{len(improved)} API(s) improved: " + ", ".join(improved[:5]) + (" ..." if len(improved) > 5 else ""))
    if unseen:
        info.append(f"{len(unseen)} API(s) of the golden not checked in this run: " + ", ".join(unseen[:5])
                    + (" ..." if len(unseen) > 5 else ""))
    if new_clean:
        info.append(f"{len(new_clean)} API(s) new and clean: " + ", ".join(new_clean[:5])
                    + (" ..." if len(new_clean) > 5 else ""))
    if retyped:
        info.append(f"{len(retyped)} API(s) ran in other dtypes than in the golden: " + ", ".join(retyped[:5])
                    + (" ..." if len(retyped) > 5 else ""))
    total = len(set(golden) | set(now))
    counts = {"apis": total, "regressed": len(failures), "improved": len(improved), "not_checked": len(unseen),
              "new_clean": len(new_clean)}
    headline = (f"{len(failures)} of {total} APIs regressed" if failures else
                f"{total} APIs within the golden's margin")
    rule = (f"a flagged API's max_rel may grow to {rule}; an API clean in the golden must stay clean; a string "
            "verdict must stay the same")
    return Comparison(failures, headline, rule, info, counts, {"apis": data})


def options(margin: float = FB_MARGIN, margin_abs: float = FB_MARGIN_ABS) -> dict[str, float]:
    """The margins of :func:`fb_bound`, checked before the run is read."""
    non_negative("margin", margin)
    non_negative("margin_abs", margin_abs)
    return {"margin": margin, "margin_abs": margin_abs}


FREE_BENCHMARK = Kind("free_benchmark", render, load, snapshot=snapshot, compare=compare, options=options)
