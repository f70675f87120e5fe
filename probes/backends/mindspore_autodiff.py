"""MindSpore (PyNative) autodiff for free_benchmark's backward stage (probes.backends.base.Autodiff).

MindSpore 2.10 gives the real cotangent in PyNative mode: `Tensor.register_hook` on an API's
output, inside a function being differentiated (`mindspore.grad`, `value_and_grad`,
`GradOperation`), fires during that backward pass with the gradient flowing into the output (None
for an output that receives none), and `mindspore.vjp` may run inside such a hook. So the
reference's ones-as-cotangent check inside the forward hook (not the real upstream gradient, and
run even when backward never happens) is replaced by the same check as
PyTorch's.

MindSpore has no grad flag per tensor: a call is recorded when the PyNative executor records
gradients (inside a grad function, outside `no_grad`), and every floating input counts as
differentiable. Removing a tensor hook from inside a running hook crashes MindSpore 2.10
(segmentation fault), so a fired hook turns into a no-op that dies with its tensor; hooks of calls
whose backward never ran are removed at the end of the step, outside any backward pass.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from contextlib import nullcontext
from typing import Any

import mindspore as ms
from mindspore import Tensor, ops

from probes.backends.cotangents import CotangentGather, attach

try:
    from mindspore.graph.api import _pynative_executor as _EXECUTOR
except ImportError:  # pragma: no cover - MindSpore before 2.9
    from mindspore.common.api import _pynative_executor as _EXECUTOR


def recording() -> bool:
    return bool(_EXECUTOR.requires_grad())


def requires_grad(t: Any) -> bool:
    return isinstance(t, Tensor) and bool(getattr(t, "requires_grad", True))


def save_input(t: Any, copy: bool) -> Any:
    return t.copy() if copy else t


def version(t: Any) -> int | None:
    return getattr(t, "_version", None)


def forward_context() -> Any:
    return None


def recompute(context: Any) -> Any:
    return nullcontext()


class _Gather(CotangentGather):
    """MindSpore fires every output's hook, with None for an unused one: the check runs when the
    last has arrived."""

    __slots__ = ()

    def hook(self, i: int) -> Callable[[Any], None]:
        seen = [False]

        def on_grad(grad: Any) -> None:
            if self.callback is None or seen[0]:
                return None
            seen[0] = True
            self.missing -= 1
            self.grads[i] = grad
            if self.missing == 0:
                self.fire()
            return None  # the gradient flows on unchanged

        return on_grad


def on_backward(outputs: Sequence[Any], callback: Callable[[list[Any]], None]) -> CotangentGather:
    return attach(_Gather(len(outputs), callback), outputs)


def vjp(fn: Callable[..., Sequence[Any]], primals: Sequence[Any], cotangents: Sequence[Any]) -> list[Any]:
    def outputs(*xs: Any) -> tuple[Any, ...]:
        return tuple(fn(*xs))

    ys, pullback = ms.vjp(outputs, *primals)
    cts = tuple(ops.zeros_like(y) if g is None else g.astype(y.dtype) for y, g in zip(ys, cotangents))
    grads = pullback(cts)
    if not isinstance(grads, (tuple, list)):
        grads = (grads,)
    return list(grads)
