"""Hypothesis strategies for precision tests, in one public place: tensors whose values the dtype
holds exactly, and inputs for a named torch API.

The tensors are made in `pytest_msprobe.api.exact_tensors` (why exactness matters, and how the
values are made, is told there) and the API inputs in `pytest_msprobe.api.inputs`, which draws its
tensors from the same module. This module only gathers both, so that neither has to import the
other. Frameworks are imported lazily, when a tensor is built: this module imports without torch
and without MindSpore.
"""

from __future__ import annotations

from pytest_msprobe.api.exact_tensors import (
    DTYPE_ALIASES,
    DTYPES,
    FLOAT_DTYPES,
    FRAMEWORKS,
    INT_DTYPES,
    array_spec,
    arrays,
    broadcastable_shapes,
    dtype_name,
    matmul_shapes,
    shapes,
    tensors,
    to_tensor,
)
from pytest_msprobe.api.inputs import api_inputs

__all__ = [
    "FLOAT_DTYPES",
    "INT_DTYPES",
    "DTYPES",
    "DTYPE_ALIASES",
    "FRAMEWORKS",
    "tensors",
    "arrays",
    "shapes",
    "broadcastable_shapes",
    "matmul_shapes",
    "api_inputs",
    "dtype_name",
    "array_spec",
    "to_tensor",
]
