"""The section of the per-API checks (@pytest.mark.msprobe_api), in tool sessions and in sessions
that ran no tool."""

from __future__ import annotations

import shlex
from typing import Any

from pytest_msprobe.reports.primitives import (
    MISSING,
    TABLE_MAX_ROWS,
    as_list,
    code,
    esc,
    mapping,
    more,
    table,
)


def api_checks_section(results: Any) -> str:
    """The @pytest.mark.msprobe_api checks: flagged ones first, each with its figure (the failing
    example's message) and the command that reruns it (Hypothesis then replays the same example)."""
    entries = [mapping(r) for r in as_list(results)]
    flagged = sorted((r for r in entries if r.get("flagged")), key=lambda r: (str(r.get("api")), str(r.get("dtype"))))
    clean = [r for r in entries if not r.get("flagged")]
    title = "<h2>Per-API checks (@pytest.mark.msprobe_api)</h2>"
    summary = (f'<p class="{"bad" if flagged else "ok"}">{len(flagged)} of {len(entries)} API \u00d7 dtype \u00d7 mode '
               "checks flagged; the rest stayed within their thresholds on every example.</p>")
    parts = [title, summary]
    if flagged:
        rows = [(code(r.get("api")), esc(r.get("dtype")), esc(r.get("pert_mode")), esc(r.get("device")),
                 f'<span class="bad">{esc(r.get("flagged"))}</span>', _inputs_cell(r.get("inputs")),
                 code(f"pytest {shlex.quote(str(r.get('test')))}")) for r in flagged[:TABLE_MAX_ROWS]]
        parts.append(table(("API", "dtype", "mode", "device", "figure (failing example)", "minimal failing inputs",
                            "reproduce"), rows, "wide"))
        parts.append(more(len(flagged) - TABLE_MAX_ROWS, "flagged checks"))
    if clean:
        clean.sort(key=lambda r: (str(r.get("api")), str(r.get("dtype")), str(r.get("pert_mode"))))
        rows = [(code(r.get("api")), esc(r.get("dtype")), esc(r.get("pert_mode")), esc(r.get("device")))
                for r in clean[:TABLE_MAX_ROWS]]
        parts.append(f"<details><summary>{len(clean)} checks within their thresholds</summary>"
                     f"{table(('API', 'dtype', 'mode', 'device'), rows)}"
                     f"{more(len(clean) - TABLE_MAX_ROWS, 'checks')}</details>")
    return '<section id="api-checks">' + "".join(parts) + "</section>"


def _inputs_cell(inputs: Any) -> str:
    from pytest_msprobe.api.marker import inputs_lines

    entries = [mapping(i) for i in as_list(inputs)]
    if not entries:
        return MISSING
    return "<br>".join(f"<code>{esc(line)}</code>" for line in inputs_lines(entries))
