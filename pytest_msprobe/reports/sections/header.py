"""The page's header: what ran, when, where, with which versions and config, and the cards that
count the session's tests and findings."""

from __future__ import annotations

import datetime as _dt
import json
from collections.abc import Mapping
from typing import Any

from pytest_msprobe.reports.primitives import as_int, as_list, cards, esc, mapping, shorten
from pytest_msprobe.reports.sections.tests import FINDINGS


def page_header(session: Mapping[str, Any], label: str, body: str) -> str:
    """The report's header: what ran, when, where and with which versions, then `body` (cards)."""
    date = session.get("date") or _dt.datetime.now(_dt.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    versions = mapping(session.get("versions"))
    meta = [("date", date), ("device", session.get("device") or "\u2014"),
            ("versions", ", ".join(f"{k} {v}" for k, v in versions.items()) or "\u2014")]
    dl = "".join(f"<dt>{esc(k)}</dt><dd>{esc(v)}</dd>" for k, v in meta)
    return (f'<header><h1>msprobe report <span class="tool">{esc(label)}</span></h1>'
            f'<dl class="meta">{dl}</dl>{body}</header>')


def tool_header(session: Mapping[str, Any], tool: str, tests: Mapping[str, Any], unit: str = "test") -> str:
    """The header of a tool's session: its config, its tests by outcome and how many had findings."""
    entries = [mapping(t) for t in tests.values()]
    findings_key = FINDINGS[tool][0]
    counts = outcome_cards(session, [str(t.get("outcome", "")) for t in entries], unit)
    if mapping(session.get("session")):
        counts.append((f"{unit}s under the probe", len(entries), ""))
    counts += [(f"with {FINDINGS[tool][1]}", sum(1 for t in entries if as_list(t.get(findings_key))),
                "bad" if any(as_list(t.get(findings_key)) for t in entries) else "good"),
               ("with probe errors", sum(1 for t in entries if as_list(t.get("errors"))),
                "warn" if any(as_list(t.get("errors")) for t in entries) else "")]
    nothing = sum(1 for t in entries if t.get("nothing_checked"))
    if nothing:
        counts.append(("gave the probe nothing to check", nothing, "warn"))
    return page_header(session, tool, _config_summary(mapping(session.get("config")), tool) + cards(counts))


def catalogue_header(session: Mapping[str, Any]) -> str:
    """The header of a session without a tool: the catalogue and/or the per-API checks."""
    label = "API precision catalogue" if session.get("catalogue") else "per-API checks"
    body = cards(outcome_cards(session, [], "test")) if mapping(session.get("session")) else ""
    return page_header(session, label, body)


def outcome_cards(session: Mapping[str, Any], outcomes: list[str], unit: str) -> list[tuple[str, int, str]]:
    """Cards of the tests the session ran, by outcome: pytest's own count when the session
    recorded it (summary.json's "session": every test, per-API and catalogue ones too), else the
    outcomes of the entries (a merged multi-rank summary, an older summary.json)."""
    ran = mapping(session.get("session"))
    if ran:
        total = as_int(ran.get("tests"))
        by = {k: as_int(v) for k, v in ran.items() if k != "tests"}
    else:
        total = len(outcomes)
        by = {k: outcomes.count(k) for k in set(outcomes) if k}
    out = [(f"{unit}s", total, ""), ("passed", by.get("passed", 0), "good"),
           ("failed", by.get("failed", 0), "bad" if by.get("failed") else "")]
    other = total - by.get("passed", 0) - by.get("failed", 0)
    if other and (ran or any(outcomes)):
        skipped = by.get("skipped", 0)
        out.append(("skipped", skipped, "") if skipped == other else ("other outcome", other, ""))
    return out


def _short_value(v: Any) -> str:
    if isinstance(v, (list, tuple)):
        items = [str(x) for x in v[:8]]
        return "[" + ", ".join(items) + (f", \u2026 +{len(v) - 8}" if len(v) > 8 else "") + "]"
    return shorten(str(v), 80)


def _config_summary(config: Mapping[str, Any], tool: str) -> str:
    if not config:
        return ""
    top = [(k, v) for k, v in config.items() if not isinstance(v, Mapping)]
    own = mapping(config.get(tool))
    # fuzz_device only matters to to_cpu (msprobe's default "npu" would read wrong on a CPU run)
    section = [(f"{tool}.{k}", v) for k, v in own.items() if not (k == "fuzz_device" and own.get("pert_mode") != "to_cpu")]
    chips = "".join(f'<span class="kv"><b>{esc(k)}</b> {esc(_short_value(v))}</span>' for k, v in top + section)
    full = esc(json.dumps(config, indent=2, sort_keys=True, default=str))
    return (f'<div class="config"><h3>config</h3>{chips}'
            f"<details><summary>full config</summary><pre>{full}</pre></details></div>")
