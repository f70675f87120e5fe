"""What a rank holds of a parameter DeepSpeed ZeRO partitions, read without any collective.

Under ZeRO stages 1, 2 and 3 the model's parameters have no ``.grad`` when the optimizer steps:
DeepSpeed flattens each parameter group, splits the flat buffer evenly between the ranks of the
data-parallel group (the last rank's part padded) and steps a plain torch optimizer whose
parameters are this rank's flat fp32 partitions. So the torch step pre-hook grad_probe uses sees
that inner optimizer, and each model parameter's gradient exists only as pieces of the ranks'
flat partitions: a contiguous range of the flattened parameter per rank (empty on a rank holding
none of it). This module finds that range and its gradient values on this rank:

* stage 3 (``ds_id`` / ``ds_tensor`` on the parameter): rank ``r`` of the group holds positions
  ``[r * n, (r + 1) * n)`` of the flattened parameter, ``n = partition_numel()``, the padding past
  ``ds_numel`` cut off;
* stages 1 and 2 (``_hp_mapping`` on every parameter of a ZeRO optimizer's groups, None on a rank
  holding none of it): ``lp_fragment_address`` is the range of the flattened parameter, and
  ``hp_fragment_address`` where it sits in the rank's flat partition.

The values are read from the flat partition's ``.grad`` of the group being stepped — what the
optimizer is about to apply, after DeepSpeed's unscaling and clipping — and, for a group DeepSpeed
steps later in the same ``engine.step()`` (several parameter groups), from the gradients as
accumulated, before that group's unscaling and clipping. Nothing here calls DeepSpeed's
``safe_get_full_grad`` or any other function that communicates: the caller combines the ranks'
figures itself, on every rank unconditionally. deepspeed is never imported here; a parameter
carries everything needed.
"""

from __future__ import annotations

import weakref
from collections.abc import Iterable
from typing import Any

import torch

from probes.backends.torch_shards import PartitionedParams, Slice

__all__ = ["ZERO_PARAMS", "continues_step", "steps_for"]


def _stage3(p: Any) -> bool:
    return hasattr(p, "ds_id") and hasattr(p, "ds_tensor")


class _ZeroParams:
    """DeepSpeed ZeRO stages 1-3: this rank's range of each flattened parameter's gradient."""

    def owns(self, p: Any) -> bool:
        # every rank owns every partitioned parameter, even one it holds none of, so that every
        # rank takes part in the exchange of its figures
        return _stage3(p) or hasattr(p, "_hp_mapping")

    def groups(self, p: Any) -> tuple[Any, ...]:
        import torch.distributed as dist

        group = getattr(p, "ds_process_group", None) if _stage3(p) else getattr(p, "_dp_group", None)
        if group is None or dist.get_world_size(group=group) == dist.get_world_size():
            return (None,)
        return (group,)

    def slice(self, p: Any) -> Slice | None:
        if _stage3(p):
            return self._stage3_slice(p)
        return self._fragment_slice(p)

    def _stage3_slice(self, p: Any) -> Slice:
        import torch.distributed as dist

        shape = tuple(int(s) for s in p.ds_shape)
        group = getattr(p, "ds_process_group", None)
        n = int(p.partition_numel())
        start = dist.get_rank(group=group) * n
        held = max(0, min(n, int(p.ds_numel) - start))
        zero = p._z3_optimizer
        sub_group, offset, count = zero.grad_position[zero.get_param_id(p)]
        flat = zero.fp32_partitioned_groups_flat[sub_group]
        if flat.grad is not None:  # the sub-group being stepped: its unscaled, clipped gradient
            grad = flat.grad.narrow(0, offset, count)
        else:  # a sub-group stepped later: the gradient as accumulated (local, no collective)
            grad = zero.get_local_fp32_grad_for_param(p)
            if grad is None:
                raise ValueError("this rank's gradient partition is not available")
        return Slice(grad.reshape(-1)[:held], shape, range(start, start + held), True, self.groups(p), True)

    def _fragment_slice(self, p: Any) -> Slice:
        shape = tuple(int(s) for s in p.shape)
        mapping = p._hp_mapping
        if mapping is None:  # this rank's partition holds none of p: an empty share
            return Slice(torch.zeros(0, device=p.device), shape, range(0, 0), True, self.groups(p), True)
        lp, hp = mapping.lp_fragment_address, mapping.hp_fragment_address
        flat = _flat_partition(mapping)
        if flat is not None and flat.grad is not None:  # the group being stepped
            grad = flat.grad.narrow(0, hp.start, hp.numel)
        else:  # a group stepped later: its gradient fragment as accumulated
            grad = mapping.get_lp_grad_fragment(p._index_in_param_group).reshape(-1)
            if grad.numel() != lp.numel:
                raise ValueError(f"a gradient fragment of {grad.numel()} elements for a range of {lp.numel}")
        return Slice(grad, shape, range(lp.start, lp.start + lp.numel), True, self.groups(p), True)


def _flat_partition(mapping: Any) -> torch.Tensor | None:
    """The rank's flat fp32 partition a stage 1/2 fragment is a view of."""
    return getattr(mapping.hp_fragment, "_base", None)


ZERO_PARAMS: PartitionedParams = _ZeroParams()

#: inner torch optimizer -> this rank's flat partitions it steps, first group first (steps_for)
_FLATS: weakref.WeakKeyDictionary[torch.optim.Optimizer, list[torch.Tensor]] = weakref.WeakKeyDictionary()


def _flats_of(params: Iterable[Any]) -> list[tuple[Any, list[torch.Tensor]]]:
    """(inner optimizer or None, this rank's flat partitions, first group first) of the ZeRO
    optimizers partitioning ``params``: stage 3 says both; a stage 1/2 fragment is a view of its
    group's partition, and the optimizer is found by the partitions it holds."""
    stage3: dict[int, tuple[Any, list[torch.Tensor]]] = {}
    fragments: dict[int, torch.Tensor] = {}
    for p in params:
        zero = getattr(p, "_z3_optimizer", None)
        if zero is not None:
            if id(zero) not in stage3:
                stage3[id(zero)] = (getattr(zero, "optimizer", None), list(zero.fp32_partitioned_groups_flat))
            continue
        mapping = getattr(p, "_hp_mapping", None)
        flat = _flat_partition(mapping) if mapping is not None else None
        if flat is not None:
            fragments.setdefault(int(mapping.param_group_index), flat)
    out = list(stage3.values())
    if fragments:
        out.append((None, [fragments[i] for i in sorted(fragments)]))
    return out


def steps_for(optimizer: torch.optim.Optimizer, params: Iterable[Any]) -> bool:
    """Whether ``optimizer`` is the torch optimizer a ZeRO optimizer steps for some of ``params``:
    its own parameters are flat partitions, never the model's, so a monitor looking for the
    model's parameters in it would not see the step. Never raises (False)."""
    try:
        held = {id(q) for group in optimizer.param_groups for q in group["params"]}
        for inner, flats in _flats_of(params):
            if inner is optimizer or (inner is None and any(id(f) in held for f in flats)):
                _FLATS[optimizer] = flats
                return True
    except Exception:  # an engine this module does not know: not a ZeRO step
        return False
    return False


def continues_step(optimizer: torch.optim.Optimizer) -> bool:
    """Whether this call of ``optimizer.step()`` is a later one of the same ``engine.step()``:
    DeepSpeed steps the inner optimizer once per parameter group (stages 1, 2) or sub-group
    (stage 3), each time holding only that group's partition; only the call for the first group
    is a new step for a monitor. Never raises (False)."""
    try:
        flats = _FLATS.get(optimizer)
        if not flats or len(flats) < 2:
            return False
        first = flats[0]
        return not any(q is first for group in optimizer.param_groups for q in group["params"])
    except Exception:
        return False
