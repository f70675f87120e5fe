"""The FP8 programs of the tools' tests: a small torchao Float8Linear MLP and its batches, and the
seeded defect both tools must catch, a `_scaled_mm` kernel whose accumulator is too narrow (it
dequantises into bfloat16 and keeps the running sum in bfloat16, one rounding per term).

free_benchmark's noise modes and backward stage have seeded kernels of their own (installed with
`scaled_mm_kernel`): one that fails one ulp away from the data it is given, and one wrong on the
gradients' mixed-format (e5m2 x e4m3) matmuls only."""

from __future__ import annotations

import contextlib
import warnings
from collections.abc import Iterator
from typing import Any

import torch


def bf16_accumulating_scaled_mm(self, mat2, scale_a, scale_b, bias=None, scale_result=None, out_dtype=None,
                                use_fast_accum=False):
    x = self.to(torch.bfloat16) * scale_a.to(torch.bfloat16)
    y = mat2.to(torch.bfloat16) * scale_b.to(torch.bfloat16)
    acc = torch.zeros(x.shape[0], y.shape[1], dtype=torch.bfloat16)
    for i in range(x.shape[1]):
        acc = acc + x[:, i : i + 1] * y[i : i + 1, :]
    if bias is not None:
        acc = acc + bias.to(torch.bfloat16)
    return acc.to(out_dtype or self.dtype)


@contextlib.contextmanager
def narrow_scaled_mm_kernel() -> Iterator[None]:
    """aten._scaled_mm's CPU kernel replaced by the seeded one while the block runs."""
    lib = torch.library.Library("aten", "IMPL")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # "overriding a previously registered kernel"
        lib.impl("_scaled_mm", bf16_accumulating_scaled_mm, "CPU")
    try:
        yield
    finally:
        lib._destroy()


def float8_mlp(seed: int = 0) -> torch.nn.Module:
    """A bf16 MLP converted by torchao to Float8Linear layers (runs on the CPU through _scaled_mm)."""
    from torchao.float8 import convert_to_float8_training

    torch.manual_seed(seed)
    model = torch.nn.Sequential(torch.nn.Linear(64, 128, bias=False), torch.nn.GELU(),
                                torch.nn.Linear(128, 32, bias=False)).to(torch.bfloat16)
    return convert_to_float8_training(model)


def fp8_batches(steps: int) -> Iterator[tuple[Any, Any]]:
    """The (inputs, targets) of each training step, the same in every run."""
    gen = torch.Generator().manual_seed(5)
    for _ in range(steps):
        x = torch.randn(16, 64, generator=gen).to(torch.bfloat16)
        yield x, torch.randn(16, 32, generator=gen).to(torch.bfloat16)


@contextlib.contextmanager
def scaled_mm_kernel(kernel: Any) -> Iterator[None]:
    """aten._scaled_mm's CPU kernel replaced by `kernel` while the block runs."""
    lib = torch.library.Library("aten", "IMPL")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # "overriding a previously registered kernel"
        lib.impl("_scaled_mm", kernel, "CPU")
    try:
        yield
    finally:
        lib._destroy()


def top_as_nonfinite_scaled_mm(self, mat2, scale_a, scale_b, bias=None, scale_result=None, out_dtype=None,
                               use_fast_accum=False):
    """A `_scaled_mm` whose decoding takes each format's largest finite value for a non-finite one
    (an off-by-one in its inf/NaN test: >= where > was meant). Right as long as no operand
    reaches the top of its format, so a run whose scales leave headroom never shows it."""

    def decoded(t):
        v = t.to(torch.float32)
        return torch.where(v.abs() >= torch.finfo(t.dtype).max, torch.full_like(v, float("nan")), v)

    out = (decoded(self) * scale_a) @ (decoded(mat2) * scale_b)
    return (out if bias is None else out + bias).to(out_dtype or self.dtype)


def e5m2_bias_off_scaled_mm(self, mat2, scale_a, scale_b, bias=None, scale_result=None, out_dtype=None,
                            use_fast_accum=False):
    """A `_scaled_mm` right for e4m3 x e4m3 (the forward's matmuls) whose mixed-format path reads
    an e5m2 operand with its exponent bias off by one (every value doubled): only the gradients'
    matmuls, whose gradient operand is e5m2, are wrong."""

    def decoded(t):
        return t.to(torch.float32) * (2.0 if t.dtype == torch.float8_e5m2 else 1.0)

    out = (decoded(self) * scale_a) @ (decoded(mat2) * scale_b)
    return (out if bias is None else out + bias).to(out_dtype or self.dtype)


def low_bits_dropped_scaled_mm(self, mat2, scale_a, scale_b, bias=None, scale_result=None, out_dtype=None,
                               use_fast_accum=False):
    """A `_scaled_mm` that ignores its operands' lowest mantissa bit (it reads every byte with
    that bit cleared): a product of coarser operands than it was given."""

    def decoded(t):
        return (t.view(torch.uint8) & 0xFE).view(t.dtype).to(torch.float32)

    out = (decoded(self) * scale_a) @ (decoded(mat2) * scale_b)
    return (out if bias is None else out + bias).to(out_dtype or self.dtype)
