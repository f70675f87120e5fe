"""Which catalogue APIs accumulate, and the terms of their sums (probes.core.accumulation).

An accumulating operator's ulp figure depends on its kernel's summation order, so it only
compares runs of one machine; its test ratio compares with a limit that holds on every machine.
The ratio needs, per output element, the magnitude of the terms summed and their number:

* **sums of products** (the matmul family, linear and bilinear layers, convolutions, einsum,
  tensordot, sums, cumulative sums, traces): the operator is linear in each floating input, so
  applied to the inputs' absolute values it gives the terms' magnitude (``|A| @ |B|``,
  ``sum |x|``), and applied to all-ones inputs the number of terms, padding and bias included.
  The scalar coefficients ``alpha`` and ``beta`` are taken as absolute values too.
* **means**: the magnitude as above; the number of terms is the input's size over the output's
  (a mean of ones is one).
* **vector norms**: the terms are non-negative, so the magnitude is the norm itself (the operator
  on absolute values); the number of terms is the input's size over the output's.

Other operators (elementwise ones, decompositions, matrix norms) have no ratio: the ulp golden
of their own machine, and free_benchmark's verdict, gate them.
"""

from __future__ import annotations

from typing import Any

import numpy as np

PRODUCTS, MEANS, NORMS = "products", "means", "norms"

_FAMILIES = {
    PRODUCTS: {
        "matmul", "mm", "bmm", "bmm[triton_optimized]", "mv", "dot", "vdot", "inner", "addmm", "addmm[decomposed]",
        "addmv", "addbmm", "baddbmm", "einsum", "tensordot", "chain_matmul", "linalg.multi_dot", "linalg.vecdot",
        "linalg.matmul", "__matmul__", "__rmatmul__", "linear", "bilinear", "conv1d", "conv2d", "conv3d",
        "conv_transpose1d", "conv_transpose2d", "conv_transpose3d", "sum", "nansum", "cumsum", "trace",
        "sum_to_size", "masked.sum", "masked.cumsum",
        # the FP8 matmul (pytest_msprobe.catalogue.fp8_ops), by operand formats and scaling
        "_scaled_mm[e4m3fn-e4m3fn-tensorwise]", "_scaled_mm[e4m3fn-e5m2-tensorwise]",
        "_scaled_mm[e4m3fn-e4m3fn-rowwise]", "_scaled_mm[e4m3fn-e5m2-rowwise]",
        # torch_npu's FP8 matmul (pytest_msprobe.catalogue.npu_ops)
        "npu_quant_matmul",
    },
    MEANS: {"mean", "nanmean", "masked.mean"},
    NORMS: {"linalg.vector_norm", "norm", "norm[fro]", "norm[inf]", "masked.norm"},
}
_BY_NAME = {name: family for family, names in _FAMILIES.items() for name in names}
COEFFICIENTS = ("alpha", "beta")


def family(api: str) -> str | None:
    """The family of a catalogue API name ("Torch.matmul", "Functional.conv2d", "Mint.sum"), None
    when it does not accumulate."""
    _, _, name = api.partition(".")
    return _BY_NAME.get(name)


def positive_coefficients(kwargs: dict[str, Any]) -> dict[str, Any]:
    """kwargs with the scalar coefficients as absolute values (beta * |C| + alpha * |A| @ |B|)."""
    return {k: abs(v) if k in COEFFICIENTS and isinstance(v, (int, float)) and not isinstance(v, bool) else v
            for k, v in kwargs.items()}


def term_count(kind: str, ones_output: np.ndarray | None, input_size: int, output_size: int) -> np.ndarray | float:
    """The number of terms per output element: the operator on all-ones inputs for sums of
    products, the input's size over the output's otherwise."""
    if kind == PRODUCTS and ones_output is not None:
        return np.abs(ones_output)
    return max(input_size / max(output_size, 1), 1.0)
