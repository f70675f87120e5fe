"""A step's statistics and signs of gradients in host memory, taken by NumPy on that memory.

A CPU gradient needs no transfer, so what a step costs there is the calls: a torch kernel call
costs several microseconds however small the tensor (a batch's extrema and norms, their stack, a
dtype cast and the signs cost ~110 us for a 6-parameter MLP), a NumPy call about one. NumPy reads
each gradient in place: its max and min, its squares in float64 into one buffer kept from step to
step (a float32's square is exact in float64; a fresh buffer would fault its pages in at every
step), one ``add.reduceat`` for every norm, and the signs straight into the step's array. The
figures are the definitions of :mod:`probes.grad_probe.stats`; a norm sums in another order than a
device's kernels, so it may differ from theirs in its last digit. This module imports no
deep-learning framework.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from probes.grad_probe.stats import Bound

__all__ = ["HOST_FIGURES_ELEMENTS", "Squares", "histogram", "host_figures"]

#: the most elements the squares buffer holds (16 MiB): a larger step's gradients take the device
#: path, whose temporaries are freed after the step
HOST_FIGURES_ELEMENTS = 1 << 21


class Squares:
    """The float64 buffer a monitor's steps square their gradients into, grown when a step needs
    more, up to HOST_FIGURES_ELEMENTS (a larger request gets an array of its own); a monitor runs
    its steps on one thread at a time."""

    def __init__(self) -> None:
        self._buffer = np.empty(0, dtype=np.float64)

    def take(self, n: int) -> np.ndarray:
        if n > HOST_FIGURES_ELEMENTS:
            return np.empty(n, dtype=np.float64)
        if self._buffer.size < n:
            self._buffer = np.empty(n, dtype=np.float64)
        return self._buffer[:n]


def host_figures(
    views: Sequence[np.ndarray], squares: Squares, l0: bool, bounds: Sequence[Bound] | None = None
) -> tuple[list[list[float]], np.ndarray]:
    """The :func:`~probes.grad_probe.stats.stat_vector` row of each flat, non-empty view (float16,
    float32 or float64): ``[max, min, norm]``, then with ``bounds`` (L2) the histogram's fractions
    and ``=0``; and the step's payload: at L0 the views as one float32 array (their checksums),
    else their signs ``v > 0`` as one new bool array (the direction files, written after the
    optimizer has run)."""
    total = sum(v.size for v in views)
    sq = squares.take(total)
    signs = None if l0 else np.empty(total, dtype=bool)
    extrema: list[object] = []
    starts: list[int] = []
    pos = 0
    with np.errstate(all="ignore"):  # NaN and infinities are figures like any other
        for v in views:
            end = pos + v.size
            extrema += (v.max(), v.min())
            np.square(v, out=sq[pos:end], dtype=np.float64)
            if signs is not None:
                np.greater(v, 0, out=signs[pos:end])
            starts.append(pos)
            pos = end
        norms = np.sqrt(np.add.reduceat(sq, starts)).tolist()
        # L0: float64 beyond float32's range is infinite, as torch's cast makes it
        payload = (
            signs
            if signs is not None
            else (np.concatenate(views, dtype=np.float32) if len(views) > 1 else views[0].astype(np.float32))
        )
    ext = np.array(extrema, dtype=np.float64).tolist()
    rows = [[ext[2 * i], ext[2 * i + 1], norm] for i, norm in enumerate(norms)]
    if bounds is not None:
        for row, v in zip(rows, views):
            row += histogram(v, bounds)
    return rows, payload


def histogram(v: np.ndarray, bounds: Sequence[Bound]) -> list[float]:
    """The interval fractions and ``=0`` of flat view ``v`` as :func:`~probes.grad_probe.stats.stat_vector`
    takes them: ``x <= b`` compared in float64 (a bound as a float64 scalar: NumPy would otherwise
    round it to the view's dtype), each count differenced and divided by the elements once."""
    n = v.size
    edges = [0, *(int(np.count_nonzero(np.less_equal(v, np.float64(b)))) for b in bounds), n]
    return [(hi - lo) / n for lo, hi in zip(edges, edges[1:])] + [int(np.count_nonzero(v == 0)) / n]
