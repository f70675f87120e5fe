"""Shapes for the tensor strategies and the API input forms: small ones, ones that broadcast, and
matmul operands.

Why the `draw_*` helpers next to the strategies: inside a composite that runs every example,
building a new strategy per draw costs Hypothesis a validation each time, so the input forms draw
shapes with these functions and cached integer strategies instead.
"""

from __future__ import annotations

import functools
from typing import Any, Callable, Tuple, Union

import numpy as np
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from probes.core.errors import ConfigError

__all__ = ["Shape", "ShapeArg", "shapes", "integers", "draw_broadcastable", "broadcastable_shapes",
           "draw_matmul_rhs", "matmul_shapes", "shape_strategy"]

Shape = Tuple[int, ...]
ShapeArg = Union[int, Shape, st.SearchStrategy, None]


@functools.lru_cache(maxsize=256)
def shapes(min_dims: int = 1, max_dims: int = 3, min_side: int = 1, max_side: int = 16) -> st.SearchStrategy[Shape]:
    """Small array shapes; they shrink towards fewer dimensions and sides of `min_side`."""
    if min_dims < 0 or max_dims < min_dims:
        raise ConfigError("max_dims", max_dims, f"an integer >= min_dims={min_dims} >= 0")
    if min_side < 0 or max_side < min_side:
        raise ConfigError("max_side", max_side, f"an integer >= min_side={min_side} >= 0")
    return hnp.array_shapes(min_dims=min_dims, max_dims=max_dims, min_side=min_side, max_side=max_side)


_BOOLEANS = st.booleans()


@functools.lru_cache(maxsize=256)
def integers(lo: int, hi: int) -> st.SearchStrategy[int]:
    """st.integers(lo, hi), cached: strategies drawn inside composites every example are built
    and validated once."""
    return st.integers(lo, hi)


def draw_broadcastable(draw: Callable[[st.SearchStrategy], Any], shape: Shape) -> Shape:
    """Inside a composite: a shape that broadcasts to `shape` (leading dims dropped, some sides
    set to 1). Shrinks to `shape` itself."""
    dropped = draw(integers(0, len(shape)))
    return tuple(1 if draw(_BOOLEANS) else s for s in shape[dropped:])


def broadcastable_shapes(shape: Shape) -> st.SearchStrategy[Shape]:
    """Shapes that broadcast against `shape` without changing it (the result shape is `shape`):
    the second operand of a binary API, a bias, a mask."""
    base = tuple(shape)
    return st.composite(lambda draw: draw_broadcastable(draw, base))()


def draw_matmul_rhs(draw: Callable[[st.SearchStrategy], Any], a_shape: Shape, max_side: int = 6) -> Shape:
    """Inside a composite: the shape of a `b` with `a @ b` defined (torch.matmul's rules): a
    vector, a matrix, or (when `a` is batched) a batch of matrices with a's batch dims."""
    k = a_shape[-1]
    forms = 3 if len(a_shape) > 2 else 2
    form = draw(integers(0, forms - 1))
    if form == 0:
        return (k,)
    m = draw(integers(1, max_side))
    return (k, m) if form == 1 else a_shape[:-2] + (k, m)


def matmul_shapes(min_dims: int = 1, max_dims: int = 4, max_side: int = 6) -> st.SearchStrategy[tuple[Shape, Shape]]:
    """Pairs of shapes `(a, b)` with `torch.matmul(a, b)` defined."""
    a_shapes = shapes(min_dims, max_dims, 1, max_side)

    @st.composite
    def pairs(draw: Callable[[st.SearchStrategy], Any]) -> tuple[Shape, Shape]:
        a = draw(a_shapes)
        return a, draw_matmul_rhs(draw, a, max_side)

    return pairs()


def shape_strategy(shape: ShapeArg) -> st.SearchStrategy[Shape]:
    """A strategy of shapes from what a user passes as `shape=`: None (small shapes), an int, a
    tuple, or a strategy already."""
    if shape is None:
        return shapes()
    if isinstance(shape, st.SearchStrategy):
        return shape
    if isinstance(shape, (int, np.integer)) and not isinstance(shape, bool):
        shape = (int(shape),)
    if isinstance(shape, (tuple, list)) and all(isinstance(s, (int, np.integer)) and s >= 0 for s in shape):
        return st.just(tuple(int(s) for s in shape))
    raise ConfigError("shape", shape, "a tuple of non-negative ints, an int, a Hypothesis strategy of shapes or None")
