"""The documented rule's figures of one op's output pairs, in as few passes and calls as the
formulas allow.

This runs for every output of every compared op, so on a model of small tensors the cost of a
call (a few microseconds in Python) weighs as much as its arithmetic. A float32, float64 or
bfloat16 leaf on the CPU, contiguous, with its float64 reference, is read once by a C kernel
(torch_kernels.dispatch_parts: the difference, its extrema and three sums, without writing a
float64 difference, which cost more than reading either side), its sums kept in a fixed order
(four partial sums) that NumPy reproduces where no compiler is found. Other leaves pay five torch
calls (the float64 difference, three dot products, one pass for the largest and smallest
element), or are measured chunk by chunk by the core (`leaf_figure_parts`) past `CHUNK_ELEMENTS`.
The five results are finished as probes.core.dispatch_figures.figures_from_parts finishes them.

The one-pass figures differ from the core's formulas (`leaf_figures`) only in the last digits of
the three sums (another summation order than the BLAS dot's); the torch calls' figures equal
them. A MaxAbsErr of zero is always +0.0: the largest and smallest element may be either zero of
a difference holding both +0.0 and -0.0.

Batching the pairs of many ops into one set of calls (segment reductions over a step) was
measured and is slower: the pairs of a step do not fit in the cache, and a reduction over them
reads memory where the per-op calls read the cache the op has just written (100 leaves of 32768
elements: 0.86 ms per leaf batched, 0.04 ms per op).
"""

from __future__ import annotations

from typing import Any

import torch

from probes.backends import torch_kernels
from probes.backends.torch_backend import BACKEND
from probes.core import dispatch_figures as df

_F64 = torch.float64
# device dtypes torch.sub widens to float64 itself (others, FP8 and bool among them, do not promote)
_PROMOTING = frozenset({torch.float16, torch.bfloat16, torch.float32, torch.float64})
# from this many elements on, the difference is taken as a cast then a same-dtype subtraction
_WIDEN_APART = 4096
def _parts(dev: torch.Tensor, ref: torch.Tensor) -> list[torch.Tensor]:
    """[ref.ref, ref.diff, diff.diff, max diff, min diff] of a flat pair, 0-d float64 tensors."""
    if ref.dtype is not _F64:
        ref = ref.double()
    if dev.dtype is _F64 or (dev.dtype in _PROMOTING and dev.shape[0] < _WIDEN_APART):
        diff = torch.sub(dev, ref)  # float64: never a view of the user's tensor
    else:  # a plain cast (a new tensor: the dtype differs) and a float64 subtraction beat torch.sub's mixed dtypes
        diff = dev.double()
        diff.sub_(ref)
    low, top = torch.aminmax(diff)
    return [ref @ ref, ref @ diff, diff @ diff, top, low]


def leaf_figures(pairs: list[tuple[torch.Tensor, torch.Tensor]],
                 known: dict[int, tuple[torch.Tensor, Any]] | None = None) -> list[list[float]]:
    """Host df.FIGURE_COUNT figures of every (device, reference) pair (equal numel > 0, on the
    CPU, so each 0-d result is read with item(): cheaper than stacking them for one transfer).
    `known`: the one pass's parts of pairs the reference runner measured (native_jobs.known_parts)."""
    out = []
    xp = None
    for d, r in pairs:
        parts = None
        if known:
            hit = known.get(id(r))
            if hit is not None and (hit[0] is d or (hit[0].data_ptr() == d.data_ptr() and hit[0].dtype is d.dtype)):
                parts = hit[1]
        if parts is not None:  # (no reshape: a view costs microseconds, and only its count is read)
            numel = d.numel()
        else:
            if d.dim() != 1:
                d = d.reshape(-1)
            if r.dim() != 1:
                r = r.reshape(-1)
            numel = d.shape[0]
            parts = torch_kernels.dispatch_parts(d, r)
        if parts is not None:
            figs = df.figures_of_sums(parts, numel)
            figs[df.MAX_ABS] += 0.0
        elif numel <= df.CHUNK_ELEMENTS:
            figs = df.figures_from_parts([p.item() for p in _parts(d, r)], numel)
            figs[df.MAX_ABS] += 0.0  # -0.0 -> +0.0 (module docstring)
        else:
            xp = xp if xp is not None else BACKEND.namespace(None)
            figs = df.figures_from_parts([p.item() for p in df.leaf_figure_parts(xp, d, r)], numel)
            figs[df.MAX_ABS] += 0.0
        out.append(figs)
    return out
