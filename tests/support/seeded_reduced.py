"""A seeded reduced-precision defect: an fp32 matmul that computes with TF32-like inputs.

`reduced_precision_matmul(a, b)` is the custom op ``msprobe_test::reduced_mm``: for float32 inputs
it keeps only the top `mantissa_bits` (default 10, as TF32 / HF32) of each input's 23 mantissa
bits (the low bits cleared through the int32 view, i.e. truncated) and multiplies in float32, so
the result is off by about 2^-11 relative (~4000 fp32 ulps) while it stays within msprobe's
documented Cosine / MaxAbsErr rule. Any other dtype (the float64 reference re-run of
online_dispatch, free_benchmark's raised-precision run) is multiplied exactly: on this CPU-only
machine the float32 path plays "the device's kernel" and the float64 path "the reference's".

`install_reduced_linear(monkeypatch)` routes torch.nn.functional.linear (hence every nn.Linear)
through it. `one_percent_matmul(a, b)` (``msprobe_test::one_percent_mm``) is the other blind spot
of the documented rule: a float32 result 1 % too large (a scale error: Cosine 1.0). Each op is
defined once per process, whatever module name this file is imported under.
"""

from __future__ import annotations

from typing import Any

import torch

NAMESPACE = "msprobe_test"
OP_NAME = "reduced_mm"
FLOAT32_MANTISSA_BITS = 23
TF32_MANTISSA_BITS = 10


def round_mantissa(x: torch.Tensor, mantissa_bits: int = TF32_MANTISSA_BITS) -> torch.Tensor:
    """float32 `x` with all but the top `mantissa_bits` mantissa bits cleared (truncation)."""
    drop = FLOAT32_MANTISSA_BITS - mantissa_bits
    if drop <= 0:
        return x
    mask = ~((1 << drop) - 1)
    return (x.contiguous().view(torch.int32) & mask).view(torch.float32)


ONE_PERCENT_OP = "one_percent_mm"


def _defined(name: str) -> Any:
    """The op if this process already defined it (this file imported under another name), else None."""
    try:
        return getattr(getattr(torch.ops, NAMESPACE), name)
    except (AttributeError, RuntimeError):
        return None


def _define() -> Any:
    existing = _defined(OP_NAME)
    if existing is not None:
        return existing

    @torch.library.custom_op(f"{NAMESPACE}::{OP_NAME}", mutates_args=())
    def reduced_mm(a: torch.Tensor, b: torch.Tensor, mantissa_bits: int = TF32_MANTISSA_BITS) -> torch.Tensor:
        if a.dtype == torch.float32 and b.dtype == torch.float32:
            return torch.matmul(round_mantissa(a, mantissa_bits), round_mantissa(b, mantissa_bits))
        return torch.matmul(a, b)

    @reduced_mm.register_fake
    def _(a: torch.Tensor, b: torch.Tensor, mantissa_bits: int = TF32_MANTISSA_BITS) -> torch.Tensor:
        return torch.matmul(a, b)

    def setup(ctx: Any, inputs: tuple, output: torch.Tensor) -> None:
        a, b, bits = inputs
        ctx.save_for_backward(a, b)
        ctx.bits = bits

    def backward(ctx: Any, grad: torch.Tensor) -> tuple:
        a, b = ctx.saved_tensors
        # the backward matmuls are reduced too (TF32 applies to every fp32 matmul); batched
        # inputs of `a` reduce over the broadcast dimensions for b's gradient
        ga = reduced_mm(grad, b.transpose(-1, -2), ctx.bits)
        gb = reduced_mm(a.transpose(-1, -2), grad, ctx.bits)
        while gb.dim() > b.dim():
            gb = gb.sum(0)
        return ga, gb, None

    reduced_mm.register_autograd(backward, setup_context=setup)
    return getattr(getattr(torch.ops, NAMESPACE), OP_NAME)


def _define_one_percent() -> Any:
    existing = _defined(ONE_PERCENT_OP)
    if existing is not None:
        return existing

    @torch.library.custom_op(f"{NAMESPACE}::{ONE_PERCENT_OP}", mutates_args=())
    def one_percent_mm(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        out = torch.matmul(a, b)
        return out * 1.01 if out.dtype == torch.float32 else out

    @one_percent_mm.register_fake
    def _(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        return torch.matmul(a, b)

    return getattr(getattr(torch.ops, NAMESPACE), ONE_PERCENT_OP)


_OP = _define()
_ONE_PERCENT = _define_one_percent()


def reduced_precision_matmul(a: torch.Tensor, b: torch.Tensor, mantissa_bits: int = TF32_MANTISSA_BITS) -> torch.Tensor:
    """a @ b, computed from float32 inputs rounded to `mantissa_bits` (the seeded defect)."""
    return _OP(a, b, mantissa_bits)


def one_percent_matmul(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """a @ b, 1 % too large in float32 (forward only: no autograd formula)."""
    return _ONE_PERCENT(a, b)


def reduced_linear(input: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None,
                   mantissa_bits: int = TF32_MANTISSA_BITS) -> torch.Tensor:
    """torch.nn.functional.linear through the reduced matmul."""
    out = reduced_precision_matmul(input, weight.t(), mantissa_bits)
    return out + bias if bias is not None else out


def install_reduced_linear(monkeypatch: Any, mantissa_bits: int = TF32_MANTISSA_BITS) -> None:
    """Route torch.nn.functional.linear (so every nn.Linear) through the reduced matmul for the
    test (monkeypatch undoes it)."""

    def linear(input: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
        return reduced_linear(input, weight, bias, mantissa_bits)

    monkeypatch.setattr(torch.nn.functional, "linear", linear)
