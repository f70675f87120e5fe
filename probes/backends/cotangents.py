"""Gathering the cotangents of an API call's outputs during the user's backward pass (shared by
the torch and MindSpore autodiff adapters of free_benchmark's backward stage).

One gather per checked call: a hook on each output stores the gradient flowing into it and the
call's check runs once, when every output has been heard from. The hooks return nothing, so the
gradients flow on unchanged. Frameworks differ only in how an output that receives no gradient
shows up (MindSpore fires its hook with None; PyTorch never fires it), so `hook` is theirs.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any


class CotangentGather:
    __slots__ = ("callback", "grads", "missing", "handles", "__weakref__")

    def __init__(self, n: int, callback: Callable[[list[Any]], None]) -> None:
        self.callback: Callable[[list[Any]], None] | None = callback
        self.grads: list[Any] = [None] * n
        self.missing = n
        self.handles: list[Any] = []

    def hook(self, i: int) -> Callable[[Any], None]:  # pragma: no cover - every framework defines it
        raise NotImplementedError

    def fire(self) -> None:
        """Run the call's check once, with what arrived (None for an output without gradient)."""
        callback, grads = self.callback, self.grads
        if callback is None:
            return
        self.callback, self.grads = None, []
        callback(grads)

    def remove(self) -> None:
        """Drop the callback: safe inside a backward pass (the hooks become no-ops that die with
        their tensors)."""
        self.callback, self.grads = None, []

    def release(self) -> None:
        """Unregister the hooks too (outside a backward pass)."""
        self.remove()
        handles, self.handles = self.handles, []
        for h in handles:
            h.remove()


def attach(gather: CotangentGather, outputs: Sequence[Any]) -> CotangentGather:
    """Register `gather`'s hook on every output (`register_hook`, as torch and MindSpore spell it);
    a failure part-way leaves no hook behind."""
    try:
        for i, out in enumerate(outputs):
            gather.handles.append(out.register_hook(gather.hook(i)))
    except BaseException:
        gather.release()
        raise
    return gather
