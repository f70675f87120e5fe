"""Turning probe records into test verdicts, tables and the session summary.

Framework-free: works on the dictionaries of the probes' summary() so the same code serves the
single-process run and the results xdist workers send back.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from typing import Any

from probes.core.records import rule_figures


def sort_figure(v: Any) -> float:
    """A max_rel as a number to sort by: verdict strings (nan_mismatch, ...) rank worst."""
    if isinstance(v, (int, float)):
        return float(v)
    return math.inf  # symbol_flipping, nan_mismatch, ...


def _shown(v: Any) -> str:
    if isinstance(v, float):
        return f"{v:.6g}"
    return str(v)


def failure_message(nodeid: str, summary: dict[str, Any], limit: int = 10) -> str:
    """What a failing test prints: each flagged API with its figure, threshold and evidence."""
    flagged = [(api, s) for api, s in summary["apis"].items() if s["flagged"]]
    flagged.sort(key=lambda kv: -sort_figure(kv[1]["worst_max_rel"]))
    section = summary["config"]["free_benchmark"]
    lines = [f"free_benchmark ({section['pert_mode']}, {section.get('rule', 'reference')} rule) flagged "
             f"{len(flagged)} API(s) in {nodeid}:"]
    rows_by_api: dict[str, dict[str, Any]] = {}
    for row in summary["flagged"]:
        rows_by_api.setdefault(row["api"], row)
    for api, s in flagged[:limit]:
        row = rows_by_api.get(api, {})
        where = f" output {row.get('output_index')}" if row.get("output_index") not in (None, "") else ""
        both = rule_figures(row.get("detail") or {})
        lines.append(
            f"  {s['first_flagged']}: max_rel {_shown(s['worst_max_rel'])} > threshold {_shown(s['threshold'])}"
            f" ({row.get('dtype', '?')}{where}; {s['flagged']} of {s['checked']} checked calls inconsistent)"
            + (f"\n      {both}" if both else "")
        )
    if len(flagged) > limit:
        lines.append(f"  ... and {len(flagged) - limit} more")
    graphs = [g for g in summary.get("graphs", []) if g.get("flagged")]
    if graphs:  # compiled graphs: where they lose it, and how to reproduce it (probes.compiled)
        from probes.compiled.check import graph_lines

        lines += graph_lines(graphs)
    csvs = summary.get("csv_files") or []
    if csvs:
        lines.append(f"evidence: {csvs[0]}" + (f" (+{len(csvs) - 1} more)" if len(csvs) > 1 else ""))
    lines.append("next: run this API alone with free_benchmark list=[...] in other modes, or compare it with "
                 "pert_mode=to_cpu (fuzz_device cpu); use --msprobe-fail-on=never to report without failing.")
    return "\n".join(lines)


def merge_api_tables(per_test: Iterable[tuple[str, dict[str, Any]]]) -> dict[str, dict[str, Any]]:
    """Aggregate per-test API statistics into the session table."""
    table: dict[str, dict[str, Any]] = {}
    for nodeid, apis in per_test:
        for api, s in apis.items():
            t = table.setdefault(api, {"checked": 0, "flagged": 0, "worst_max_rel": None, "threshold": None,
                                       "tests": [], "first_flagged": None})
            t["checked"] += s["checked"]
            t["flagged"] += s["flagged"]
            if s["flagged"]:
                t["tests"].append(nodeid)
                if t["worst_max_rel"] is None or sort_figure(s["worst_max_rel"]) > sort_figure(t["worst_max_rel"]):
                    t["worst_max_rel"], t["threshold"], t["first_flagged"] = (
                        s["worst_max_rel"], s["threshold"], s["first_flagged"])
    return table


def risky_table_lines(table: dict[str, dict[str, Any]]) -> list[str]:
    risky = [(api, t) for api, t in table.items() if t["flagged"]]
    risky.sort(key=lambda kv: (-sort_figure(kv[1]["worst_max_rel"]), kv[0]))
    if not risky:
        checked = sum(t["checked"] for t in table.values())
        return [f"no risky API: {len(table)} APIs, {checked} calls checked, all within their thresholds"]
    header = ("API", "calls checked", "inconsistent", "worst max_rel", "threshold", "tests affected")
    rows = [(api, str(t["checked"]), str(t["flagged"]), _shown(t["worst_max_rel"]), _shown(t["threshold"]),
             str(len(t["tests"]))) for api, t in risky]
    return text_table(header, rows)


def text_table(header: tuple[str, ...], rows: list[tuple[str, ...]]) -> list[str]:
    """A left-aligned fixed-width table (header, dashes, rows) for the terminal summary."""
    widths = [max(len(r[i]) for r in rows + [header]) for i in range(len(header))]
    fmt = "  ".join(f"{{:<{w}}}" for w in widths)
    return [fmt.format(*header), fmt.format(*("-" * w for w in widths))] + [fmt.format(*r) for r in rows]


def api_check_lines(results: list[dict[str, Any]]) -> list[str]:
    """The session's per-API (marker) checks: the flagged ones, then a count."""
    flagged = sorted((r for r in results if r["flagged"]), key=lambda r: (r["api"], r["dtype"], r["pert_mode"]))
    lines = [f"{r['api']} [{r['dtype']}, {r['pert_mode']}]: {r['flagged']}" for r in flagged]
    lines.append(f"{len(results) - len(flagged)} of {len(results)} API x dtype x mode checks within their thresholds")
    return lines
