"""Per-gradient statistics of grad_probe, written once over an array namespace.

The caller hands in ``xp`` (array-API style: array-api-compat's torch or numpy namespace), so on
torch the arithmetic runs on the gradient's own device. :func:`stat_vector` returns ONE small
float64 device vector per gradient; a caller stacks the vectors of every parameter of a step and
pays one host transfer for the whole step (:func:`split_stats` turns a host row back into
figures). Only the "MD5" column (L0) needs the gradient's bytes on the host (:func:`crc32_hex`).

Definitions are msprobe 8.3.3's, with its precision and empty-gradient defects fixed:

* max / min / norm (Frobenius) and the histogram are computed in float64; the reference
  computes them in the gradient's dtype and rounds to float32 (its norm of ``[[0.5, -0.25],
  [0.0, 2.0]]`` is 2.076655864715576, ours is sqrt(4.3125) = 2.0766559657295187; max and min of
  float32/float16/bfloat16 gradients are exact in both). The norm is sqrt(sum x**2) in float64
  (no rescaling: overflows only beyond ~1e154, i.e. never for float32-or-narrower gradients).
* interval fractions for ``bounds = [b0 … b(n-1)]``: ``(-inf, b0]``, ``(b(i-1), b(i)]``,
  ``(b(n-1), inf)``, bucketed in float64 with the bounds as given (the reference casts the bounds
  to float32); ``-inf`` falls in the first interval, ``+inf`` and NaN in the last, as in the
  reference. Each fraction is count / numel. ``=0`` is the fraction of elements equal to 0 (also
  counted in the interval holding 0).
* an empty gradient (numel 0) gives NaN max/min/norm and 0.0 fractions instead of raising (the
  reference raised inside the optimizer hook).

Vector layout: ``[max, min, norm, frac_0 … frac_n, eq0]`` (fractions and eq0 only when
``histogram`` is true, i.e. at L2). This module imports no deep-learning framework.
"""

from __future__ import annotations

import math
import zlib
from collections.abc import Sequence
from typing import Any, NamedTuple

from probes.core.fp8 import range_use_figures
from probes.core.thresholds import LARGEST_FINITE

#: Gradients larger than this are reduced chunk by chunk, so the float64 temporaries never cost
#: more than 32 MiB whatever the parameter size.
CHUNK_ELEMENTS = 1 << 22

Bound = float | int


class GradStats(NamedTuple):
    """The statistics of one parameter's gradient at one step: one row of grad_summary_{N}.csv
    (a named tuple: a monitor makes one per parameter and step)."""

    name: str
    shape: tuple[int, ...]
    max: float
    min: float
    norm: float
    fractions: tuple[float, ...] = ()  # one per interval (L2 only)
    zero_fraction: float | None = None  # "=0" (L2 only)
    md5: str | None = None  # CRC-32 of float32 bytes (L0 only; see crc32_hex)
    # FP8_HEALTH_FIGURES per format of grad_probe.fp8_health; None = not measured (empty cells)
    fp8: tuple[float, ...] | None = ()


def vector_length(bounds: Sequence[Bound], histogram: bool) -> int:
    """Length of the vector :func:`stat_vector` returns."""
    return 3 + (len(bounds) + 2 if histogram else 0)


def stat_vector(
    xp: Any, g: Any, bounds: Sequence[Bound], histogram: bool, dtype: Any = None, device: Any = None
) -> Any:
    """Device vector ``[max, min, norm, fractions…, eq0]`` of gradient ``g`` (any shape).

    ``dtype`` is the compute dtype (default ``xp.float64``; a caller may pass float32 on a device
    without float64). ``device`` is where the result lives (default: ``g``'s device).
    """
    dtype = xp.float64 if dtype is None else dtype
    n = math.prod(g.shape)
    if device is None:
        device = _device(xp, g)
    if n == 0:
        figures = [math.nan, math.nan, math.nan] + ([0.0] * (len(bounds) + 2) if histogram else [])
        return xp.asarray(figures, dtype=dtype, device=device)
    flat = xp.reshape(g, (-1,))
    parts = []
    for start in range(0, n, CHUNK_ELEMENTS):
        chunk = xp.astype(flat[start : start + CHUNK_ELEMENTS], dtype)
        figures = [xp.max(chunk), xp.min(chunk), xp.sum(chunk * chunk)]
        if histogram:
            # cumulative counts of x <= b(i): NaN is never <= b, so it lands in the last interval
            figures += [xp.astype(xp.count_nonzero(chunk <= b), dtype) for b in bounds]
            figures.append(xp.astype(xp.count_nonzero(chunk == 0), dtype))
        parts.append(xp.stack(figures))
    acc = parts[0] if len(parts) == 1 else _combine(xp, parts)
    out = [acc[0], acc[1], xp.sqrt(acc[2])]
    if histogram:
        cumulative = acc[3 : 3 + len(bounds)]
        total = xp.asarray([float(n)], dtype=dtype, device=device)
        # counts are integers below 2**53, so the differences are exact; each fraction is then
        # one correctly rounded division, equal to Python's count / numel
        edges = xp.concat([xp.zeros((1,), dtype=dtype, device=device), cumulative, total])
        out += [edges[1:] - edges[:-1], acc[3 + len(bounds) :]]
        head = xp.stack(out[:3])
        return xp.concat([head, xp.concat(out[3:]) / float(n)])
    return xp.stack(out)


def stat_columns(xp: Any, grads: Sequence[Any], bounds: Sequence[Bound], histogram: bool, dtype: Any = None,
                 batched: Any = None) -> Any:
    """The :func:`stat_vector` figures of several non-empty gradients of one device and dtype, as
    one ``(width, len(grads))`` matrix: a column per gradient.

    ``batched`` (optional) offers ``extrema`` (the max and min rows) and ``norms`` of a list of
    arrays in one call each (torch's ``_foreach`` kernels, probes/backends/torch_xp.py): a step of
    a small model then costs a few kernel launches instead of several per parameter. Its norm sums
    in another order than :func:`stat_vector`, so a norm may differ in its last digit; the same
    gradients always give the same figures. Histograms (L2) are taken gradient by gradient.
    """
    dtype = xp.float64 if dtype is None else dtype
    if batched is None or histogram:
        return xp.stack([stat_vector(xp, g, bounds, histogram, dtype=dtype) for g in grads], axis=1)
    return xp.concat([batched.extrema(grads, dtype), xp.reshape(batched.norms(grads, dtype), (1, -1))])


#: the figures of each FP8 format of ``fp8_health``, in column order (one CSV column each)
FP8_HEALTH_FIGURES = ("underflow", "saturated")
#: the smallest amax a scale is taken from (torchao's clamp): an all-zero gradient has a finite scale
AMAX_FLOOR = 1e-12


def fp8_amax(xp: Any, g: Any, dtype: Any, chunked: bool = True) -> Any:
    """Device 0-d: the largest finite ``|g|`` (0 when there is none), the amax of the FP8 columns.

    Finite only, unlike torchao's amax: an infinity there makes the scale 0 and flushes the whole
    tensor, which would hide what the cast does to the rest; the infinities saturate instead.
    ``chunked=False``: one pass over the whole tensor, for code compiled into a graph (MindSpore's),
    where the float copy exists anyway and every slice is one more node to compile."""
    best = None
    n, flat = math.prod(g.shape), xp.reshape(g, (-1,))
    for start, stop in _spans(n, chunked):
        a = xp.abs(_piece(xp, flat, start, stop, n, dtype))
        m = xp.max(xp.where(xp.isfinite(a), a, xp.zeros_like(a)))
        best = m if best is None else xp.maximum(best, m)
    return xp.asarray(0.0, dtype=dtype, device=_device(xp, g)) if best is None else best


def fp8_counts(xp: Any, g: Any, amax: Any, formats: Sequence[str], dtype: Any, chunked: bool = True) -> Any:
    """Device vector of counts, ``FP8_HEALTH_FIGURES`` per format, of ``g`` scaled as torchao's
    tensorwise recipe scales it: ``scale = largest value / max(amax, AMAX_FLOOR)`` (probes.core.fp8
    counts each scaled value). ``amax`` is :func:`fp8_amax` (of the full tensor, for a slice);
    ``chunked`` as there."""
    floor = xp.maximum(amax, xp.full_like(amax, AMAX_FLOOR))
    scales = [LARGEST_FINITE[f] / floor for f in formats]
    parts = []
    n, flat = math.prod(g.shape), xp.reshape(g, (-1,))
    for start, stop in _spans(n, chunked):
        chunk = _piece(xp, flat, start, stop, n, dtype)
        figures = []
        for f, scale in zip(formats, scales):
            use = range_use_figures(xp, chunk * scale, f)  # [saturated, underflowed, flushed, elements]
            figures += [use[1], use[0]]
        parts.append(xp.stack(figures))
    if not parts:
        return xp.zeros((len(FP8_HEALTH_FIGURES) * len(formats),), dtype=dtype, device=_device(xp, g))
    return parts[0] if len(parts) == 1 else xp.sum(xp.stack(parts), axis=0)


def fp8_columns(xp: Any, grads: Sequence[Any], formats: Sequence[str], dtype: Any, chunked: bool = True) -> Any:
    """The FP8 health fractions of whole gradients, ``(len(FP8_HEALTH_FIGURES) * len(formats),
    len(grads))``: a column per gradient, to stack under its :func:`stat_columns` (an empty
    gradient gives 0.0, as its histogram fractions). ``chunked`` as for :func:`fp8_amax`."""
    cols = []
    for g in grads:
        counts = fp8_counts(xp, g, fp8_amax(xp, g, dtype, chunked), formats, dtype, chunked)
        cols.append(counts / float(max(math.prod(g.shape), 1)))
    return xp.stack(cols, axis=1)


def _spans(n: int, chunked: bool) -> list[tuple[int, int]]:
    """[start, stop) of each CHUNK_ELEMENTS piece of ``n`` elements (one piece when not chunked),
    so a caller holds one float piece at a time."""
    step = CHUNK_ELEMENTS if chunked else max(n, 1)
    return [(start, min(start + step, n)) for start in range(0, n, step)]


def _piece(xp: Any, flat: Any, start: int, stop: int, n: int, dtype: Any) -> Any:
    return xp.astype(flat if (start, stop) == (0, n) else flat[start:stop], dtype)


#: rows of the summed figures of sharded gradients before the histogram's counts: sum of
#: squares, elements, ranks that had the gradient, ranks whose figures failed
SHARD_SUM_ROWS = 4


class SliceShare(NamedTuple):
    """What one rank adds to one sharded gradient's figures: its slice when it counts (None for a
    copy another rank counts, no gradient or a failure), and the two flags."""

    values: Any
    had: bool
    failed: bool = False


def shard_figures(xp: Any, shares: Sequence[SliceShare], bounds: Sequence[Bound], histogram: bool, dtype: Any,
                  device: Any, batched: Any = None) -> tuple[Any, Any]:
    """This rank's figures of several sharded gradients that combine across ranks, a column per
    gradient: ``(sums, extremes)``, to be all-reduced by sum (``SHARD_SUM_ROWS`` rows, then at L2
    the counts of ``x <= b`` and of ``x == 0``) and by max (max, -min).

    A share without values gives the neutral column, so every rank takes part in the same
    collectives whatever its slices gave. ``batched`` as for :func:`stat_columns`: the extrema and
    norms of the slices of each dtype in one call each.
    """
    n = len(shares)
    host = [[0.0] * n for _ in range(SHARD_SUM_ROWS)]
    live: dict[Any, list[int]] = {}  # dtype -> indices of the shares with values
    for i, share in enumerate(shares):
        host[2][i] = 1.0 if share.had else 0.0
        host[3][i] = 1.0 if share.failed else 0.0
        if share.values is not None and math.prod(share.values.shape):
            host[1][i] = float(math.prod(share.values.shape))
            live.setdefault(share.values.dtype, []).append(i)
    order = [i for group in live.values() for i in group]
    width = SHARD_SUM_ROWS + (len(bounds) + 1 if histogram else 0)
    sums, extremes = [], []
    for group in live.values():
        gs = [shares[i].values for i in group]
        flats = None if batched is not None and not histogram else [
            xp.astype(xp.reshape(g, (-1,)), dtype) for g in gs]
        if batched is not None:
            ext = batched.extrema(gs, dtype)
            sq = batched.norms(gs, dtype)
            sq = sq * sq
        else:
            ext = xp.stack([xp.stack([xp.max(f), xp.min(f)]) for f in flats], axis=1)
            sq = xp.stack([xp.sum(f * f) for f in flats])
        extremes.append(xp.stack([ext[0], -ext[1]]))
        rows = [xp.reshape(sq, (1, -1))]
        if histogram:  # the float copies above, taken once
            counts = [xp.stack([xp.astype(xp.count_nonzero(f <= b), dtype) for b in bounds]
                               + [xp.astype(xp.count_nonzero(f == 0), dtype)]) for f in flats]
            rows.append(xp.stack(counts, axis=1))
        sums.append(xp.concat(rows))
    dead = n - len(order)
    if dead:
        sums.append(xp.zeros((1 + width - SHARD_SUM_ROWS, dead), dtype=dtype, device=device))
        extremes.append(xp.full((2, dead), -math.inf, dtype=dtype, device=device))
    position = [0] * n  # the column of share i in the concatenated (live first, then dead) figures
    taken = set(order)
    for k, i in enumerate(order + [i for i in range(n) if i not in taken]):
        position[i] = k
    index = xp.asarray(position, device=device)
    measured = xp.take(xp.concat(sums, axis=1), index, axis=1)
    flags = xp.asarray(host[1:], dtype=dtype, device=device)
    summed = xp.concat([measured[:1], flags, measured[1:]])
    return summed, xp.take(xp.concat(extremes, axis=1), index, axis=1)


def combine_shards(xp: Any, sums: Any, extremes: Any, bounds: Sequence[Bound], histogram: bool) -> Any:
    """The :func:`stat_vector` columns, ``(width, n)``, of ``n`` sharded gradients from their
    reduced :func:`shard_figures` (``sums`` ``(SHARD_SUM_ROWS + …, n)``, ``extremes`` ``(2, n)``): the same
    max, min, fractions and ``=0`` as the full gradient's, and its norm up to the summation order.
    A NaN anywhere makes max, min and norm NaN, as on the full tensor."""
    total = sums[1]
    has_nan = xp.isnan(sums[0])  # a sum of squares is NaN exactly when some element is NaN
    empty = total == 0
    nan_row = xp.full(total.shape, math.nan, dtype=sums.dtype, device=sums.device)
    bad = has_nan | empty
    rows = [xp.where(bad, nan_row, extremes[0]), xp.where(bad, nan_row, -extremes[1]),
            xp.where(empty, nan_row, xp.sqrt(sums[0]))]
    if histogram:
        k = len(bounds)
        cumulative = sums[SHARD_SUM_ROWS : SHARD_SUM_ROWS + k]
        edges = xp.concat([xp.zeros((1,) + tuple(total.shape), dtype=sums.dtype, device=sums.device), cumulative,
                           xp.reshape(total, (1, -1))])
        safe = xp.where(empty, xp.ones(total.shape, dtype=sums.dtype, device=sums.device), total)
        counts = xp.concat([edges[1:] - edges[:-1], sums[SHARD_SUM_ROWS + k :]])
        fractions = xp.where(empty, xp.zeros(counts.shape, dtype=sums.dtype, device=sums.device), counts / safe)
        return xp.concat([xp.stack(rows), fractions])
    return xp.stack(rows)


def _combine(xp: Any, parts: list[Any]) -> Any:
    stacked = xp.stack(parts)
    return xp.concat(
        [
            xp.reshape(xp.max(stacked[:, 0]), (1,)),
            xp.reshape(xp.min(stacked[:, 1]), (1,)),
            xp.sum(stacked[:, 2:], axis=0),
        ]
    )


def _device(xp: Any, g: Any) -> Any:
    try:
        return g.device
    except AttributeError:  # numpy < 2 arrays have no .device
        return None


def split_stats(
    name: str,
    shape: Sequence[int],
    row: Sequence[float],
    bounds: Sequence[Bound],
    histogram: bool,
    md5: str | None = None,
    fp8_width: int = 0,
) -> GradStats:
    """A :class:`GradStats` record from a host copy of one :func:`stat_vector`, followed by
    ``fp8_width`` FP8 health fractions (:func:`fp8_columns`)."""
    if not histogram and not fp8_width:  # L0 and L1 by default: a record per parameter and step
        return GradStats(name, tuple(map(int, shape)), float(row[0]), float(row[1]), float(row[2]), md5=md5)
    row = [float(v) for v in row]
    width = vector_length(bounds, histogram)
    fp8 = tuple(row[width : width + fp8_width])
    fractions: tuple[float, ...] = ()
    zero: float | None = None
    if histogram:
        fractions = tuple(row[3 : 3 + len(bounds) + 1])
        zero = row[3 + len(bounds) + 1]
    return GradStats(
        name=name,
        shape=tuple(int(s) for s in shape),
        max=row[0],
        min=row[1],
        norm=row[2],
        fractions=fractions,
        zero_fraction=zero,
        md5=md5,
        fp8=fp8,
    )


def crc32_hex(values: Any) -> str:
    """The reference's "MD5" column: CRC-32 of the float32 little-endian C-order bytes, 8 hex digits.

    It is not an MD5 (the misleading column name is kept for file compatibility); float64 gradients are
    rounded to float32 first, as in the reference, so distinct float64 gradients can share a value.
    ``values`` is anything numpy can turn into an array (a host copy of the gradient).
    """
    import numpy as np  # host-side only; numpy is a dependency of every supported framework

    arr = np.ascontiguousarray(np.asarray(values), dtype="<f4")
    return f"{zlib.crc32(memoryview(arr).cast('B')) & 0xFFFFFFFF:08x}"
