"""PyTorch autodiff for free_benchmark's backward stage (probes.backends.base.Autodiff).

The real cotangent of an API call's outputs is read by tensor hooks on those outputs. A tensor
hook lives in the output's autograd node, so it dies with the graph: a call whose backward never
runs (unused output, eval without no_grad, an exception before backward) leaves nothing behind,
and no process-wide table of calls exists. Hooks registered before an in-place change of the
output still see the gradient of the value the API returned (PyTorch >= 2.0).

The vector-Jacobian products are recomputed with `torch.autograd.grad` on detached leaves
(create_graph=False), a reentrant backward that is allowed inside a hook, under the autocast
state the forward call ran with.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from contextlib import ExitStack
from typing import Any

import torch

from probes.backends.cotangents import CotangentGather, attach

_ENGINE = torch.autograd.Variable._execution_engine


def recording() -> bool:
    return torch.is_grad_enabled() and not torch.is_inference_mode_enabled()


def in_backward_pass() -> bool:
    """True while the autograd engine runs a backward pass on this thread (an autograd Function's
    backward, a hook)."""
    return torch._C._current_graph_task_id() != -1


def requires_grad(t: Any) -> bool:
    return isinstance(t, torch.Tensor) and t.requires_grad


def save_input(t: Any, copy: bool) -> Any:
    t = t.detach()
    return t.clone() if copy else t


def version(t: Any) -> int | None:
    return t._version


_AUTOCAST_DEVICES = ("cpu", "cuda")


def forward_context() -> Any:
    """(device type, enabled, dtype) of autocast, so the recomputation runs as the forward did."""
    state = []
    for dev in _AUTOCAST_DEVICES:
        if dev == "cuda" and not torch.cuda.is_available():
            continue
        enabled = torch.is_autocast_enabled(dev)
        state.append((dev, enabled, torch.get_autocast_dtype(dev) if enabled else None))
    return tuple(state)


class _Recompute:
    """enable_grad plus the forward's autocast state (backward hooks run with grad mode off)."""

    def __init__(self, context: Any) -> None:
        self.context = context
        self.stack = ExitStack()

    def __enter__(self) -> None:
        self.stack.enter_context(torch.enable_grad())
        for dev, enabled, dtype in self.context or ():
            if enabled or torch.is_autocast_enabled(dev):
                self.stack.enter_context(torch.autocast(dev, dtype=dtype, enabled=enabled))

    def __exit__(self, *exc: Any) -> None:
        self.stack.close()


def recompute(context: Any) -> _Recompute:
    return _Recompute(context)


class _Gather(CotangentGather):
    """With several outputs, an output that receives no gradient never fires its hook: the first
    arrival queues a callback for the end of the backward pass, which completes the call with None
    for the missing ones."""

    __slots__ = ("queued",)

    def __init__(self, n: int, callback: Callable[[list[Any]], None]) -> None:
        super().__init__(n, callback)
        self.queued = False

    def hook(self, i: int) -> Callable[[Any], None]:
        def on_grad(grad: Any) -> None:
            if self.callback is None:
                return None
            if self.grads[i] is None:
                self.missing -= 1
            self.grads[i] = grad
            if self.missing == 0:
                self.fire()
            elif not self.queued:
                self.queued = True
                _ENGINE.queue_callback(self.fire)
            return None  # the gradient flows on unchanged

        return on_grad


def on_backward(outputs: Sequence[Any], callback: Callable[[list[Any]], None]) -> CotangentGather:
    return attach(_Gather(len(outputs), callback), outputs)


def vjp(fn: Callable[..., Sequence[Any]], primals: Sequence[Any], cotangents: Sequence[Any]) -> list[Any]:
    xs = [p.detach().requires_grad_(True) for p in primals]
    outs = fn(*xs)
    ys, gs = [], []
    for y, g in zip(outs, cotangents):
        if not (isinstance(y, torch.Tensor) and y.requires_grad):
            continue
        ys.append(y)
        gs.append(torch.zeros_like(y) if g is None else g.detach().to(device=y.device, dtype=y.dtype))
    if not ys:
        return [None] * len(xs)
    return list(torch.autograd.grad(ys, xs, gs, allow_unused=True))
