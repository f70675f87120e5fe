"""What OnlineDispatchMode needs to know about an overload and an op call's tensor types.

Worked out once per overload (`OpInfo`, cached by the mode), so that an op call pays one dict
lookup for its skip decision, its CPU reference and which arguments it writes.
"""

from __future__ import annotations

from typing import Any

import torch

from probes.backends import npu_references, torch_dtensor
from probes.online_dispatch import reference, skip_list

# subclasses that run only under their own mode (a tracer's): they cannot take an op back, and
# have no values to compare
_MODE_BOUND = ("FakeTensor", "FunctionalTensor")


def dispatching_subclass(types: Any) -> bool:
    """A subclass among the op's tensor types that takes the op back when the mode declines it:
    one with its own __torch_dispatch__, not a tracer's, not a device stand-in."""
    own = [t for t in types if getattr(t, "__torch_dispatch__", _PLAIN_DISPATCH) is not _PLAIN_DISPATCH
           and not getattr(t, "__simulated_device__", None)]
    return bool(own) and not any(c.__name__ in _MODE_BOUND for t in own for c in t.__mro__)


_PLAIN_DISPATCH = torch.Tensor.__torch_dispatch__


def has_dtensor(types: Any) -> bool:
    """A DTensor among the op's types: its local kernels come back here on each rank's shards."""
    dtensor = torch_dtensor.dtensor_class()
    return dtensor is not None and any(issubclass(t, dtensor) for t in types)


class OpInfo:
    """What the mode needs about one overload, computed once."""

    __slots__ = ("api", "overload", "half_to_float", "written", "skip", "on_host", "per_call", "chained", "name",
                 "rounded_once", "mutates", "native", "positions")

    def __init__(self, func: Any) -> None:
        self.name = str(func)  # the summary's and the error records' key, once (str() of an overload is not free)
        self.overload = func._overloadname
        self.skip = skip_list.skip_reason(func)
        self.per_call = skip_list.call_rule(func)  # attention: skipped only when the call drops out
        self.chained = skip_list.chains_roundings(func)
        self.rounded_once = reference.rounds_once(func)  # the FP8 matmuls: their own floor (verdict.rows)
        self.api = func._opname
        self.on_host = reference.host_reference(func) or func
        if func.namespace == "npu":  # torch_npu's fused ops: no CPU kernel, their math is the reference
            self.api = f"NPU.{func._opname}"
            self.on_host = npu_references.reference_for(func._opname)
            if self.on_host is None and self.skip is None:
                self.skip = skip_list.NO_CPU_REFERENCE
        compared = self.skip is None or self.per_call is not None
        self.half_to_float = reference.half_to_float_index(func) if compared else None
        self.written = reference.written_arguments(func) if compared else ((), ())
        # writes into an argument (compared or not): ops judged later must be judged first, as
        # they may read what this op changes
        self.mutates = any(a.alias_info is not None and a.alias_info.is_write for a in func._schema.arguments)
        # the reference runner's index of the overload (native_jobs); None until asked, -1: not
        # an op the runner re-runs (its reference is not the op itself, it writes, or it is not
        # an aten op: a custom op's kernel may be Python, which belongs on the user's thread)
        self.native: int | None = None if (self.on_host is func and not self.mutates
                                           and func.namespace == "aten") else -1
        self.positions = {a.name: i for i, a in enumerate(func._schema.arguments)}  # keyword -> schema position
