"""The result of comparing two grad_probe runs: per parameter and step a similarity and a status,
the step summaries and the rule's flags, per rank for dump roots; and the status words they use.

Kept apart from the comparator so that what reads a result (the assertion, the CLI, reports) does
not depend on how it was computed.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from probes.grad_probe.direction_rule import FIRST_STEP_MIN, MAX_DROP, Flag, first_flagged_step

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
