"""What a comparison writes into its output folder: msprobe's ``similarities.csv`` (UTF-8 BOM,
CRLF), ``similarities_picture/*.png`` (matplotlib, imported only when pictures are drawn) and our
``summary.json``."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

from probes.core.file_names import SIMILARITIES_CSV
from probes.core.writers import CsvAppender, write_json_atomic
from probes.grad_probe.comparison import EMPTY, DistributedGradComparison, GradComparison
from probes.grad_probe.direction_rule import SUMMARY_ROW
from probes.grad_probe.progress import with_progress

# the comparator's logger: what a user filters on when a comparison replaces or skips a file
log = logging.getLogger("probes.grad_probe.comparator")

SUMMARY_JSON = "summary.json"
CSV_ENCODING = "utf-8-sig"
CSV_NEWLINE = "\r\n"


def _cell(value: float | None, status: str) -> Any:
    if value is None:
        return None
    if status == EMPTY:
        return 0  # msprobe writes the int 0 when nothing was counted
    return float(value)


def write_similarities_csv(out: Path, res: GradComparison) -> Path:
    """``similarities.csv``: one row per parameter and the summary row, one column per step; a
    cell without a similarity is empty so the table stays rectangular."""
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


def write_plots(out: Path, res: GradComparison, show_progress: bool | None) -> None:
    """One picture per row; without matplotlib the pictures are skipped with a note, since the
    CSV and the summary already hold every figure."""
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
                          progress=lambda it, n, d: with_progress(it, n, d, show_progress))
    except ImportError as exc:
        log.warning("matplotlib is not installed; similarities_picture/ not written (%s)", exc)
        res.notes.append("plots skipped: matplotlib is not installed")


def write_summary_json(out: Path, res: GradComparison | DistributedGradComparison) -> Path:
    """``summary.json``: the whole result, for tools and reports."""
    path = out / SUMMARY_JSON
    write_json_atomic(path, res.to_dict())
    return path
