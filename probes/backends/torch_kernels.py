"""The host arrays' C kernels (host_kernels.py) on plain CPU tensors' memory, by address.

A checked call's perturbation and its output pair's ratio figures run here first: no NumPy view,
no detach, no tensor made back from an array (those cost ~10 us a call around a ~10 us kernel),
and no size limit below torch's own kernels' (one pass over the elements beats torch's several at
any size a call's output has on one thread). A tensor the kernels cannot walk (another device, a
subclass, a transform's wrapper, gaps in its memory, the kernels not built) gets None: the caller
takes the NumPy or torch path, whose results are the same.
"""

from __future__ import annotations

from typing import Any

import torch

from probes.backends import host_kernels
from probes.backends.torch_host import plain_cpu

#: past this many elements torch's multi-threaded kernels may be the faster (an output this large
#: also costs its re-run far more than its figures)
KERNEL_MAX_ELEMENTS = 1 << 22
_RATIO_DTYPES = frozenset({torch.float32, torch.float64})
_EQUAL_KINDS = {torch.float32: "f32", torch.float64: "f64", torch.float16: "f16", torch.bfloat16: "bf16",
                **{t: "bytes" for t in (torch.bool, torch.uint8, torch.int8, torch.int16, torch.int32, torch.int64)}}
_BIT_WIDTHS = {torch.float16: 2, torch.bfloat16: 2, torch.float32: 4, torch.float64: 8}

# torch's C methods: while a probe runs, the Python-level names are its pass-through wrappers
_T = torch._C.TensorBase
_data_ptr, _numel, _stride, _is_contiguous = _T.data_ptr, _T.numel, _T.stride, _T.is_contiguous
_empty_like = torch._C._VariableFunctions.empty_like


def ratio_figures(a: Any, b: Any, tol: float) -> list[float] | None:
    """[max r, min r, min a*b] (metrics.ratio_reductions) of two plain CPU float32 or float64
    tensors of one dtype, shape and memory layout, or None."""
    if a.dtype is not b.dtype or a.dtype not in _RATIO_DTYPES or a.shape != b.shape:
        return None
    n = _numel(a)
    if not 0 < n <= KERNEL_MAX_ELEMENTS or not (plain_cpu(a) and plain_cpu(b)) or not _same_dense(a, b):
        return None
    try:
        where = _data_ptr(a), _data_ptr(b)
    except RuntimeError:  # no storage (a transform's tensor that passed for plain): the other paths
        return None
    return host_kernels.ratio_figures(a.element_size(), *where, n, tol)


def band_edited(t: Any, op: str, above: int, below: int) -> Any:
    """A new tensor of t's dtype and layout whose elements' bit patterns are t's, `op` ("add" or
    "bitwise_xor") 1 where above < the magnitude code < below; None where the kernels cannot."""
    itemsize = _BIT_WIDTHS.get(t.dtype)
    n = _numel(t)
    if itemsize is None or not 0 < n <= KERNEL_MAX_ELEMENTS or not plain_cpu(t) or not _dense(t):
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
    n = _numel(a)
    if kind is None or a.dtype is not b.dtype or a.shape != b.shape or not 0 < n <= KERNEL_MAX_ELEMENTS:
        return None
    if not (plain_cpu(a) and plain_cpu(b)) or not _same_dense(a, b):
        return None
    try:
        where = _data_ptr(a), _data_ptr(b)
    except RuntimeError:  # no storage (a transform's tensor that passed for plain): the other paths
        return None
    return host_kernels.all_equal(kind, *where, n * a.element_size() if kind == "bytes" else n)


def _same_dense(a: Any, b: Any) -> bool:
    """Both cover their memory densely in one order, element i of one beside element i of the
    other: the kernels may walk them by address."""
    if _is_contiguous(a) and _is_contiguous(b):
        return True
    return _stride(a) == _stride(b) and _dense(a)


def _dense(t: Any) -> bool:
    if _is_contiguous(t):
        return True
    expected = 1
    for size, stride in sorted(zip(t.shape, _stride(t)), key=lambda d: d[1]):
        if size != 1 and stride != expected:
            return False
        expected *= size
    return True
