"""``assert_grad_directions_close``: the direction rule between two grad_probe dumps as a test assertion.

It runs the comparator (which applies the rule of ``direction_rule``) and turns its result into one
failure message: the first flagged step, the rule, the flagged parameters with their agreeing
element counts, and where the evidence lies. It sits above both modules so that neither imports it.
"""

from __future__ import annotations

import shutil
import tempfile
from collections.abc import Mapping
from pathlib import Path
from typing import Union

from probes.grad_probe.comparator import GradComparator, GradComparison, is_dump_root
from probes.grad_probe.direction_rule import (
    FIRST_STEP_MIN,
    MAX_DROP,
    check_thresholds,
    first_flagged_step,
    rule_text,
)

__all__ = ["assert_grad_directions_close"]


def _format_failure(results: Mapping[int | None, GradComparison], rank_status: Mapping[int, str], evidence: Path,
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
