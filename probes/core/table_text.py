"""The session's tables and account as terminal lines: the plugin's terminal summary and
``python -m probes summary`` print the same lines from the same typed tables (framework-free, so
the command line needs neither the plugin nor a framework)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from probes.core.session_tables import ApiRow, ProbeAccount, ProbeError, sort_figure

CLOSEST_SHOWN = 3  # clean APIs named with their margin on the "no risky API" line
REASONS_SHOWN = 6  # reasons for calls not checked on the terminal line
TESTS_SHOWN = 10  # tests that gave the probe nothing, named on the terminal


def figure_text(v: Any) -> str:
    """A figure of a table cell: floats to six significant digits, words (nan_mismatch) as they are."""
    if isinstance(v, float):
        return f"{v:.6g}"
    return str(v)


def short_reason(reason: str, limit: int = 48) -> str:
    """A reason a call was not checked, short enough for a terminal line (summary.json and the
    report keep it whole): up to its first colon, parenthesis or semicolon."""
    cut = len(reason)
    for sep in (":", " (", ";"):
        at = reason.find(sep)
        if 0 < at < cut:
            cut = at
    text = reason[:cut].strip()
    return text if len(text) <= limit else text[: limit - 1] + "\u2026"


def text_table(header: tuple[str, ...], rows: list[tuple[str, ...]]) -> list[str]:
    """A left-aligned fixed-width table (header, dashes, rows) for the terminal summary."""
    widths = [max(len(r[i]) for r in rows + [header]) for i in range(len(header))]
    fmt = "  ".join(f"{{:<{w}}}" for w in widths)
    return [fmt.format(*header), fmt.format(*("-" * w for w in widths))] + [fmt.format(*r) for r in rows]


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
    rows = [(api, str(t.checked), str(t.flagged), figure_text(t.worst_max_rel), figure_text(t.threshold),
             str(len(t.tests))) for api, t in risky]
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


def api_check_lines(results: list[dict[str, Any]]) -> list[str]:
    """The session's per-API (marker) checks: the flagged ones, then a count."""
    flagged = sorted((r for r in results if r["flagged"]), key=lambda r: (r["api"], r["dtype"], r["pert_mode"]))
    lines = [f"{r['api']} [{r['dtype']}, {r['pert_mode']}]: {r['flagged']}" for r in flagged]
    lines.append(f"{len(results) - len(flagged)} of {len(results)} API x dtype x mode checks within their thresholds")
    return lines
