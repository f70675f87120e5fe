"""GradComparator: run-vs-run gradient direction similarity (msprobe's GradComparator), numpy only.

Reads what grad_probe dumps (``{dump}/rank{R}/grad_summary_{N}.csv``, ``rank{R}/step{N}/{param}.npy``)
and writes msprobe's outputs (``similarities.csv`` with BOM + CRLF, ``similarities_picture/*.png``)
plus a ``summary.json``. Differences from msprobe 8.3.3 (whose comparator took the parameter
order from an arbitrary CSV and aborted the whole run on one missing file or shape mismatch):

* Parameter order is deterministic: the ``param_name`` (or ``Param_name``) column of the lowest
  numbered common step's CSV, read as strings (``"0"`` stays ``"0"``); parameters found only in
  other steps' CSVs or in direction files are appended in sorted order.
* Nothing raises for one bad parameter, step or rank: every cell gets a status
  (:data:`CELL_STATUSES`); a cell without a similarity is written empty, so the CSV stays
  rectangular, and it is left out of the step summary. A rank found in one run only gets a rank
  status in the result and in ``summary.json``.
* Only ``.npy`` files are read (``allow_pickle=False``); ``.pt`` files are ignored.
* Inputs are only read, never written, and need no write permission.
* L0 dumps (no direction files, but a CRC-32 ``MD5`` column) are compared by hash equality per
  parameter: similarity 1.0 (``md5_equal``) or 0.0 (``md5_differs``); the step summary weights each
  parameter by its element count from the ``shape`` column.
* A parameter literally named ``summary`` keeps the ``summary`` row for the step summary; the
  parameter's row is renamed ``summary (parameter)`` (see :attr:`GradComparison.row_names`).
* Empty gradients (0 elements, same shape): similarity 0 as msprobe writes it (kept for
  compatibility), status ``empty``; the rule ignores them. A step whose compared parameters are all
  empty has summary 0 with summary status ``empty``; a step with nothing comparable has an empty
  summary cell and status ``no_data``.
"""

from __future__ import annotations

import logging
import os
import re
import sys
import time
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Union

import numpy as np

from probes.core.writers import CsvAppender, read_csv_rows, write_json_atomic
from probes.grad_probe.csv_format import RANK_DIR_RE, SLICES_JSON, SUMMARY_CSV_RE, param_from_file_name
from probes.grad_probe.direction_rule import (
    FIRST_STEP_MIN,
    MAX_DROP,
    SUMMARY_ROW,
    Flag,
    apply_rule,
    check_thresholds,
    first_flagged_step,
)
from probes.grad_probe.sharded_directions import Assembled, ShardedRun

log = logging.getLogger("probes.grad_probe.comparator")

PathLike = Union[str, os.PathLike]
Signs = Union[Path, Assembled]  # a rank's direction file, or a sharded run's reassembled parameter

SIMILARITIES_CSV = "similarities.csv"
SUMMARY_JSON = "summary.json"
CSV_ENCODING = "utf-8-sig"
CSV_NEWLINE = "\r\n"

# cell statuses
OK = "ok"
EMPTY = "empty"
ABSENT = "absent"  # the parameter has no data at this step in either run (grad was None in both)
MISSING_A = "missing_a"
MISSING_B = "missing_b"
SHAPE_MISMATCH = "shape_mismatch"
NOT_BOOL = "not_bool"
UNREADABLE = "unreadable"
MD5_EQUAL = "md5_equal"
MD5_DIFFERS = "md5_differs"
CELL_STATUSES = (OK, EMPTY, ABSENT, MISSING_A, MISSING_B, SHAPE_MISMATCH, NOT_BOOL, UNREADABLE, MD5_EQUAL, MD5_DIFFERS)
# statuses whose similarity the rule reads
RULED = (OK, MD5_EQUAL, MD5_DIFFERS)
# statuses that mean the two runs' data could not be compared
PROBLEMS = (MISSING_A, MISSING_B, SHAPE_MISMATCH, NOT_BOOL, UNREADABLE)

# summary statuses
NO_DATA = "no_data"

# rank statuses
RANK_OK = "ok"
RANK_NO_COMMON_STEPS = "no_common_steps"

MODE_DIRECTION = "direction"
MODE_MD5 = "md5"

_STEP_RE = re.compile(r"^step(\d+)$")
_PARAM_COLUMNS = ("param_name", "Param_name")
_SHAPE_COLUMNS = ("shape", "Shape")
_MD5_COLUMN = "MD5"
PROGRESS_MIN_ITEMS = 200


# ---------------------------------------------------------------------------------------------
# results


@dataclass
class GradComparison:
    """One rank's comparison. ``similarity[param][step]`` is None where ``status`` is not comparable.

    Only the two folders are required: the comparator starts from an empty result and fills it
    in, and a caller building one by hand names each field it sets.
    """

    dir_a: str
    dir_b: str
    out: str | None = None
    steps: list[int] = field(default_factory=list)
    params: list[str] = field(default_factory=list)
    similarity: dict[str, dict[int, float | None]] = field(default_factory=dict)
    status: dict[str, dict[int, str]] = field(default_factory=dict)
    summary: dict[int, float | None] = field(default_factory=dict)
    flags: list[Flag] = field(default_factory=list)
    summary_status: dict[int, str] = field(default_factory=dict)
    counts: dict[str, dict[int, tuple[int, int]]] = field(default_factory=dict)
    mode: dict[int, str] = field(default_factory=dict)
    row_names: dict[str, str] = field(default_factory=dict)
    steps_only_a: list[int] = field(default_factory=list)
    steps_only_b: list[int] = field(default_factory=list)
    first_step_min: float = FIRST_STEP_MIN
    max_drop: float = MAX_DROP
    notes: list[str] = field(default_factory=list)

    @property
    def state(self) -> str:
        return RANK_OK if self.steps else RANK_NO_COMMON_STEPS

    def first_flagged_step(self) -> int | None:
        return first_flagged_step(self.flags)

    def problems(self) -> list[tuple[str, int, str]]:
        """(row name, step, status) of every cell whose data could not be compared."""
        return [(self.row_names.get(p, p), s, self.status[p][s]) for s in self.steps for p in self.params
                if self.status[p][s] in PROBLEMS]

    def param_of_row(self, row: str) -> str | None:
        for p, r in self.row_names.items():
            if r == row:
                return p
        return None

    @property
    def ok(self) -> bool:
        """Something was compared, nothing is flagged, every cell was comparable and both runs have
        the same steps."""
        return (bool(self.steps) and not self.flags and not self.problems() and not self.steps_only_a
                and not self.steps_only_b)

    def to_dict(self) -> dict[str, Any]:
        return {
            "dir_a": self.dir_a, "dir_b": self.dir_b, "out": self.out, "state": self.state,
            "steps": self.steps, "steps_only_a": self.steps_only_a, "steps_only_b": self.steps_only_b,
            "mode": {str(s): m for s, m in self.mode.items()},
            "first_step_min": self.first_step_min, "max_drop": self.max_drop,
            "first_flagged_step": self.first_flagged_step(),
            "flags": [f.to_dict() for f in self.flags],
            "summary": [self.summary.get(s) for s in self.steps],
            "summary_status": [self.summary_status.get(s) for s in self.steps],
            "params": [{"name": p, "row": self.row_names.get(p, p),
                        "similarity": [self.similarity[p][s] for s in self.steps],
                        "status": [self.status[p][s] for s in self.steps]} for p in self.params],
            "problems": [list(x) for x in self.problems()],
            "notes": self.notes,
        }


class DistributedGradComparison(dict):
    """rank -> GradComparison for the ranks found in both runs, plus ``rank_status`` for all ranks."""

    def __init__(self, out: str | None = None) -> None:
        super().__init__()
        self.out = out
        self.rank_status: dict[int, str] = {}

    @property
    def flags(self) -> list[tuple[int, Flag]]:
        return sorted(((r, f) for r, res in self.items() for f in res.flags), key=lambda x: (x[1].step, x[0]))

    def first_flagged_step(self) -> int | None:
        return min((f.step for _, f in self.flags), default=None)

    @property
    def ok(self) -> bool:
        return (bool(self.rank_status) and all(s == RANK_OK for s in self.rank_status.values())
                and all(res.ok for res in self.values()))

    def to_dict(self) -> dict[str, Any]:
        return {"out": self.out, "rank_status": {f"rank{r}": s for r, s in sorted(self.rank_status.items())},
                "first_flagged_step": self.first_flagged_step(),
                "ranks": {f"rank{r}": {"state": res.state, "first_flagged_step": res.first_flagged_step(),
                                       "flags": [f.to_dict() for f in res.flags],
                                       "problems": [list(x) for x in res.problems()],
                                       "out": res.out} for r, res in sorted(self.items())}}


# ---------------------------------------------------------------------------------------------
# progress


def _progress(iterable: Iterable, total: int, desc: str, enabled: bool | None = None):
    """tqdm when installed, else a stderr counter; only for long runs on a terminal (or when asked)."""
    if enabled is None:
        enabled = total >= PROGRESS_MIN_ITEMS and sys.stderr.isatty()
    if not enabled:
        return iterable
    try:
        from tqdm import tqdm
    except ImportError:
        return _counter(iterable, total, desc)
    return tqdm(iterable, total=total, desc=desc)


def _counter(iterable: Iterable, total: int, desc: str):
    last = 0.0
    i = 0
    for i, item in enumerate(iterable, 1):
        yield item
        now = time.monotonic()
        if now - last > 0.5 and i < total:
            sys.stderr.write(f"\r{desc}: {i}/{total}")
            sys.stderr.flush()
            last = now
    sys.stderr.write(f"\r{desc}: {i}/{total}\n")


# ---------------------------------------------------------------------------------------------
# reading a rank folder (read-only)


def _entries(directory: Path) -> list[os.DirEntry]:
    """A folder's entries in name order; an unreadable folder reads as empty."""
    try:
        return sorted(os.scandir(directory), key=lambda e: e.name)
    except OSError:
        return []


def _numbered(directory: Path, pattern: re.Pattern, want_dir: bool, canonical: str) -> dict[int, Path]:
    """{n: path} for entries matching pattern; the canonical spelling (rank1) wins over rank01."""
    found: dict[int, Path] = {}
    for entry in _entries(directory):
        m = pattern.match(entry.name)
        if not m:
            continue
        try:
            is_dir = entry.is_dir()
        except OSError:
            continue
        if is_dir != want_dir:
            continue
        n = int(m.group(1))
        if n not in found or entry.name == canonical.format(n):
            found[n] = Path(entry.path)
    return found


def rank_dirs(p: Path) -> dict[int, Path]:
    return _numbered(p, RANK_DIR_RE, True, "rank{}")


def step_dirs(p: Path) -> dict[int, Path]:
    return _numbered(p, _STEP_RE, True, "step{}")


def step_csvs(p: Path) -> dict[int, Path]:
    return _numbered(p, SUMMARY_CSV_RE, False, "grad_summary_{}.csv")


def is_dump_root(path: PathLike) -> bool:
    """True for a folder holding rank{R} folders and no grad_summary CSV / step folder of its own."""
    p = Path(path)
    if step_csvs(p) or step_dirs(p):
        return False
    return bool(rank_dirs(p))


@dataclass
class _StepCsv:
    params: list[str]
    md5: dict[str, str] | None
    shape: dict[str, str]


def _read_step_csv(path: Path | None) -> _StepCsv | None:
    if path is None:
        return None
    try:
        rows = read_csv_rows(path)
    except (OSError, UnicodeDecodeError, ValueError) as exc:
        log.warning("cannot read %s: %s", path, exc)
        return None
    if not rows:
        return _StepCsv([], None, {})
    keys = rows[0].keys()
    pcol = next((c for c in _PARAM_COLUMNS if c in keys), None)
    if pcol is None:
        log.warning("%s has no param_name column; ignored", path)
        return None
    scol = next((c for c in _SHAPE_COLUMNS if c in keys), None)
    has_md5 = _MD5_COLUMN in keys
    params: list[str] = []
    seen: set[str] = set()
    md5: dict[str, str] = {}
    shape: dict[str, str] = {}
    for row in rows:
        name = row.get(pcol)
        if name is None or name in seen:
            continue
        params.append(name)
        seen.add(name)
        if has_md5:
            md5[name] = (row.get(_MD5_COLUMN) or "").strip().lower()
        shape[name] = (row.get(scol) or "").strip() if scol else ""
    return _StepCsv(params, md5 if has_md5 else None, shape)


def _decoded(stem: str) -> str:
    try:
        return param_from_file_name(stem)
    except UnicodeDecodeError:  # not one of ours: keep the stem as the name
        return stem


def _npy_files(step_dir: Path | None) -> dict[str, Path]:
    """{param name: .npy path}. Names are the file stems verbatim; a percent-encoded stem also
    answers to its decoded name when that does not clash. Other suffixes (``.pt``) are ignored."""
    if step_dir is None:
        return {}
    files: dict[str, Path] = {}
    decoded: dict[str, Path] = {}
    for entry in _entries(step_dir):
        if not entry.name.endswith(".npy") or not entry.is_file():
            continue
        stem = entry.name[:-4]
        files[stem] = Path(entry.path)
        if "%" in stem:
            decoded.setdefault(_decoded(stem), Path(entry.path))
    for name, path in decoded.items():
        files.setdefault(name, path)
    return files


#: module names that wrappers put in front of a model's own parameter names
WRAPPER_PREFIXES = ("module.", "_orig_mod.", "_fsdp_wrapped_module.", "_checkpoint_wrapped_module.")
_WRAPPER_PARTS = frozenset(p.rstrip(".") for p in WRAPPER_PREFIXES)


def _unwrapped(name: str) -> str:
    """The name without wrapper components (``module.l1.weight`` -> ``l1.weight``; a component
    that merely contains one, ``submodule``, stays)."""
    *modules, leaf = name.split(".")
    return ".".join([p for p in modules if p not in _WRAPPER_PARTS] + [leaf])


def _wrapper_aliases(names_a: list[str], names_b: list[str]) -> dict[str, str]:
    """{name in run b: name in run a} for parameters whose names differ only by wrapper prefixes,
    when that pairs them one to one (otherwise nothing is renamed)."""
    only_a, only_b = set(names_a) - set(names_b), set(names_b) - set(names_a)
    if not only_a or not only_b:
        return {}
    by_a = {_unwrapped(n): n for n in only_a}
    by_b = {_unwrapped(n): n for n in only_b}
    if len(by_a) != len(only_a) or len(by_b) != len(only_b):
        return {}
    return {n: by_a[_unwrapped(n)] for n in names_b if n in only_b and _unwrapped(n) in by_a}


def _first_params(step_csv: Any, side: str, steps: list[int]) -> list[str]:
    for n in steps:
        c = step_csv(side, n)
        if c is not None and c.params:
            return c.params
    return []


def _renamed_csv(c: _StepCsv | None, aliases: dict[str, str]) -> _StepCsv | None:
    if c is None:
        return None
    return _StepCsv([aliases.get(p, p) for p in c.params],
                    None if c.md5 is None else {aliases.get(p, p): v for p, v in c.md5.items()},
                    {aliases.get(p, p): v for p, v in c.shape.items()})


def _step_signs(step_dir: Path | None, run: ShardedRun | None, step: int) -> dict[str, Signs]:
    """{param: signs} of one rank's step: its direction files, with the sharded parameters' slices
    replaced by the full parameters reassembled from every rank."""
    files: dict[str, Signs] = dict(_npy_files(step_dir))
    if run is not None:
        for param in run.params(step):
            files[param] = run.assembled(step, param)
    return files


def _numel(shape_text: str) -> int | None:
    text = shape_text.strip()
    if not (text.startswith("[") and text.endswith("]")):
        return None
    inner = text[1:-1].strip()
    if not inner:
        return 1
    dims = re.findall(r"-?\d+", inner)
    if not dims:
        return None
    return int(np.prod([int(d) for d in dims], dtype=np.int64))


def _load(path: Path) -> np.ndarray | None:
    try:
        return np.load(path, allow_pickle=False)
    except (OSError, ValueError, EOFError) as exc:
        log.warning("cannot load %s: %s", path, exc)
        return None


def _signs(source: Signs) -> tuple[Any, Any]:
    """(signs, the mask of elements held or None for all) of a direction file or a reassembled
    sharded parameter; (None, None) when unreadable."""
    if isinstance(source, Assembled):
        got = source.load()
        return (None, None) if got is None else got
    return _load(source), None


def _compare_arrays(pa: Signs | None, pb: Signs | None) -> tuple[str, int, int]:
    """(status, same, total) for one parameter at one step. With a sharded run on either side,
    only the elements both runs hold count (all of them, unless slices are missing)."""
    if pa is None and pb is None:
        return ABSENT, 0, 0
    if pa is None:
        return MISSING_A, 0, 0
    if pb is None:
        return MISSING_B, 0, 0
    (a, held_a), (b, held_b) = _signs(pa), _signs(pb)
    if a is None or b is None or not isinstance(a, np.ndarray) or not isinstance(b, np.ndarray):
        return UNREADABLE, 0, 0
    if a.shape != b.shape:
        return SHAPE_MISMATCH, 0, 0
    if a.dtype != np.bool_ or b.dtype != np.bool_:
        return NOT_BOOL, 0, 0
    if held_a is not None or held_b is not None:
        held = held_a if held_b is None else held_b if held_a is None else held_a & held_b
        total = int(np.count_nonzero(held))
        if total == 0:
            return (EMPTY, 0, 0) if a.size == 0 else (MISSING_A if held_a is not None and not held_a.any() else
                                                       MISSING_B, 0, 0)
        return OK, int(np.count_nonzero((a == b) & held)), total
    total = int(a.size)
    if total == 0:
        return EMPTY, 0, 0
    same = int(np.count_nonzero(a == b))
    return OK, same, total


def _compare_md5(name: str, ca: _StepCsv, cb: _StepCsv) -> tuple[str, int, int]:
    in_a = name in ca.md5
    in_b = name in cb.md5
    if not in_a and not in_b:
        return ABSENT, 0, 0
    if not in_a:
        return MISSING_A, 0, 0
    if not in_b:
        return MISSING_B, 0, 0
    ha, hb = ca.md5[name], cb.md5[name]
    if not ha or not hb:
        return UNREADABLE, 0, 0
    sa, sb = ca.shape.get(name, ""), cb.shape.get(name, "")
    na, nb = _numel(sa), _numel(sb)
    if sa and sb and (na, sa.replace(" ", "")) != (nb, sb.replace(" ", "")):
        return SHAPE_MISMATCH, 0, 0
    weight = na if na is not None else 1
    return (MD5_EQUAL, weight, weight) if ha == hb else (MD5_DIFFERS, 0, weight)


# ---------------------------------------------------------------------------------------------
# writing


def _cell(value: float | None, status: str) -> Any:
    if value is None:
        return None
    if status == EMPTY:
        return 0  # msprobe writes the int 0 when nothing was counted
    return float(value)


def _write_csv(out: Path, res: GradComparison) -> Path:
    path = out / SIMILARITIES_CSV
    if path.exists():
        log.warning("%s exists and will be replaced", path)
        path.unlink()
    writer = CsvAppender(path, ["step", *map(str, res.steps)], encoding=CSV_ENCODING, newline=CSV_NEWLINE)
    for p in res.params:
        writer.add([res.row_names[p], *(_cell(res.similarity[p][s], res.status[p][s]) for s in res.steps)])
    writer.add([SUMMARY_ROW, *(_cell(res.summary[s], res.summary_status[s]) for s in res.steps)])
    writer.flush()
    return path


def _write_plots(out: Path, res: GradComparison, progress: bool | None) -> None:
    try:
        from probes.grad_probe.plots import plot_similarities
    except ImportError as exc:  # pragma: no cover - plots.py itself imports nothing heavy
        res.notes.append(f"plots skipped: {exc}")
        return
    rows = {res.row_names[p]: [res.similarity[p][s] for s in res.steps] for p in res.params}
    rows[SUMMARY_ROW] = [res.summary[s] for s in res.steps]
    flagged: dict[str, set[int]] = {}
    for f in res.flags:
        flagged.setdefault(f.param, set()).add(f.step)
    try:
        plot_similarities(out, res.steps, rows, threshold=res.first_step_min, flagged=flagged,
                          progress=lambda it, n, d: _progress(it, n, d, progress))
    except ImportError as exc:
        log.warning("matplotlib is not installed; similarities_picture/ not written (%s)", exc)
        res.notes.append("plots skipped: matplotlib is not installed")


# ---------------------------------------------------------------------------------------------
# the comparator


def _check_input(label: str, path: PathLike) -> Path:
    p = Path(path)
    if not p.exists():
        raise FileNotFoundError(f"{label} does not exist: {p}")
    if not p.is_dir():
        raise NotADirectoryError(f"{label} is not a directory: {p}")
    return p


class GradComparator:
    """msprobe-compatible entry points: ``compare_distributed(dir1, dir2, out)`` and ``compare(dir1, dir2, out)``."""

    @staticmethod
    def compare(path1: PathLike, path2: PathLike, output_dir: PathLike | None, *,
                first_step_min: float = FIRST_STEP_MIN, max_drop: float = MAX_DROP, plots: bool = True,
                progress: bool | None = None,
                sharded: tuple[ShardedRun | None, ShardedRun | None] = (None, None)) -> GradComparison:
        """Compare two rank folders; write similarities.csv, pictures and summary.json to ``output_dir``
        (nothing is written when it is None) and return the result. ``sharded``: the runs'
        reassembled sharded parameters (compare_distributed passes them)."""
        check_thresholds(first_step_min, max_drop)
        a = _check_input("path1", path1)
        b = _check_input("path2", path2)
        res = _compare_rank(a, b, first_step_min, max_drop, progress, sharded)
        if sharded == (None, None) and any(_holds_slices(p) for p in (a, b)):
            res.notes.append(f"a run's direction files hold one rank's slices of sharded parameters ({SLICES_JSON}): "
                             "compare the dump roots with compare_distributed, which reassembles them")
        if output_dir is not None:
            out = Path(output_dir)
            out.mkdir(parents=True, exist_ok=True)
            res.out = str(out)
            if res.steps:
                _write_csv(out, res)
                if plots:
                    _write_plots(out, res, progress)
            write_json_atomic(out / SUMMARY_JSON, res.to_dict())
        return res

    @staticmethod
    def compare_distributed(path1: PathLike, path2: PathLike, output_dir: PathLike | None, *,
                            first_step_min: float = FIRST_STEP_MIN, max_drop: float = MAX_DROP, plots: bool = True,
                            progress: bool | None = None) -> DistributedGradComparison:
        """Compare every ``rank{k}`` of two dump roots into ``output_dir/rank{k}``.

        A rank found in one run only is reported (``rank_status``), not raised; raises ValueError only
        when neither run has any rank folder.
        """
        check_thresholds(first_step_min, max_drop)
        a = _check_input("path1", path1)
        b = _check_input("path2", path2)
        ranks_a, ranks_b = rank_dirs(a), rank_dirs(b)
        if not ranks_a and not ranks_b:
            raise ValueError(f"no rank{{R}} folder in {a} nor in {b}: pass dump roots to compare_distributed, "
                             "or rank folders to compare")
        out = Path(output_dir) if output_dir is not None else None
        result = DistributedGradComparison(out=str(out) if out is not None else None)
        sharded = (ShardedRun.of(ranks_a, step_dirs), ShardedRun.of(ranks_b, step_dirs))
        ranks = sorted(set(ranks_a) | set(ranks_b))
        for rank in _progress(ranks, len(ranks), "rank", progress if len(ranks) > 1 else False):
            if rank not in ranks_a:
                result.rank_status[rank] = MISSING_A
                continue
            if rank not in ranks_b:
                result.rank_status[rank] = MISSING_B
                continue
            res = GradComparator.compare(ranks_a[rank], ranks_b[rank], out / f"rank{rank}" if out is not None else None,
                                         first_step_min=first_step_min, max_drop=max_drop, plots=plots,
                                         progress=progress, sharded=sharded)
            for run in sharded:
                res.notes.extend(run.notes if run is not None else ())
            result[rank] = res
            result.rank_status[rank] = res.state
        if out is not None:
            write_json_atomic(out / SUMMARY_JSON, result.to_dict())
        return result


def _holds_slices(rank_dir: Path) -> bool:
    return any((d / SLICES_JSON).is_file() for d in step_dirs(rank_dir).values())


def _compare_rank(a: Path, b: Path, first_step_min: float, max_drop: float, progress: bool | None,
                  sharded: tuple[ShardedRun | None, ShardedRun | None] = (None, None)) -> GradComparison:
    dirs_a: dict[int, Path | None] = dict(step_dirs(a))
    dirs_b: dict[int, Path | None] = dict(step_dirs(b))
    for dirs, run in zip((dirs_a, dirs_b), sharded):
        for n in run.steps if run is not None else ():
            dirs.setdefault(n, None)  # a rank holding no slice of its own still compares the full parameters
    csvs_a, csvs_b = step_csvs(a), step_csvs(b)
    res = GradComparison(dir_a=str(a), dir_b=str(b), first_step_min=first_step_min, max_drop=max_drop)
    # which steps can be compared, and how
    candidates = sorted(set(dirs_a) | set(dirs_b) | set(csvs_a) | set(csvs_b))
    csv_cache: dict[tuple[str, int], _StepCsv | None] = {}

    def step_csv(side: str, n: int) -> _StepCsv | None:
        key = (side, n)
        if key not in csv_cache:
            csv_cache[key] = _read_step_csv((csvs_a if side == "a" else csvs_b).get(n))
        return csv_cache[key]

    only_a, only_b = [], []
    for n in candidates:
        if n in dirs_a and n in dirs_b:
            res.mode[n] = MODE_DIRECTION
            continue
        if n not in dirs_a and n not in dirs_b:
            ca, cb = step_csv("a", n), step_csv("b", n)
            if ca is not None and cb is not None and ca.md5 is not None and cb.md5 is not None:
                res.mode[n] = MODE_MD5
                continue
        has_a = n in dirs_a or n in csvs_a
        has_b = n in dirs_b or n in csvs_b
        if has_a and not has_b:
            only_a.append(n)
        elif has_b and not has_a:
            only_b.append(n)
        else:
            res.notes.append(f"step {n}: no comparable data (direction files in both runs, or an MD5 column in both "
                             "runs' CSVs); not compared")
    res.steps = sorted(res.mode)
    res.steps_only_a, res.steps_only_b = only_a, only_b
    if only_a or only_b:
        res.notes.append(f"steps in one run only (not compared): a={only_a} b={only_b}")
    if not res.steps:
        if rank_dirs(a) or rank_dirs(b):
            res.notes.append("these folders hold rank{R} folders: use compare_distributed (or pass rank folders)")
        return res

    # parameter order: the lowest common step's CSV (a, else b), then everything else sorted
    # the same parameter under another wrapper (DDP's "module.", torch.compile's "_orig_mod."):
    # run b's names are read as run a's
    aliases = _wrapper_aliases(_first_params(step_csv, "a", res.steps), _first_params(step_csv, "b", res.steps))
    if aliases:
        for n in res.steps:
            csv_cache[("b", n)] = _renamed_csv(step_csv("b", n), aliases)
        sample = ", ".join(f"{b_name} as {a_name}" for b_name, a_name in list(aliases.items())[:2])
        res.notes.append(f"{len(aliases)} parameters of run b matched to run a's names across a wrapper prefix "
                         f"({sample}{', ...' if len(aliases) > 2 else ''})")
    params: list[str] = []
    for n in res.steps:
        c = step_csv("a", n) or step_csv("b", n)
        if c is not None and c.params:
            params = list(c.params)
            break
    seen = set(params)
    files: dict[int, tuple[dict[str, Path], dict[str, Path]]] = {}
    extra: set[str] = set()
    for n in res.steps:
        if res.mode[n] == MODE_DIRECTION:
            fa, fb = _step_signs(dirs_a[n], sharded[0], n), _step_signs(dirs_b[n], sharded[1], n)
            stems = {path.name[:-4] for path in (*fa.values(), *fb.values()) if isinstance(path, Path)}
            stems |= {k for side in (fa, fb) for k, v in side.items() if isinstance(v, Assembled)}
            if aliases:
                fb = {aliases.get(_decoded(k), k): v for k, v in fb.items()}
                stems = {aliases.get(_decoded(k), k) for k in stems}
            files[n] = (fa, fb)
            extra.update(k for k in stems if k not in seen and _decoded(k) not in seen)
        else:
            for side in ("a", "b"):
                c = step_csv(side, n)
                extra.update(k for k in (c.params if c else ()) if k not in seen)
    params.extend(sorted(extra))
    res.params = params

    # row names: the summary row keeps "summary"; a parameter of that name is renamed
    taken = set(params) | {SUMMARY_ROW}
    for p in params:
        row = p
        if p == SUMMARY_ROW:
            row = f"{SUMMARY_ROW} (parameter)"
            while row in taken:
                row += " (parameter)"
            taken.add(row)
            res.notes.append(f"parameter {p!r} is written as row {row!r}")
        res.row_names[p] = row

    for p in params:
        res.similarity[p], res.status[p], res.counts[p] = {}, {}, {}
    work = [(n, p) for n in res.steps for p in params]
    sums: dict[int, list[int]] = {n: [0, 0, 0] for n in res.steps}  # same, total, compared cells
    for n, p in _progress(work, len(work), "calculate similarities (by step)", progress):
        if res.mode[n] == MODE_DIRECTION:
            fa, fb = files[n]
            status, same, total = _compare_arrays(fa.get(p), fb.get(p))
        else:
            status, same, total = _compare_md5(p, step_csv("a", n), step_csv("b", n))
        res.status[p][n] = status
        if status in RULED or status == EMPTY:
            if status == MD5_EQUAL or status == MD5_DIFFERS:
                res.similarity[p][n] = 1.0 if status == MD5_EQUAL else 0.0
            else:
                res.similarity[p][n] = same / total if total else 0.0
            res.counts[p][n] = (same, total)
            acc = sums[n]
            acc[0] += same
            acc[1] += total
            acc[2] += 1
        else:
            res.similarity[p][n] = None
    for n in res.steps:
        same, total, cells = sums[n]
        if cells == 0:
            res.summary[n], res.summary_status[n] = None, NO_DATA
        elif total == 0:
            res.summary[n], res.summary_status[n] = 0.0, EMPTY
        else:
            res.summary[n], res.summary_status[n] = same / total, OK

    ruled = {res.row_names[p]: {n: (res.similarity[p][n] if res.status[p][n] in RULED else None) for n in res.steps}
             for p in params}
    summary = {n: (res.summary[n] if res.summary_status[n] == OK else None) for n in res.steps}
    res.flags = apply_rule(ruled, res.steps, summary, first_step_min, max_drop)
    return res
