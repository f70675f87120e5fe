"""online_dispatch's per-leaf figures: what the documented rule and the scaled rule read, measured.

They run over an array namespace `xp` on whatever device the caller put both leaves on
(online_dispatch puts them on the reference's side), chunk by chunk so that every temporary
stays cache-sized, and return *device* figures that the caller gathers with one host transfer
per op: this runs for every output of every op of the user's model, so each pass and each device
call counts. The verdict over the host copy (probes.core.dispatch_metrics) is plain Python and
apart, so that the measuring can be tuned without touching the rule.
"""

from __future__ import annotations

import math
from typing import Any

from probes.core import metrics, scaled
from probes.core.thresholds import MACHINE_EPS

# norms at or below this count as all-zero data; |ref| = 0 counts as this in MaxRelativeErr
FLOAT64_EPS = MACHINE_EPS["float64"]

# Leaves are measured in chunks of this many elements: a chunk's reference and difference (1 MiB
# each in float64) stay in cache through the chunk's passes, the per-chunk Python overhead (~8 array
# calls) stays small next to the arithmetic, and each call is above the CPU's parallel grain
# (32768 elements), so the comparison uses the same intra-op threads as the model (measured on 2
# threads: 2.6 ms per 1M-element leaf, against 7.3 ms with chunks of 32768).
CHUNK_ELEMENTS = 1 << 17

# Layout of the figure vector of one leaf pair (device array, float64).
# MaxRelativeErr, max/min/mean of each side (the noise floor's scale) are not here: they are
# measured only for leaves that fail the literal rule (`max_relative_error`, `input_stats`).
DOT, DEV_SQ, REF_SQ, MAX_ABS, NONFINITE_MISMATCH, FINITE_COUNT = range(6)
FIGURE_COUNT = 6
# The scaled rule's figure (`scaled_figure`) follows them in the vector a caller gathers per leaf:
# max |dev - ref| / max(|ref|, row scale), relative (0 for integer / bool leaves).
SCALED = FIGURE_COUNT
LEAF_FIGURE_COUNT = FIGURE_COUNT + 1
NOT_MEASURED = -1.0  # the scaled figure's value when the caller skipped it (rule="reference")
# Layout of the statistics vector of one leaf (the CSV's max/min/mean): max, min, sum, finite count.
STAT_COUNT = 4
# Layout of the single-benchmark vector (the figures msprobe 8.3.3 actually computed).
SB_ABS, SB_REL, SB_EB, SB_MISMATCH = range(4)
SB_COUNT = 4


def _f64(xp: Any, a: Any) -> Any:
    return a if a.dtype == xp.float64 else xp.astype(a, xp.float64)


def _finite_chunk(xp: Any, dev: Any, ref: Any) -> Any:
    """Figures of one chunk, assuming every element is finite (a non-finite element makes some
    figure non-finite, which sends the leaf to `_masked_figures`). `ref` is float64; `dev` may be
    any float dtype. The difference is made in a fresh float64 buffer and subtracted in place
    (one write, faster than a mixed-dtype subtraction), and the dot products come from ref and
    diff (dev.ref = rr + rd, dev.dev = rr + 2 rd + dd, exact up to float64 rounding). Every pass
    over the chunk counts, since this runs for every output of every op of the user's model:
    one conversion, one subtraction, three dot products and two reductions (max and min need no
    temporary, unlike abs)."""
    diff = xp.astype(dev, xp.float64)  # copy=True: never a view of the user's tensor
    diff -= ref
    rr, rd, dd = ref @ ref, ref @ diff, diff @ diff
    top = xp.maximum(xp.max(diff), -xp.min(diff))
    zero = top * 0.0
    return xp.stack([rr + rd, rr + 2.0 * rd + dd, rr, top, zero, zero + float(dev.shape[0])])


def _combine(xp: Any, parts: list[Any]) -> Any:
    if len(parts) == 1:
        return parts[0]
    s = xp.stack(parts)
    total = xp.sum(s, axis=0)
    top = xp.max(s, axis=0)
    return xp.stack([
        total[DOT], total[DEV_SQ], total[REF_SQ], top[MAX_ABS], total[NONFINITE_MISMATCH], total[FINITE_COUNT],
    ])


def _masked_figures(xp: Any, dev: Any, ref: Any) -> Any:
    """Figures over the pairs that are finite on both sides; non-finite elements count as a
    mismatch unless both sides hold the same value (the same infinity, or NaN and NaN)."""
    fin = xp.isfinite(dev) & xp.isfinite(ref)
    zero = xp.zeros_like(dev)
    figs = _finite_chunk(xp, xp.where(fin, dev, zero), xp.where(fin, ref, zero))
    both_nan = xp.isnan(dev) & xp.isnan(ref)
    mismatch = xp.sum(xp.astype(~fin & ~both_nan & (dev != ref), xp.float64))
    return xp.stack([
        figs[DOT], figs[DEV_SQ], figs[REF_SQ], figs[MAX_ABS], mismatch, xp.sum(xp.astype(fin, xp.float64)),
    ])


def leaf_figures(xp: Any, dev: Any, ref: Any) -> Any:
    """Device float64 array of FIGURE_COUNT figures for a flat device leaf and its reference.

    Both must already be on one device with equal numel (> 0); any real dtype.
    """
    if dev.dtype == xp.bool:
        dev = xp.astype(dev, xp.float64)
    parts = [_finite_chunk(xp, cd, _f64(xp, cr)) for cd, cr in metrics.iter_chunks(xp, dev, ref, CHUNK_ELEMENTS)]
    return _combine(xp, parts)


# A leaf of one chunk sends its raw reductions [ref.ref, ref.diff, diff.diff, max diff, min diff]
# and the host finishes the figures (`figures_from_parts`): the same float64 arithmetic as
# `_finite_chunk`'s, done in Python instead of by six more 0-d device ops per leaf.
RAW_COUNT = 5


def part_count(numel: int) -> int:
    """How many values `leaf_figure_parts` returns for a leaf of `numel` elements."""
    return RAW_COUNT if numel <= CHUNK_ELEMENTS else FIGURE_COUNT


def leaf_figure_parts(xp: Any, dev: Any, ref: Any) -> list[Any]:
    """0-d device arrays from which `figures_from_parts` makes a flat leaf's FIGURE_COUNT figures
    on the host. A caller stacks the parts of every leaf of an op and transfers them at once:
    online_dispatch runs this for every output of every op, so each device call counts."""
    if dev.dtype == xp.bool:
        dev = xp.astype(dev, xp.float64)
    if dev.shape[0] > CHUNK_ELEMENTS:
        figs = leaf_figures(xp, dev, ref)
        return [figs[i] for i in range(FIGURE_COUNT)]
    diff = xp.astype(dev, xp.float64)  # copy=True: never a view of the user's tensor
    ref = _f64(xp, ref)
    diff -= ref
    return [ref @ ref, ref @ diff, diff @ diff, xp.max(diff), xp.min(diff)]


def figures_from_parts(parts: list[float], numel: int) -> list[float]:
    """The FIGURE_COUNT figures of a leaf from the host copy of its `leaf_figure_parts`, equal to
    `leaf_figures`' bit for bit (same operations in the same order; max propagates NaN as the
    device maximum does)."""
    if numel > CHUNK_ELEMENTS:
        return list(parts)
    return figures_of_sums(parts, numel)


def figures_of_sums(parts: list[float], numel: int) -> list[float]:
    """The FIGURE_COUNT figures of a leaf from its [r.r, r.d, d.d, max d, min d] (d = dev - ref in
    float64), whatever order the sums were taken in; a non-finite one sends the leaf to the masked
    pass."""
    rr, rd, dd, top, low = parts
    neg = -low
    if math.isnan(neg) or (neg > top and not math.isnan(top)):
        top = neg
    zero = top * 0.0
    return [rr + rd, rr + 2.0 * rd + dd, rr, top, zero, zero + float(numel)]


def masked_leaf_figures(xp: Any, dev: Any, ref: Any) -> Any:
    """`leaf_figures` for leaves holding inf/NaN (the caller retries with this when a figure of
    the fast path came out non-finite)."""
    return _masked_figures(xp, _f64(xp, xp.reshape(dev, (-1,))), _f64(xp, xp.reshape(ref, (-1,))))


def reference_rms(figures: list[float]) -> float:
    """The reference's RMS over the leaf's finite elements, from its FIGURE_COUNT figures."""
    count = figures[FINITE_COUNT]
    return math.sqrt(max(figures[REF_SQ], 0.0) / count) if count > 0 else 0.0


def scaled_bound(figures: list[float], eps: float) -> float:
    """An upper bound of the leaf's scaled error from its documented-rule figures (MaxAbsErr over
    the floor scale: scaled.error_bound); inf when a figure is not finite."""
    if not all(math.isfinite(v) for v in figures):
        return math.inf
    return scaled.error_bound(max_abs_err(figures), reference_rms(figures), eps)


def scaled_figure(xp: Any, dev: Any, ref: Any, eps: float | None, masked: bool = False,
                  tensor_rms: float | None = None) -> Any:
    """1-element device float64 array: the scaled error of a device leaf against its reference
    (`scaled.scaled_error`, rows by the leaf's shape), `eps` the device dtype's machine epsilon,
    None for integer / bool leaves (0: they are compared exactly). `dev` may be narrower than `ref` (raised chunk by chunk). The fast path assumes
    finite values: an inf or NaN makes the figure non-finite and the caller retries with
    `masked=True`, as for `leaf_figures`."""
    if eps is None:
        return xp.full((1,), 0.0, dtype=xp.float64)
    err = scaled.scaled_error(xp, dev, ref, eps, tuple(dev.shape), finite=not masked, tensor_rms=tensor_rms)[0]
    return xp.reshape(_f64(xp, err), (1,))


def needs_masked_pass(figures: list[float]) -> bool:
    return not all(math.isfinite(v) for v in figures)


def max_relative_error(xp: Any, dev: Any, ref: Any) -> Any:
    """0-d device array: MaxRelativeErr = max |dev - ref| / |ref| over pairs finite on both sides,
    |ref| = 0 counted as float64 eps (as documented)."""
    dev, ref = _f64(xp, dev), _f64(xp, ref)
    fin = xp.isfinite(dev) & xp.isfinite(ref)
    zero = xp.zeros_like(ref)
    rel = xp.abs(xp.where(fin, dev - ref, zero)) / xp.clip(xp.abs(xp.where(fin, ref, zero)), min=FLOAT64_EPS)
    return xp.max(rel)


def single_benchmark_figures(xp: Any, dev: Any, ref: Any, small_value: float) -> Any:
    """Device array [small-value abs err, large-value rel err, error balance, non-finite
    mismatches] (msprobe 8.3.3's single-benchmark figures) for a flat leaf pair, by `metrics.single_benchmark_reductions` (one
    definition, shared with free_benchmark's to_cpu). Computed for failing leaves only (and for
    every leaf with debug=True), so the pass every op pays stays lean."""
    return metrics.single_benchmark_reductions(xp, _f64(xp, dev), _f64(xp, ref), small_value)


def input_stats(xp: Any, t: Any) -> Any:
    """Device float64 array [max, min, sum, finite count] of one leaf (fast path: all finite):
    the CSV's max/min/mean columns and the inputs' magnitude for the noise floor."""
    flat = _f64(xp, xp.reshape(t, (-1,)))
    return xp.stack([xp.max(flat), xp.min(flat), xp.sum(flat), xp.full_like(flat[:1], float(flat.shape[0]))[0]])


def masked_input_stats(xp: Any, t: Any) -> Any:
    flat = _f64(xp, xp.reshape(t, (-1,)))
    fin = xp.isfinite(flat)
    return xp.stack([
        xp.max(xp.where(fin, flat, xp.full_like(flat, -math.inf))),
        xp.min(xp.where(fin, flat, xp.full_like(flat, math.inf))),
        xp.sum(xp.where(fin, flat, xp.zeros_like(flat))),
        xp.sum(xp.astype(fin, xp.float64)),
    ])


def max_abs_err(figures: list[float]) -> float:
    return figures[MAX_ABS] if figures[FINITE_COUNT] > 0 else 0.0


def finite_abs_max(stats_max: float, stats_min: float) -> float:
    """Largest magnitude from a max/min pair, 0 where the leaf had no finite value."""
    vals = [abs(v) for v in (stats_max, stats_min) if math.isfinite(v)]
    return max(vals) if vals else 0.0

