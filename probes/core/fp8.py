"""How much of an FP8 format's range a scaled tensor uses: the fraction of its elements that
saturate and the fraction that underflow, per call.

FP8 training casts ``x * scale`` to an 8-bit format, with the scale chosen so that the tensor's
largest magnitude (its amax) lands at the format's largest value. Both ends of the range lose
information, and neither shows in the matmul's own error against a float64 run on the same FP8
operands (that run starts from the already-cast values):

* **saturated**: ``|x * scale|`` beyond what rounds to the format's largest finite value (the
  largest value plus half its ulp: 464 for e4m3fn's 448). The cast clips it to that value (or
  makes it inf / NaN, the framework's choice): magnitude is lost beyond rounding. A scale from a
  stale amax (delayed scaling after the activations grew) saturates most of a tensor; the element
  whose magnitude *is* the amax lands on the largest value, within rounding, and is not counted.
* **underflowed**: ``0 < |x * scale|`` below the format's smallest normal number: the value is
  kept with fewer significant bits than the format has (a subnormal) or flushed to zero. Of
  these, **flushed** counts the ones that round to zero (at most half the smallest subnormal). A
  scale too small for the tensor (an amax inflated by one outlier) underflows most of it.

The counts are computed on the values *before* the cast (the caller multiplies by the scale, in
a dtype wide enough to hold them: the cast result cannot tell a flushed value from a zero), over
an array namespace `xp`, as one device array the caller brings to the host with its other
figures; `RangeUse.of` turns the host copy into fractions.

`input_rounding_floor` is the other FP8 fact a comparison needs: what the rounding of the
operands to FP8 alone contributes to a result, for comparisons against a float64 run on the
*unrounded* inputs (a re-run of an FP8 layer in high precision), where it is the noise floor, not
a defect. online_dispatch needs none: its reference starts from the same FP8 operands.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from probes.core.thresholds import (
    FLOAT8_DTYPES,
    MACHINE_EPS,
    MIN_EXPONENT,
    SIGNIFICAND_BITS,
    overflow_boundary,
)

RANGE_COUNT = 4  # [saturated, underflowed, flushed, elements]


def smallest_subnormal(dtype_name: str) -> float:
    """2^(emin - (p - 1)): the format's step below its normal range."""
    return 2.0 ** (MIN_EXPONENT[dtype_name] - (SIGNIFICAND_BITS[dtype_name] - 1))


def range_use_figures(xp: Any, scaled_values: Any, dtype_name: str, wide: Any = None) -> Any:
    """Device array [saturated, underflowed, flushed, elements] (counts) of the values
    `x * scale` about to be cast to the FP8 format `dtype_name` (module docstring), in `wide`
    (float64 unless the device has none: the formats' boundaries are exact in float32). NaNs count
    in neither; an infinity saturates."""
    if dtype_name not in FLOAT8_DTYPES:
        raise ValueError(f"dtype {dtype_name!r}: range use is defined for {', '.join(FLOAT8_DTYPES)}")
    wide = xp.float64 if wide is None else wide
    v = xp.abs(xp.reshape(xp.astype(scaled_values, wide), (-1,)))
    saturated = xp.sum(xp.astype(v > overflow_boundary(dtype_name), wide))
    nonzero = v > 0.0
    underflowed = xp.sum(xp.astype(nonzero & (v < 2.0 ** MIN_EXPONENT[dtype_name]), wide))
    flushed = xp.sum(xp.astype(nonzero & (v <= 0.5 * smallest_subnormal(dtype_name)), wide))
    elements = saturated * 0.0 + float(v.shape[0])  # on the figures' device
    return xp.stack([saturated, underflowed, flushed, elements])


@dataclass(frozen=True)
class RangeUse:
    """Fractions of a tensor's elements that saturated / underflowed / flushed to zero in the cast."""

    saturated: float
    underflowed: float
    flushed: float
    elements: int

    @staticmethod
    def of(figures: list[float]) -> RangeUse:
        """From the host copy of `range_use_figures` (an empty tensor uses nothing)."""
        saturated, underflowed, flushed, elements = figures[:RANGE_COUNT]
        n = max(elements, 1.0)
        return RangeUse(saturated / n, underflowed / n, flushed / n, int(elements))


def range_use(xp: Any, scaled_values: Any, dtype_name: str) -> RangeUse:
    """`range_use_figures` brought to the host at once: for callers with nothing else to transfer."""
    figures = range_use_figures(xp, scaled_values, dtype_name)
    return RangeUse.of([float(figures[i]) for i in range(RANGE_COUNT)])


def input_rounding_floor(*operand_dtypes: str) -> float:
    """The most, relative to the terms' magnitude (``|A| @ |B|`` for a matmul), that rounding each
    operand of a product to its format contributes to a sum of products: each factor is off by at
    most its unit roundoff u = eps/2, so a product by prod(1 + u) - 1 (e4m3 x e4m3: 0.1289;
    e4m3 x e5m2: 0.1953), for operands in the formats' normal range (a subnormal operand is off by
    up to half its format's smallest subnormal instead). At the result's own scale the same
    rounding reads larger (cancellation): about 1.3 times this in e4m3 x e4m3 matmuls of
    normal values. An operand in a dtype the comparison keeps (float32) adds its own, negligible,
    unit roundoff."""
    bound = 1.0
    for name in operand_dtypes:
        bound *= 1.0 + MACHINE_EPS[name] / 2.0
    return bound - 1.0
