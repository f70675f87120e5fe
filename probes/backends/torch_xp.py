"""An array-API-style namespace over torch's C functions, for formulas that must not see user
patches of the torch module.

User code (and seeded defects in tests) may replace ``torch.sum`` or ``torch.mul`` with its own
function; array-api-compat's torch namespace looks those attributes up at call time, so a probe's
figures would silently go through the user's code. The functions here are bound once to
``torch._C._VariableFunctions`` and to Tensor methods, which such patches leave alone. Only what
probes/core/scaled.py uses is provided, with array-API names and semantics, plus the batched
reductions grad_probe's statistics take over a step's gradients (``extrema`` and ``norms``:
one ``_foreach`` kernel call for many tensors instead of several calls per tensor).
"""

from __future__ import annotations

from typing import Any

import torch

_C = torch._C._VariableFunctions

float32 = torch.float32
float64 = torch.float64


def reshape(x: Any, shape: Any) -> Any:
    return x.reshape(shape)


def astype(x: Any, dtype: Any, copy: bool = True) -> Any:  # noqa: FBT001
    return x.to(dtype)


def isfinite(x: Any) -> Any:
    return _C.isfinite(x)


def isnan(x: Any) -> Any:
    return _C.isnan(x)


def where(cond: Any, x: Any, y: Any) -> Any:
    return _C.where(cond, x, y)


def zeros_like(x: Any) -> Any:
    return _C.zeros_like(x)


def sum(x: Any, axis: Any = None) -> Any:  # noqa: A001
    return _C.sum(x) if axis is None else _C.sum(x, axis)


def max(x: Any, axis: Any = None) -> Any:  # noqa: A001
    return _C.amax(x) if axis is None else _C.amax(x, axis)


def min(x: Any, axis: Any = None) -> Any:  # noqa: A001
    return _C.amin(x) if axis is None else _C.amin(x, axis)


def sqrt(x: Any) -> Any:
    return _C.sqrt(x)


def abs(x: Any) -> Any:  # noqa: A001
    return _C.abs(x)


def maximum(x: Any, y: Any) -> Any:
    if not isinstance(y, torch.Tensor):
        return _C.clamp_min(x, y)
    if not isinstance(x, torch.Tensor):
        return _C.clamp_min(y, x)
    return _C.maximum(x, y)


def stack(xs: Any, axis: int = 0) -> Any:
    return _C.stack([x if isinstance(x, torch.Tensor) else torch.tensor(x) for x in xs], axis)


# one-pass forms the core uses when a namespace offers them (probes/core/scaled.py)
def max_abs(x: Any) -> Any:
    lo, hi = _C.aminmax(x)
    return _C.maximum(hi, -lo)


def root_mean_square(x: Any) -> Any:
    return torch._C._linalg.linalg_vector_norm(x, 2) / ((x.numel() or 1) ** 0.5)


# batched reductions over a list of non-empty tensors of one device and dtype (probes/grad_probe/stats.py)
def extrema(xs: list, dtype: Any) -> Any:
    """(2, len(xs)): the max of each tensor, then its min (one aminmax pass over each tensor,
    one stack for all)."""
    pairs = [v for x in xs for v in reversed(_C.aminmax(x))]
    return _C.stack(pairs).to(dtype).reshape(-1, 2).T


def norms(xs: list, dtype: Any) -> Any:
    return _C.stack(_C._foreach_norm(xs, 2, dtype=dtype))
