"""The rule a gradient run is judged by on its own, without a second run: every gradient
statistic must be finite.

A NaN or an infinity in a parameter's gradient (its max, min or norm in grad_summary_{N}.csv)
means the step that follows corrupts the parameter; it is the first thing a user wants a test to
fail on. Read from the files, so it serves both frameworks and any earlier dump alike.
Direction similarity between two runs (the 0.97/0.03 rule) is probes.grad_probe.direction_rule.
"""

from __future__ import annotations

import math
import re
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from probes.core.writers import read_csv_rows

_STEP_CSV = re.compile(r"^grad_summary_(\d+)\.csv$")
FIGURES = ("max", "min", "norm")


@dataclass(frozen=True)
class NonFiniteGradient:
    """One parameter at one step whose gradient statistics are not finite."""

    param: str
    step: int
    figures: dict[str, str]  # the non-finite ones: {"norm": "nan", ...}
    csv: str

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    def describe(self) -> str:
        shown = ", ".join(f"{k} {v}" for k, v in self.figures.items())
        return f"gradient of {self.param} is not finite at step {self.step} ({shown})"


def nonfinite_gradients(dump_path: str | Path) -> list[NonFiniteGradient]:
    """Every non-finite (parameter, step) under a grad_probe dump path (all ranks, all
    optimizer folders), ordered by file then row."""
    found: list[NonFiniteGradient] = []
    for csv_path in sorted(Path(dump_path).rglob("grad_summary_*.csv")):
        m = _STEP_CSV.match(csv_path.name)
        if m is None:
            continue
        for row in read_csv_rows(csv_path):
            if _empty(row.get("shape", "")):
                continue  # an empty gradient's statistics are NaN by definition, not a finding
            bad = {k: row[k] for k in FIGURES if k in row and not _finite(row[k])}
            if bad:
                found.append(NonFiniteGradient(row.get("param_name", "?"), int(m.group(1)), bad, str(csv_path)))
    return found


def _empty(shape_text: str) -> bool:
    return "0" in re.findall(r"\d+", shape_text)


def _finite(text: str | None) -> bool:
    try:
        return math.isfinite(float(text or "nan"))
    except ValueError:
        return False
