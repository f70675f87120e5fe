"""What a rank holds of a sharded (DTensor) tensor, without gathering it.

FSDP2, tensor parallelism and both on a 2-D mesh give every parameter, and its gradient, as a
``DTensor``: each rank holds a local tensor and the placements say how the local tensors make the
full one (``Shard``: a slice; ``Replicate``: a copy on every rank of that mesh dimension;
``Partial``: a summand). A monitor that describes the full parameter takes its statistics on the
local tensors and combines them across ranks; for that it needs, per tensor, the plain local
tensor, whether this rank's values are the ones to count (one copy of each replicated slice),
where the slice sits in the full tensor (to reassemble direction data offline) and the process
groups to combine over.

Everything here is local except :func:`reduce_figures` and the reduction of a ``Partial``
gradient (:func:`describe`): both are collectives, and a caller issues them on every rank of the
mesh in the same order (the parameters' order, the same on every rank), never on a decision one
rank takes alone. torch.distributed is imported only when a DTensor is seen.
"""

from __future__ import annotations

import weakref
from collections.abc import Sequence
from typing import Any, NamedTuple, Protocol

import torch

from probes.backends.torch_dtensor import dtensor_class

__all__ = ["DTENSOR_PARAMS", "PartitionedParams", "Slice", "describe", "groups_of", "is_sharded", "reduce_figures"]

#: the global indices of a slice along one dimension: a ``range`` when contiguous, else the
#: explicit indices (strided shards, as FSDP2 on top of tensor parallelism may give)
DimIndex = range | tuple[int, ...]


class Slice(NamedTuple):
    """This rank's part of one sharded tensor."""

    local: torch.Tensor  # plain tensor: what this rank holds
    shape: tuple[int, ...]  # the full tensor's shape
    # per dimension, the global indices held; or a range of positions in the flattened full
    # tensor (partitioned optimizers split the flat parameter); None: unknown
    index: tuple[DimIndex, ...] | range | None
    counted: bool  # this rank's values count once in the full tensor's figures
    groups: tuple[Any, ...]  # the process groups to combine over, in order (None: the default group)
    in_mesh: bool  # this rank is part of the tensor's mesh


class PartitionedParams(Protocol):
    """How an engine that splits parameters across ranks says what this rank holds of one: the
    parameters it owns, the process groups their figures combine over, and this rank's slice of
    a parameter's gradient (None: no gradient on this rank). ``slice`` may be a collective (the
    caller calls it on every rank, for the same parameters in the same order)."""

    def owns(self, p: Any) -> bool: ...

    def groups(self, p: Any) -> tuple[Any, ...]: ...

    def slice(self, p: Any) -> Slice | None: ...


class _DTensorParams:
    """FSDP2 and tensor parallelism: the parameter and its gradient are DTensors."""

    def owns(self, p: Any) -> bool:
        return is_sharded(p)

    def groups(self, p: Any) -> tuple[Any, ...]:
        return groups_of(p)

    def slice(self, p: Any) -> Slice | None:
        g = getattr(p, "main_grad", None)
        g = p.grad if g is None else g
        return None if g is None else describe(g.detach())


DTENSOR_PARAMS: PartitionedParams = _DTensorParams()


def is_sharded(t: Any) -> bool:
    """Whether ``t`` is a DTensor (cheap: torch.distributed is never imported for it)."""
    dtensor = dtensor_class()
    return dtensor is not None and isinstance(t, dtensor)


def describe(t: Any) -> Slice:
    """The :class:`Slice` of DTensor ``t`` held by this rank.

    A ``Partial`` placement (a summand on each rank) is reduced first, by a reduce-scatter along
    the tensor's longest dimension (a slice per rank, never the full tensor on one rank; a 0-d
    tensor is all-reduced): a collective, so every rank of the mesh must call this for the same
    tensors in the same order.
    """
    from torch.distributed.tensor import Replicate, Shard

    placements = tuple(t.placements)
    if any(p.is_partial() for p in placements):
        into = Shard(max(range(t.ndim), key=lambda d: t.shape[d])) if t.ndim else Replicate()
        placements = tuple(into if p.is_partial() else p for p in placements)
        t = t.redistribute(t.device_mesh, placements)
    shape = tuple(int(s) for s in t.shape)
    try:
        known = _LAYOUTS.setdefault(t.device_mesh, {})
    except TypeError:  # a mesh that cannot be weakly referenced: worked out every time
        known = {}
    layout = known.get((placements, shape))
    if layout is None:  # the same for every step of a parameter: worked out once
        layout = known[(placements, shape)] = _layout(t, placements, shape)
    return Slice(t._local_tensor, shape, *layout)


#: mesh -> {(placements, shape): the rest of a Slice}
_LAYOUTS: weakref.WeakKeyDictionary[Any, dict[tuple[Any, ...], tuple[Any, bool, tuple[Any, ...], bool]]] = (
    weakref.WeakKeyDictionary())


def _layout(t: Any, placements: tuple[Any, ...], shape: tuple[int, ...]) -> tuple[Any, bool, tuple[Any, ...], bool]:
    mesh = t.device_mesh
    coordinate = mesh.get_coordinate()
    if coordinate is None:
        return None, False, (), False
    counted = all(c == 0 for c, p in zip(coordinate, placements) if not _shard_like(p))
    return _global_index(shape, mesh, placements, coordinate), counted, groups_of(t), True


def _shard_like(p: Any) -> bool:
    return p.is_shard() or type(p).__name__ == "_StridedShard"


def groups_of(t: Any) -> tuple[Any, ...]:
    """The process groups whose all-reduces, in turn, combine over every rank of DTensor ``t``'s mesh: the
    default group when the mesh is the whole job, else one per mesh dimension (groups the mesh
    created already: making a new group is itself a collective of the whole job)."""
    import torch.distributed as dist

    mesh = t.device_mesh
    if mesh.get_coordinate() is None:  # this rank holds nothing of it and is in none of its groups
        return ()
    if mesh.size() == dist.get_world_size():
        return (None,)
    return tuple(mesh.get_group(d) for d in range(mesh.ndim))


def _global_index(shape: tuple[int, ...], mesh: Any, placements: Sequence[Any],
                  coordinate: Sequence[int]) -> tuple[DimIndex, ...] | None:
    """Per dimension, the global indices of this rank's slice: placements applied left to right
    as DTensor applies them, strided shards included. None when torch's helpers are not there."""
    try:
        from torch.distributed.tensor._utils import _get_shard_size_and_offsets
    except ImportError:  # pragma: no cover - another torch version: the contiguous form only
        return _contiguous_index(shape, mesh, placements)
    local = list(shape)
    offsets: dict[int, Any] = {}
    for mesh_dim, p in enumerate(placements):
        if not _shard_like(p):
            continue
        size, index = _get_shard_size_and_offsets(local[p.dim], mesh.shape[mesh_dim], coordinate[mesh_dim], p,
                                                  offsets.get(p.dim), shape[p.dim], False)
        local[p.dim] = size
        offsets[p.dim] = index if size else torch.arange(0)
    out: list[DimIndex] = []
    for d, n in enumerate(shape):
        index = offsets.get(d)
        if index is None:
            out.append(range(n))
            continue
        values = [int(i) for i in index.tolist()]
        if not values:
            out.append(range(0))
        elif values == list(range(values[0], values[0] + len(values))):
            out.append(range(values[0], values[0] + len(values)))
        else:
            out.append(tuple(values))
    return tuple(out)


def _contiguous_index(shape: tuple[int, ...], mesh: Any, placements: Sequence[Any]) -> tuple[DimIndex, ...] | None:
    try:
        from torch.distributed.tensor._utils import compute_local_shape_and_global_offset

        local, offset = compute_local_shape_and_global_offset(shape, mesh, placements)
    except Exception:  # pragma: no cover - defensive
        return None
    return tuple(range(o, o + n) for o, n in zip(offset, local))


def reduce_figures(sums: torch.Tensor, extremes: torch.Tensor | None, groups: Sequence[Any]) -> None:
    """All-reduce, in place, the summable figures (sum) and the extremes (max, when given) of a
    step's sharded tensors over ``groups`` in turn: one or two small all-reduces per group, issued
    together."""
    import torch.distributed as dist

    for group in groups:
        pending = [dist.all_reduce(sums, op=dist.ReduceOp.SUM, group=group, async_op=True)]
        if extremes is not None:
            pending.append(dist.all_reduce(extremes, op=dist.ReduceOp.MAX, group=group, async_op=True))
        for work in pending:
            work.wait()
