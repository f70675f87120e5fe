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
    if type(a) is not torch.Tensor and type(a) is not torch.nn.Parameter:
        return None
    if type(b) is not torch.Tensor and type(b) is not torch.nn.Parameter:
        return None
    if a.device.type != "cpu" or b.device.type != "cpu" or a.layout != torch.strided or b.layout != torch.strided:
        return None
    if a.dtype != b.dtype or a.shape != b.shape or a.is_conj() or b.is_conj() or a.is_neg() or b.is_neg():
        return None
    if _wrapped(a) or _wrapped(b):  # a torch.func transform's level: its values are not these
        return None
    try:
        if a.numel() >= _NUMPY_FROM and a.dtype in _NUMPY_DTYPES:
            return bool((a.detach().numpy() == b.detach().numpy()).all())
        return torch.equal(a, b)
    except (RuntimeError, TypeError):  # a tensor NumPy cannot view: the device path measures it
        return None


def _wrapped(t: torch.Tensor) -> bool:
    is_wrapped = getattr(torch._C._functorch, "is_functorch_wrapped_tensor", None)
    return is_wrapped is not None and is_wrapped(t)
