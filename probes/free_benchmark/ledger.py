"""free_benchmark's record of a run: what each API did, why calls went unchecked, what failed, and
the rows of the inconsistent leaves, with the files they go to (free_benchmark.csv per step and
rank, summary.json).

Kept apart from the per-call path (service.py), which decides what is checked and how, so that
every stage (forward, backward, compiled graphs, the run's own steps) reports through one set of
calls and the files read the same whichever stage wrote them.
"""

from __future__ import annotations

import bisect
import logging
import math
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from probes.core.config import ProbeConfig
from probes.core.errors import ProbeError
from probes.core.file_names import FREE_BENCHMARK_CSV, free_benchmark_summary_name
from probes.core.leaf_verdicts import OutputModified
from probes.core.records import FREE_BENCHMARK_COLUMNS, FreeBenchmarkRow
from probes.core.trees import format_path
from probes.core.writers import CsvAppender, json_value, write_json_atomic
from probes.free_benchmark.fp8 import worst_range_use

log = logging.getLogger("probes.free_benchmark")

# Rows kept in memory for summary.json and the plugin; the CSV always gets every row, so a long
# run that flags the same API every step does not grow the process without bound.
ROWS_KEPT = 2000
# Rows repeated in summary.json (serialised once, when they are made): the file is rewritten at
# every step, so it must not grow with the run.
SUMMARY_ROWS = 100
# a finite stand-in for "infinitely far over the threshold" (flips, NaN mismatches, no_change)
SCORE_CAP = 1e6


@dataclass
class ApiStats:
    """What one API did over the run (the summary table's row)."""

    calls: int = 0
    checked: int = 0
    flagged: int = 0
    fixed: int = 0
    worst_figure: float = 0.0
    worst_max_rel: float | str | None = None
    threshold: float | None = None
    first_flagged: str | None = None
    dtypes: set[str] = field(default_factory=set)
    preheat_flagged: int = 0  # calls with rows during preheat (kept out of the CSV and `flagged`)
    # the largest error / threshold of any checked call, flagged or not (1 = at the threshold):
    # how close a clean API came
    worst_score: float | None = None
    fp8: dict[str, Any] | None = None  # its FP8 inputs' range use (free_benchmark/fp8.py), worst seen

    def to_dict(self) -> dict[str, Any]:
        extra = {} if self.fp8 is None else {"fp8": self.fp8}
        return extra | {
            "calls": self.calls, "checked": self.checked, "flagged": self.flagged, "fixed": self.fixed,
            "worst_max_rel": self.worst_max_rel, "threshold": self.threshold, "worst_score": self.worst_score,
            "first_flagged": self.first_flagged, "dtypes": sorted(self.dtypes),
            "preheat_flagged": self.preheat_flagged,
        }


class Ledger:
    """The counts, skips, errors and rows of one free_benchmark run, and its files.

    `rank` and `distributed` name the files; the probe sets them once the process group is known.
    `dirty` says summary.json is out of date: every change sets it, `write` clears it.
    """

    def __init__(self, config: ProbeConfig, framework: str,
                 before_error: Callable[[], object] | None = None) -> None:
        self.config = config
        self.fb = config.free_benchmark
        self.framework = framework
        self.dump_path = Path(config.dump_path)
        # run before an error is recorded: a framework whose failed operators stay queued drops them
        # here, so they do not fail later in the user's code
        self.before_error = before_error
        self.rank: int | None = None
        self.distributed = False
        self.stats: dict[str, ApiStats] = {}
        self.rows: list[FreeBenchmarkRow] = []
        self.rows_total = 0
        self.skipped: Counter[tuple[str, str]] = Counter()
        self.errors: dict[tuple[str, str], dict[str, Any]] = {}
        self.writers: dict[int, CsvAppender] = {}  # one per step with rows not yet written out
        # every CSV that got rows, sorted, and each path as summary.json writes it: a long run
        # adds one a step, and neither the writers nor the summary's encoding grow with it
        self._csv_files: list[str] = []
        self._csv_files_json: list[str] = []
        self.preheat_rows_total = 0
        self.last_score = 0.0  # of the latest finished check (see _score)
        self.dirty = True
        self._summary_rows: list[dict[str, Any]] = []
        self._summary_rows_json: list[str] = []  # each as summary.json writes it, made once
        self._last_csv: tuple[Any, Any, Any] = (None, None, None)  # (step, csv_path, its text)
        self._preheat_rows: list[dict[str, Any]] = []
        self._summary_written = False

    # what a call did ---------------------------------------------------------------------------
    def skip(self, key: str, reason: str, count: int = 1) -> None:
        """`count` calls of `key` not checked, for `reason` (logged the first time)."""
        seen = (key, reason) in self.skipped
        self.skipped[(key, reason)] += count
        self.dirty = True
        if not seen:
            log.info("free_benchmark: %s is not checked: %s", key, reason)

    def error(self, key: str, name: str, exc: BaseException) -> None:
        """A check of `name` that failed: counted per API and exception type, the first logged."""
        if self.before_error is not None:
            self.before_error()
        self.dirty = True
        entry = self.errors.get((key, type(exc).__name__))
        if entry is None:
            self.errors[(key, type(exc).__name__)] = {"api": key, "first_call": name, "error": f"{type(exc).__name__}: {exc}", "count": 1}
            log.warning("free_benchmark: could not check %s (%s: %s); the call itself went on unchanged",
                        name, type(exc).__name__, exc)
        else:
            entry["count"] += 1

    def check_failed(self, key: str, name: str, exc: BaseException) -> None:
        """A deferred check that could not finish: skipped when its output changed meanwhile,
        else an error (raised in strict mode, as a check at the call would be)."""
        if isinstance(exc, OutputModified):
            self.skip(key, str(exc))
        elif self.config.strict:
            raise ProbeError(f"free_benchmark failed on {name}: {exc}") from exc
        else:
            self.error(key, name, exc)

    def fixed(self, stats: ApiStats) -> None:
        """A call whose output fix mode substituted (it writes no rows, as the reference)."""
        stats.checked += 1
        stats.fixed += 1
        self.dirty = True

    def record(self, key: str, name: str, stats: ApiStats, verdicts: list[Any], step: int,
               preheat: bool = False) -> None:
        """Count a finished check and write a row per inconsistent leaf (both stages). Rows of a
        call judged during its API's preheat are kept out of the CSV and of `rows` (warm-up
        thresholds raise no alarm): summary.json counts them and lists the first ones."""
        stats.checked += 1
        self.dirty = True
        if len(verdicts) == 1:  # the usual call, one output leaf: the loop below without its loops
            v = verdicts[0]
            self.last_score = _score(v)
            stats.dtypes.add(v.dtype_repr)
            if v.detail.get("rule") == "fp8_range":
                stats.fp8 = worst_range_use(stats.fp8, v.detail)
            bad = [] if v.consistent else [v]
        else:
            self.last_score = max(map(_score, verdicts), default=0.0)
            bad = []
            for v in verdicts:
                stats.dtypes.add(v.dtype_repr)
                if not v.consistent:
                    bad.append(v)
                if v.detail.get("rule") == "fp8_range":
                    stats.fp8 = worst_range_use(stats.fp8, v.detail)
        if verdicts and not preheat and (stats.worst_score is None or self.last_score > stats.worst_score):
            stats.worst_score = self.last_score
        if not bad:
            return
        if preheat:
            stats.preheat_flagged += 1
        else:
            stats.flagged += 1
        fb = self.fb
        csv_path, csv_text = self._step_csv(step)
        for v in bad:
            row = FreeBenchmarkRow(
                rank=self.rank or 0, pert_mode=fb.pert_mode, stage=fb.fuzz_stage, step=step,
                api_name=name, max_rel=v.max_rel, dtype=v.dtype_repr, shape=v.shape_repr,
                output_index=format_path(v.path), api=key, threshold=v.threshold, figure=v.figure,
                detail=dict(v.detail) if preheat else dict(v.detail, csv=csv_text),
            )
            if preheat:
                self.preheat_rows_total += 1
                if len(self._preheat_rows) < SUMMARY_ROWS:
                    self._preheat_rows.append(dict(row.to_dict(), preheat=True))
                continue
            self._add_row(row)
            if v.figure > stats.worst_figure or stats.worst_max_rel is None:
                stats.worst_figure, stats.worst_max_rel, stats.threshold = v.figure, v.max_rel, v.threshold
        if not preheat and stats.first_flagged is None:
            stats.first_flagged = name
            self._warn_first(name, stats, bad, csv_path)

    def _warn_first(self, name: str, stats: ApiStats, bad: list[Any], csv_path: Path) -> None:
        fb = self.fb
        worst = stats.worst_max_rel
        if worst is None:  # to_cpu's single-benchmark rule has no max_rel: its own figures
            d = max(bad, key=lambda v: v.figure).detail
            shown = ", ".join(f"{k} {d[k]:.6g}" for k in ("rel_err", "abs_err", "error_balance")
                              if isinstance(d.get(k), float))
            log.warning("free_benchmark: %s is inconsistent under %s: %s (rtol %s; rows in %s)",
                        name, fb.pert_mode, shown, stats.threshold, csv_path)
            return
        shown = f"{worst:.6g}" if isinstance(worst, float) else worst
        figure = "scaled error" if fb.rule == "scaled" else "max_rel"  # what the threshold bounds
        log.warning(
            "free_benchmark: %s is inconsistent under %s: %s %s > threshold %s (rows in %s)",
            name, fb.pert_mode, figure, shown, stats.threshold, csv_path,
        )

    def _add_row(self, row: FreeBenchmarkRow) -> None:
        self.rows_total += 1
        self.dirty = True
        if len(self.rows) < ROWS_KEPT:
            self.rows.append(row)
        if len(self._summary_rows) < SUMMARY_ROWS:
            self._summary_rows.append(row.to_dict())
            self._summary_rows_json.append(json_value(self._summary_rows[-1]))
        writer = self.writers.get(row.step)
        if writer is None:
            path = self._step_csv(row.step)[1]
            writer = self.writers[row.step] = CsvAppender(path, FREE_BENCHMARK_COLUMNS)
            at = bisect.bisect_left(self._csv_files, path)
            if at == len(self._csv_files) or self._csv_files[at] != path:
                self._csv_files.insert(at, path)
                self._csv_files_json.insert(at, json_value(path))
        writer.add(row.csv_values())

    # files -------------------------------------------------------------------------------------
    def csv_path(self, step: int) -> Path:
        return self.dump_path / f"step{step}" / f"rank{self.rank or 0}" / FREE_BENCHMARK_CSV

    def _step_csv(self, step: int) -> tuple[Path, str]:
        """csv_path(step) and its text, made once per step (a step may flag hundreds of calls)."""
        if self._last_csv[0] != step:
            path = self.csv_path(step)
            self._last_csv = (step, path, str(path))
        return self._last_csv[1], self._last_csv[2]

    @property
    def summary_path(self) -> Path:
        return self.dump_path / free_benchmark_summary_name(self.rank, self.distributed)

    def write(self, summary: Callable[[], dict[str, Any]]) -> None:
        """Append the rows still buffered and rewrite summary.json (from `summary()`) when
        something in it changed or it was never written."""
        for writer in self.writers.values():
            writer.flush()
        self.writers.clear()  # written out: a later row of the same step appends to its file
        if self.rank is not None and (self.dirty or not self._summary_written):
            write_json_atomic(self.summary_path, summary(),
                              encoded={"flagged": "[" + ", ".join(self._summary_rows_json) + "]",
                                       "csv_files": "[" + ", ".join(self._csv_files_json) + "]"})
            self.dirty = False
            self._summary_written = True

    def summary(self, steps_seen: int, preheat: Any = None, preheat_note: str | None = None,
                graphs: dict[str, Any] | None = None) -> dict[str, Any]:
        """summary.json's content; `preheat` (a Preheat, when applied) adds each API's learned
        thresholds, `graphs` the compiled graphs' reports."""
        by_reason: dict[str, dict[str, int]] = {}
        for (key, reason), n in sorted(self.skipped.items()):
            by_reason.setdefault(reason, {})[key] = n
        apis = {k: s.to_dict() for k, s in sorted(self.stats.items())}
        if preheat is not None:
            for k, entry in apis.items():
                entry["preheat"] = preheat.describe(k)
        summary = {
            "tool": "free_benchmark",
            "framework": self.framework,
            "rank": self.rank or 0,
            "config": self.config.to_dict(),
            "steps_seen": steps_seen,
            "apis": apis,
            "flagged": list(self._summary_rows),
            "rows_total": self.rows_total,
            "not_checked": by_reason,
            "errors": [dict(e) for e in self.errors.values()],
            "csv_files": list(self._csv_files),
        }
        if graphs:
            summary["graphs"] = [r.to_dict() for _name, r in sorted(graphs.items())]
        if preheat is not None or preheat_note is not None:
            fb = self.fb
            summary["preheat"] = {
                "applied": preheat is not None, "note": preheat_note,
                "preheat_step": fb.preheat_step, "max_sample": fb.max_sample,
                "rows_total": self.preheat_rows_total, "rows": list(self._preheat_rows),
            }
        return summary


def _score(v: Any) -> float:
    """How far a leaf's figure is from its threshold: 1 at the threshold, above 1 inconsistent
    (the per-API tests feed it to Hypothesis' targeted search, which then climbs towards the
    inputs where an API is worst)."""
    if not math.isfinite(v.figure):
        return SCORE_CAP
    if "ratio" in v.detail or v.detail.get("rule") == "scaled":
        excess = v.figure - 1.0
        if v.threshold <= 0.0:
            return 0.0 if excess <= 0.0 else SCORE_CAP
        return min(max(excess, 0.0) / v.threshold, SCORE_CAP)
    return min(v.figure, SCORE_CAP)
