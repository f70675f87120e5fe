"""Turning probe records into test verdicts, tables and the session summary.

Framework-free: works on the dictionaries of the probes' summary() so the same code serves the
single-process run and the results xdist workers send back.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from probes.core.records import rule_figures
from pytest_msprobe.reports.tables import ApiRow, ProbeAccount, ProbeError, short_reason, sort_figure

CLOSEST_SHOWN = 3  # clean APIs named with their margin on the "no risky API" line
REASONS_SHOWN = 6  # reasons for calls not checked on the terminal line
TESTS_SHOWN = 10  # tests that gave the probe nothing, named on the terminal


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


def risky_table_lines(table: Mapping[str, ApiRow]) -> list[str]:
    """The risky APIs, worst first; when there are none, one line with how close the closest came."""
    risky = [(api, t) for api, t in table.items() if t.flagged]
    risky.sort(key=lambda kv: (-sort_figure(kv[1].worst_max_rel), kv[0]))
    if not risky:
        checked = sum(t.checked for t in table.values())
        closest = sorted(((t.worst_score, api) for api, t in table.items() if t.worst_score), reverse=True)
        near = ("; closest: " + ", ".join(f"{api} {score:.3g}x its threshold" for score, api in closest[:CLOSEST_SHOWN])
                if closest else "")
        return [f"no risky API: {len(table)} APIs, {checked} calls checked, all within their thresholds{near}"]
    header = ("API", "calls checked", "inconsistent", "worst max_rel", "threshold", "tests affected")
    rows = [(api, str(t.checked), str(t.flagged), _shown(t.worst_max_rel), _shown(t.threshold), str(len(t.tests)))
            for api, t in risky]
    return text_table(header, rows)


def account_lines(account: ProbeAccount, checked_label: str) -> list[str]:
    """The probe's own account of a session: its errors (the first few, with their calls), the
    calls it left unchecked by reason, and the tests that gave it nothing to check."""
    lines = [f"{account.checked} {checked_label} in {account.tests} test(s) under the probe"]
    if account.errors:
        lines.append(f"probe errors: {account.errors} in {account.tests_with_errors} test(s); what each names was "
                     "not checked. Recorded, not raised: each test kept its own outcome (set \"strict\": true in the "
                     "config to fail it instead):")
        lines += [f"  {e['test']}: {ProbeError(e['call'], e['error'], e['count']).describe()}"[:300]
                  for e in account.first_errors]
        if account.errors > len(account.first_errors):
            lines.append("  ... every error is in summary.json (each test's \"errors\") and report.html")
    if account.not_checked:
        total = sum(account.not_checked.values())
        lines.append(f"not checked: {total} call(s): " + ", ".join(
            f"{short_reason(reason)} {n}" for reason, n in list(account.not_checked.items())[:REASONS_SHOWN])
            + (", ..." if len(account.not_checked) > REASONS_SHOWN else "") + " (reasons in full in report.html)")
    if account.nothing_checked:
        shown = list(account.nothing_checked.items())[:TESTS_SHOWN]
        lines.append(f"{len(account.nothing_checked)} test(s) ran under the probe but gave it nothing to check:")
        lines += [f"  {nodeid}: {why}" for nodeid, why in shown]
        if len(account.nothing_checked) > TESTS_SHOWN:
            lines.append(f"  ... and {len(account.nothing_checked) - TESTS_SHOWN} more (summary.json: probe.nothing_checked)")
    return lines


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
