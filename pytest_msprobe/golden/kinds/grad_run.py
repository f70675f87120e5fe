"""The grad_run golden: a whole grad_probe run (every rank, step and parameter), stored in
``grad_stats.csv`` (``unit,step,param,max,min,norm,shape,md5``; unit is ``rank{R}`` or
``optimizer{k}/rank{R}``) and ``grad_directions.npz`` (``bits/{unit}/step{N}/{param}``: the
``g > 0`` array flattened and ``np.packbits``-ed; ``shape/{unit}/step{N}/{param}``: its shape;
parameter names percent-encoded as in the dump's file names).

A run is judged by the gradient-direction rule against the golden run (the rule's limits are
grad_probe's, probes/core/thresholds.py), its max/min/norm within ``GRAD_ATOL + GRAD_RTOL *
|golden|``, and by having the same ranks, steps, parameters and shapes.
"""

from __future__ import annotations

import math
import os
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from probes.core.errors import ConfigError
from probes.core.number_format import short_number
from probes.core.thresholds import DIRECTION_FIRST_STEP_MIN as FIRST_STEP_MIN
from probes.core.thresholds import DIRECTION_MAX_DROP as MAX_DROP
from probes.core.writers import read_csv_rows
from probes.grad_probe.csv_format import file_name_for_param, param_from_file_name
from probes.grad_probe.direction_rule import apply_rule
from probes.grad_probe.dump_reader import (
    PARAM_COLUMNS,
    decoded_name,
    is_dump_root,
    rank_dirs,
    step_csvs,
    step_dirs,
)
from pytest_msprobe.golden.kinds.cells import csv_bytes, npz_bytes, parse_figure, read_npz, read_table, shown
from pytest_msprobe.golden.kinds.kind import Category, Comparison, Failure, Kind, non_negative, unit_interval

# the statistics: |now - golden| <= GRAD_ATOL + GRAD_RTOL * |golden|
GRAD_RTOL = 1e-2
GRAD_ATOL = 1e-6

GRAD_STATS_FILE = "grad_stats.csv"
GRAD_DIRECTIONS_FILE = "grad_directions.npz"
GRAD_HEADER = ["unit", "step", "param", "max", "min", "norm", "shape", "md5"]
STAT_FIGURES = ("max", "min", "norm")
_OPTIMIZER_RE = re.compile(r"^optimizer\d+$")
_RANK_RE = re.compile(r"^rank\d+$")

Key = tuple[str, int, str]  # (unit, step, param)


@dataclass(frozen=True)
class GradStats:
    max: float | None
    min: float | None
    norm: float | None
    shape: str
    md5: str


@dataclass
class GradRun:
    """Every (unit, step, param) of a grad_probe dump: its statistics and packed directions."""

    stats: dict[Key, GradStats] = field(default_factory=dict)
    bits: dict[Key, tuple[np.ndarray, tuple[int, ...]]] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)

    def keys(self) -> set[Key]:
        return set(self.stats) | set(self.bits)


def _units(path: Path) -> dict[str, Path]:
    """``rank{R}`` (and ``optimizer{k}/rank{R}`` of the plugin's watch) -> rank folder."""
    if is_dump_root(path):
        units = {f"rank{r}": d for r, d in rank_dirs(path).items()}
        for sub in sorted(p for p in path.iterdir() if p.is_dir() and _OPTIMIZER_RE.match(p.name)):
            units.update({f"{sub.name}/rank{r}": d for r, d in rank_dirs(sub).items()})
        return units
    if step_csvs(path) or step_dirs(path):
        return {path.name if _RANK_RE.match(path.name) else "rank0": path}
    return {}


def _num(cell: str | None) -> float | None:
    fig = parse_figure(cell)
    return fig if isinstance(fig, float) else None


def snapshot(dump_dir: Any) -> GradRun:
    path = Path(dump_dir) if isinstance(dump_dir, (str, os.PathLike)) else None
    allowed = "a grad_probe dump root (rank{R} folders) or one rank folder (grad_summary_{N}.csv, step{N}/)"
    if path is None or not path.is_dir():
        raise ConfigError("dump_dir", dump_dir, allowed)
    units = _units(path)
    if not units:
        raise ConfigError("dump_dir", str(dump_dir), allowed, hint="this folder holds neither")
    run = GradRun()
    for unit, folder in units.items():
        for step, csv_path in step_csvs(folder).items():
            rows = read_csv_rows(csv_path)
            pcol = next((c for c in PARAM_COLUMNS if rows and c in rows[0]), None)
            if rows and pcol is None:
                run.notes.append(f"{csv_path}: no param_name column; ignored")
                continue
            for row in rows:
                run.stats[(unit, step, row[pcol])] = GradStats(_num(row.get("max")), _num(row.get("min")),
                                                               _num(row.get("norm")), (row.get("shape") or "").strip(),
                                                               (row.get("MD5") or "").strip().lower())
        for step, step_dir in step_dirs(folder).items():
            for npy in sorted(step_dir.glob("*.npy")):
                param = decoded_name(npy.name[:-4])
                try:
                    arr = np.load(npy, allow_pickle=False)
                except (OSError, ValueError, EOFError) as exc:
                    run.notes.append(f"{npy}: unreadable ({exc})")
                    continue
                if not isinstance(arr, np.ndarray) or arr.dtype != np.bool_:
                    run.notes.append(f"{npy}: not a boolean direction array; ignored")
                    continue
                run.bits[(unit, step, param)] = (np.packbits(arr.reshape(-1)), tuple(int(d) for d in arr.shape))
    return run


def _npz_key(prefix: str, key: Key) -> str:
    unit, step, param = key
    return f"{prefix}/{unit}/step{step}/{file_name_for_param(param)}"


def render(run: GradRun) -> dict[str, bytes]:
    rows = []
    for key in sorted(run.keys()):
        s = run.stats.get(key)
        unit, step, param = key
        rows.append([unit, step, param, *((s.max, s.min, s.norm, s.shape, s.md5) if s else (None,) * 3 + ("", ""))])
    arrays: dict[str, np.ndarray] = {}
    for key, (packed, shape) in run.bits.items():
        arrays[_npz_key("bits", key)] = packed
        arrays[_npz_key("shape", key)] = np.asarray(shape, dtype=np.int64)
    return {GRAD_STATS_FILE: csv_bytes(GRAD_HEADER, rows), GRAD_DIRECTIONS_FILE: npz_bytes(arrays)}


def load(folder: Path) -> GradRun:
    run = GradRun()
    for row in read_table(folder / GRAD_STATS_FILE, GRAD_HEADER):
        figs = [_num(row[f]) for f in STAT_FIGURES]
        if any(f is not None for f in figs) or row["shape"] or row["md5"]:  # else: known by its direction only
            run.stats[(row["unit"], int(row["step"]), row["param"])] = GradStats(*figs, row["shape"], row["md5"])
    arrays = read_npz(folder / GRAD_DIRECTIONS_FILE)
    for name, packed in arrays.items():
        if not name.startswith("bits/"):
            continue
        unit_part, step_part, enc = name[len("bits/"):].rsplit("/", 2)
        key = (unit_part, int(step_part[len("step"):]), param_from_file_name(enc))
        run.bits[key] = (packed, tuple(int(d) for d in arrays["shape/" + name[len("bits/"):]]))
    return run


def _agree(a: tuple[np.ndarray, tuple[int, ...]], b: tuple[np.ndarray, tuple[int, ...]]) -> tuple[int, int]:
    """(elements with the same sign, elements): padding bits are zero in both, so they agree."""
    total = int(np.prod(a[1], dtype=np.int64)) if a[1] else 1
    differ = int(np.unpackbits(np.bitwise_xor(a[0], b[0])).sum())
    return total - differ, total


def _steps_text(steps: list[int]) -> str:
    return ", ".join(map(str, steps[:8])) + (" ..." if len(steps) > 8 else "")


def compare(golden: GradRun, now: GradRun, first_step_min: float = FIRST_STEP_MIN, max_drop: float = MAX_DROP,
                 rtol: float = GRAD_RTOL, atol: float = GRAD_ATOL) -> Comparison:
    failures: list[Failure] = []
    gk, ck = golden.keys(), now.keys()
    g_by_unit: dict[str, set[Key]] = {}
    c_by_unit: dict[str, set[Key]] = {}
    for keys, by_unit in ((gk, g_by_unit), (ck, c_by_unit)):
        for k in keys:
            by_unit.setdefault(k[0], set()).add(k)
    g_units, c_units = set(g_by_unit), set(c_by_unit)
    for unit in sorted(g_units - c_units):
        failures.append(Failure(unit, "missing_unit", f"{unit}: in the golden, not in this run", Category.STRUCTURE))
    for unit in sorted(c_units - g_units):
        failures.append(Failure(unit, "extra_unit", f"{unit}: in this run, not in the golden", Category.STRUCTURE))
    similarity_data: dict[str, Any] = {}
    cells = regressed_direction = 0
    stat_failures: list[Failure] = []
    bad_cells: set[Key] = set()
    for unit in sorted(g_units & c_units):
        g_steps = sorted({k[1] for k in g_by_unit[unit]})
        c_steps = sorted({k[1] for k in c_by_unit[unit]})
        only_g, only_c = sorted(set(g_steps) - set(c_steps)), sorted(set(c_steps) - set(g_steps))
        if only_g:
            failures.append(Failure(unit, "missing_steps", f"{unit}: steps in the golden only: {_steps_text(only_g)}",
                                    Category.STRUCTURE, 0.0, only_g, None))
        if only_c:
            failures.append(Failure(unit, "extra_steps", f"{unit}: steps in this run only: {_steps_text(only_c)}",
                                    Category.STRUCTURE, 0.0, None, only_c))
        steps = sorted(set(g_steps) & set(c_steps))
        step_set = set(steps)
        g_params: dict[str, list[int]] = {}
        c_params: dict[str, list[int]] = {}
        for k in g_by_unit[unit]:
            if k[1] in step_set:
                g_params.setdefault(k[2], []).append(k[1])
        for k in c_by_unit[unit]:
            if k[1] in step_set:
                c_params.setdefault(k[2], []).append(k[1])
        for label, mine, other in (("golden", g_params, c_params), ("run", c_params, g_params)):
            gone = {p: sorted(set(s) - set(other.get(p, []))) for p, s in mine.items()}
            gone = {p: s for p, s in gone.items() if s}
            if gone:
                where = "in the golden, not in this run" if label == "golden" else "in this run, not in the golden"
                names = ", ".join(f"{p} (steps {_steps_text(s)})" for p, s in sorted(gone.items())[:5])
                failures.append(Failure(unit, f"{'missing' if label == 'golden' else 'extra'}_params",
                                        f"{unit}: {len(gone)} parameter(s) {where}: {names}"
                                        + (" ..." if len(gone) > 5 else ""), Category.STRUCTURE, 0.0,
                                        sorted(gone)))
        params = sorted(set(g_params) & set(c_params))
        sim: dict[str, dict[int, float | None]] = {p: {} for p in params}
        agree: dict[tuple[str, int], tuple[int, int]] = {}
        summary: dict[int, list[int]] = {s: [0, 0] for s in steps}
        for step in steps:
            for p in params:
                key = (unit, step, p)
                if key not in gk or key not in ck:
                    continue
                cells += 1
                gb, cb = golden.bits.get(key), now.bits.get(key)
                gs, cs = golden.stats.get(key), now.stats.get(key)
                value: float | None = None
                if gb is not None and cb is not None:
                    if gb[1] != cb[1]:
                        failures.append(Failure(f"{unit} {p}", "shape_changed", f"{unit} step {step} {p}: gradient "
                                                f"shape {list(cb[1])}, golden {list(gb[1])}", Category.STRUCTURE,
                                                0.0, list(gb[1]), list(cb[1])))
                        bad_cells.add(key)
                    else:
                        same, total = _agree(gb, cb)
                        if total:
                            value = same / total
                            agree[(p, step)] = (same, total)
                            summary[step][0] += same
                            summary[step][1] += total
                elif gb is not None or cb is not None:
                    side = "the golden" if gb is not None else "this run"
                    failures.append(Failure(f"{unit} {p}", "direction_missing", f"{unit} step {step} {p}: direction "
                                            f"data only in {side}", Category.STRUCTURE))
                    bad_cells.add(key)
                elif gs is not None and cs is not None and gs.md5 and cs.md5:
                    value = 1.0 if gs.md5 == cs.md5 else 0.0
                sim[p][step] = value
                if gs is not None and cs is not None:
                    for fig in STAT_FIGURES:
                        f = _stat_failure(unit, step, p, fig, getattr(gs, fig), getattr(cs, fig), rtol, atol)
                        if f is not None:
                            stat_failures.append(f)
                            bad_cells.add(key)
        flags = apply_rule(sim, steps, None, first_step_min, max_drop)
        for flag in flags:
            same_total = agree.get((flag.param, flag.step))
            counted = f" [{same_total[0]}/{same_total[1]} elements agree with the golden]" if same_total else ""
            failures.append(Failure(f"{unit} {flag.param}", f"direction_{flag.reason}",
                                    f"{unit} {flag.param}: {flag.describe(first_step_min, max_drop)}{counted}",
                                    Category.DIRECTION, 1.0 - flag.similarity, flag.previous, flag.similarity,
                                    first_step_min if flag.previous is None else flag.previous - max_drop))
            bad_cells.add((unit, flag.step, flag.param))
            regressed_direction += 1
        lowest = [min((v for p in params if (v := sim[p].get(s)) is not None), default=None) for s in steps]
        similarity_data[unit] = {"steps": steps,
                                 "summary": [(a / t if t else None) for a, t in (summary[s] for s in steps)],
                                 "lowest": lowest}
    failures.extend(stat_failures)
    structure = sum(1 for f in failures if f.category == Category.STRUCTURE)
    counts = {"cells": cells, "regressed_cells": len(bad_cells), "direction_flags": regressed_direction,
              "statistics": len(stat_failures), "structure": structure}
    rule = (f"direction similarity to the golden >= {first_step_min} at the first step and no drop > {max_drop} "
            f"between steps; max/min/norm within {atol:g} + {rtol:g} x |golden|; same ranks, steps, parameters")
    if failures:
        headline = (f"{len(bad_cells)} of {cells} (rank, step, parameter) cells regressed: {regressed_direction} "
                    f"direction flag(s), {len(stat_failures)} statistic(s) out of tolerance, {structure} structure "
                    "difference(s)")
    else:
        lows = [v for d in similarity_data.values() for v in d["lowest"] if v is not None]
        low = f"; lowest direction similarity {shown(min(lows))}" if lows else ""
        headline = f"{cells} (rank, step, parameter) cells match the golden{low}"
    info = [f"notes: {'; '.join(now.notes[:3])}"] if now.notes else []
    return Comparison(failures, headline, rule, info, counts, {"similarity": similarity_data})


def _stat_failure(unit: str, step: int, param: str, fig: str, g: float | None, c: float | None, rtol: float,
                  atol: float) -> Failure | None:
    if g is None or c is None:
        return None
    if (math.isnan(g) and math.isnan(c)) or g == c:
        return None
    allowed = atol + rtol * abs(g) if math.isfinite(g) else 0.0
    diff = abs(c - g) if math.isfinite(g) and math.isfinite(c) else math.inf
    if diff <= allowed:
        return None
    return Failure(f"{unit} {param}", f"{fig}_out_of_tolerance", f"{unit} step {step} {param} {fig}: golden {shown(g)}, now "
                   f"{shown(c)}, allowed ±{short_number(allowed, 3)} (|diff| {shown(diff)})", Category.FIGURE,
                   diff / allowed if allowed else math.inf, g, c, allowed)


def options(first_step_min: float = FIRST_STEP_MIN, max_drop: float = MAX_DROP, rtol: float = GRAD_RTOL,
            atol: float = GRAD_ATOL) -> dict[str, float]:
    """The direction rule's limits and the statistics' tolerance, checked before the dump is read."""
    non_negative("rtol", rtol)
    non_negative("atol", atol)
    unit_interval("first_step_min", first_step_min)
    unit_interval("max_drop", max_drop)
    return {"first_step_min": first_step_min, "max_drop": max_drop, "rtol": rtol, "atol": atol}


GRAD_RUN = Kind("grad_run", render, load, snapshot=snapshot, compare=compare, options=options)
