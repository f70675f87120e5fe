"""Errors in units in the last place (ulps) of the output dtype, against a float64 reference.

This is how libm test suites report accuracy (glibc's ulps tables, CORE-MATH), extended to
tensor operators, where three cases need a rule of their own:

* **Spacing.** The ulp of a value x in dtype D is the gap between the two D numbers around x:
  ``2 ** (max(floor(log2 |x|), emin_D) - (p_D - 1))`` with p_D the significand bits (fp32 24,
  fp16 11, bf16 8) and emin_D the smallest normal exponent. Below the normal range the spacing
  stays the subnormal one, so a **subnormal** result is measured in subnormal steps (a device
  that flushes a whole row of subnormals to zero shows large errors: it did lose them). The FP8
  formats (e4m3: p 4, emin -6; e5m2: p 3, emin -14) are measured the same way, in their own ulps:
  a correctly rounded cast to e4m3 scores 0.5 ulp, 6.25 % of the value.
* **Zeros and cancellation.** An output element that is zero or tiny in exact arithmetic is
  usually the difference of larger terms (a sum that cancels, a matrix product's small entry,
  x - mean). A kernel as exact as its dtype allows is off by many of *that element's* ulps but by
  less than one ulp of the terms' scale. So each element is measured at
  ``max(|reference|, row scale)`` where the row scale is the RMS of the reference over the
  element's row (trailing dimensions holding at least ``scaled.MIN_ROW`` elements: a token's
  features, a matrix row; the rule of probes.core.scaled), and a row that is all zero in exact
  arithmetic at the RMS of the whole output. An element above its row's RMS is judged by its own
  ulp, as libm does. A correctly rounded kernel scores at most 0.5 ulp by this measure.
* **Non-finite values.** The reference is first rounded to D: where it overflows D, the right
  answer *is* the infinity. An element whose rounded reference is inf or NaN scores 0 when the
  output holds the same value (the same infinity; NaN against NaN) and ``inf`` otherwise; a
  non-finite output against a finite reference scores ``inf``.

Framework-free (numpy): the catalogue brings each output to the host once per sample, where its
float64 reference already is.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from probes.core.scaled import row_length
from probes.core.thresholds import HAS_INFINITY, LARGEST_FINITE, MIN_EXPONENT, SIGNIFICAND_BITS

ULP_DTYPES = tuple(SIGNIFICAND_BITS)
PERCENTILE = 99.0


def spacing(x: np.ndarray, dtype_name: str) -> np.ndarray:
    """The ulp of D at |x| (float64 array), the subnormal spacing below D's normal range."""
    p, emin = SIGNIFICAND_BITS[dtype_name], MIN_EXPONENT[dtype_name]
    ax = np.abs(x)
    _, exp = np.frexp(ax)  # |x| = m * 2**exp, 0.5 <= m < 1: floor(log2|x|) = exp - 1
    exp = np.where(ax > 0.0, exp - 1, emin)  # frexp(0) has exponent 0: zero takes the subnormal step
    return np.ldexp(1.0, np.maximum(exp, emin) - (p - 1))


def round_to(ref: np.ndarray, dtype_name: str) -> np.ndarray:
    """The reference rounded to D (to nearest even), as float64: where it overflows D it is inf,
    or NaN for a format without an infinity (the FP8 "fn" / "fnuz" formats: whether a cast
    saturates there instead is the framework's convention, not the format's)."""
    if dtype_name not in _NUMPY_DTYPES and dtype_name != "bfloat16":
        return _round_by_spacing(np.asarray(ref, dtype=np.float64), dtype_name)
    if dtype_name == "bfloat16":
        with np.errstate(over="ignore"):
            bits = ref.astype(np.float32).view(np.uint32).astype(np.uint64)
        rounded = ((bits + 0x7FFF + ((bits >> 16) & 1)) >> 16) << 16
        out = rounded.astype(np.uint32).view(np.float32).astype(np.float64)
        # NaN payloads can carry into the exponent: keep NaN as NaN
        return np.where(np.isnan(ref), np.nan, out)
    with np.errstate(over="ignore"):
        narrow = ref.astype(_NUMPY_DTYPES[dtype_name])
    return narrow.astype(np.float64)


_NUMPY_DTYPES = {"float16": np.float16, "float32": np.float32, "float64": np.float64}


def _round_by_spacing(ref: np.ndarray, dtype_name: str) -> np.ndarray:
    """Rounding to a format numpy has no dtype for (the FP8 formats): |x| / spacing is an integer
    significand in exact float64 arithmetic (the spacing is a power of two), np.rint rounds it to
    nearest even, and a significand carried to 2^p is the next binade's first value."""
    step = spacing(ref, dtype_name)
    with np.errstate(invalid="ignore", over="ignore"):
        rounded = np.rint(ref / step) * step
    beyond = np.abs(rounded) > LARGEST_FINITE[dtype_name]
    overflow = np.copysign(np.inf, ref) if dtype_name in HAS_INFINITY else np.nan
    return np.where(np.isnan(ref), np.nan, np.where(beyond, overflow, rounded))


def ulp_errors(out: np.ndarray, ref: np.ndarray, dtype_name: str) -> np.ndarray:
    """Per-element error of `out` (values of dtype D, as float64) against the float64 `ref`, in
    ulps of D (module docstring). Both have the output's shape."""
    if dtype_name not in SIGNIFICAND_BITS:
        raise ValueError(f"dtype {dtype_name!r}: ulps are defined for {', '.join(ULP_DTYPES)}")
    out = np.asarray(out, dtype=np.float64)
    ref = np.asarray(ref, dtype=np.float64)
    shape = out.shape
    if out.size == 0:
        return np.zeros(0)
    rounded = round_to(ref, dtype_name)
    finite_ref = np.isfinite(rounded)
    safe_ref = np.where(finite_ref, ref, 0.0)
    # the row scale: RMS of the reference over each row, a zero row at the whole output's RMS
    row = row_length(tuple(shape)) if shape else 1
    rows = safe_ref.reshape(-1, row)
    row_rms = np.sqrt(np.mean(rows * rows, axis=1))
    whole = math.sqrt(float(np.mean(safe_ref * safe_ref)))
    row_rms = np.where(row_rms > 0.0, row_rms, whole)
    scale = np.maximum(np.abs(rows), row_rms[:, None]).reshape(-1)
    with np.errstate(invalid="ignore", over="ignore"):
        err = np.abs(out.reshape(-1) - safe_ref.reshape(-1)) / spacing(scale, dtype_name)
    flat_out, flat_rounded, flat_finite = out.reshape(-1), rounded.reshape(-1), finite_ref.reshape(-1)
    same_special = (flat_out == flat_rounded) | (np.isnan(flat_out) & np.isnan(flat_rounded))
    err = np.where(flat_finite, err, np.where(same_special, 0.0, np.inf))
    err = np.where(flat_finite & ~np.isfinite(flat_out), np.inf, err)
    return err


@dataclass(frozen=True)
class UlpSummary:
    """What the catalogue reports of one API x dtype: elements measured, max and p99 ulp."""

    elements: int
    max_ulp: float
    p99_ulp: float

    @staticmethod
    def of(errors: list[np.ndarray]) -> UlpSummary:
        flat = np.concatenate([np.ravel(e) for e in errors]) if errors else np.zeros(0)
        if flat.size == 0:
            return UlpSummary(0, 0.0, 0.0)
        # p99 by the "higher" method: a value that was measured, never an interpolation
        return UlpSummary(int(flat.size), float(np.max(flat)), float(np.percentile(flat, PERCENTILE, method="higher")))
