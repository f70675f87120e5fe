"""grad_probe's FP8 health figures, read back from the step summaries it wrote.

With ``grad_probe.fp8_health`` every ``rank{R}/grad_summary_{N}.csv`` ends each row with, per
format, the fraction of the gradient that would underflow and the fraction that would saturate
if cast to that format at its tensorwise amax scale. The report reads them here, at render time,
from the dump folders the session's tests name (``dump_paths``, one per optimizer), instead of
carrying the series in summary.json: a series is parameters x steps x formats figures, which
every xdist worker would otherwise send to the controller and summary.json would hold twice
(the CSVs already do). A folder that is gone or a file that cannot be read costs its figures
only. Framework-free.
"""

from __future__ import annotations

import csv
import math
import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from probes.grad_probe.csv_format import ENCODING, RANK_DIR_RE, SUMMARY_CSV_RE
from probes.grad_probe.stats import FP8_HEALTH_FIGURES

PARAM_COLUMNS = ("param_name", "Param_name")  # MindSpore graph mode spells it Param_name
SHAPE_COLUMNS = ("shape", "Shape")


@dataclass
class Fp8Health:
    """One optimizer's figures for one FP8 format: per parameter, per figure, a value per step
    (NaN where the step has none); over ranks, the worst rank's value."""

    test: str
    folder: Path
    format: str
    steps: list[int]
    params: dict[str, dict[str, list[float]]] = field(default_factory=dict)

    def lost(self, param: str) -> float:
        """The largest fraction of the parameter's gradient the format loses at one step (its
        underflow and saturated fractions together): what "worst first" orders by."""
        figures = self.params[param]
        per_step = [sum(v for v in vs if math.isfinite(v)) for vs in zip(*figures.values())]
        return max(per_step, default=0.0)

    def worst(self) -> float:
        return max((self.lost(p) for p in self.params), default=0.0)


def _fp8_columns(header: list[str]) -> dict[str, dict[str, int]]:
    """format -> figure -> column index, from the columns after the shape column."""
    shape = next((i for i, h in enumerate(header) if h in SHAPE_COLUMNS), None)
    out: dict[str, dict[str, int]] = {}
    if shape is None:
        return out
    for i, h in enumerate(header[shape + 1:], shape + 1):
        for figure in FP8_HEALTH_FIGURES:
            suffix = f" {figure}"
            if h.endswith(suffix):
                out.setdefault(h[: -len(suffix)], {})[figure] = i
    return {f: cols for f, cols in out.items() if len(cols) == len(FP8_HEALTH_FIGURES)}


def _number(cell: str) -> float:
    try:
        return float(cell)
    except ValueError:  # an empty cell: a record without the figures measured
        return math.nan


def _read(path: Path) -> list[list[str]] | None:
    try:
        with open(path, encoding=ENCODING, newline="") as fh:
            return list(csv.reader(fh))
    except (OSError, UnicodeDecodeError, csv.Error):
        return None


def _numbered(folder: Path, pattern: Any, want_dir: bool) -> list[tuple[int, Path]]:
    try:
        entries = sorted(os.scandir(folder), key=lambda e: e.name)
    except OSError:
        return []
    found = []
    for entry in entries:
        m = pattern.match(entry.name)
        try:
            if m and entry.is_dir() == want_dir:
                found.append((int(m.group(1)), Path(entry.path)))
        except OSError:
            continue
    return found


def read_folder(test: str, folder: Path) -> list[Fp8Health]:
    """One optimizer's dump folder (or one rank's folder): its figures per format, or nothing when
    its CSVs have no FP8 health columns (grad_probe ran without fp8_health)."""
    # (format, param, figure) -> step -> worst value over ranks
    values: dict[tuple[str, str, str], dict[int, float]] = {}
    formats: list[str] = []
    steps: set[int] = set()
    # a test's optimizer folder holds rank{R}/ folders; a merged multi-rank run names the rank folders
    ranks = [rank for _, rank in _numbered(folder, RANK_DIR_RE, True)] or [folder]
    for rank in ranks:
        for step, path in _numbered(rank, SUMMARY_CSV_RE, False):
            rows = _read(path)
            if not rows:
                continue
            columns = _fp8_columns(rows[0])
            if not columns:
                break  # a run writes the same columns every step: this rank has none
            name_at = next((i for i, h in enumerate(rows[0]) if h in PARAM_COLUMNS), 0)
            steps.add(step)
            formats += [f for f in columns if f not in formats]
            for row in rows[1:]:
                if len(row) < len(rows[0]):
                    continue
                for fmt, cols in columns.items():
                    for figure, i in cols.items():
                        at = values.setdefault((fmt, row[name_at], figure), {})
                        v, old = _number(row[i]), at.get(step)
                        if old is None or math.isnan(old) or v > old:
                            at[step] = v
    ordered = sorted(steps)
    out = []
    for fmt in formats:
        health = Fp8Health(test, folder, fmt, ordered)
        for (f, param, figure), by_step in values.items():
            if f == fmt:
                health.params.setdefault(param, {})[figure] = [by_step.get(s, math.nan) for s in ordered]
        out.append(health)
    return out


def read_session(tests: Mapping[str, Any]) -> list[Fp8Health]:
    """Every FP8 health series of the session's tests, from each test's optimizer folders."""
    out = []
    for nodeid, entry in tests.items():
        paths = entry.get("dump_paths") if isinstance(entry, Mapping) else None
        for path in paths if isinstance(paths, list) else []:
            folder = Path(str(path)).resolve()  # a relative dump path is the run's, from its folder
            out += read_folder(str(nodeid), folder)
    return out
