"""bfloat16 values held in float32: numpy has no bfloat16 type, so a bf16 value is a float32 whose
low 16 bits are zero, and these bit operations are the only place that layout is spelled out.

Why truncation for drawn values and round-to-nearest-even for background values: truncation
towards zero keeps bf16-representable bounds and never turns a finite value infinite, so it suits
Hypothesis's draws; the background values are clipped to the bounds first and then rounded the way
a torch cast rounds (rounding is monotonic and the bounds are bf16 values, so they stay inside).
"""

from __future__ import annotations

import numpy as np

from probes.core.errors import ConfigError

__all__ = ["KEEP", "QNAN", "inward", "truncate", "round_to_bf16", "check_exact", "top_halves"]

KEEP = np.uint32(0xFFFF0000)
QNAN = np.uint32(0x7FC00000)


def inward(x: np.float32, up: bool) -> float:
    """The bf16 value next to the float32 `x` on the inner side of a bound (`up`: a lower bound),
    so that the rounded range holds only values the caller allowed."""
    bits = np.array([x], dtype=np.float32).view(np.uint32)[0]
    low = bits & np.uint32(0xFFFF)
    if low == 0:
        return float(x)
    trunc = np.array([bits & KEEP], dtype=np.uint32).view(np.float32)[0]  # towards zero
    # truncation moves towards zero; away from zero is one bf16 step further out
    away = np.array([(bits & KEEP) + np.uint32(0x10000)], dtype=np.uint32).view(np.float32)[0]
    lower, upper = (trunc, away) if x > 0 else (away, trunc)
    return float(upper if up else lower)


def truncate(a: np.ndarray) -> np.ndarray:
    """float32 -> the bf16 values truncated towards zero, held in float32 (NaN stays NaN)."""
    bits = np.ascontiguousarray(a, dtype=np.float32).view(np.uint32)
    kept = bits & KEEP
    nan = np.isnan(a)
    if nan.any():
        kept = np.where(nan, QNAN, kept)  # the NaN torch casts produce
    return kept.view(np.float32)


def round_to_bf16(a: np.ndarray) -> np.ndarray:
    """Finite float32 -> the nearest bf16 values (ties to even, as a torch cast rounds), held in
    float32: numpy has no bfloat16 type."""
    bits = a.view(np.uint32)
    rounded = bits + np.uint32(0x7FFF) + ((bits >> np.uint32(16)) & np.uint32(1))
    return (rounded & KEEP).view(np.float32)


def check_exact(a: np.ndarray) -> np.ndarray:
    """`a` unchanged if every value is a bf16 value: a user's elements strategy that is not would
    be rounded by the cast, and the reported value would not be the one the API saw."""
    bits = np.ascontiguousarray(a, dtype=np.float32).view(np.uint32)
    bad = (bits & np.uint32(0xFFFF)) != 0
    if bad.any():
        value = a[bad].flat[0]
        raise ConfigError("elements", float(value), "values exactly representable in bfloat16 "
                          "(a float32 whose low 16 bits are zero)",
                          hint="round them, e.g. torch.tensor(v).bfloat16().item(), or leave elements=None")
    return a


def top_halves(a: np.ndarray) -> np.ndarray:
    """The bf16 bit patterns of `a` as int16: what a framework views as bfloat16 without a
    rounding cast."""
    return (np.ascontiguousarray(a).view(np.uint32) >> np.uint32(16)).astype(np.uint16).view(np.int16)
