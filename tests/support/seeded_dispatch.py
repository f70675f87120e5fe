"""A seeded device defect for online_dispatch: a custom op whose CPU kernel is wrong for float32 only.

On this CPU-only machine the device under test is the CPU and the reference is the same kernel
in float64, so the float32 path is "the device's kernel" and the float64 path "the reference's":
exactly the situation of an accelerator kernel that disagrees with the CPU.
"""

from __future__ import annotations

import torch

NAMESPACE = "seeded_dispatch"


@torch.library.custom_op(f"{NAMESPACE}::scaled_tanh", mutates_args=())
def scaled_tanh(x: torch.Tensor) -> torch.Tensor:
    """tanh(x); the float32 kernel loses the sign of negative inputs (a branch bug). A pure scale
    error would not do: the documented rule's cosine is blind to scale, MaxAbsErr only fails > 1."""
    if x.dtype == torch.float32:
        return torch.tanh(x.abs())
    return torch.tanh(x)


@scaled_tanh.register_fake
def _(x: torch.Tensor) -> torch.Tensor:
    return torch.empty_like(x)


def _backward(ctx, grad):  # d tanh = 1 - tanh^2 (correct in every dtype: the defect is forward only)
    (x,) = ctx.saved_tensors
    return grad * (1 - torch.tanh(x) ** 2)


def _setup(ctx, inputs, output):
    ctx.save_for_backward(inputs[0])


scaled_tanh.register_autograd(_backward, setup_context=_setup)


@torch.library.custom_op(f"{NAMESPACE}::bias_grad", mutates_args=())
def bias_grad(grad: torch.Tensor) -> torch.Tensor:
    """Sum over every dimension but the last (a bias gradient); the float32 kernel drops the last
    row: a real defect on a value that is zero in exact arithmetic (a key bias's gradient)."""
    dims = tuple(range(grad.dim() - 1))
    if grad.dtype == torch.float32:
        return grad[..., :-1, :].sum(dim=dims)
    return grad.sum(dim=dims)


@bias_grad.register_fake
def _(grad: torch.Tensor) -> torch.Tensor:
    return grad.new_empty(grad.shape[-1:])


@torch.library.custom_op(f"{NAMESPACE}::float32_only", mutates_args=())
def float32_only(x: torch.Tensor) -> torch.Tensor:
    """An op with no float64 kernel: the CPU reference run fails."""
    if x.dtype != torch.float32:
        raise RuntimeError("float32_only: no kernel for " + str(x.dtype))
    return x * 2


@float32_only.register_fake
def _(x: torch.Tensor) -> torch.Tensor:
    return torch.empty_like(x)
