"""THE gradient-direction rule (msprobe's documented reading of ``similarities.csv``), written once.

msprobe's docs give an empirical reading of ``similarities.csv``: for any parameter (and the
per-step summary), a similarity below 0.97 at the first compared step, or a decrease of more than
0.03 from one compared step to the next, marks the step where a precision problem appears.
msprobe never evaluated it; here it is a function, and ``assert_grad_directions_close``
(probes.grad_probe.assertion) turns it into a test assertion. This module imports no other module
of grad_probe, so the comparator and the assertion can both build on it.

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
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

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
