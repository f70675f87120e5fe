"""The FP8 programs of the tools' tests: a small torchao Float8Linear MLP and its batches, and the
seeded defect both tools must catch, a `_scaled_mm` kernel whose accumulator is too narrow (it
dequantises into bfloat16 and keeps the running sum in bfloat16, one rounding per term)."""

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
