"""How free_benchmark judges the range an FP8 call's inputs used, beside its output's error.

The output comparison of an FP8 matmul (improve_precision: the float64 product of its own
dequantised inputs) sees the kernel, never the scale: a stale amax that clips most of a tensor to
448, or a scale so small that most of it is flushed to zero, leaves a product the kernel computed
exactly right from wrong operands. So each FP8 input adds a verdict of its own, on the range use
the backend measured at its cast (probes/core/fp8.py): flagged when more than
`SATURATED_LIMIT` of its elements saturated, or more than `UNDERFLOWED_LIMIT` underflowed (kept
as subnormals or flushed), with the reason named in the row (`max_rel` "fp8_saturated" /
"fp8_underflowed", `detail.reason`).

The limits: with a current amax nothing saturates (the amax lands on the largest value, within
rounding), so any saturation is a scale out of date; 1 % leaves room for delayed scaling's small
drift. Underflow of a correctly scaled Gaussian tensor is about 1e-4 in e4m3 (docs/fp8.md); a
limit of one half says "most of it", the failure a tiny scale causes, and stays clear of a
tensor with a long tail of small values. True zeros (ReLU's) are neither.

The figures are device arrays fed through the comparison's own host transfer (the comparison is
wrapped, not run apart), so an FP8 call costs no transfer of its own.
"""

from __future__ import annotations

import math
from typing import Any

from probes.core import fp8
from probes.core.leaf_verdicts import Comparison, LeafVerdict

SATURATED_LIMIT = 0.01
UNDERFLOWED_LIMIT = 0.5


def with_range_use(check: Comparison, inputs: list[Any]) -> Comparison:
    """`check` with one verdict per FP8 input appended: its figures ride along with the first
    pass's."""
    try:
        request: list[Any] | None = next(check)
    except StopIteration as done:  # a comparison settled without figures
        request, verdicts = None, list(done.value)
    first = [] if request is None else list(request)
    host = yield first + [i.figures for i in inputs]
    mine = host[len(first):]
    if request is not None:
        try:
            request = check.send(host[:len(first)])
            while True:
                request = check.send((yield request))
        except StopIteration as done:
            verdicts = list(done.value)
    ranges = [range_verdict(i, h) for i, h in zip(inputs, mine)]
    return verdicts + ranges


def range_verdict(inp: Any, h: list[float]) -> LeafVerdict:
    use = fp8.RangeUse.of(h)
    err_sq, ref_sq = h[fp8.RANGE_COUNT], h[fp8.RANGE_COUNT + 1]
    detail: dict[str, Any] = {
        "rule": "fp8_range", "format": inp.format, "saturated": use.saturated, "underflowed": use.underflowed,
        "flushed": use.flushed, "elements": use.elements,
        "measured": "before the cast" if inp.before_cast else
        "on the FP8 values (the cast was not seen: saturated and flushed values cannot be told apart)",
    }
    if inp.before_cast and ref_sq > 0.0:
        detail["cast_error"] = math.sqrt(err_sq / ref_sq)  # relative 2-norm of the dequantised input
    saturated = use.saturated / SATURATED_LIMIT
    underflowed = use.underflowed / UNDERFLOWED_LIMIT
    worst, limit, what = ((saturated, SATURATED_LIMIT, "saturated") if saturated >= underflowed
                          else (underflowed, UNDERFLOWED_LIMIT, "underflowed"))
    consistent = worst <= 1.0
    if not consistent:
        fraction = use.saturated if what == "saturated" else use.underflowed
        why = ("its scale is too large for it (an amax out of date?): the cast clipped them" if what == "saturated"
               else "its scale is too small for it (an amax inflated by an outlier?): "
                    f"{use.flushed:.1%} of the input became zero")
        detail["reason"] = f"{fraction:.1%} of FP8 input {inp.where} {what} in {inp.format}; {why}"
    return LeafVerdict(path=(f"fp8_input.{inp.where}",), leaf=None, consistent=consistent,
                       max_rel=f"fp8_{what}", threshold=limit, figure=worst, dtype_repr=inp.format,
                       shape_repr=str(tuple(inp.data.shape)), detail=detail)


def worst_range_use(seen: dict[str, Any] | None, detail: dict[str, Any]) -> dict[str, Any]:
    """The per-API summary of its FP8 inputs' range verdicts: the most any input saturated,
    underflowed, flushed, and its cast's largest error (where the cast was seen)."""
    seen = dict(seen or {"inputs": 0, "formats": []})
    seen["inputs"] += 1
    if detail["format"] not in seen["formats"]:
        seen["formats"] = sorted([*seen["formats"], detail["format"]])
    for k in ("saturated", "underflowed", "flushed", "cast_error"):
        if k in detail:
            seen[k] = max(seen.get(k, 0.0), detail[k])
    return seen
