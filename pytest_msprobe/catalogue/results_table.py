"""A session's catalogue.csv, and the figures as its readers see them.

The gate's messages, the terminal summary and the report section show the same figures the same
way (an ulp to its shortest exact text, a test ratio to 3 digits, infinity first and NaN last when
sorted), so they read alike wherever they appear; one place defines that.
"""

from __future__ import annotations

import csv
import io
import math
from pathlib import Path
from typing import Any

from probes.core.catalogue_status import failing
from probes.core.file_names import CATALOGUE_COLUMNS, CATALOGUE_CSV
from probes.core.number_format import short_number
from probes.core.writers import write_text_atomic
from pytest_msprobe.golden import kinds as gk

CSV_FILE = CATALOGUE_CSV  # probes.results reads it back by the same name and columns
CSV_HEADER = list(CATALOGUE_COLUMNS)


def ulp_text(v: Any, missing: str = "-") -> str:
    """An ulp figure as shown, `missing` when not measured."""
    return short_number(float(v)) if isinstance(v, (int, float)) else missing


def ratio_text(v: Any) -> str:
    """A test ratio as shown: 3 significant digits (it is read against its limit, not to the last ulp)."""
    return short_number(float(v), 3) if isinstance(v, (int, float)) else "-"


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
    rows = sorted(results, key=lambda r: (-ulp_sort_value(r.get("max_ulp")), r["api"], r["dtype"]))
    buf = io.StringIO()
    writer = csv.writer(buf, lineterminator="\n")
    writer.writerow(CSV_HEADER)
    for r in rows:
        writer.writerow([gk.fmt(r.get(k)) if k != "free_benchmark" else r.get("verdict", "") for k in CSV_HEADER])
    return write_text_atomic(path, buf.getvalue())
