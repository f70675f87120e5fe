"""The host arrays' C kernels (host_kernels.py) on plain CPU tensors' memory, by address.

A checked call's perturbation, and its output pair's equality, ratio figures or scaled bound, and
online_dispatch's figures of a compared output, run here first: no NumPy view, no detach, no tensor made back from an array (those cost ~10 us a call
around a ~10 us kernel), and no size limit below torch's own kernels' (one pass over the elements
beats torch's several at any size a call's output has on one thread). A tensor the kernels cannot walk (another device, a
subclass, a transform's wrapper, gaps in its memory, the kernels not built) gets None: the caller
takes the NumPy or torch path, whose results are the same.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

from probes.backends import host_arrays, host_kernels
from probes.backends.torch_host import plain_cpu, plain_cpu_pair
from probes.backends.torch_xp import root_mean_square

#: past this many elements torch's multi-threaded kernels may be the faster (an output this large
#: also costs its re-run far more than its figures)
KERNEL_MAX_ELEMENTS = 1 << 22
_FLOAT_DTYPES = frozenset({torch.float32, torch.float64})
_EQUAL_KINDS = {torch.float32: "f32", torch.float64: "f64", torch.float16: "f16", torch.bfloat16: "bf16",
                **{t: "bytes" for t in (torch.bool, torch.uint8, torch.int8, torch.int16, torch.int32, torch.int64)}}
# online_dispatch's leaves the one pass reads (dispatch_parts), by the kernel's name for their dtype
_PARTS_KINDS = {torch.float32: "f32", torch.float64: "f64", torch.bfloat16: "bf16"}
_BIT_WIDTHS = {torch.float16: 2, torch.bfloat16: 2, torch.float32: 4, torch.float64: 8}

# torch's C methods: while a probe runs, the Python-level names are its pass-through wrappers
_T = torch._C.TensorBase
_data_ptr, _numel, _stride, _is_contiguous = _T.data_ptr, _T.numel, _T.stride, _T.is_contiguous
_detach, _reshape = _T.detach, _T.reshape
_empty_like = torch._C._VariableFunctions.empty_like


def ratio_figures(a: Any, b: Any, tol: float) -> list[float] | None:
    """[max r, min r, min a*b] (metrics.ratio_reductions) of two plain CPU float32 or float64
    tensors of one dtype, shape and memory layout, or None."""
    where = _pair(a, b, _FLOAT_DTYPES)
    return None if where is None else host_kernels.ratio_figures(a.element_size(), *where, tol)


def scaled_bound(a: Any, b: Any) -> list[float] | None:
    """[max |a - b|, RMS of b] (scaled.bound_figures) of a pair as ratio_figures takes it: the
    maximum by the kernel (exact: the order does not matter), the RMS by torch's own reduction,
    the one the device path takes, so a leaf's figures are the device path's."""
    where = _pair(a, b, _FLOAT_DTYPES)
    top = None if where is None else host_kernels.max_abs_diff(a.element_size(), *where)
    if top is None:
        return None
    return [top, float(root_mean_square(_reshape(_detach(b), (-1,))))]


def band_edited(t: Any, op: str, above: int, below: int) -> Any:
    """A new tensor of t's dtype and layout whose elements' bit patterns are t's, `op` ("add" or
    "bitwise_xor") 1 where above < the magnitude code < below; None where the kernels cannot."""
    itemsize = _BIT_WIDTHS.get(t.dtype)
    n = _numel(t)
    if itemsize is None or not 0 < n <= KERNEL_MAX_ELEMENTS or not plain_cpu(t) or not (_is_contiguous(t) or _dense(t)):
        return None
    out = _empty_like(t)  # the same strides for a dense tensor, and no autograd history
    if _stride(out) != _stride(t):
        return None
    try:
        where = _data_ptr(t), _data_ptr(out)
    except RuntimeError:  # no storage (inside a torch.func transform, a new tensor is its wrapper)
        return None
    return out if host_kernels.edit_band(op, itemsize, *where, n, above, below) else None


def all_equal(a: Any, b: Any) -> bool | None:
    """Whether two plain CPU tensors of one dtype, shape and memory layout are equal as `a == b`
    reads them (torch_equality.host_equal), or None."""
    kind = _EQUAL_KINDS.get(a.dtype)
    where = None if kind is None else _pair(a, b, _EQUAL_KINDS)
    if where is None:
        return None
    first, second, n = where
    return host_kernels.all_equal(kind, first, second, n * a.element_size() if kind == "bytes" else n)


def dispatch_parts(dev: Any, ref: Any) -> list[float] | None:
    """online_dispatch's [r.r, r.d, d.d, max d, min d] (host_arrays.dispatch_parts) of a flat
    float32, float64 or bfloat16 CPU leaf and its float64 reference, both contiguous, in one pass
    by address (NumPy's passes in the same order without the kernels); a zero extremum is +0.0
    on both paths. None for a pair it does not read: another dtype or device, a subclass, gaps
    in memory, past KERNEL_MAX_ELEMENTS."""
    kind = _PARTS_KINDS.get(dev.dtype)
    if kind is None or ref.dtype is not torch.float64 or not 0 < dev.shape[0] <= KERNEL_MAX_ELEMENTS \
            or not (_is_contiguous(dev) and _is_contiguous(ref) and plain_cpu_pair(dev, ref)):
        return None
    try:
        parts = host_kernels.dispatch_parts(kind, _data_ptr(dev), _data_ptr(ref), dev.shape[0])
    except RuntimeError:  # no storage (a transform's tensor that passed for plain)
        return None
    if parts is None:
        if kind == "bf16":
            wide = host_arrays.bfloat16_as_float32(_detach(dev).view(torch.int16).numpy())
        else:
            wide = _detach(dev).numpy()
        parts = host_arrays.dispatch_parts(wide.astype(np.float64), _detach(ref).numpy())
    parts[3] += 0.0
    parts[4] += 0.0
    return parts


def _pair(a: Any, b: Any, dtypes: Any) -> tuple[int, int, int] | None:
    """(a's address, b's, their numel) for two plain CPU tensors of one dtype among `dtypes`, one
    shape and one dense memory layout, holding 1 to KERNEL_MAX_ELEMENTS elements; else None."""
    dtype = a.dtype
    if b.dtype is not dtype or dtype not in dtypes or a.shape != b.shape:
        return None
    n = _numel(a)
    if not 0 < n <= KERNEL_MAX_ELEMENTS or not plain_cpu_pair(a, b):
        return None
    if not (_is_contiguous(a) and _is_contiguous(b)) and not (_stride(a) == _stride(b) and _dense(a)):
        return None  # both must cover their memory densely in one order: the kernels walk them by address
    try:
        return _data_ptr(a), _data_ptr(b), n
    except RuntimeError:  # no storage (a transform's tensor that passed for plain): the other paths
        return None


def _dense(t: Any) -> bool:
    if _is_contiguous(t):
        return True
    expected = 1  # dims by stride (a tie's order decides nothing: two sizes > 1 at one stride fail either way)
    for stride, size in sorted(zip(_stride(t), t.shape)):
        if size != 1 and stride != expected:
            return False
        expected *= size
    return True
