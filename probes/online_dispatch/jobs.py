"""One compared op call between the user's op and its rows, and what the call's judging may hand on.

A call is judged now or later (the reference thread, worker processes), so everything its rows
and dumps need travels with it: `Job` holds it, `snapshot` gives the thread private copies of
what the user may change in place (for a void op, the arguments it wrote: `written_devices`),
and the outcomes other than figures (`ReferenceFailed`, `SKIPPED`) are values rather than
exceptions, so they cross the thread in op order.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

from probes.online_dispatch import dump, reference
from probes.online_dispatch.leaf_pairs import OpComparison
from probes.online_dispatch.op_info import OpInfo


class Job:
    """One compared op call until it is judged (kept for rows and dumps). `prefix` and `cmp` are
    filled in by the mode's `_prepare`, inline or in the reference thread."""

    __slots__ = ("func", "info", "device", "ref", "args", "kwargs", "stack", "prefix", "cmp")

    def __init__(self, func: Any, info: OpInfo, device: torch.device, ref: reference.ReferenceCall,
                 args: tuple, kwargs: dict, stack: tuple | None) -> None:
        self.func, self.info, self.device, self.ref = func, info, device, ref
        self.args, self.kwargs, self.stack = args, kwargs, stack
        self.prefix: str | None = None
        self.cmp: OpComparison | None = None


class ReferenceFailed:
    """The CPU re-run raised: the op has no usable CPU kernel for these arguments."""

    __slots__ = ("exc",)

    def __init__(self, exc: BaseException) -> None:
        self.exc = exc


class Skipped:
    """The op turned out to have no CPU kernel on an earlier call: counted as skipped, no row."""


SKIPPED = Skipped()


def dump_job(run_dir: Path, job: Job) -> None:
    """The .npy files of one judged call: the inputs as the op received them (the pristine copies
    of written arguments), and every measured output leaf on both sides."""
    ref = job.ref
    dump.dump_inputs(run_dir, job.prefix, ref.pristine_args if ref.pristine_args is not None else ref.args,
                     ref.pristine_kwargs if ref.pristine_kwargs is not None else ref.kwargs, job.args, job.kwargs)
    leaves = [(leaf.name, *job.cmp.pairs[leaf.index]) for leaf in job.cmp.outputs if leaf.index >= 0]
    dump.dump_outputs(run_dir, leaves)


def written_devices(info: OpInfo, args: tuple, kwargs: dict) -> list[Any]:
    """The device arguments a void op (``_foreach_add_``) wrote into: its outputs."""
    positions, names = info.written
    return [args[i] for i in positions if i < len(args)] + [kwargs[n] for n in names if n in kwargs]


def written_pairs(info: OpInfo, devices: list[Any], ref: reference.ReferenceCall) -> list[tuple[Any, Any]]:
    """(device, reference) values of the arguments a void op wrote into, in written_devices' order."""
    positions, names = info.written
    refs = [ref.args[i] for i in positions if i < len(ref.args)] + [ref.kwargs[n] for n in names if n in ref.kwargs]
    return list(zip(devices, refs))


def output_bytes(out: Any) -> int:
    if isinstance(out, torch.Tensor):
        return out.numel() * out.element_size()
    if isinstance(out, (tuple, list)):
        return sum(t.numel() * t.element_size() for t in out if isinstance(t, torch.Tensor))
    return 0


def snapshot(x: Any) -> Any:
    if isinstance(x, torch.Tensor):
        return x.detach().clone()
    if isinstance(x, (list, tuple)):
        items = [snapshot(v) for v in x]
        return items if isinstance(x, list) else tuple(items)
    return x
