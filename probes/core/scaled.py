"""The scale-aware error: how far one result is from another, at the result's own scale.

msprobe's rules judge each element by its own magnitude (the ratio rule) or by a fixed absolute
cut (online_dispatch's MaxAbsErr <= 1). Both are wrong for the same reason: an output element
near zero is usually the difference of larger terms (P@V in attention, cos near its zeros, a
linear layer's output), so a kernel as accurate as its dtype allows is off by many of *that
element's* ulps, yet by less than one ulp of the output's scale. And a fixed absolute cut is
blind to any relative error whose absolute size stays small.

Here every element's error is divided by max(|reference|, row scale):

    e = max_i |a_i - b_i| / max(|b_i|, rms(b over the row), lam * rms(b over the tensor))

- Elements larger than their row's RMS are judged relatively, as the ratio rule does: a big value
  1 % off is 1 % off.
- Smaller elements are judged at the row's scale: cancellation that is real at that scale (a
  naive expm1 whose outputs are all tiny, an off-by-one reduction) still shows, rounding noise
  of a near-zero element does not.
- A row is the trailing dimensions, grown from the last one until it holds at least
  `MIN_ROW` elements (a token's features, an attention head's values, a matrix row). Rows,
  because in a batch one row's scale can be far below another's (per-token norms, per-sample
  gradients): a per-tensor scale alone would let a wrong small row pass.
- But a row that is zero in exact arithmetic (the gradient of the first query of causal
  attention, a masked token) is computed as the cancellation of tensor-scale terms: it holds
  rounding noise of a few, or a few dozen, ulps *of the tensor's scale*, which is no error of
  its own. So a row is never judged below `lam` times the tensor's RMS, where
  lam = min(1, ROW_FLOOR_ULPS * eps / T): the row scale under which ROW_FLOOR_ULPS ulps of the
  tensor's scale would already exceed the threshold T. With fp32's T = 2e-4 (1,678 ulps) rows
  down to 0.15 of the tensor's scale are judged at their own; with a half dtype's T of a few
  ulps lam is 1 and the tensor's scale is the floor.
- For outputs above one chunk the chunk's RMS stands in for the tensor's (one pass, bounded
  memory); a chunk always holds whole rows.

The result of a correctly rounded kernel is at most half an ulp (eps/2) by this measure, so
thresholds read naturally in ulps of the output dtype (probes/core/thresholds.py). Non-finite
elements are matched by identity (the same infinity, NaN against NaN) and counted otherwise,
never masked (msprobe's ratio rule counted NaN as agreeing, so a new NaN went unreported).

The measure's own parameters are defined here (MIN_ROW, ROW_FLOOR_ULPS, SMALLEST_SCALE): they
shape what is measured; the limits a figure is judged against are in thresholds.py.
"""

from __future__ import annotations

import math
from typing import Any

from probes.core import metrics
from probes.core import thresholds as th
from probes.core.metrics import CHUNK_ELEMENTS

MIN_ROW = 16
# ulps of the tensor's scale a structurally zero row may hold as rounding noise (measured: 19 in
# the fp32 query gradient of causal attention with 32-wide heads; grows with the reduction length)
ROW_FLOOR_ULPS = 256.0
# The smallest scale an output of each dtype is judged at: about the dtype's smallest normal
# number (float16's exactly; for the others a power of ten above it). Below it the dtype's
# spacing is absolute: fp16's subnormals below 6.1e-5 would otherwise score up to 1024 ulps.
# The FP8 formats: their smallest normal number, the fnuz variants' that of their "fn" sibling (the
# two share an epsilon, so the measure cannot tell them apart; the sibling's is the larger).
SMALLEST_SCALE = {"float16": 2.0**-14, "bfloat16": 1e-37, "float32": 1e-37, "float64": 1e-300,
                  "float8_e4m3fn": 2.0**-6, "float8_e5m2": 2.0**-14, "float8_e4m3fnuz": 2.0**-6,
                  "float8_e5m2fnuz": 2.0**-14, "float8_e8m0fnu": 2.0**-127}
# callers pass the output dtype's machine epsilon, which names the dtype (an fnuz format's is its
# "fn" sibling's)
_DTYPE_OF_EPS = {eps: name for name, eps in th.MACHINE_EPS.items() if not name.endswith("fnuz")}
# the figures per leaf: [max scaled error, nan mismatches, inf mismatches]
SCALED_COUNT = 3


def row_length(shape: tuple[int, ...], min_row: int = MIN_ROW) -> int:
    """Elements per row: trailing dimensions until at least `min_row` (or the whole tensor)."""
    n = 1
    for size in reversed(shape):
        if n >= min_row:
            break
        n *= size
    return max(n, 1)


def _row_chunks(xp: Any, a: Any, b: Any, row: int, chunk: int):
    flat_a = xp.reshape(a, (-1,))
    flat_b = xp.reshape(b, (-1,))
    n = flat_a.shape[0]
    rows_per_chunk = max(chunk // row, 1)
    step = rows_per_chunk * row
    for start in range(0, n, step):
        ca, cb = flat_a[start : start + step], flat_b[start : start + step]
        m = ca.shape[0] // row
        yield xp.reshape(ca, (m, row)), xp.reshape(cb, (m, row))


def _elementwise_error(xp: Any, a: Any, b: Any, tiny: float, chunk: int, finite: bool) -> Any:
    """scaled_error with every element at its own magnitude: max |a - b| / max(|b|, tiny), in a
    handful of operators (the row machinery would spend a dozen on rows of one element)."""
    parts = []
    for ca, cb in metrics.iter_chunks(xp, a, b, chunk):
        ca, cb, fin, fa, fb = _prepared(xp, ca, cb, finite)
        q = fa - fb if fa.dtype == fb.dtype else xp.astype(fa, fb.dtype) - fb
        q /= xp.maximum(xp.abs(fb), tiny)
        parts.append(_chunk_figures(xp, _max_abs(xp, q), ca, cb, fin))
    return _combine(xp, parts)


def _prepared(xp: Any, ca: Any, cb: Any, finite: bool) -> tuple[Any, Any, Any, Any, Any]:
    """(ca, cb, finite mask, a side, b side) of one chunk: as they are for the fast pass; for the
    robust one in float64 (squares cannot overflow) with non-finite pairs set to zero."""
    if finite:
        return ca, cb, None, ca, cb
    ca, cb = xp.astype(ca, xp.float64), xp.astype(cb, xp.float64)
    fin = xp.isfinite(ca) & xp.isfinite(cb)
    zero = xp.zeros_like(cb)
    return ca, cb, fin, xp.where(fin, ca, zero), xp.where(fin, cb, zero)


def _chunk_figures(xp: Any, err: Any, ca: Any, cb: Any, fin: Any) -> Any:
    """[err, nan mismatches, inf mismatches] of a chunk (the counts are 0 in the fast pass, fin None)."""
    if fin is None:
        none = err * 0.0
        return xp.stack([err, none, none])
    nan_a, nan_b = xp.isnan(ca), xp.isnan(cb)
    nan_mm = xp.sum(xp.astype(nan_a != nan_b, cb.dtype))
    inf_mm = xp.sum(xp.astype(~fin & ~(nan_a | nan_b) & (ca != cb), cb.dtype))
    return xp.stack([err, nan_mm, inf_mm])


def _combine(xp: Any, parts: list[Any]) -> Any:
    if len(parts) == 1:
        return parts[0]
    stacked = xp.stack(parts)
    return xp.stack([xp.max(stacked[:, 0]), xp.sum(stacked[:, 1]), xp.sum(stacked[:, 2])])


def row_floor(eps: float, threshold: float) -> float:
    """lam of the module docstring: the fraction of the tensor's scale below which a row is
    judged at the tensor's scale."""
    if threshold <= 0.0:
        return 1.0
    return min(1.0, ROW_FLOOR_ULPS * eps / threshold)


def scaled_error(xp: Any, a: Any, b: Any, eps: float, shape: tuple[int, ...] | None = None,
                 chunk: int | None = None, finite: bool = False, floor: float | None = None,
                 min_row: int = MIN_ROW, tensor_rms: float | None = None) -> Any:
    """Device array [max scaled error, nan mismatches, inf mismatches] of `a` against `b`.

    `b` has a float dtype of at least 32 bits (the error of a bf16 result must not be measured
    in bf16); `a` has b's dtype or a narrower float dtype, raised to b's chunk by chunk. `eps` is
    the *output* dtype's machine epsilon (the row floor's unit); `shape` the leaf's logical
    shape (rows follow it; default a's shape). `finite=True` skips the masks (most of the passes)
    for callers that retry without it when the error comes out non-finite, as it does whenever
    either side holds an inf or NaN; the two counts are then 0. `floor` is lam of the module
    docstring (default: `row_floor` with the scaled threshold of the dtype whose eps this is).
    `min_row=1, floor=0.0` judges every element at its own magnitude (down to the dtype's
    smallest normal): right for a pointwise API re-run on the very same input values, whose
    every element must be as accurate as the dtype allows. `tensor_rms`: the reference's RMS
    over the whole leaf when the caller knows it (then it replaces each chunk's, and
    `error_bound` is a true upper bound of the result).
    """
    shape = tuple(a.shape) if shape is None else tuple(shape)
    row = row_length(shape, min_row)
    chunk = CHUNK_ELEMENTS if chunk is None else chunk
    if floor is None:
        floor = row_floor(eps, scaled_threshold_for_eps(eps))
    # no row is judged below the output dtype's smallest normal number: under it the dtype's
    # spacing is absolute (fp16's subnormals below 6.1e-5 would otherwise score up to 1024 ulps)
    tiny = smallest_scale(eps)
    if row == 1 and floor == 0.0:
        return _elementwise_error(xp, a, b, tiny, chunk, finite)
    parts = []
    for ca, cb in _row_chunks(xp, a, b, row, chunk):
        # few chunk-sized temporaries alive at once, and few passes: this runs for every checked
        # output (free_benchmark) and every op output (online_dispatch)
        ca, cb, fin, fa, fb = _prepared(xp, ca, cb, finite)
        row_ms = xp.sum(fb * fb, axis=1) / row
        if tensor_rms is None:
            level = xp.maximum(xp.sqrt(xp.sum(row_ms) / row_ms.shape[0]) * floor, tiny)
        else:
            level = max(tensor_rms * floor, tiny)
        row_scale = xp.maximum(xp.sqrt(row_ms), level)
        denom = xp.maximum(xp.abs(fb), xp.reshape(row_scale, (-1, 1)))
        if fa.dtype != fb.dtype:
            q = xp.astype(fa, fb.dtype)  # a private buffer: never the caller's data
            q -= fb
        elif finite:
            q = fa - fb
        else:
            q = fa  # the where() above made it private
            q -= fb
        q /= denom
        err = _max_abs(xp, q)  # max |q| without another pass for abs
        if finite and tensor_rms is None:  # squares that overflowed make the scale inf: NaN sends the caller to the robust pass
            err = err + level * 0.0
        parts.append(_chunk_figures(xp, err, ca, cb, fin))
    return _combine(xp, parts)


def _max_abs(xp: Any, x: Any) -> Any:
    fast = getattr(xp, "max_abs", None)  # a namespace may do it in one pass
    return fast(x) if fast is not None else xp.maximum(xp.max(x), -xp.min(x))


def bound_figures(xp: Any, a: Any, b: Any) -> Any:
    """Device array [max |a - b|, RMS of b] over the whole leaves (any shape, same dtype): the
    two figures `error_bound` needs. A few operators, against the full measure's two dozen,
    which is what a call costs on small and medium outputs; NaN anywhere makes the first NaN."""
    d = a - b
    top = _max_abs(xp, xp.reshape(d, (-1,)))
    flat = xp.reshape(b, (-1,))
    fast = getattr(xp, "root_mean_square", None)
    rms = fast(flat) if fast is not None else xp.sqrt(xp.sum(flat * flat) / flat.shape[0])
    return xp.stack([top, rms])


def finish_bound(figures: list[float], eps: float, floor: float | None = None) -> float:
    """`error_bound` from the host copy of `bound_figures`; inf when it cannot bound (a NaN, or
    squares that overflowed)."""
    top, rms = figures[0], figures[1]
    if not (math.isfinite(top) and math.isfinite(rms)):
        return math.inf
    return error_bound(top, rms, eps, floor)


def smallest_scale(eps: float) -> float:
    """SMALLEST_SCALE of the dtype whose machine epsilon is `eps` (an epsilon of no known dtype
    counts as float64's when below 1e-10, else as float32's)."""
    name = _DTYPE_OF_EPS.get(eps) or ("float64" if eps < 1e-10 else "float32")
    return SMALLEST_SCALE[name]


def error_bound(max_abs_err: float, tensor_rms: float, eps: float, floor: float | None = None) -> float:
    """An upper bound of `scaled_error` from two figures a comparison has anyway (the largest
    absolute error and the reference's RMS): every element is divided by at least
    lam * RMS. A caller that finds the bound within its threshold can skip the full measure."""
    if floor is None:
        floor = row_floor(eps, scaled_threshold_for_eps(eps))
    scale = max(tensor_rms * floor, smallest_scale(eps))
    return max_abs_err / scale


def scaled_threshold_for_eps(eps: float) -> float:
    """The scaled rule's base threshold of the dtype whose machine epsilon is `eps`."""
    name = _DTYPE_OF_EPS.get(eps)
    return th.SCALED_THRESHOLD.get(name, th.SCALED_THRESHOLD_DEFAULT) if name else th.SCALED_THRESHOLD_DEFAULT


def finish(figures: list[float]) -> tuple[float, bool, bool]:
    """(error, nan mismatch, inf mismatch) from the host copy of `scaled_error`."""
    err, nan_mm, inf_mm = figures[0], figures[1] > 0, figures[2] > 0
    if math.isnan(err):
        err = math.inf
    return err, nan_mm, inf_mm
