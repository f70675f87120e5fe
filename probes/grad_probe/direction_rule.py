"""THE gradient-direction rule (msprobe's documented reading of ``similarities.csv``), written once.

msprobe's docs give an empirical reading of ``similarities.csv``: for any parameter (and the
per-step summary), a similarity below 0.97 at the first compared step, or a decrease of more than
0.03 from one compared step to the next, marks the step where a precision problem appears.
msprobe never evaluated it; here it is a function, and ``assert_grad_directions_close`` turns it into
a test assertion.

Precise rule, for one series of (step, similarity) pairs in step order:

* cells whose similarity is ``None`` (nothing comparable at that step) are skipped;
* the first non-``None`` cell is flagged when ``similarity < first_step_min`` (reason
  ``"below_first_step_min"``);
* every later cell is flagged when ``previous - similarity > max_drop``, where ``previous`` is the
  last non-``None`` similarity before it (reason ``"drop"``).

Both comparisons are strict; the drop test allows 1e-12 of binary rounding slack, so that
1.0 -> 0.97 (a drop of exactly 0.03 in decimal, 0.030000000000000027 in binary) is not flagged.
"""

from __future__ import annotations

import math
import shutil
import tempfile
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Union

from probes.core.thresholds import DIRECTION_FIRST_STEP_MIN as FIRST_STEP_MIN
from probes.core.thresholds import DIRECTION_MAX_DROP as MAX_DROP

ROUNDING_SLACK = 1e-12

REASON_FIRST_STEP = "below_first_step_min"
REASON_DROP = "drop"

SUMMARY_ROW = "summary"


@dataclass(frozen=True)
class Flag:
    """One flagged cell: ``param`` is the row name as written in similarities.csv."""

    param: str
    step: int
    similarity: float
    reason: str
    previous: float | None = None
    previous_step: int | None = None

    def describe(self, first_step_min: float = FIRST_STEP_MIN, max_drop: float = MAX_DROP) -> str:
        if self.reason == REASON_FIRST_STEP:
            return (f"similarity {self.similarity:.6g} < {first_step_min} at its first compared step "
                    f"({self.step})")
        drop = (self.previous or 0.0) - self.similarity
        return (f"similarity {self.similarity:.6g} dropped by {drop:.6g} > {max_drop} from "
                f"{self.previous:.6g} at step {self.previous_step}")

    def to_dict(self) -> dict:
        return {"param": self.param, "step": self.step, "similarity": self.similarity, "reason": self.reason,
                "previous": self.previous, "previous_step": self.previous_step}


def check_thresholds(first_step_min: float, max_drop: float) -> None:
    if not (isinstance(first_step_min, (int, float)) and 0.0 <= first_step_min <= 1.0):
        raise ValueError(f"first_step_min must be a number in [0, 1], got {first_step_min!r}")
    if not (isinstance(max_drop, (int, float)) and 0.0 <= max_drop <= 1.0):
        raise ValueError(f"max_drop must be a number in [0, 1], got {max_drop!r}")


def flag_series(name: str, series: Iterable[tuple[int, float | None]], first_step_min: float = FIRST_STEP_MIN,
                max_drop: float = MAX_DROP) -> list[Flag]:
    """Apply the rule to one row: ``series`` yields (step, similarity or None) in step order."""
    flags: list[Flag] = []
    previous: float | None = None
    previous_step: int | None = None
    for step, value in series:
        if value is None or (isinstance(value, float) and math.isnan(value)):
            continue
        value = float(value)
        if previous is None:
            if value < first_step_min:
                flags.append(Flag(name, step, value, REASON_FIRST_STEP))
        elif (previous - value) - max_drop > ROUNDING_SLACK:
            flags.append(Flag(name, step, value, REASON_DROP, previous, previous_step))
        previous, previous_step = value, step
    return flags


def apply_rule(similarity: Mapping[str, Mapping[int, float | None]], steps: Sequence[int],
               summary: Mapping[int, float | None] | None = None, first_step_min: float = FIRST_STEP_MIN,
               max_drop: float = MAX_DROP, summary_name: str = SUMMARY_ROW) -> list[Flag]:
    """Flags for every row of a similarity table (and its summary row).

    Sorted by step, then by row order (the order of ``similarity``, summary last).
    """
    check_thresholds(first_step_min, max_drop)
    ordered = sorted(steps)
    rows: list[tuple[str, Mapping[int, float | None]]] = list(similarity.items())
    if summary is not None:
        rows.append((summary_name, summary))
    rank = {name: i for i, (name, _) in enumerate(rows)}
    flags: list[Flag] = []
    for name, cells in rows:
        flags.extend(flag_series(name, ((s, cells.get(s)) for s in ordered), first_step_min, max_drop))
    flags.sort(key=lambda f: (f.step, rank[f.param]))
    return flags


def first_flagged_step(flags: Iterable[Flag]) -> int | None:
    steps = [f.step for f in flags]
    return min(steps) if steps else None


def rule_text(first_step_min: float = FIRST_STEP_MIN, max_drop: float = MAX_DROP) -> str:
    return (f"similarity < {first_step_min} at the first compared step, or a drop of more than {max_drop} "
            "from the previous compared step")


# ---------------------------------------------------------------------------------------------
# assertion helper


def _format_failure(results: Mapping[int | None, object], rank_status: Mapping[int, str], evidence: Path,
                    first_step_min: float, max_drop: float, strict: bool) -> str | None:
    lines: list[str] = []
    flagged = {rank: res.flags for rank, res in results.items() if res.flags}
    first = min((first_flagged_step(fl) for fl in flagged.values()), default=None)
    if first is not None:
        lines.append(f"Gradient directions are not close! First flagged step: {first}.")
        lines.append(f"Rule: {rule_text(first_step_min, max_drop)}.")
        for rank, fl in flagged.items():
            here = [f for f in fl if f.step == first]
            if not here:
                continue
            where = "" if rank is None else f" (rank {rank})"
            lines.append(f"Flagged at step {first}{where}:")
            res = results[rank]
            for f in here:
                counts = res.counts.get(res.param_of_row(f.param), {}).get(f.step)
                extra = f" [{counts[0]}/{counts[1]} elements agree]" if counts else ""
                lines.append(f"  {f.param}: {f.describe(first_step_min, max_drop)}{extra}")
            later = sorted({f.step for f in fl if f.step != first})
            if later:
                lines.append(f"  later flagged steps{where}: {', '.join(map(str, later[:20]))}"
                             + (" ..." if len(later) > 20 else ""))
    bad_ranks = {r: s for r, s in rank_status.items() if s != "ok"}
    if bad_ranks:
        if not lines:
            lines.append("Gradient directions could not be compared everywhere!")
        lines.append("Ranks not compared: " + ", ".join(f"rank{r}: {s}" for r, s in sorted(bad_ranks.items())))
    for rank, res in results.items():
        where = "" if rank is None else f"rank {rank}: "
        if not res.steps:
            if not lines:
                lines.append("Gradient directions could not be compared!")
            lines.append(f"{where}no step present in both runs ({res.dir_a} vs {res.dir_b})")
            continue
        if strict and (res.steps_only_a or res.steps_only_b):
            if not lines:
                lines.append("Gradient direction data differ between the runs!")
            lines.append(f"{where}steps in one run only: a={res.steps_only_a} b={res.steps_only_b}")
        if strict:
            problems = res.problems()
            if problems:
                if not lines:
                    lines.append("Gradient direction data differ between the runs!")
                shown = "; ".join(f"{p} at step {s}: {st}" for p, s, st in problems[:10])
                more = f" (and {len(problems) - 10} more)" if len(problems) > 10 else ""
                lines.append(f"{where}{len(problems)} cells not comparable: {shown}{more}")
    if not lines:
        return None
    lines.append(f"Evidence: {evidence} (similarities.csv, similarities_picture/, summary.json)")
    return "\n".join(lines)


def assert_grad_directions_close(dir_a: Union[str, Path], dir_b: Union[str, Path], first_step_min: float = FIRST_STEP_MIN,
                                 max_drop: float = MAX_DROP, *, out: Union[str, Path, None] = None,
                                 plots: bool = True, strict: bool = True) -> None:
    """Compare two grad_probe dumps and fail like ``torch.testing.assert_close`` if they diverge.

    ``dir_a``/``dir_b`` are either two dump roots (holding ``rank{R}`` folders) or two rank folders.
    The comparison's files (similarities.csv, pictures, summary.json) go to ``out``; without it to a
    temporary folder that is kept only when the assertion fails. With ``strict`` (the default) a rank
    or a parameter present in one run only, or direction files of different shapes/dtypes, also fail.
    """
    from probes.grad_probe.comparator import GradComparator, is_dump_root

    check_thresholds(first_step_min, max_drop)
    a, b = Path(dir_a), Path(dir_b)
    for label, p in (("dir_a", a), ("dir_b", b)):
        if not p.is_dir():
            raise FileNotFoundError(f"{label} is not a directory: {p}")
    root_a, root_b = is_dump_root(a), is_dump_root(b)
    if root_a != root_b:
        raise ValueError(f"cannot compare a dump root with a rank folder: {a} ({'root' if root_a else 'rank'}) vs "
                         f"{b} ({'root' if root_b else 'rank'})")
    temp = out is None
    evidence = Path(tempfile.mkdtemp(prefix="grad_compare_")) if temp else Path(out)
    kwargs = dict(first_step_min=first_step_min, max_drop=max_drop, plots=plots)
    if root_a:
        dist = GradComparator.compare_distributed(a, b, evidence, **kwargs)
        results: dict = dict(dist)
        rank_status = dist.rank_status
    else:
        results = {None: GradComparator.compare(a, b, evidence, **kwargs)}
        rank_status = {}
    message = _format_failure(results, rank_status, evidence, first_step_min, max_drop, strict)
    if message is None:
        if temp:
            shutil.rmtree(evidence, ignore_errors=True)
        return
    raise AssertionError(message)
