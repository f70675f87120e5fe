"""Hypothesis strategies for precision tests: tensors whose values the dtype holds exactly.

Why exactness matters: a float32 value cast to float16/bfloat16 is rounded by the cast, so the
value Hypothesis reports (and shrinks) is not the value the API saw, and the bounds asked for can
be crossed by the rounding. Here every value is made in the target format: Hypothesis draws float16
values as 16-bit floats and bfloat16 values as float32 bit patterns with the low 16 bits cleared
(`pytest_msprobe.api.bfloat16_bits`); bounds are first rounded inwards to the dtype, and numpy's
random values are clipped to those bounds and then rounded to the dtype
(`pytest_msprobe.api.exact_values`, which also tells why the values come from numpy and how they
still shrink). So `x == x.to(float32).to(x.dtype)` always holds.

This module is the strategies' front: it turns an array strategy into framework tensors
(`pytest_msprobe.api.framework_tensors`, which imports torch or MindSpore lazily, when a tensor is
built: this module imports without either). Neither it nor the modules it builds on import the API
input table, so the table (`pytest_msprobe.api.inputs`) and the public
`pytest_msprobe.api.strategies` both build on them.
"""

from __future__ import annotations

from typing import Any, Callable

import numpy as np
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from probes.core.errors import ConfigError
from pytest_msprobe.api import bfloat16_bits as bf16
from pytest_msprobe.api.bfloat16_bits import round_to_bf16
from pytest_msprobe.api.exact_values import array_spec, round_inward
from pytest_msprobe.api.framework_tensors import converter, to_tensor
from pytest_msprobe.api.tensor_dtypes import (
    DTYPE_ALIASES,
    DTYPES,
    FLOAT_DTYPES,
    FORMATS,
    FRAMEWORKS,
    INT_DTYPES,
    dtype_name,
    resolve_dtype,
    resolve_framework,
)
from pytest_msprobe.api.tensor_shapes import (
    ShapeArg,
    broadcastable_shapes,
    draw_broadcastable,
    draw_matmul_rhs,
    integers,
    matmul_shapes,
    shape_strategy,
    shapes,
)

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
    "draw_broadcastable",
    "draw_matmul_rhs",
    "integers",
    "dtype_name",
    "array_spec",
    "to_tensor",
    "round_inward",
    "round_to_bf16",
]


def arrays(dtype: Any, shape: ShapeArg = None, *, elements: st.SearchStrategy | None = None,
           allow_nan: bool = False, allow_infinity: bool = False, allow_subnormal: bool = False,
           min_value: Any = None, max_value: Any = None) -> st.SearchStrategy[np.ndarray]:
    """numpy arrays holding values of `dtype` exactly (bfloat16 as float32 with zero low bits):
    what `tensors` converts, usable on its own for framework-free code."""
    name, _ = resolve_dtype(dtype)
    return _arrays(name, shape, elements, allow_nan, allow_infinity, allow_subnormal, min_value, max_value)


def _arrays(name: str, shape: ShapeArg, elements: st.SearchStrategy | None, allow_nan: bool,
            allow_infinity: bool, allow_subnormal: bool, min_value: Any, max_value: Any) -> st.SearchStrategy:
    shapes_drawn = shape_strategy(shape)
    if elements is not None:
        given = {"min_value": min_value, "max_value": max_value, "allow_nan": allow_nan or None,
                 "allow_infinity": allow_infinity or None, "allow_subnormal": allow_subnormal or None}
        for key, value in given.items():
            if value is not None:
                raise ConfigError(key, value, "left at its default when elements= is given "
                                  "(the elements strategy decides the values)")
        base = hnp.arrays(FORMATS[name].storage, shapes_drawn, elements=elements)
        return base.map(bf16.check_exact) if name == "bfloat16" else base
    spec = array_spec(name, min_value=min_value, max_value=max_value, allow_nan=allow_nan,
                      allow_infinity=allow_infinity, allow_subnormal=allow_subnormal)

    @st.composite
    def draw_array(draw: Callable[[st.SearchStrategy], Any]) -> np.ndarray:
        return spec.draw(draw, draw(shapes_drawn))

    return draw_array()


def tensors(dtype: Any, shape: ShapeArg = None, *, elements: st.SearchStrategy | None = None,
            device: str = "cpu", allow_nan: bool = False, allow_infinity: bool = False,
            allow_subnormal: bool = False, min_value: Any = None, max_value: Any = None,
            framework: str | None = None) -> st.SearchStrategy[Any]:
    """Tensors of `dtype` whose every value the dtype holds exactly.

    dtype: a neutral name (see DTYPES), a torch dtype or a MindSpore dtype. framework: "torch" or
    "mindspore"; None takes the dtype object's framework, else torch. shape: a tuple, an int, a
    strategy of shapes, or None for small shapes (`shapes()`). Bounds are rounded inwards to the
    dtype, so every value lies in [min_value, max_value]; NaN, infinities and subnormals appear
    only when allowed. elements: a strategy of Python scalars the dtype holds exactly (then the
    bounds and allow_* flags stay at their defaults). device: where torch tensors are placed;
    MindSpore places tensors by its context and ignores it.
    """
    name, from_dtype = resolve_dtype(dtype)
    chosen = resolve_framework(framework, from_dtype, dtype)
    if not isinstance(device, str) or not device:
        raise ConfigError("device", device, 'a device string such as "cpu", "cuda", "cuda:0" or "npu"')
    source = _arrays(name, shape, elements, allow_nan, allow_infinity, allow_subnormal, min_value, max_value)
    return source.map(converter(chosen, name, device))
