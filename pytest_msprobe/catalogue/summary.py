"""The catalogue's lines in the terminal summary: counts by status, the worst APIs, the files."""

from __future__ import annotations

import math
import os
from collections import Counter
from typing import Any

from pytest_msprobe.catalogue import gate

WORST_LISTED = 10


def _ulp(v: Any) -> str:
    if not isinstance(v, (int, float)):
        return "-"
    return f"{v:.3g}" if math.isfinite(v) else str(v)


def worst(results: list[dict[str, Any]], n: int = WORST_LISTED) -> list[dict[str, Any]]:
    """Failing rows first, then the largest max ulp."""
    measured = [r for r in results if isinstance(r.get("max_ulp"), (int, float))]

    def key(r: dict[str, Any]) -> tuple[int, float]:
        v = r["max_ulp"]
        return (0 if gate.failing(r) else 1, -(v if not math.isnan(v) else math.inf))

    return sorted(measured, key=key)[:n]


def catalogue_lines(results: list[dict[str, Any]], info: dict[str, Any], regen: bool) -> list[str]:
    counts = Counter(r.get("status", "") for r in results)
    devices = sorted({r["device"] for r in results})
    order = [gate.REGRESSED, gate.NEWLY_FLAGGED, gate.BROKEN, gate.FLAGGED, gate.OK, gate.ACCEPTED, gate.NEW,
             gate.MEASURED, gate.REGENERATED, gate.SKIPPED]
    lines = [f"{len(results)} API x dtype on {', '.join(devices)}: "
             + ", ".join(f"{counts[s]} {s}" for s in order if counts.get(s))]
    top = worst(results)
    if top:
        lines.append("worst (max ulp / p99 ulp, against a float64 CPU reference):")
        width = max(len(f"{r['api']} {r['dtype']}") for r in top)
        for r in top:
            label = f"{r['api']} {r['dtype']}".ljust(width)
            lines.append(f"  {label}  {_ulp(r['max_ulp']):>9} / {_ulp(r['p99_ulp']):<9} "
                         f"{r.get('verdict', '') or '-':<11} {r.get('status', '')}")
    if counts.get(gate.MEASURED):
        lines.append("no golden for this device: nothing was gated; --msprobe-regen-golden writes "
                     f"golden/{gate.golden_name(devices[0])}/ (review and commit it)")
    elif counts.get(gate.NEW):
        lines.append(f"{counts[gate.NEW]} API x dtype not in the golden yet: --msprobe-regen-golden adds them")
    for device, (folder, changed) in (info.get("golden") or {}).items():
        lines.append(f"golden {'written' if changed else 'unchanged'}: {os.fspath(folder)}/ ({device}); "
                     "review the diff and commit it")
    lines.append(f"catalogue: {os.fspath(info['csv'])}")
    if info.get("report"):
        lines.append(f"report: {os.fspath(info['report'])}")
    elif info.get("report_error"):
        lines.append(f"report.html could not be written: {info['report_error']}")
    return lines
