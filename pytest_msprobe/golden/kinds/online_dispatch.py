"""The online_dispatch golden: the ops that fail, each with its worst figures over its failing
calls, stored in ``failing_ops.csv`` (``op,calls,cosine,max_abs_err``).

A run regresses when an op fails that the golden does not list; ops that stopped failing are
information only.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from probes.core.errors import ConfigError
from pytest_msprobe.golden.kinds.cells import Figure, csv_bytes, jsonable, parse_figure, read_table, shown
from pytest_msprobe.golden.kinds.kind import Category, Comparison, Failure, Kind


@dataclass(frozen=True)
class OdEntry:
    calls: int
    cosine: Figure  # the lowest over the op's failing calls (NaN counts as lowest)
    max_abs_err: Figure  # the highest


OD_FILE = "failing_ops.csv"
OD_HEADER = ["op", "calls", "cosine", "max_abs_err"]


def _worse(a: Figure, b: Figure, higher_is_worse: bool) -> Figure:
    if a is None or b is None:
        return b if a is None else a
    if isinstance(a, str) or isinstance(b, str):
        return a if isinstance(a, str) else b
    if math.isnan(a) or math.isnan(b):
        return math.nan
    return max(a, b) if higher_is_worse else min(a, b)


def snapshot(failing_ops: Any) -> dict[str, OdEntry]:
    if not isinstance(failing_ops, (list, tuple)):
        raise ConfigError("failing_ops", failing_ops, "a list of dicts with 'op', 'cosine' and 'max_abs_err'")
    out: dict[str, OdEntry] = {}
    for i, item in enumerate(failing_ops):
        if not isinstance(item, Mapping) or not isinstance(item.get("op"), str) or not item["op"]:
            raise ConfigError(f"failing_ops[{i}]", item, "a dict with a non-empty str 'op', 'cosine' and 'max_abs_err'")
        op = item["op"]
        cos, err = parse_figure(item.get("cosine")), parse_figure(item.get("max_abs_err"))
        old = out.get(op)
        if old is not None:
            cos, err = _worse(old.cosine, cos, False), _worse(old.max_abs_err, err, True)
        out[op] = OdEntry((old.calls if old else 0) + 1, cos, err)
    return out


def render(snapshot: dict[str, OdEntry]) -> dict[str, bytes]:
    rows = [[op, e.calls, e.cosine, e.max_abs_err] for op, e in sorted(snapshot.items())]
    return {OD_FILE: csv_bytes(OD_HEADER, rows)}


def load(folder: Path) -> dict[str, OdEntry]:
    return {row["op"]: OdEntry(int(row["calls"] or 0), parse_figure(row["cosine"]), parse_figure(row["max_abs_err"]))
            for row in read_table(folder / OD_FILE, OD_HEADER)}


def compare(golden: dict[str, OdEntry], now: dict[str, OdEntry]) -> Comparison:
    failures = []
    for op in sorted(set(now) - set(golden)):
        e = now[op]
        cos = e.cosine
        sev = 2.0 if not isinstance(cos, float) or math.isnan(cos) else 1.0 - cos
        failures.append(Failure(op, "new_failing_op", f"{op}: fails now (cosine {shown(cos)}, max_abs_err "
                                f"{shown(e.max_abs_err)}, {e.calls} call(s)); the golden does not list it as failing "
                                "(allowed: not failing)", Category.FIGURE, sev, None, {"cosine": jsonable(cos),
                                "max_abs_err": jsonable(e.max_abs_err)}, None))
    fixed = sorted(set(golden) - set(now))
    info = []
    if fixed:
        info.append(f"{len(fixed)} op(s) of the golden no longer fail: " + ", ".join(fixed[:5])
                    + (" ..." if len(fixed) > 5 else ""))
    counts = {"failing_now": len(now), "failing_golden": len(golden), "new": len(failures), "fixed": len(fixed)}
    headline = (f"{len(failures)} of {len(now)} failing ops are new (not failing in the golden)" if failures else
                f"no new failing op ({len(now)} failing, all listed in the golden's {len(golden)})")
    data = {"ops": {op: {"golden": op in golden, "now": op in now} for op in sorted(set(golden) | set(now))}}
    return Comparison(failures, headline, "every failing op must be listed in the golden", info, counts, data)


ONLINE_DISPATCH = Kind("online_dispatch", render, load, snapshot=snapshot, compare=compare)
