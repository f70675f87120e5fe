"""The catalogue's regression gate: each API x dtype against its device golden.

The golden of a device is one reviewed file, ``golden/catalogue/<device>/catalogue.csv`` (one
row per API x dtype: samples, max and p99 ulp, free_benchmark verdict), with meta.json recording
the versions that made it (torch / mindspore, python, numpy, probes) and the date. One file per
device, so an accepted upgrade is one diff to read.

The rule, per API x dtype, when the golden has the row:

* **regressed**: max ulp or p99 ulp above ``golden * (1 + ULP_MARGIN) + ULP_MARGIN_ABS``.
  Deterministic inputs on one machine reproduce the golden exactly; the margin absorbs a
  different vector library or summation order after an upgrade (a 1-ulp kernel may become a
  2.5-ulp one), not a lost bit: a float32 kernel computing in TF32 or bfloat16 moves by 2^13 ulps
  or more, a bfloat16 sum accumulating in bfloat16 over 1,024 terms by 2.5 to tens of ulps.
* **newly flagged**: free_benchmark flags it now and did not in the golden.
* **broken**: the golden measured it and now the device run raises on every sample.
* otherwise **ok**, or **accepted** when the golden already had it flagged or far off and it
  holds its number: a known, accepted error stays green until it grows.

Without a golden row the API is **new** (no golden for it yet) or **measured** (no golden for
the device at all): not gated, and failing only when free_benchmark flags it. With
``--msprobe-regen-golden`` every measured row is **regenerated**: the session writes the golden
at its end (rows of APIs not run this time are kept), and the tests pass; review the diff.
"""

from __future__ import annotations

import csv
import io
import math
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pytest_msprobe.golden import kinds as gk

ULP_MARGIN = 0.5
ULP_MARGIN_ABS = 1.0
GOLDEN_NAME = "catalogue/{device}"
GOLDEN_FILE = "catalogue.csv"
GOLDEN_HEADER = ["api", "dtype", "source", "samples", "max_ulp", "p99_ulp", "free_benchmark"]
CSV_FILE = "catalogue.csv"
CSV_HEADER = ["api", "dtype", "device", "samples", "max_ulp", "p99_ulp", "free_benchmark", "status",
              "golden_max_ulp", "golden_p99_ulp", "source", "elements", "message"]

OK, ACCEPTED, REGRESSED, NEWLY_FLAGGED, BROKEN = "ok", "accepted", "regressed", "newly flagged", "broken"
NEW, MEASURED, FLAGGED, REGENERATED, SKIPPED = "new", "measured", "flagged", "regenerated", "skipped"
FAILING = (REGRESSED, NEWLY_FLAGGED, BROKEN, FLAGGED)
# the order statuses are listed and sorted in (terminal summary, report): failures first
STATUS_ORDER = (REGRESSED, NEWLY_FLAGGED, BROKEN, FLAGGED, ACCEPTED, NEW, MEASURED, REGENERATED, OK, SKIPPED)
STATUS_RANK = {s: i for i, s in enumerate(STATUS_ORDER)}


@dataclass(frozen=True)
class GoldenRow:
    source: str
    samples: int
    max_ulp: float
    p99_ulp: float
    free_benchmark: str


def ulp_bound(golden: float) -> float:
    """THE margin rule: the largest ulp figure still accepted against a golden figure."""
    return golden * (1.0 + ULP_MARGIN) + ULP_MARGIN_ABS


def golden_name(device: str) -> str:
    return GOLDEN_NAME.format(device=device)


def render(rows: dict[tuple[str, str], GoldenRow]) -> dict[str, bytes]:
    body = [[api, dtype, r.source, r.samples, r.max_ulp, r.p99_ulp, r.free_benchmark]
            for (api, dtype), r in sorted(rows.items())]
    return {GOLDEN_FILE: gk.csv_bytes(GOLDEN_HEADER, body)}


def load(folder: Path) -> dict[tuple[str, str], GoldenRow]:
    out = {}
    for row in gk.read_table(folder / GOLDEN_FILE, GOLDEN_HEADER):
        out[(row["api"], row["dtype"])] = GoldenRow(row["source"], int(row["samples"] or 0), float(row["max_ulp"]),
                                                    float(row["p99_ulp"]), row["free_benchmark"])
    return out


CATALOGUE = gk.Kind("catalogue", render, load)

_cache: dict[Path, Any] = {}
_cache_lock = threading.Lock()


def golden_rows(root: Path, device: str) -> dict[tuple[str, str], GoldenRow] | None:
    """The device's golden rows (read once per process), None when there is no golden."""
    folder = root / golden_name(device)
    with _cache_lock:
        if folder not in _cache:
            _cache[folder] = load(folder) if (folder / GOLDEN_FILE).is_file() else None
        return _cache[folder]


def judge(result: dict[str, Any], golden: dict[tuple[str, str], GoldenRow] | None, regen: bool) -> dict[str, Any]:
    """Set the result's status, message and golden figures (module docstring); returns it."""
    g = golden.get((result["api"], result["dtype"])) if golden is not None else None
    if g is not None:
        result["golden_max_ulp"], result["golden_p99_ulp"] = g.max_ulp, g.p99_ulp
    flagged = result["verdict"] == "flagged"
    what = f"{result['api']} ({result['dtype']}, {result['device']})"
    if regen:
        result["status"], result["message"] = REGENERATED, "measured for the golden written at the end of the session"
        return result
    if result.get("error"):
        if g is not None and g.samples > 0:
            result["status"] = BROKEN
            result["message"] = (f"{what}: the golden measured {g.samples} samples; now the device run raises: "
                                 f"{result['error']}")
        else:
            result["status"], result["message"] = SKIPPED, f"the device run raises: {result['error']}"
        return result
    if g is None:
        result["status"] = FLAGGED if flagged else (MEASURED if golden is None else NEW)
        where = "no golden for this device" if golden is None else "not in the golden yet"
        result["message"] = (f"{what}: free_benchmark flags it ({result.get('verdict_detail', '')}); {where}"
                             if flagged else f"{what}: {where}; --msprobe-regen-golden writes it")
        return result
    over = []
    for key, now, before in (("max", result["max_ulp"], g.max_ulp), ("p99", result["p99_ulp"], g.p99_ulp)):
        if not _within(now, before):
            over.append(f"{key} ulp {ulp_text(now)} > allowed {ulp_text(ulp_bound(before))} (golden {ulp_text(before)})")
    if over:
        result["status"] = REGRESSED
        result["message"] = f"{what} regressed: " + "; ".join(over)
    elif flagged and g.free_benchmark != "flagged":
        result["status"] = NEWLY_FLAGGED
        result["message"] = (f"{what}: free_benchmark flags it now ({result.get('verdict_detail', '')}); "
                             f"the golden's verdict was {g.free_benchmark!r}")
    elif flagged or g.free_benchmark == "flagged":
        result["status"], result["message"] = ACCEPTED, f"{what}: known error, holds its golden figures"
    else:
        result["status"], result["message"] = OK, ""
    return result


def _within(now: float, golden: float) -> bool:
    if math.isnan(now):
        return math.isnan(golden)
    return now <= ulp_bound(golden) or (math.isinf(golden) and math.isinf(now))


def ulp_text(v: Any, missing: str = "-") -> str:
    """An ulp figure as shown: 4 significant digits, inf / nan as words, `missing` when not measured."""
    if not isinstance(v, (int, float)):
        return missing
    return f"{v:.4g}" if math.isfinite(v) else str(v)


def failing(result: dict[str, Any]) -> bool:
    return result.get("status") in FAILING


def ulp_sort_value(v: Any) -> float:
    """Sort value of an ulp figure, largest first when negated: infinity first, NaN and missing last."""
    if isinstance(v, (int, float)) and not math.isnan(v):
        return float(v)
    return -1.0


def worst(results: list[dict[str, Any]], n: int) -> list[dict[str, Any]]:
    """The rows to read first: failing ones, then the largest max ulp (measured rows only)."""
    measured = [r for r in results if isinstance(r.get("max_ulp"), (int, float))]
    return sorted(measured, key=lambda r: (0 if failing(r) else 1, -ulp_sort_value(r["max_ulp"])))[:n]


def write_csv(path: Path, results: list[dict[str, Any]]) -> Path:
    """catalogue.csv: one row per API x dtype of this session, worst max ulp first."""
    from probes.core.writers import write_text_atomic

    rows = sorted(results, key=lambda r: (-ulp_sort_value(r.get("max_ulp")), r["api"], r["dtype"]))
    buf = io.StringIO()
    writer = csv.writer(buf, lineterminator="\n")
    writer.writerow(CSV_HEADER)
    for r in rows:
        writer.writerow([gk.fmt(r.get(k)) if k != "free_benchmark" else r.get("verdict", "") for k in CSV_HEADER])
    return write_text_atomic(path, buf.getvalue())


def write_golden(store: Any, device: str, results: list[dict[str, Any]]) -> bool:
    """Merge this session's measured rows into the device's golden (rows of APIs not run are
    kept) and write it; False when nothing changed."""
    folder = store.folder(golden_name(device))
    rows = load(folder) if (folder / GOLDEN_FILE).is_file() else {}
    for r in results:
        if r.get("status") != REGENERATED:
            continue
        rows[(r["api"], r["dtype"])] = GoldenRow(r["source"], int(r["samples"]), float(r["max_ulp"]),
                                                 float(r["p99_ulp"]), r["verdict"])
    changed = store.write(golden_name(device), CATALOGUE, rows)
    with _cache_lock:
        _cache.pop(folder, None)
    return changed
