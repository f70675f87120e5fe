"""A step's statistics and signs of gradients in host memory, taken by NumPy on that memory.

A CPU gradient needs no transfer, so what a step of small gradients costs there is the calls: a
torch kernel call costs several microseconds however small the tensor (a batch's extrema and
norms, their stack, a dtype cast and the signs cost ~110 us for a 6-parameter MLP), a NumPy call
about one. The gradients are put end to end once; then one ``reduceat`` each gives every
gradient's max, min and sum of squares (squared in float64 into a buffer kept from step to step:
a float32's square is exact there, and a fresh buffer would fault its pages in at every step) and
one comparison all the signs. The figures are the definitions of :mod:`probes.grad_probe.stats`;
a norm sums in another order than a device's kernels, so it may differ from theirs in its last
digit. This module imports no deep-learning framework.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np

from probes.backends import host_kernels
from probes.backends.host_arrays import ordered_sum
from probes.grad_probe.stats import Bound

__all__ = ["HOST_FIGURES_ELEMENTS", "SQUARE_PARTIALS", "Squares", "histogram", "host_figures", "one_pass_figures"]

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
    float32 or float64; small ones: a part of host_parts), and the step's payload: at L0 the views
    as one float32 array (their checksums), else their signs ``v > 0`` as one new bool array (the
    direction files, written after the optimizer has run). ``bounds`` (L2): the rows go on with
    the histogram's fractions and ``=0``.

    The views are put end to end once, so that each figure of every view is one call
    (``reduceat``): a few calls a step however many parameters."""
    starts = []
    total = 0
    for v in views:
        starts.append(total)
        total += v.size
    flat = np.concatenate(views) if len(views) > 1 else views[0]
    with np.errstate(all="ignore"):  # NaN and infinities are figures like any other
        top = np.maximum.reduceat(flat, starts).tolist()
        bottom = np.minimum.reduceat(flat, starts).tolist()
        sq = np.square(flat, out=squares.take(total), dtype=np.float64)
        norms = np.sqrt(np.add.reduceat(sq, starts)).tolist()
        # L0: float64 beyond float32's range is infinite, as torch's cast makes it
        payload = flat.astype(np.float32) if l0 else np.greater(flat, 0)
    rows = [list(row) for row in zip(top, bottom, norms)]
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


#: the partial sums of one_pass_figures' sum of squares (host_kernels.c's GP)
SQUARE_PARTIALS = 8
_ONE_PASS_DTYPES = (np.dtype(np.float32), np.dtype(np.float64))


def one_pass_figures(views: Sequence[np.ndarray]) -> tuple[list[list[float]], np.ndarray]:
    """The L1 rows ([max, min, norm]) of flat, non-empty float32 / float64 views and their signs
    ``v > 0`` as one new bool array, each view read once by host_kernels' grad figures: a pass per
    figure (torch's extrema and norm, NumPy's signs) costs more than one that takes them all. The
    norm's squares (float64) are summed in SQUARE_PARTIALS partial sums, element i into partial
    i % 8 in index order, combined as ((p0 + p1) + (p2 + p3)) + ((p4 + p5) + (p6 + p7)). Without
    the kernels NumPy gives the same order (`_figures_in_order`), so a machine with a compiler and
    one without print the same figures."""
    signs = np.empty(sum(v.size for v in views), dtype=bool)
    if host_kernels.kernels() is None or not all(v.dtype in _ONE_PASS_DTYPES and v.flags.c_contiguous for v in views):
        return _figures_in_order(views, signs), signs
    rows = []
    pos = 0
    for v in views:
        figures = host_kernels.grad_figures(v.itemsize, v.ctypes.data, v.size, signs.ctypes.data + pos)
        rows.append([figures[0], figures[1], math.sqrt(figures[2])])
        pos += v.size
    return rows, signs


def _figures_in_order(views: Sequence[np.ndarray], signs: np.ndarray) -> list[list[float]]:
    """one_pass_figures' rows by NumPy, writing the signs: the squares laid out eight to a row,
    each view from a row of its own, each view's rows summed by host_arrays.ordered_sum."""
    starts, rows_at = [], [0]
    total = 0
    for v in views:
        starts.append(total)
        total += v.size
        rows_at.append(rows_at[-1] + -(-v.size // SQUARE_PARTIALS))
    flat = np.concatenate(views) if len(views) > 1 else views[0].reshape(-1)
    squares = np.zeros((rows_at[-1], SQUARE_PARTIALS))
    cells = squares.reshape(-1)
    with np.errstate(all="ignore"):  # NaN and infinities are figures like any other
        np.greater(flat, 0, out=signs)
        top = np.maximum.reduceat(flat, starts).tolist()
        bottom = np.minimum.reduceat(flat, starts).tolist()
        for v, at in zip(views, rows_at):
            np.square(v.reshape(-1), out=cells[at * SQUARE_PARTIALS : at * SQUARE_PARTIALS + v.size], dtype=np.float64)
        out = []
        for i in range(len(views)):
            out.append([top[i], bottom[i], math.sqrt(ordered_sum(squares[rows_at[i] : rows_at[i + 1]]))])
    return out
