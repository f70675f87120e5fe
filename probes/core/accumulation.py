"""The accumulation test ratio: a sum's error against the limit every correct kernel meets.

An ulp figure of a matrix product or a reduction depends on the order its kernel adds the terms
in: two correct float32 GEMMs of two CPUs score 9 and 23 ulps on the same inputs. An ulp golden
therefore only compares runs of one machine. Classical BLAS/LAPACK test suites judge such
operators with a *test ratio* instead: the error divided by what rounding may contribute, given
the accumulation length and the magnitudes of the terms (not of the result, which cancellation
can make arbitrarily small), passed below a fixed threshold on every machine.

The limit used here is the probabilistic rounding-error bound of Higham and Mary (2019): a sum of
K terms computed in a precision with unit roundoff u, in any order, is off by at most about
``lam * sqrt(K) * u * sum|terms|`` when rounding errors behave like independent random variables
(which they do on the random inputs the catalogue measures), where the worst-case bound grows
with K instead. Per output element i:

    ratio_i = |out_i - ref_i| / (u_D * |ref_i|  +  sqrt(K_i) * u_acc * m_i  +  tiny_D)

* ``u_D * |ref_i|``: the one final rounding to the output dtype D (a correctly rounded result
  scores at most 1 from this term alone);
* ``m_i``: the magnitude of the terms, the operator applied to the inputs' absolute values
  (``|A| @ |B|`` for a product, ``sum |x|`` for a sum), ``K_i`` the number of terms;
* ``u_acc``: the unit roundoff of the dtype a correct kernel accumulates in: float32 for the half
  types (PyTorch's and the NPU's convention), the dtype itself otherwise. A bfloat16 sum that
  keeps its running total in bfloat16 is therefore over the limit on every machine, while any
  summation order in float32 is within it;
* ``tiny_D``: half of D's smallest subnormal step, so that exact zeros do not divide by zero.

Non-finite values follow probes.core.ulps: where the reference overflows D the right answer is
the infinity; matching specials score 0 and anything else scores ``inf``.

A kernel that multiplies in reduced precision (TF32 / HF32 inputs, bfloat16 inputs to a float32
product) loses ``u_reduced / u`` = 2^13 (TF32) of every product, spread over K terms against a
limit that grows with sqrt(K): its ratio falls with K (for TF32, measured 7,000 at K = 1, 84 at
1,024, 25 at 4,096) but stays far above a correct kernel's at the lengths the catalogue measures
(at most 1,024 terms).

The ratio's limit (RATIO_LIMIT) is defined here, beside the bound it is counted in (it means
nothing apart from it); the dtypes' formats come from probes/core/thresholds.py.

Framework-free (numpy): the caller computes the magnitudes with its framework, in float64.
"""

from __future__ import annotations

import numpy as np

from probes.core.thresholds import FLOAT8_DTYPES, MIN_EXPONENT, SIGNIFICAND_BITS
from probes.core.ulps import round_to

# the dtype a correct kernel accumulates a sum of D values in
ACCUMULATES_IN = {"float16": "float32", "bfloat16": "float32", "float32": "float32", "float64": "float64",
                  **{name: "float32" for name in FLOAT8_DTYPES}}

# The limit per output dtype, in units of the bound above. Calibrated by
# benchmarks/calibrate_accumulation.py: correct kernels (PyTorch's CPU kernels on the ISA paths
# of other CPUs too, NumPy's OpenBLAS and pairwise sums, naive left-to-right summation, on signed,
# one-signed, normal and 16-binade inputs, K = 1 .. 4,096) stay at or below 1.2 for float32 and
# 1.0 for the half types (one final rounding); TF32-, float16- and bfloat16-input float32
# products exceed 80 up to K = 1,024 (25 at 4,096), half-precision sums and products that keep
# their running total in the half type exceed 150. The limit leaves a correct kernel of another
# design (blocked, split-K, two roundings) a factor of 3 and a defect a factor of 20.
RATIO_LIMIT = {"float16": 4.0, "bfloat16": 4.0, "float32": 4.0, "float64": 4.0, **{name: 4.0 for name in FLOAT8_DTYPES}}


def unit_roundoff(dtype_name: str) -> float:
    """u = 2^-p: half the spacing of D at 1 (p counts the implicit bit)."""
    return 2.0 ** -SIGNIFICAND_BITS[dtype_name]


def accumulation_ratio(out: np.ndarray, ref: np.ndarray, magnitude: np.ndarray, length: np.ndarray | float,
               dtype_name: str) -> np.ndarray:
    """Per-element ratio (module docstring) of `out` (D values as float64) against the float64
    `ref`, given the terms' magnitude `m` and their number `K` (arrays of the output's shape, or a
    scalar K)."""
    if dtype_name not in SIGNIFICAND_BITS:
        raise ValueError(f"dtype {dtype_name!r}: the test ratio is defined for {', '.join(SIGNIFICAND_BITS)}")
    out = np.asarray(out, dtype=np.float64).reshape(-1)
    ref = np.asarray(ref, dtype=np.float64).reshape(-1)
    if out.size == 0:
        return np.zeros(0)
    magnitude = _flat(np.abs(np.asarray(magnitude, dtype=np.float64)), ref.size)
    length = _flat(np.maximum(np.asarray(length, dtype=np.float64), 1.0), ref.size)
    rounded = round_to(ref, dtype_name)
    finite_ref = np.isfinite(rounded)
    safe_ref = np.where(finite_ref, ref, 0.0)
    tiny = 0.5 * 2.0 ** (MIN_EXPONENT[dtype_name] - (SIGNIFICAND_BITS[dtype_name] - 1))
    with np.errstate(invalid="ignore", over="ignore"):
        limit = (unit_roundoff(dtype_name) * np.abs(safe_ref)
                 + np.sqrt(length) * unit_roundoff(ACCUMULATES_IN[dtype_name]) * np.where(finite_ref, magnitude, 0.0)
                 + tiny)
        ratio = np.abs(out - safe_ref) / limit
    same_special = (out == rounded) | (np.isnan(out) & np.isnan(rounded))
    ratio = np.where(finite_ref, ratio, np.where(same_special, 0.0, np.inf))
    return np.where(finite_ref & ~np.isfinite(out), np.inf, np.where(np.isnan(ratio), np.inf, ratio))


def _flat(a: np.ndarray, size: int) -> np.ndarray:
    """An output-shaped array flattened, a scalar broadcast to `size` elements."""
    flat = a.reshape(-1)
    return np.broadcast_to(flat, (size,)) if flat.size == 1 else flat
