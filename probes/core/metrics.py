"""Comparison formulas, written once over an array namespace.

The caller hands in `xp` (array-API style: array-api-compat's torch or numpy namespace, or a
backend's own) so the arithmetic runs where the tensors live; only a handful of scalars are copied
to the host. The functions return *device* scalars stacked in one array, so a caller can gather
the figures of every output leaf and pay one host transfer per call.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

# Outputs bigger than this are reduced chunk by chunk, so the temporaries of the metric never
# cost more than a chunk (the reference kept only the last chunk's verdict; we keep the max).
# 2^18 elements (1 MiB in float32) keeps the probe's peak memory small next to a model's
# activations while the per-chunk Python overhead stays negligible.
CHUNK_ELEMENTS = 1 << 18


def iter_chunks(xp: Any, a: Any, b: Any, chunk: int | None = None):
    """Matching flat chunks of a and b (one chunk up to `chunk` elements, CHUNK_ELEMENTS by default)."""
    chunk = CHUNK_ELEMENTS if chunk is None else chunk
    flat_a = xp.reshape(a, (-1,))
    flat_b = xp.reshape(b, (-1,))
    n = flat_a.shape[0]
    if n <= chunk:
        yield flat_a, flat_b
        return
    for start in range(0, n, chunk):
        yield flat_a[start : start + chunk], flat_b[start : start + chunk]


def ratio_reductions(xp: Any, a: Any, b: Any, tol: float) -> Any:
    """Device array [max r, min r, min a*b] with r = max(|a|, tol) / max(|b|, tol).

    `a` and `b` must already share a float dtype of at least 32 bits (the ratio of two bf16
    values rounded to bf16 has a granularity of 0.8 %, twice the bf16 threshold). Non-finite
    elements make max/min r non-finite or zero, which `finish_ratio` detects and hands to the
    slower, mask-aware `nonfinite_ratio_reductions`.
    """
    parts = []
    for ca, cb in iter_chunks(xp, a, b):
        r = xp.maximum(xp.abs(ca), tol) / xp.maximum(xp.abs(cb), tol)
        parts.append(xp.stack([xp.max(r), xp.min(r), xp.min(ca * cb)]))
    return combine_ratio_parts(xp, parts)


def combine_ratio_parts(xp: Any, parts: list[Any]) -> Any:
    """[max r, min r, min a*b] over all chunks: every chunk counts, not only the last."""
    if len(parts) == 1:
        return parts[0]
    stacked = xp.stack(parts)
    return xp.stack([xp.max(stacked[:, 0]), xp.min(stacked[:, 1]), xp.min(stacked[:, 2])])


def nonfinite_ratio_reductions(xp: Any, a: Any, b: Any, tol: float) -> Any:
    """Device array [max r, min r, min a*b, nan mismatches, inf mismatches] over finite pairs.

    Elements that are non-finite on either side are consistent only when both sides hold the
    same value (the same infinity, or NaN and NaN); otherwise they are counted, never masked (the reference
    mapped NaN ratios to 1, so a NaN on one side only went unreported).
    """
    fin = xp.isfinite(a) & xp.isfinite(b)
    one = xp.ones_like(a)
    r = xp.maximum(xp.abs(xp.where(fin, a, one)), tol) / xp.maximum(xp.abs(xp.where(fin, b, one)), tol)
    prod = xp.where(fin, a * b, xp.zeros_like(a))
    nan_a, nan_b = xp.isnan(a), xp.isnan(b)
    nan_mismatch = xp.sum(xp.astype(nan_a != nan_b, a.dtype))
    inf_mismatch = xp.sum(xp.astype(~fin & ~(nan_a | nan_b) & (a != b), a.dtype))
    return xp.stack([xp.max(r), xp.min(r), xp.min(prod), nan_mismatch, inf_mismatch])


@dataclass(frozen=True)
class RatioVerdict:
    """The ratio rule's outcome for one output leaf (msprobe's, but every chunk counts and NaN/inf
    mismatches are reported)."""

    ratio: float
    symbol_flipping: bool = False
    nan_mismatch: bool = False
    inf_mismatch: bool = False

    def consistent(self, threshold: float) -> bool:
        if self.symbol_flipping or self.nan_mismatch or self.inf_mismatch:
            return False
        return ratio_within(self.ratio, threshold)

    @property
    def max_rel(self) -> float | str:
        """The CSV's max_rel field: ratio - 1, or the name of what broke the ratio."""
        if self.nan_mismatch:
            return "nan_mismatch"
        if self.inf_mismatch:
            return "inf_mismatch"
        if self.symbol_flipping:
            return "symbol_flipping"
        return self.ratio - 1.0

    @property
    def figure(self) -> float:
        """A number to rank verdicts by (flips and non-finite mismatches rank as +inf)."""
        if self.symbol_flipping or self.nan_mismatch or self.inf_mismatch:
            return math.inf
        return self.ratio


def needs_nonfinite_pass(reductions: list[float]) -> bool:
    """True when the fast reductions saw a non-finite element and the masked pass must run."""
    rmax, rmin = reductions[0], reductions[1]
    return not (math.isfinite(rmax) and math.isfinite(rmin) and rmin > 0.0)


def finish_ratio(reductions: list[float], tol: float) -> RatioVerdict:
    """Turn host copies of `ratio_reductions`/`nonfinite_ratio_reductions` into a verdict."""
    rmax, rmin, prod_min = reductions[0], reductions[1], reductions[2]
    nan_mm = len(reductions) > 3 and reductions[3] > 0
    inf_mm = len(reductions) > 4 and reductions[4] > 0
    ratio, flipped = ratio_and_flip(rmax, rmin, prod_min, tol)
    return RatioVerdict(ratio=ratio, symbol_flipping=flipped, nan_mismatch=nan_mm, inf_mismatch=inf_mm)


def ratio_and_flip(rmax: float, rmin: float, prod_min: float, tol: float) -> tuple[float, bool]:
    """The ratio rule's two findings from its reductions: the ratio (the larger of the largest
    ratio and the inverse of the smallest) and whether a sign flipped (min a*b below -tol^2)."""
    return max(rmax, 1.0 / rmin if rmin > 0 else math.inf), prod_min < -(tol * tol)


def ratio_within(ratio: float, threshold: float) -> bool:
    """Whether a ratio lies in the rule's band [1 / threshold, threshold]."""
    return 1.0 / threshold <= ratio <= threshold


@dataclass(frozen=True)
class SingleBenchmarkVerdict:
    """The to_cpu rule's figures for one output leaf (msprobe's, but the real output is never
    written and the error balance fails both ways, not only when positive)."""

    abs_err: float
    rel_err: float
    error_balance: float
    nonfinite_mismatch: bool
    consistent: bool


def single_benchmark_chunk(xp: Any, actual: Any, golden: Any, small_value: float) -> Any:
    """Device array [abs_err, rel_err, sum of d/scale] of one chunk, assuming finite values.

    The fast path of the single-benchmark rule: if any element is non-finite the figures come
    out non-finite and `needs_nonfinite_single` sends the leaf to `single_benchmark_reductions`.
    A golden zero under |actual| >= small_value gives rel_err = inf, as it should.
    """
    diff = actual - golden
    adiff = xp.abs(diff)
    small = xp.abs(actual) < small_value
    zero = xp.zeros_like(adiff)
    abs_err = xp.max(xp.where(small, adiff, zero))
    agold = xp.abs(golden)
    rel_err = xp.max(xp.where(small, zero, adiff / agold))
    eb_sum = xp.sum(diff / xp.maximum(agold, 1.0))
    return xp.stack([abs_err, rel_err, eb_sum])


def combine_single_chunks(parts: list[list[float]], numel: int) -> list[float]:
    """[abs_err, rel_err, error_balance, 0 mismatches] from host copies of the chunks' figures."""
    return [max(p[0] for p in parts), max(p[1] for p in parts), sum(p[2] for p in parts) / max(numel, 1), 0.0]


def needs_nonfinite_single(figures: list[float]) -> bool:
    return not all(math.isfinite(v) for v in figures[:3])


def single_benchmark_reductions(xp: Any, actual: Any, golden: Any, small_value: float) -> Any:
    """Device array [abs_err, rel_err, error_balance, nonfinite mismatches], float64 inputs.

    Works on values only (never writes into `actual`: the reference overwrote inf/NaN in the
    user's real output with 1). Non-finite elements are compared by identity and left out of
    the error figures.
    """
    fin = xp.isfinite(actual) & xp.isfinite(golden)
    zero = xp.zeros_like(actual)
    act = xp.where(fin, actual, zero)
    gold = xp.where(fin, golden, zero)
    diff = xp.abs(act - gold)
    small = xp.abs(act) < small_value
    abs_err = xp.max(xp.where(small, diff, zero))
    abs_gold = xp.abs(gold)
    rel = xp.where(small, zero, diff / xp.where(abs_gold > 0, abs_gold, xp.ones_like(gold)))
    # a golden zero under a big actual value is an infinite relative error
    rel = xp.where(~small & (abs_gold == 0) & (diff > 0), xp.full_like(rel, math.inf), rel)
    rel_err = xp.max(rel)
    scale = xp.where(abs_gold >= 1.0, abs_gold, xp.ones_like(gold))
    eb = xp.mean((act - gold) / scale)
    mismatch = ~fin & ~(xp.isnan(actual) & xp.isnan(golden)) & (actual != golden)
    return xp.stack([abs_err, rel_err, eb, xp.sum(xp.astype(mismatch, actual.dtype))])


def finish_single_benchmark(reductions: list[float], rtol: float, atol: float, eb_limit: float) -> SingleBenchmarkVerdict:
    abs_err, rel_err, eb, mismatches = reductions
    nonfinite = mismatches > 0
    ok = not nonfinite and abs_err <= atol and rel_err <= rtol and abs(eb) <= eb_limit
    return SingleBenchmarkVerdict(abs_err, rel_err, eb, nonfinite, ok)
