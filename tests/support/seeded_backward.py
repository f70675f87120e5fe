"""Seeded backward-only defects: APIs whose forward is exact and whose backward kernel is
ill-conditioned (a one-ulp change of the input moves the gradient by ~0.1-1 %), so only the
backward stage can see them.

Each is installed over a real attribute (F.softsign, torch.mul, mindspore.ops.softsign) *before*
the probe is created, so the probe wraps and reports it under that attribute's name. MindSpore is
imported only by the MindSpore factory.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

_SOFTSIGN = F.softsign
_MUL = torch.mul


def _wobble(x: torch.Tensor) -> torch.Tensor:
    """1 +- 0.5: swings with one-ulp changes of x (condition number ~1e5)."""
    return 1 + 0.5 * torch.sin(x * 1e5)


class _IllConditionedSoftsign(torch.autograd.Function):
    """softsign(x) forward; its backward multiplies the true derivative by _wobble(x)."""

    @staticmethod
    def forward(ctx, x):
        ctx.save_for_backward(x)
        return _SOFTSIGN(x)

    @staticmethod
    def backward(ctx, grad):
        (x,) = ctx.saved_tensors
        return grad * _wobble(x) / (1 + x.abs()) ** 2


def ill_conditioned_backward_softsign(x: torch.Tensor, *args, **kwargs) -> torch.Tensor:
    return _IllConditionedSoftsign.apply(x)


class _IllConditionedMul(torch.autograd.Function):
    """a * b forward; d/da is exact, d/db is multiplied by _wobble(a) (so a one-ulp change of
    the first input, the one add_noise/bit_noise perturb, moves the second input's gradient)."""

    @staticmethod
    def forward(ctx, a, b):
        ctx.save_for_backward(a, b)
        return _MUL(a, b)

    @staticmethod
    def backward(ctx, grad):
        a, b = ctx.saved_tensors
        return grad * b, grad * a * _wobble(a)


def ill_conditioned_backward_mul(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    return _IllConditionedMul.apply(a, b)


def mindspore_ill_conditioned_backward_softsign():
    """The same defect for MindSpore: a Cell with a custom bprop around the real ops.softsign."""
    from mindspore import nn, ops

    softsign = ops.softsign

    class IllConditionedSoftsign(nn.Cell):
        def construct(self, x):
            return softsign(x)

        def bprop(self, x, out, dout):
            return (dout * (1 + 0.5 * ops.sin(x * 1e5)) / (1 + ops.abs(x)) ** 2,)

    cell = IllConditionedSoftsign()

    def ill_conditioned_backward(x, *args, **kwargs):
        return cell(x)

    return ill_conditioned_backward
