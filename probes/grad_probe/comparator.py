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

Reading a dump is :mod:`~probes.grad_probe.dump_reader`'s job, one cell's comparison
:mod:`~probes.grad_probe.cell_compare`'s, the result :mod:`~probes.grad_probe.comparison`'s and the
output files :mod:`~probes.grad_probe.comparison_writers`'s; this module puts them together.
"""

from __future__ import annotations

from pathlib import Path

from probes.grad_probe.cell_compare import compare_arrays, compare_md5
from probes.grad_probe.comparison import (
    ABSENT,
    CELL_STATUSES,
    EMPTY,
    MD5_DIFFERS,
    MD5_EQUAL,
    MISSING_A,
    MISSING_B,
    MODE_DIRECTION,
    MODE_MD5,
    NO_DATA,
    NOT_BOOL,
    OK,
    PROBLEMS,
    RANK_NO_COMMON_STEPS,
    RANK_OK,
    RULED,
    SHAPE_MISMATCH,
    UNREADABLE,
    DistributedGradComparison,
    GradComparison,
)
from probes.grad_probe.comparison_writers import (
    CSV_ENCODING,
    CSV_NEWLINE,
    SIMILARITIES_CSV,
    SUMMARY_JSON,
    write_plots,
    write_similarities_csv,
    write_summary_json,
)
from probes.grad_probe.csv_format import SLICES_JSON
from probes.grad_probe.direction_rule import (
    FIRST_STEP_MIN,
    MAX_DROP,
    SUMMARY_ROW,
    apply_rule,
    check_thresholds,
)
from probes.grad_probe.dump_reader import (
    PathLike,
    Signs,
    StepCsv,
    decoded_name,
    holds_slices,
    is_dump_root,
    rank_dirs,
    read_step_csv,
    step_csvs,
    step_dirs,
    step_signs,
)
from probes.grad_probe.param_names import WRAPPER_PREFIXES, first_params, renamed_csv, wrapper_aliases
from probes.grad_probe.progress import PROGRESS_MIN_ITEMS, with_progress
from probes.grad_probe.sharded_directions import Assembled, ShardedRun

# what callers imported from here before the reader, the results and the writers had modules of
# their own; the comparator itself is GradComparator and compare_rank below
__all__ = [
    "ABSENT", "CELL_STATUSES", "CSV_ENCODING", "CSV_NEWLINE", "EMPTY", "MD5_DIFFERS", "MD5_EQUAL", "MISSING_A",
    "MISSING_B", "MODE_DIRECTION", "MODE_MD5", "NOT_BOOL", "NO_DATA", "OK", "PROBLEMS", "PROGRESS_MIN_ITEMS",
    "RANK_NO_COMMON_STEPS", "RANK_OK", "RULED", "SHAPE_MISMATCH", "SIMILARITIES_CSV", "SUMMARY_JSON", "UNREADABLE",
    "WRAPPER_PREFIXES", "DistributedGradComparison", "GradComparator", "GradComparison", "PathLike", "Signs",
    "compare_rank", "is_dump_root", "rank_dirs", "step_csvs", "step_dirs", "wrapper_aliases",
]

#: the old private name of :func:`probes.grad_probe.param_names.wrapper_aliases`, for callers that used it
_wrapper_aliases = wrapper_aliases


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
        res = compare_rank(a, b, first_step_min, max_drop, progress, sharded)
        if sharded == (None, None) and any(holds_slices(p) for p in (a, b)):
            res.notes.append(f"a run's direction files hold one rank's slices of sharded parameters ({SLICES_JSON}): "
                             "compare the dump roots with compare_distributed, which reassembles them")
        if output_dir is not None:
            out = Path(output_dir)
            out.mkdir(parents=True, exist_ok=True)
            res.out = str(out)
            if res.steps:
                write_similarities_csv(out, res)
                if plots:
                    write_plots(out, res, progress)
            write_summary_json(out, res)
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
        for rank in with_progress(ranks, len(ranks), "rank", progress if len(ranks) > 1 else False):
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
            write_summary_json(out, result)
        return result


def compare_rank(a: Path, b: Path, first_step_min: float, max_drop: float, progress: bool | None,
                 sharded: tuple[ShardedRun | None, ShardedRun | None] = (None, None)) -> GradComparison:
    """Two rank folders compared cell by cell, without writing anything: which steps compare and
    how (direction files, else L0 hashes), the parameter order and row names, every cell's status,
    the step summaries and the rule's flags."""
    dirs_a: dict[int, Path | None] = dict(step_dirs(a))
    dirs_b: dict[int, Path | None] = dict(step_dirs(b))
    for dirs, run in zip((dirs_a, dirs_b), sharded):
        for n in run.steps if run is not None else ():
            dirs.setdefault(n, None)  # a rank holding no slice of its own still compares the full parameters
    csvs_a, csvs_b = step_csvs(a), step_csvs(b)
    res = GradComparison(dir_a=str(a), dir_b=str(b), first_step_min=first_step_min, max_drop=max_drop)
    # which steps can be compared, and how
    candidates = sorted(set(dirs_a) | set(dirs_b) | set(csvs_a) | set(csvs_b))
    csv_cache: dict[tuple[str, int], StepCsv | None] = {}

    def step_csv(side: str, n: int) -> StepCsv | None:
        key = (side, n)
        if key not in csv_cache:
            csv_cache[key] = read_step_csv((csvs_a if side == "a" else csvs_b).get(n))
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
    aliases = wrapper_aliases(first_params(step_csv, "a", res.steps), first_params(step_csv, "b", res.steps))
    if aliases:
        for n in res.steps:
            csv_cache[("b", n)] = renamed_csv(step_csv("b", n), aliases)
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
            fa, fb = step_signs(dirs_a[n], sharded[0], n), step_signs(dirs_b[n], sharded[1], n)
            stems = {path.name[:-4] for path in (*fa.values(), *fb.values()) if isinstance(path, Path)}
            stems |= {k for side in (fa, fb) for k, v in side.items() if isinstance(v, Assembled)}
            if aliases:
                fb = {aliases.get(decoded_name(k), k): v for k, v in fb.items()}
                stems = {aliases.get(decoded_name(k), k) for k in stems}
            files[n] = (fa, fb)
            extra.update(k for k in stems if k not in seen and decoded_name(k) not in seen)
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
    for n, p in with_progress(work, len(work), "calculate similarities (by step)", progress):
        if res.mode[n] == MODE_DIRECTION:
            fa, fb = files[n]
            status, same, total = compare_arrays(fa.get(p), fb.get(p))
        else:
            status, same, total = compare_md5(p, step_csv("a", n), step_csv("b", n))
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
