"""The documented rule's figures of one op's output pairs, in as few torch calls as the formulas allow.

This runs for every output of every compared op, so on a model of small tensors the cost of a
call (a few microseconds in Python) weighs as much as its arithmetic. A leaf of at most
`CHUNK_ELEMENTS` pays five calls: the float64 difference (one pass, the device leaf widened
exactly on the way), three dot products and one pass for its largest and smallest element; the
op's leaves then go to the host in one transfer, where the figures are finished as
probes.core.dispatch_figures.figures_from_parts finishes them. Larger leaves are measured chunk
by chunk by the core (`leaf_figure_parts`), where the arithmetic outweighs the calls.

The values equal the core's (`leaf_figures`: the same float64 roundings in the same order), except
that a MaxAbsErr of zero is always +0.0: the largest and smallest element come from one
reduction here, which may pick the other zero of a difference holding both +0.0 and -0.0.

Batching the pairs of many ops into one set of calls (segment reductions over a step) was
measured and is slower: the pairs of a step do not fit in the cache, and a reduction over them
reads memory where the per-op calls read the cache the op has just written (100 leaves of 32768
elements: 0.86 ms per leaf batched, 0.04 ms per op).
"""

from __future__ import annotations

import torch

from probes.backends.torch_backend import BACKEND
from probes.core import dispatch_figures as df

_F64 = torch.float64
# device dtypes torch.sub widens to float64 itself (others, FP8 and bool among them, do not promote)
_PROMOTING = frozenset({torch.float16, torch.bfloat16, torch.float32, torch.float64})
# from this many elements on, the difference is taken as a cast then a same-dtype subtraction
_WIDEN_APART = 8192


def _parts(dev: torch.Tensor, ref: torch.Tensor) -> list[torch.Tensor]:
    """[ref.ref, ref.diff, diff.diff, max diff, min diff] of a flat pair, 0-d float64 tensors."""
    if dev.dtype not in _PROMOTING:
        dev = dev.to(_F64)
    if ref.dtype != _F64:
        ref = ref.to(_F64)
    if dev.shape[0] < _WIDEN_APART:
        diff = torch.sub(dev, ref)  # float64: never a view of the user's tensor
    else:  # on larger leaves a plain cast and a float64 subtraction beat torch.sub's mixed dtypes
        diff = dev.to(_F64, copy=True)
        diff.sub_(ref)
    low, top = torch.aminmax(diff)
    return [ref @ ref, ref @ diff, diff @ diff, top, low]


def leaf_figures(pairs: list[tuple[torch.Tensor, torch.Tensor]]) -> list[list[float]]:
    """Host df.FIGURE_COUNT figures of every (device, reference) pair (equal numel > 0, on the
    CPU), one transfer."""
    parts: list[torch.Tensor] = []
    xp = None
    for d, r in pairs:
        d, r = d.reshape(-1), r.reshape(-1)
        if d.shape[0] <= df.CHUNK_ELEMENTS:
            parts += _parts(d, r)
        else:
            xp = xp if xp is not None else BACKEND.namespace(None)
            parts += df.leaf_figure_parts(xp, d, r)
    flat = torch.stack(parts).tolist()
    out, at = [], 0
    for d, _r in pairs:
        numel = d.numel()
        count = df.part_count(numel)
        figs = df.figures_from_parts(flat[at : at + count], numel)
        figs[df.MAX_ABS] += 0.0  # -0.0 -> +0.0 (module docstring)
        out.append(figs)
        at += count
    return out
