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

import math
from typing import Any

import array_api_compat.numpy as np_xp
import numpy as np

from probes.backends import host_kernels
from probes.backends.base import BitViews, bit_view_table

_NAMES = {np.dtype(name): name for name in ("float16", "float32", "float64", "int16", "int32", "int64")}


class HostArrays(BitViews):
    """The backend operations the perturbations use, for NumPy arrays."""

    bit_dtypes = bit_view_table(np.dtype, ("float16", "float32", "float64"))  # NumPy has no bfloat16

    def namespace(self, a: Any) -> Any:
        return np_xp

    def dtype_name(self, a: Any) -> str:
        dtype = a.dtype  # float16 / float32 / float64, as the backends name them (NumPy's
        return _NAMES.get(dtype) or dtype.name  # .name is Python code: ~5 us a call)

    def shape(self, a: Any) -> tuple[int, ...]:
        return a.shape

    def clone(self, a: Any) -> Any:
        return np.array(a, copy=True)

    def in_band(self, bits: np.ndarray, width: int, above: int, below: int) -> np.ndarray:
        """1 where `above` < the magnitude code of a float's `bits` (its `width`-bit signed
        integer view) < `below`, else 0: a comparison is the sign of a difference, read as the
        top bit of its unsigned view. Four passes over one fresh array where no element reaches
        `below` (its maximum is read first), seven otherwise; NumPy's integer operations with a
        scalar are vectorised, its clip and comparisons into bools are not (measured: 4 against
        9 us at 32K elements)."""
        # (out=: a 0-d result stays an array; empty_like keeps the input's layout, as torch does)
        magnitude = np.bitwise_and(bits, (1 << (width - 1)) - 1, out=np.empty_like(bits))
        unsigned = magnitude.dtype.str.replace("i", "u")
        upper = None
        if magnitude.size and int(magnitude.max()) >= below:  # the band's upper test is needed
            upper = np.subtract(magnitude, below, out=np.empty_like(magnitude))  # negative where below `below`
            np.right_shift(upper.view(unsigned), width - 1, out=upper.view(unsigned))
        np.subtract(above, magnitude, out=magnitude)  # negative where above `above`
        np.right_shift(magnitude.view(unsigned), width - 1, out=magnitude.view(unsigned))
        if upper is not None:
            np.bitwise_and(magnitude, upper, out=magnitude)
        return magnitude

    def combined(self, op: str, band: np.ndarray, bits: np.ndarray) -> np.ndarray:
        """`bits` op `band` (add, bitwise_xor), written into `band`."""
        return getattr(np, op)(bits, band, out=band)

    def edited_in_band(self, op: str, bits: np.ndarray, width: int, above: int, below: int) -> np.ndarray | None:
        """combined(op, in_band(bits, ...), bits) in one pass into a fresh array of `bits`' layout
        (host_kernels.c), or None where the kernels are missing or cannot walk `bits`."""
        if bits.size == 0 or bits.dtype not in _BAND_DTYPES:  # (native byte order only)
            return None
        out = np.empty_like(bits)  # the input's layout, as torch keeps it
        walked = in_memory_order(bits, out)
        if walked is None or not host_kernels.edit_band(op, bits.itemsize, walked[0].ctypes.data,
                                                        walked[1].ctypes.data, bits.size, above, below):
            return None
        return out


_BAND_DTYPES = frozenset(np.dtype(f"int{width}") for width in (16, 32, 64))
HOST_ARRAYS = HostArrays()


def in_memory_order(a: np.ndarray, b: np.ndarray) -> tuple[np.ndarray, np.ndarray] | None:
    """C-contiguous views of `a` and `b` (one shape) that walk both in the order of `a`'s memory,
    element i of one paired with element i of the other, when both cover their memory densely
    in that order (a transposed tensor does); None otherwise, and for negative strides or a
    NumPy scalar."""
    if type(a) is not np.ndarray or type(b) is not np.ndarray:
        return None
    if a.flags.c_contiguous and b.flags.c_contiguous:
        return a, b
    if a.strides != b.strides:
        return None
    order = sorted(range(a.ndim), key=a.strides.__getitem__, reverse=True)
    ta, tb = a.transpose(order), b.transpose(order)
    return (ta, tb) if ta.flags.c_contiguous and tb.flags.c_contiguous else None


#: the dtypes the ratio figures are computed in (a narrower float is widened to float32 first)
COMPUTE_DTYPES = (np.dtype(np.float32), np.dtype(np.float64))


def bound_figures(a: np.ndarray, b: np.ndarray) -> list[float]:
    """[max |a - b|, RMS of b] as host numbers: the scaled rule's first figures
    (probes.core.scaled.bound_figures) of two arrays of one compute dtype; NaN anywhere makes the
    first NaN, squares that overflow make the second inf (either sends the leaf to the full
    measure)."""
    walked = in_memory_order(a, b) if a.size and a.dtype == b.dtype and a.dtype in COMPUTE_DTYPES else None
    top = None if walked is None else host_kernels.max_abs_diff(a.itemsize, walked[0].ctypes.data,
                                                                walked[1].ctypes.data, a.size)
    with np.errstate(all="ignore"):  # overflow and NaN are figures, not warnings in the user's output
        if top is None:  # NumPy's passes: the same number
            d = np.subtract(a, b, out=np.empty(a.shape, a.dtype)).reshape(-1)
            top = float(np.maximum(d.max(), -d.min())) + 0.0  # (+ 0.0: a zero is +0.0 whichever max() returned)
        flat = np.ascontiguousarray(b).reshape(-1)
        return [top, math.sqrt(float(np.dot(flat, flat)) / (flat.size or 1))]


def scaled_figures(a: np.ndarray, b: np.ndarray, eps: float, shape: tuple[int, ...], finite: bool = True,
                   **options: Any) -> list[float]:
    """probes.core.scaled.scaled_error as host numbers (by default its fast pass, non-finite
    whenever a value is: NumPy's reductions return NaN for a NaN element): the core's formula
    itself, over NumPy's array namespace."""
    from probes.core import scaled

    with np.errstate(all="ignore"):  # overflow and NaN are figures, not warnings in the user's output
        return [float(x) + 0.0 for x in scaled.scaled_error(np_xp, a, b, eps, shape, finite=finite, **options)]


def ratio_figures(a: np.ndarray, b: np.ndarray, tol: float) -> list[float]:
    """[max r, min r, min a*b] with r = max(|a|, tol) / max(|b|, tol), as host numbers: the
    ratio rule's figures (probes.core.metrics.ratio_reductions) of two arrays of one compute
    dtype, in two scratch arrays (a fresh buffer per operation would cost as much as the
    arithmetic). Overflow to inf is a figure, as on the frameworks' kernels, not a warning in
    the user's output."""
    if a.size and a.dtype == b.dtype and a.dtype in COMPUTE_DTYPES:  # (native byte order only)
        walked = in_memory_order(a, b)  # (max and min: any order gives the same)
        figures = None if walked is None else host_kernels.ratio_figures(
            a.itemsize, walked[0].ctypes.data, walked[1].ctypes.data, a.size, tol)
        if figures is not None:
            return figures
    tol_ = a.dtype.type(tol)  # the clamp in the compute dtype, as the framework's kernels clamp
    r = np.abs(a, out=np.empty(a.shape, a.dtype))  # (out=: a 0-d result stays an array)
    s = np.abs(b, out=np.empty(b.shape, b.dtype))
    clamp_below(r, tol_)
    clamp_below(s, tol_)
    with np.errstate(all="ignore"):  # overflow and NaN are figures, not warnings in the user's output
        np.divide(r, s, out=r)
        np.multiply(a, b, out=s)
    return [float(r.max()), float(r.min()), float(s.min())]


#: the length of the constant arrays clamp_below compares with
FLOOR_CHUNK = 1 << 16
_FLOORS: dict[tuple[np.dtype, float], np.ndarray] = {}


def clamp_below(r: np.ndarray, value: Any) -> None:
    """r = max(r, value) in place, for a C-contiguous `r` (NaN stays NaN). Against an array of
    `value`s, not the scalar: NumPy's maximum with a scalar operand takes an unvectorised loop,
    four times slower than with an array (16 against 4 us at 32K float32 elements)."""
    key = (r.dtype, float(value))
    floor = _FLOORS.get(key)
    if floor is None:
        if len(_FLOORS) >= 64:  # a handful of (dtype, tolerance) pairs in practice
            _FLOORS.clear()
        floor = _FLOORS[key] = np.full(FLOOR_CHUNK, value, r.dtype)
        floor.flags.writeable = False
    flat = r.reshape(-1)
    for start in range(0, flat.size, FLOOR_CHUNK):
        part = flat[start : start + FLOOR_CHUNK]
        np.maximum(part, floor[: part.size], out=part)


def bfloat16_as_float32(bits: np.ndarray) -> np.ndarray:
    """The float32 values of bfloat16 elements given as their int16 bit patterns (exact: a
    bfloat16 is the upper half of the float32 with the same value)."""
    return (bits.view(np.uint16).astype(np.uint32) << 16).view(np.float32)


def ordered_sum(rows: np.ndarray) -> float:
    """The sum of a (m, P) float64 array in the order of the host kernels' partial sums (P a power
    of two): column k is partial k, the elements k, k + P, ... added in index order (NumPy reduces
    down a column row by row), and the P partials combined pairwise, ((p0 + p1) + (p2 + p3)) + ...
    Laid out P to a row, element i of a flat array is in partial i % P; zeros padding the last row
    leave a partial as it was (a partial sum from +0.0 is never -0.0)."""
    p = np.add.reduce(rows, axis=0).tolist()
    while len(p) > 1:
        p = [p[j] + p[j + 1] for j in range(0, len(p), 2)]
    return p[0]


#: the partial sums of online_dispatch's one-pass figures (host_kernels.c's DP)
DISPATCH_PARTIALS = 4


def dispatch_parts(dev: np.ndarray, ref: np.ndarray) -> list[float]:
    """[r.r, r.d, d.d, max d, min d] of a flat float64 pair, d = dev - ref: online_dispatch's
    figures in the order of host_kernels' one pass (each sum an `ordered_sum` of DISPATCH_PARTIALS
    partials), so that a machine without a compiler prints the figures of one with. The max and
    min are NaN where some d is."""
    with np.errstate(all="ignore"):  # overflow and NaN are figures, not warnings in the user's output
        d = dev - ref
        top, low = float(d.max()), float(d.min())
        pad = -d.shape[0] % DISPATCH_PARTIALS
        if pad:
            d, ref = np.concatenate((d, np.zeros(pad))), np.concatenate((ref, np.zeros(pad)))
        r, d = ref.reshape(-1, DISPATCH_PARTIALS), d.reshape(-1, DISPATCH_PARTIALS)
        return [ordered_sum(r * r), ordered_sum(r * d), ordered_sum(d * d), top, low]
