"""Seeded precision defects for the API catalogue's tests: kernels that lose precision the way
real device kernels do, patched onto public torch names (the catalogue calls them at call time).
Each is wrong only in the dtype it targets, so the float64 reference stays exact.

Also a pytest plugin (``-p seeded_catalogue``): MSPROBE_SEEDED_DEFECT=rsqrt|sum|matmul patches
one of them for the whole run."""

from __future__ import annotations

import os

import torch

_ORIGINAL = {"rsqrt": torch.rsqrt, "sum": torch.sum, "matmul": torch.matmul}


def rsqrt_through_bfloat16(x, *args, **kwargs):
    """float32 rsqrt computed in a bfloat16 intermediate and returned as float32."""
    if isinstance(x, torch.Tensor) and x.dtype == torch.float32:
        return _ORIGINAL["rsqrt"](x.to(torch.bfloat16), *args, **kwargs).to(torch.float32)
    return _ORIGINAL["rsqrt"](x, *args, **kwargs)


def sum_accumulating_in_bfloat16(x, dim=None, keepdim=False, *, dtype=None, out=None):
    """bfloat16 sum whose running total is itself bfloat16 (every addition rounds), one term
    after the other, instead of accumulating in float32."""
    if not (isinstance(x, torch.Tensor) and x.dtype == torch.bfloat16 and dtype is None and out is None):
        kwargs = {} if dtype is None else {"dtype": dtype}
        if dim is None:
            return _ORIGINAL["sum"](x, **kwargs)
        return _ORIGINAL["sum"](x, dim, keepdim, **kwargs) if out is None else _ORIGINAL["sum"](x, dim, keepdim, out=out)
    dims = tuple(range(x.dim())) if dim is None or dim == () or dim == [] else (
        (dim,) if isinstance(dim, int) else tuple(dim))
    dims = tuple(sorted(d % max(x.dim(), 1) for d in dims)) if x.dim() else ()
    kept = [d for d in range(x.dim()) if d not in dims]
    moved = x.permute(*kept, *dims).reshape(*[x.shape[d] for d in kept], -1) if x.dim() else x.reshape(1)
    acc = torch.zeros(moved.shape[:-1], dtype=torch.bfloat16)
    for i in range(moved.shape[-1]):
        acc = acc + moved[..., i]
    if keepdim and dim is not None:
        for d in dims:
            acc = acc.unsqueeze(d)
    return acc


def _tf32(t: torch.Tensor) -> torch.Tensor:
    """float32 rounded to TF32's 10 explicit significand bits (to nearest)."""
    bits = t.contiguous().view(torch.int32)
    return ((bits + 0x1000) & ~0x1FFF).view(torch.float32)


def matmul_in_tf32(a, b, *args, **kwargs):
    """float32 matmul whose inputs are rounded to TF32 first, as a TF32 / HF32 tensor core does."""
    if isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor) and a.dtype == b.dtype == torch.float32:
        return _ORIGINAL["matmul"](_tf32(a), _tf32(b), *args, **kwargs)
    return _ORIGINAL["matmul"](a, b, *args, **kwargs)


DEFECTS = {"rsqrt": rsqrt_through_bfloat16, "sum": sum_accumulating_in_bfloat16, "matmul": matmul_in_tf32}


def pytest_configure(config):
    name = os.environ.get("MSPROBE_SEEDED_DEFECT")
    if name:
        setattr(torch, name, DEFECTS[name])
