"""NumPy arrays as the probes' scratch space for tensors that live in host memory.

A check of a small CPU tensor is a dozen tiny operations. Dispatched as framework operators they
cost a few microseconds each on torch (its dispatcher, and the probe's own pass-through wrappers
while its hooks are installed) and 0.05-0.5 ms each on MindSpore's PyNative; on a NumPy view of the
same memory (no copy) each is about a microsecond. Both backends hand such tensors over as NumPy
views (their `host_view`) and share what is computed on them here: the perturbations' operations
(HOST_ARRAYS, see probes/free_benchmark/perturbations.py) and the ratio rule's figures.

The values are those of the framework's kernels: IEEE arithmetic (abs, max, divide, multiply are
correctly rounded in both) and exact max/min reductions, which return NaN when an element is NaN,
as torch's do. NumPy runs on one thread, so the backends keep their own kernels for large tensors.
"""

from __future__ import annotations

from typing import Any

import array_api_compat.numpy as np_xp
import numpy as np

from probes.backends.base import BitViews, bit_view_table


class HostArrays(BitViews):
    """The backend operations the perturbations use, for NumPy arrays."""

    bit_dtypes = bit_view_table(np.dtype, ("float16", "float32", "float64"))  # NumPy has no bfloat16

    def namespace(self, a: Any) -> Any:
        return np_xp

    def dtype_name(self, a: Any) -> str:
        return a.dtype.name  # float16 / float32 / float64, as the backends name them

    def shape(self, a: Any) -> tuple[int, ...]:
        return a.shape

    def clone(self, a: Any) -> Any:
        return np.array(a, copy=True)


HOST_ARRAYS = HostArrays()

#: the dtypes the ratio figures are computed in (a narrower float is widened to float32 first)
COMPUTE_DTYPES = (np.dtype(np.float32), np.dtype(np.float64))


def ratio_figures(a: np.ndarray, b: np.ndarray, tol: float) -> list[float]:
    """[max r, min r, min a*b] with r = max(|a|, tol) / max(|b|, tol), as host numbers: the
    ratio rule's figures (probes.core.metrics.ratio_reductions) of two arrays of one compute
    dtype, in two scratch arrays (a fresh buffer per operation would cost as much as the
    arithmetic)."""
    tol_ = a.dtype.type(tol)  # the clamp in the compute dtype, as the framework's kernels clamp
    r = np.abs(a, out=np.empty(a.shape, a.dtype))  # (out=: a 0-d result stays an array)
    s = np.abs(b, out=np.empty(b.shape, b.dtype))
    np.maximum(r, tol_, out=r)
    np.maximum(s, tol_, out=s)
    np.divide(r, s, out=r)
    np.multiply(a, b, out=s)
    return [float(r.max()), float(r.min()), float(s.min())]


def bfloat16_as_float32(bits: np.ndarray) -> np.ndarray:
    """The float32 values of bfloat16 elements given as their int16 bit patterns (exact: a
    bfloat16 is the upper half of the float32 with the same value)."""
    return (bits.view(np.uint16).astype(np.uint32) << 16).view(np.float32)
