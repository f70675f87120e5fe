"""One optimizer step's grad_probe files, taken the same way by every framework's monitor.

The PyTorch and MindSpore monitors must write the same bytes for the same gradients (a comparison
lines the two runs up cell by cell), so the walk over the parameters, the error and missing-gradient
book-keeping, and the turn of host figures into CSV rows, checksums and direction files live here
once. What differs by framework is handed in as a :class:`StepFigures`: how a gradient is read and
checked, how the figures are taken on its device (batched, sharded) and how they come to the host
in one transfer. This module imports no deep-learning framework.
"""

from __future__ import annotations

from collections.abc import Sequence
from contextlib import AbstractContextManager
from typing import Any, NamedTuple, Protocol

from probes.core.errors import ProbeError
from probes.grad_probe import csv_format, stats
from probes.grad_probe.monitor_common import MonitorBase

__all__ = ["StepFigure", "StepFigures", "dump_step", "write_step_figures"]


class StepFigure(NamedTuple):
    """One parameter's figures on the host, as a framework hands them over for the files."""

    name: str
    shape: tuple[int, ...]  # the full parameter's (a sharded one's too): the CSV's shape column
    row: Sequence[float]  # the statistics vector, then the FP8 health fractions
    # L0: the values the checksum is taken of; L1/L2: the signs (g > 0) for the direction file,
    # None when this rank writes none (it holds no counted slice of a sharded parameter)
    payload: Any
    sharded: bool = False  # the direction file is a slice: shards.json says where it sits
    index: Any = None  # where this rank's slice sits in the full parameter (csv_format.slice_entry)
    # how many ranks had the gradient (0: a sharded parameter's missing gradient) and how many
    # ranks' slices failed (the parameter then gets an error, not a row), as the figures count them
    had: float = 1.0
    failed: float = 0.0


class StepFigures(Protocol):
    """A framework's part of one step (see the module docstring); made per step, so it may hold
    the step's inputs."""

    def computing(self) -> AbstractContextManager[Any]:
        """Where the step's figures are taken (PyTorch: no autograd recording)."""
        ...

    def partitioned(self, p: Any) -> bool:
        """True for a parameter split across ranks: its figures need every rank, written or not."""
        ...

    def gradient(self, name: str, p: Any) -> Any:
        """The parameter's gradient this step, or None when it has none."""
        ...

    def no_gradient(self, step: int, name: str) -> None:
        """A parameter without a gradient this step (already listed in summary.json)."""
        ...

    def take(self, name: str, g: Any) -> Any:
        """What `measure` needs of one gradient; raises when it cannot be measured (the parameter
        then loses its row, the others keep theirs)."""
        ...

    def measure(self, step: int, taken: list[Any], sharded: list[tuple[str, Any]]) -> Any:
        """The step's figures, still on the devices (every rank of a sharded parameter's mesh
        calls this for it, in the same order)."""
        ...

    def to_host(self, measured: Any) -> list[list[StepFigure]]:
        """`measure`'s figures on the host, in one transfer per device, grouped as measured."""
        ...


def dump_step(monitor: MonitorBase, step: int, figures: StepFigures, write: bool = True) -> None:
    """Take and write one step's files. ``write=False``: only this rank's share of the sharded
    parameters' figures (a rank the rank filter leaves out: the other ranks wait for it)."""
    strict = monitor.config.strict
    taken: list[Any] = []
    sharded: list[tuple[str, Any]] = []
    missing: list[str] = []
    with figures.computing():
        for name, p in monitor.selected:
            if figures.partitioned(p):
                sharded.append((name, p))
                continue
            if not write:
                continue
            g = figures.gradient(name, p)
            if g is None:
                missing.append(name)
                figures.no_gradient(step, name)
                continue
            try:
                taken.append(figures.take(name, g))
            except Exception as exc:
                if strict:
                    raise  # recorded once, by the monitor's hook
                monitor.record_error(step, name, exc)
        measured = figures.measure(step, taken, sharded)
        if not write:
            return
        groups = figures.to_host(measured)
    write_step_figures(monitor, step, groups, missing, sort_missing=bool(sharded))


def write_step_figures(monitor: MonitorBase, step: int, groups: list[list[StepFigure]], missing: list[str],
                       sort_missing: bool = False) -> None:
    """Hand one step's host figures to the monitor's writer as CSV rows, checksums and direction
    files. Figures measured in several groups are put back in the parameters' order (and so is
    `missing` when `sort_missing`: a sharded parameter's missing gradient is only known here)."""
    rank = monitor.rank or 0
    level, root, bounds, histogram = monitor.level, monitor.root, monitor.bounds, monitor.histogram
    fp8_width = len(stats.FP8_HEALTH_FIGURES) * len(monitor.fp8_formats)
    records: list[stats.GradStats] = []
    directions: list[tuple[Any, Any]] = []  # (direction file, host bools), written off this thread
    slices: dict[str, Any] = {}
    for group in groups:
        for figure in group:
            name = figure.name
            if figure.failed:
                monitor.record_error(step, name, ProbeError(
                    f"the figures of {int(figure.failed)} rank(s)' slices of this sharded gradient failed"))
                continue
            if not figure.had:
                missing.append(name)
                continue
            md5 = None
            if level == "L0":
                md5 = stats.crc32_hex(figure.payload)  # of this rank's slice, for a sharded parameter
            elif figure.payload is not None:
                directions.append((csv_format.direction_file(root, rank, step, name), figure.payload))
                if figure.sharded:
                    slices[name] = csv_format.slice_entry(figure.shape, figure.index)
            records.append(stats.split_stats(name, figure.shape, figure.row, bounds, histogram, md5, fp8_width))
    if len(groups) > 1:  # the CSV's rows in the parameters' order
        order = {name: i for i, (name, _p) in enumerate(monitor.selected)}
        records.sort(key=lambda r: order[r.name])
        if sort_missing:
            missing.sort(key=lambda n: order[n])
    monitor.write_step(step, rank, missing, records, directions, slices)
