"""The catalogue's lines in the terminal summary: counts by status, the worst APIs, the files."""

from __future__ import annotations

import os
from collections import Counter
from typing import Any

from pytest_msprobe.catalogue import gate

WORST_LISTED = 10


def catalogue_lines(results: list[dict[str, Any]], info: dict[str, Any]) -> list[str]:
    counts = Counter(r.get("status", "") for r in results)
    devices = sorted({r["device"] for r in results})
    lines = [f"{len(results)} API x dtype on {', '.join(devices)}: "
             + ", ".join(f"{counts[s]} {s}" for s in gate.STATUS_ORDER if counts.get(s))]
    top = gate.worst(results, WORST_LISTED)
    if top:
        lines.append("worst (max ulp / p99 ulp, against a float64 CPU reference):")
        width = max(len(f"{r['api']} {r['dtype']}") for r in top)
        for r in top:
            label = f"{r['api']} {r['dtype']}".ljust(width)
            lines.append(f"  {label}  {gate.ulp_text(r['max_ulp']):>9} / {gate.ulp_text(r['p99_ulp']):<9} "
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
