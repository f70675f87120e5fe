"""The tests (or ranks) of the session, findings first, each linked to its evidence and to its
probe errors; and the torch.compile graphs they ran."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

from probes.core.tool_keys import TOOL_KEYS
from pytest_msprobe.reports.primitives import (
    MISSING,
    TABLE_MAX_ROWS,
    anchor,
    as_int,
    as_list,
    badge,
    cell_list,
    code,
    esc,
    evidence_links,
    fmt,
    href,
    mapping,
    more,
    table,
)

# Per tool: the per-test key listing its findings, and what they are called.
FINDINGS = {tool: (keys.findings_key, keys.findings_label) for tool, keys in TOOL_KEYS.items()}


def tests_section(tests: Mapping[str, Any], tool: str, base: Path, unit: str = "test") -> str:
    """Every test: failed ones first, then those with findings, then those with probe errors.
    Findings of the other tools are listed too (a merged summary carries them)."""
    title = f"<h2>{esc(unit)}s</h2>"
    if not tests:
        return f'<section id="tests">{title}<p class="muted">No {esc(unit)} ran under the probe.</p></section>'
    keys = [FINDINGS[tool][0]] + [k for k, _ in FINDINGS.values() if k != FINDINGS[tool][0]]

    def findings(t: Mapping[str, Any]) -> list[Any]:
        return [x for k in keys for x in as_list(t.get(k))]

    items = [(str(k), mapping(v)) for k, v in tests.items()]
    items.sort(key=lambda kv: (kv[1].get("outcome") != "failed", not findings(kv[1]),
                               not as_list(kv[1].get("errors")), kv[0]))
    rows = []
    for nodeid, t in items[:TABLE_MAX_ROWS]:
        outcome = t.get("outcome")
        shown = (badge(str(outcome), {"passed": "good", "failed": "bad"}.get(str(outcome), "warn"))
                 if outcome else MISSING)
        errors = len(as_list(t.get("errors")))
        rows.append((code(nodeid), shown, cell_list(findings(t)), evidence_links(t, base),
                     f'<a href="#err-{anchor(nodeid)}">{errors}</a>' if errors else "0"))
    return (f'<section id="tests">{title}'
            + table((unit, "outcome", FINDINGS[tool][1], "evidence", "probe errors"), rows, "wide tests")
            + more(len(items) - TABLE_MAX_ROWS, f"{unit}s") + "</section>")


def graphs_section(tests: Mapping[str, Any], base: Path) -> str:
    """torch.compile graphs (probes.compiled): checked, sampled and flagged, the compiled error next
    to the eager kernels', the first failing node and its reproduction."""
    rows = []
    graphs = [(str(nodeid), mapping(g)) for nodeid, t in tests.items() for g in as_list(mapping(t).get("graphs"))]
    graphs.sort(key=lambda ng: (-as_int(ng[1].get("flagged")), ng[0]))
    for nodeid, g in graphs[:TABLE_MAX_ROWS]:
        figures = []
        for stage in ("forward", "backward"):
            f = mapping(g.get(stage))
            if f:
                eager = f", eager {fmt(f.get('eager_ulps'))}" if f.get("eager_ulps") is not None else ""
                figures.append(f"{stage}: {fmt(f.get('compiled_ulps'))}{eager} / {fmt(f.get('threshold_ulps'))} "
                               f"ulps ({f.get('dtype')})")
        found = mapping(g.get("localisation"))
        node = "\u2014"
        if found:
            node = (f"{code(found.get('node'))} {esc(found.get('target'))} {esc(found.get('source') or '')} "
                    f"({esc(found.get('where'))}): <a href=\"{esc(href(found.get('repro'), base))}\">repro</a>")
        status = (badge("flagged", "bad") if as_int(g.get("flagged")) else
                  badge("not checked", "warn") if g.get("not_checked") else badge("clean", "good"))
        rows.append((code(f"Graph.{g.get('graph')}"), code(nodeid), esc(g.get("backend")),
                     esc(f"{as_int(g.get('calls'))} / {as_int(g.get('sampled'))} / {as_int(g.get('checked'))}"), status,
                     esc("; ".join(figures) or (g.get("not_checked") or "\u2014")), node))
    return ('<section id="graphs"><h2>compiled graphs (torch.compile): compiled code against float64</h2>'
            "<p>Each graph Dynamo handed the backend, judged on its sampled calls against its eager program in "
            "float64; the eager kernels' error on the same calls is shown next to the compiled one.</p>"
            + table(("graph", "test", "backend", "calls / sampled / checked", "status",
                     "worst output: compiled, eager / allowed", "first failing node"), rows, "wide", )
            + more(len(graphs) - TABLE_MAX_ROWS, "graphs") + "</section>")
