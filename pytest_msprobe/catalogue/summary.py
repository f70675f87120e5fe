"""The catalogue's lines in the terminal summary: counts by status, the worst APIs, the files."""

from __future__ import annotations

import os
from collections import Counter
from typing import Any

from probes.core.catalogue_status import NEW, STATUS_ORDER
from pytest_msprobe.catalogue import gate

WORST_LISTED = 10


def catalogue_lines(results: list[dict[str, Any]], info: dict[str, Any]) -> list[str]:
    counts = Counter(r.get("status", "") for r in results)
    devices = sorted({r["device"] for r in results})
    lines = [f"{len(results)} API x dtype on {', '.join(devices)}: "
             + ", ".join(f"{counts[s]} {s}" for s in STATUS_ORDER if counts.get(s))]
    top = gate.worst(results, WORST_LISTED)
    if top:
        lines.append("worst (max ulp / p99 ulp, against a float64 CPU reference):")
        width = max(len(f"{r['api']} {r['dtype']}") for r in top)
        for r in top:
            label = f"{r['api']} {r['dtype']}".ljust(width)
            lines.append(f"  {label}  {gate.ulp_text(r['max_ulp']):>9} / {gate.ulp_text(r['p99_ulp']):<9} "
                         f"{r.get('verdict', '') or '-':<11} {r.get('status', '')}")
    if not info.get("golden"):
        for device, (identity, stored, _root) in sorted((info.get("machines") or {}).items()):
            lines += golden_lines(device, identity, stored, [r for r in results if r.get("device") == device])
    for device, (folder, changed) in (info.get("golden") or {}).items():
        lines.append(f"golden {'written' if changed else 'unchanged'}: {os.fspath(folder)}/ ({device}); "
                     "review the diff and commit it")
    lines.append(f"catalogue: {os.fspath(info['csv'])}")
    if info.get("report"):
        lines.append(f"report: {os.fspath(info['report'])}")
    elif info.get("report_error"):
        lines.append(f"report.html could not be written: {info['report_error']}")
    return lines


def golden_lines(device: str, identity: Any, stored: list[str], rows: list[dict[str, Any]]) -> list[str]:
    """Which golden judged the device's rows, and what was gated when this machine has none."""
    folder = f"golden/{gate.golden_name(device, identity.key)}/"
    if identity.key in stored:
        new = sum(r.get("status") == NEW for r in rows)
        lines = [f"golden: {folder} (this machine: {identity.description})"]
        if new:
            lines.append(f"{new} API x dtype not in this machine's golden yet: --msprobe-regen-golden adds them")
        return lines
    others = [s for s in stored if s != identity.key]
    measured = [r for r in rows if isinstance(r.get("max_ulp"), (int, float))]
    ratios = sum(isinstance(r.get("ratio"), (int, float)) for r in measured)
    crossed = sum(bool(r.get("golden")) for r in measured)
    verdicts = sum(r.get("verdict") in ("pass", "flagged") for r in measured)
    lines = [f"no catalogue golden for this machine: {folder} does not exist ({identity.description})"]
    gated = [f"the accumulation test ratio on {ratios}", f"free_benchmark's verdict on {verdicts}"]
    if others:
        gated.insert(1, f"the cross-machine ulp limit ({gate.CROSS_MACHINE_FACTOR:g}x + {gate.CROSS_MACHINE_ABS:g} "
                        f"ulps) against the golden of {', '.join(others)} on {crossed}")
    lines.append(f"gated without it, on any machine: {'; '.join(gated)} API x dtype; ulp regressions are gated "
                 "against this machine's own golden only")
    lines.append(f"create it on this machine: pytest --pyargs pytest_msprobe.catalogue --msprobe-regen-golden, "
                 f"then review and commit {folder}")
    return lines
