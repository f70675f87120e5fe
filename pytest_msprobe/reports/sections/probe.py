"""What the probe itself did: what it checked and left unchecked (and why), the tests that gave it
nothing to check, and the errors it recorded inside itself instead of raising them into tests."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from probes.core.session_tables import ProbeAccount, ProbeError
from probes.core.tool_keys import CHECKED_LABELS
from pytest_msprobe.reports.primitives import (
    TABLE_MAX_ROWS,
    anchor,
    as_list,
    code,
    esc,
    fmt,
    mapping,
    more,
    table,
)

ERRORS_LISTED = 200


def account_section(account: ProbeAccount, tool: str, unit: str) -> str:
    """What the probe checked, what it left unchecked and why (the reasons in full), and the
    tests that gave it nothing to check."""
    parts = ["<h2>what the probe checked</h2>",
             f"<p>{account.checked} {esc(CHECKED_LABELS.get(tool, 'checked'))} in {account.tests} {esc(unit)}(s) under "
             f"the probe; {account.errors} probe error(s) in {account.tests_with_errors} {esc(unit)}(s).</p>"]
    if account.not_checked:
        total = sum(account.not_checked.values())
        rows = [(esc(reason), esc(fmt(n))) for reason, n in list(account.not_checked.items())[:TABLE_MAX_ROWS]]
        parts.append(f"<p>{total} call(s) not checked, by reason:</p>" + table(("reason", "calls"), rows))
    if account.nothing_checked:
        items = list(account.nothing_checked.items())
        rows = [(code(nodeid), esc(why)) for nodeid, why in items[:TABLE_MAX_ROWS]]
        parts.append(f'<p class="bad">{len(items)} {esc(unit)}(s) ran under the probe but gave it nothing to '
                     "check:</p>" + table((unit, "why"), rows, "wide") + more(len(items) - TABLE_MAX_ROWS, f"{unit}s"))
    return '<section id="probe">' + "".join(parts) + "</section>"


def _error_text(err: Any) -> str:
    if isinstance(err, Mapping):
        return ProbeError.from_dict("error", err).describe()
    return str(err)


def errors_section(tests: Mapping[str, Any], unit: str = "test") -> str:
    """Each test's probe errors in full, under an anchor the tests table links to (bounded)."""
    title = "<h2>probe errors</h2>"
    with_errors = [(str(k), as_list(mapping(v).get("errors"))) for k, v in tests.items()]
    with_errors = [(k, errs) for k, errs in with_errors if errs]
    if not with_errors:
        return f'<section id="errors">{title}<p class="ok">No probe error.</p></section>'
    parts, listed = [], 0
    for nodeid, errs in sorted(with_errors):
        if listed >= ERRORS_LISTED:
            break
        room = ERRORS_LISTED - listed
        lis = "".join(f"<li><pre>{esc(_error_text(err))}</pre></li>" for err in errs[:room])
        rest = f'<li class="muted">+{len(errs) - room} more</li>' if len(errs) > room else ""
        listed += min(len(errs), room)
        parts.append(f'<div class="errs" id="err-{anchor(nodeid)}"><h3>{code(nodeid)}</h3>'
                     f"<ul>{lis}{rest}</ul></div>")
    total = sum(len(e) for _, e in with_errors)
    note = (f"<p>{total} error(s) recorded inside the probe in {len(with_errors)} {esc(unit)}(s); they were "
            f"recorded, not raised into the {esc(unit)}s.</p>")
    return f'<section id="errors">{title}{note}' + "".join(parts) + more(total - listed, "errors") + "</section>"
