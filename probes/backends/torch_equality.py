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

from probes.backends import torch_kernels
from probes.backends.torch_host import NUMPY_DTYPES, as_numpy, plain_cpu

#: from this many elements, NumPy's vectorised comparison beats torch.equal on the CPU
_NUMPY_FROM = 4096


def host_equal(a: Any, b: Any) -> bool | None:
    """True/False when `a` and `b` are plain strided CPU tensors of one dtype and shape (every
    element equal by value), None when the caller must measure them on the device."""
    same = torch_kernels.all_equal(a, b)  # the C kernel, one pass by address
    if same is not None:
        return same
    if a.dtype is not b.dtype or not (plain_cpu(a) and plain_cpu(b)) or a.shape != b.shape:
        return None
    try:
        if a.numel() >= _NUMPY_FROM and a.dtype in NUMPY_DTYPES:
            return bool((as_numpy(a) == as_numpy(b)).all())
        return torch.equal(a, b)
    except (RuntimeError, TypeError):  # a tensor NumPy cannot view: the device path measures it
        return None
