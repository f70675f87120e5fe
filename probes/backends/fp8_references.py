"""The exact answer of an FP8 matmul, from the call's own FP8 operands and scales, in float64.

A kernel multiplies FP8 values that are exact in float64, by scales that are too, so this product
is the value a correct kernel rounds once (plus its float32 accumulation): online_dispatch's
reference of ``aten._scaled_mm`` and free_benchmark's improve_precision re-run of it share it. A
layout of scales it does not model raises NotImplementedError naming why (as npu_references).
"""

from __future__ import annotations

from typing import Any

import torch


def _dequantised(data: torch.Tensor, scale: torch.Tensor, rowwise: tuple[int, int]) -> torch.Tensor | None:
    """data * scale in float64 for the scales the reference models: one per tensor (0-d or one
    element) or one per row of the left operand / column of the right one (`rowwise` is that
    shape); None for another layout (block scales)."""
    if scale.numel() == 1:
        return data.double() * scale.double().reshape(())
    if tuple(scale.shape) == rowwise:
        return data.double() * scale.double()
    return None


def scaled_mm(self: torch.Tensor, mat2: torch.Tensor, scale_a: torch.Tensor, scale_b: torch.Tensor,
              bias: torch.Tensor | None = None, scale_result: torch.Tensor | None = None,
              out_dtype: Any = None, use_fast_accum: bool = False) -> Any:
    """The reference of ``aten._scaled_mm``: (self * scale_a) @ (mat2 * scale_b) + bias in float64,
    from the call's own FP8 operands and scales; the correct answer is this value rounded to the
    output dtype, so a correct kernel scores at most half an ulp of it plus its float32
    accumulation. ``use_fast_accum`` is held to the same answer: it may accumulate in a narrower
    type, and how much that loses is what the comparison reports. Not compared: a call with a
    ``scale_result`` (an FP8 output's scale, whose direction, multiply or divide, is the kernel's
    convention) or with block scales: NotImplementedError, naming why."""
    m, n = self.shape[0], mat2.shape[1]
    if scale_result is not None:
        raise NotImplementedError("an FP8 output's scale_result: applied by multiplying or dividing, by kernel")
    a = _dequantised(self, scale_a, (m, 1))
    b = _dequantised(mat2, scale_b, (1, n))
    if a is None or b is None:
        shapes = f"{list(scale_a.shape)} x {list(scale_b.shape)}"
        raise NotImplementedError(f"scales of shape {shapes}: only tensorwise and rowwise scales are modelled")
    out = a @ b
    if bias is not None:
        out = out + bias.double()
    return out
