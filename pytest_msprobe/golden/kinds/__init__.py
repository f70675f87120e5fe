"""The kinds of golden, one module each, and the registry that finds a task's kind by its name.

* free_benchmark -> ``apis.csv`` (:mod:`.free_benchmark`)
* grad_probe -> a ``grad_run`` golden: ``grad_stats.csv`` and ``grad_directions.npz`` (:mod:`.grad_run`)
* online_dispatch -> ``failing_ops.csv`` (:mod:`.online_dispatch`)

Each is a :class:`Kind` (snapshot, render, load, compare); the store checks every one with the same
routine, so adding a kind is adding a module and a line here. The cells and files they share are in
:mod:`.cells`. The margins a run's figures are allowed against a golden's (FB_MARGIN, GRAD_RTOL,
...) are the kinds' own; the gradient-direction rule's limits are grad_probe's
(probes/core/thresholds.py), applied to the golden run as to any other.
"""

from __future__ import annotations

from probes.core.errors import ConfigError
from pytest_msprobe.golden.kinds.cells import (
    Figure,
    csv_bytes,
    fmt,
    jsonable,
    npz_bytes,
    parse_figure,
    read_npz,
    read_table,
    shown,
)
from pytest_msprobe.golden.kinds.free_benchmark import FB_MARGIN, FB_MARGIN_ABS, FREE_BENCHMARK, fb_bound
from pytest_msprobe.golden.kinds.grad_run import FIRST_STEP_MIN, GRAD_ATOL, GRAD_RTOL, GRAD_RUN, MAX_DROP
from pytest_msprobe.golden.kinds.kind import Category, Comparison, Failure, Kind
from pytest_msprobe.golden.kinds.online_dispatch import ONLINE_DISPATCH

__all__ = ["FB_MARGIN", "FB_MARGIN_ABS", "FIRST_STEP_MIN", "FREE_BENCHMARK", "GRAD_ATOL", "GRAD_RTOL", "GRAD_RUN",
           "KINDS", "MAX_DROP", "ONLINE_DISPATCH", "Category", "Comparison", "Failure", "Figure", "Kind", "csv_bytes",
           "fb_bound", "fmt", "jsonable", "kind_for", "npz_bytes", "parse_figure", "read_npz", "read_table", "shown"]

#: task name -> the kind of golden its results are checked against
KINDS: dict[str, Kind] = {"free_benchmark": FREE_BENCHMARK, "grad_probe": GRAD_RUN, "online_dispatch": ONLINE_DISPATCH}


def kind_for(task: str | Kind) -> Kind:
    """The kind a task's results are checked against (a Kind passes through: the store also checks
    kinds that no task owns)."""
    if isinstance(task, Kind):
        return task
    try:
        return KINDS[task]
    except (KeyError, TypeError):
        raise ConfigError("golden kind", task, f"one of {', '.join(KINDS)}, or a Kind") from None
