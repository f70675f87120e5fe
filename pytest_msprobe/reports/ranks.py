"""One report over the ranks of a multi-rank dump: which rank flagged what first.

Every rank of a torchrun job writes its own files (free_benchmark ``summary_rank{R}.json`` at the
dump root, grad_probe ``rank{R}/summary.json`` beside its CSVs, online_dispatch
``msprobe[_tag]_rank{R}_{ts}/summary.json``); a precision problem usually shows on one rank, and
the question is which rank, which API/op/parameter, at which step, by how much. This module reads
those files only (no framework import, so it also runs on a machine that just downloaded the
dump), orders the findings by step then rank, and writes ``summary_merged.json`` in the session
summary's schema, with one entry per rank under "tests" and ``"unit": "rank"``, so
:func:`pytest_msprobe.reports.html.render_html` draws it as is and calls the entries ranks.
"""

from __future__ import annotations

import json
import math
import os
from pathlib import Path
from typing import Any

from probes.core.config import TASKS
from probes.core.errors import ConfigError
from probes.core.session_tables import ProbeAccount, write_table
from probes.core.writers import write_json_atomic
from pytest_msprobe.tools import TOOLS

MERGED_NAME = "summary_merged.json"
REPORT_NAME = "report_merged.html"
STATUS_CLEAN, STATUS_FLAGGED, STATUS_NOT_SELECTED, STATUS_MISSING = "clean", "flagged", "not selected", "missing"



def rank_summaries(dump_path: str | os.PathLike[str], tool: str | None = None) -> tuple[str, dict[int, list[Path]]]:
    """The tool of a dump and its per-rank summary files (rank -> files; online_dispatch may have
    several runs per rank). ``tool`` None: found from the files."""
    from probes.results import rank_summary_files

    root = Path(dump_path)
    if tool is not None and tool not in TASKS:
        raise ConfigError("tool", tool, f"one of {', '.join(TASKS)}")
    found = rank_summary_files(root)
    if tool is None:
        present = [t for t in TASKS if found[t]]
        if len(present) != 1:
            raise ConfigError("dump_path", str(root), "a dump of exactly one tool (pass tool=...)",
                              hint=f"found per-rank summaries of: {', '.join(present) or 'no tool'}")
        tool = present[0]
    return tool, found[tool]


def merge_ranks(dump_path: str | os.PathLike[str], tool: str | None = None, *, world_size: int | None = None,
                write: bool = True, html: bool = False) -> dict[str, Any]:
    """The merged summary of a multi-rank dump (see the module docstring).

    ``world_size``: ranks 0..world_size-1 without files get the status "missing" (a rank that
    crashed or never ran the probe). ``write``: also write ``{dump}/summary_merged.json``;
    ``html``: also render ``{dump}/report_merged.html``.
    """
    root = Path(dump_path)
    tool, files = rank_summaries(root, tool)
    ranks = sorted(set(files) | set(range(world_size or 0)))
    per_rank: dict[int, dict[str, Any]] = {}
    results: list[tuple[str, dict[str, Any]]] = []
    findings: list[dict[str, Any]] = []
    config: dict[str, Any] = {}
    for rank in ranks:
        summaries = [json.loads(p.read_text(encoding="utf-8")) for p in files.get(rank, [])]
        if not summaries:
            per_rank[rank] = {"status": STATUS_MISSING, "summaries": [], "findings": 0, "first": None, "errors": []}
            continue
        config = config or summaries[0].get("config") or {}
        result, found, errors = TOOLS[tool].read_rank(summaries, files[rank], rank)
        results.append((f"rank{rank}", result))
        findings += found
        selected = _selected(summaries[0].get("config") or {}, rank)
        status = STATUS_FLAGGED if found else (STATUS_CLEAN if selected else STATUS_NOT_SELECTED)
        per_rank[rank] = {"status": status, "summaries": [str(p) for p in files[rank]], "findings": len(found),
                          "first": found[0] if found else None, "errors": errors}
    findings.sort(key=lambda f: (math.inf if f["step"] is None else f["step"], f["rank"], f["order"]))
    task = TOOLS[tool]
    tests = {name: dict(task.entry(r), outcome="failed" if per_rank[int(name[4:])]["findings"] else "passed")
             for name, r in results}
    merged: dict[str, Any] = {
        "tool": tool,
        "dump_path": str(root),
        "config": config,
        "ranks": {f"rank{r}": v for r, v in per_rank.items()},
        "flagged_ranks": [r for r, v in per_rank.items() if v["status"] == STATUS_FLAGGED],
        "first": findings[0] if findings else None,
        "findings": findings,
        # the session summary's keys, one entry per rank: what html_report.render_html draws,
        # naming the entries ranks ("unit") instead of tests
        "unit": "rank",
        "tests": tests,
        task.table_key: write_table(task.table(results)),
        "probe": ProbeAccount.of(tests).to_dict(),
    }
    if write:
        write_json_atomic(root / MERGED_NAME, merged)
    if html:
        from pytest_msprobe.reports.html import render_html

        render_html(merged, root / REPORT_NAME)
    return merged


def describe(merged: dict[str, Any]) -> str:
    """One line per flagged rank, the first finding first: what a failing test prints."""
    first = merged.get("first")
    if first is None:
        return f"{merged['tool']}: nothing flagged on rank(s) " + ", ".join(merged["ranks"])
    lines = [f"{merged['tool']}: first flagged on rank {first['rank']}: {_finding_text(first)}"]
    for name, r in merged["ranks"].items():
        if r["status"] == STATUS_FLAGGED:
            lines.append(f"  {name}: {r['findings']} finding(s), first {_finding_text(r['first'])}")
        elif r["status"] != STATUS_CLEAN:
            lines.append(f"  {name}: {r['status']}")
    return "\n".join(lines)


def _finding_text(f: dict[str, Any]) -> str:
    step = "" if f["step"] is None else f" at step {f['step']}"
    return f"{f['what']}{step} ({f['figure_text']}; evidence {f['evidence']})"


def _selected(config: dict[str, Any], rank: int) -> bool:
    ranks = config.get("rank") or []
    return not ranks or rank in ranks


__all__ = ["MERGED_NAME", "REPORT_NAME", "describe", "merge_ranks", "rank_summaries"]
