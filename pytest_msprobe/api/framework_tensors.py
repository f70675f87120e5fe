"""numpy arrays of exact values -> torch or MindSpore tensors of the same values, bit for bit.

Why a module of its own: it is the only code here that touches a framework, and it imports each
one lazily, when a tensor is built, so the strategies import without torch and without MindSpore.
"""

from __future__ import annotations

from typing import Any, Callable

import numpy as np

from pytest_msprobe.api import bfloat16_bits as bf16
from pytest_msprobe.api.tensor_dtypes import resolve_dtype, resolve_framework

__all__ = ["to_tensor", "converter"]


def to_tensor(a: np.ndarray, dtype: Any, device: str = "cpu", framework: str | None = None) -> Any:
    """A framework tensor of `dtype` holding the values of `a` (from `arrays`/`array_spec`) exactly."""
    name, from_dtype = resolve_dtype(dtype)
    return converter(resolve_framework(framework, from_dtype, dtype), name, device)(a)


def converter(framework: str, name: str, device: str) -> Callable[[np.ndarray], Any]:
    """The array -> tensor function for a resolved framework and dtype name: `tensors` maps its
    array strategy through it, deciding the framework once rather than per example."""
    if framework == "torch":
        return lambda a: _to_torch(a, name, device)
    return lambda a: _to_mindspore(a, name)


def _to_torch(a: np.ndarray, name: str, device: str) -> Any:
    import torch

    if name == "bfloat16":  # the top half of each float32 is the bf16 bit pattern
        t = torch.from_numpy(bf16.top_halves(a)).view(torch.bfloat16)
    else:
        t = torch.from_numpy(np.array(a, copy=True))
    return t if device == "cpu" else t.to(device)


_MS_READY = False


def _to_mindspore(a: np.ndarray, name: str) -> Any:
    global _MS_READY
    import mindspore as ms

    if not _MS_READY:
        from probes.backends.mindspore_xp import warm_up

        warm_up()
        _MS_READY = True
    t = ms.Tensor(np.array(a, copy=True))
    if name == "bfloat16":  # exact: the float32 values are bf16 values
        t = t.astype(ms.bfloat16)
    return t
