"""Whether two CPU tensors are equal, answered on the host at once: the common case of a
no_change re-run, and of integer and bool outputs, which match exactly almost always.

On the CPU there is no transfer to batch: the answer is already on the host, and a device
scalar of the differing count (`(a != b).sum()`) costs a bool temporary, a reduction and two
casts, about 50-100 us for a 32K-element output on an AVX2 CPU, where this costs 1-30 us
(NumPy's comparison for larger arrays, torch.equal for small ones). The semantics are those of
`a != b`: NaN differs from NaN, -0.0 equals 0.0; tensors this cannot read plainly (a subclass, a
sparse or conjugate view, another device) get None and take the device path.
"""

from __future__ import annotations

from typing import Any

import torch

#: from this many elements, NumPy's vectorised comparison beats torch.equal on the CPU
_NUMPY_FROM = 4096
_NUMPY_DTYPES = frozenset({torch.float16, torch.float32, torch.float64, torch.bool, torch.int8, torch.uint8,
                           torch.int16, torch.int32, torch.int64})


def host_equal(a: Any, b: Any) -> bool | None:
    """True/False when `a` and `b` are plain strided CPU tensors of one dtype and shape (every
    element equal by value), None when the caller must measure them on the device."""
    kind = type(a)
    if kind is not torch.Tensor and kind is not torch.nn.Parameter:
        return None
    kind = type(b)
    if kind is not torch.Tensor and kind is not torch.nn.Parameter:
        return None
    if not (a.is_cpu and b.is_cpu) or a.layout is not _STRIDED or b.layout is not _STRIDED:
        return None
    if a.dtype is not b.dtype or a.shape != b.shape or a.is_conj() or b.is_conj() or a.is_neg() or b.is_neg():
        return None
    if _IS_WRAPPED is not None and (_IS_WRAPPED(a) or _IS_WRAPPED(b)):  # a torch.func transform's level:
        return None  # its values are not these
    try:
        if a.numel() >= _NUMPY_FROM and a.dtype in _NUMPY_DTYPES:
            return bool((a.detach().numpy() == b.detach().numpy()).all())
        return torch.equal(a, b)
    except (RuntimeError, TypeError):  # a tensor NumPy cannot view: the device path measures it
        return None


_STRIDED = torch.strided
_IS_WRAPPED = getattr(torch._C._functorch, "is_functorch_wrapped_tensor", None)
