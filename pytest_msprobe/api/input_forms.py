"""The forms: how the inputs of an API relate in shape (one input, broadcasting operands, matmul,
conv, layer_norm...), each a function that draws one example's `(args, kwargs)` for a table row.

Why shared by rows: many APIs take their inputs in the same shape relation, so a row names its
form and these functions build every such API's inputs. Every tensor comes from
`pytest_msprobe.api.exact_tensors`, so its values are exact in the dtype; torch is imported when a
strategy is drawn, not on import.
"""

from __future__ import annotations

from typing import Any, Callable, Dict, Tuple

import numpy as np
from hypothesis import strategies as st

from probes.core.errors import ConfigError
from pytest_msprobe.api import exact_tensors as exact
from pytest_msprobe.api.input_table import ApiSpec

__all__ = ["Inputs", "Form", "FORMS", "FORM_RANK"]

_PRIMARY_MAX_SIDE = 8


class Inputs:
    """What a form needs while drawing one example: shapes, the row's domains, the dtype."""

    def __init__(self, draw: Callable[[st.SearchStrategy], Any], row: ApiSpec, dtype: str, device: str,
                 shapes: st.SearchStrategy | None, api: str) -> None:
        self.draw, self.row, self.dtype, self.device, self._shapes, self.api = draw, row, dtype, device, shapes, api
        self._next_domain = 0

    def primary_shape(self) -> Tuple[int, ...]:
        lo, hi = self.row.rank
        if self._shapes is None:
            return self.draw(exact.shapes(lo, hi, self.row.min_side, max(_PRIMARY_MAX_SIDE, self.row.min_side)))
        shape = tuple(self.draw(self._shapes))
        if not lo <= len(shape) <= hi or any(s < self.row.min_side for s in shape):
            sides = f" with every side >= {self.row.min_side}" if self.row.min_side > 1 else ""
            raise ConfigError("shapes", shape, f"a shape of {lo} to {hi} dimensions{sides}: the first input of {self.api}")
        return shape

    def side(self, lo: int = 1, hi: int = 6) -> int:
        return self.draw(exact.integers(lo, hi))

    def _array(self, dtype: str, shape: Tuple[int, ...], lo: Any = None, hi: Any = None) -> Any:
        a = exact.array_spec(dtype, min_value=lo, max_value=hi).draw(self.draw, shape)
        return exact.to_tensor(a, dtype, self.device, "torch")

    def tensor(self, shape: Tuple[int, ...]) -> Any:
        """The next float input, with the next domain of the row."""
        dom = self.row.domain(self._next_domain)
        self._next_domain += 1
        t = self._array(self.dtype, shape, dom.lo, dom.hi)
        if dom.symmetric:
            import torch

            t = torch.where(self.mask(shape), -t, t)
        return t

    def indices(self, shape: Tuple[int, ...], high: int) -> Any:
        return self._array("int64", shape, 0, high - 1)

    def mask(self, shape: Tuple[int, ...]) -> Any:
        return self._array("bool", shape)

    def broadcastable(self, shape: tuple[int, ...]) -> tuple[int, ...]:
        return exact.draw_broadcastable(self.draw, shape)

    def dim(self, ndim: int) -> int:
        return self.draw(exact.integers(-max(ndim, 1), max(ndim, 1) - 1))


_BOOLEANS = st.booleans()
Form = Callable[[Inputs, Dict[str, Any]], Tuple[tuple, Dict[str, Any]]]


def _unary(i: Inputs, kw: Dict[str, Any]) -> Tuple[tuple, Dict[str, Any]]:
    return (i.tensor(i.primary_shape()),), kw


def _unary_dim(i: Inputs, kw: Dict[str, Any]) -> Tuple[tuple, Dict[str, Any]]:
    shape = i.primary_shape()
    kw.setdefault("dim", i.dim(len(shape)))
    return (i.tensor(shape),), kw


def _reduce(i: Inputs, kw: Dict[str, Any]) -> Tuple[tuple, Dict[str, Any]]:
    shape = i.primary_shape()
    if "dim" not in kw and i.draw(_BOOLEANS):
        kw["dim"] = i.dim(len(shape))
        kw.setdefault("keepdim", i.draw(_BOOLEANS))
    return (i.tensor(shape),), kw


def _nary(count: int) -> Form:
    def form(i: Inputs, kw: Dict[str, Any]) -> Tuple[tuple, Dict[str, Any]]:
        shape = i.primary_shape()
        first = i.tensor(shape)
        return (first, *(i.tensor(i.broadcastable(shape)) for _ in range(count - 1))), kw

    return form


def _where(i: Inputs, kw: Dict[str, Any]) -> Tuple[tuple, Dict[str, Any]]:
    shape = i.primary_shape()
    cond = i.mask(i.broadcastable(shape))
    return (cond, i.tensor(shape), i.tensor(i.broadcastable(shape))), kw


def _same(i: Inputs, kw: Dict[str, Any]) -> Tuple[tuple, Dict[str, Any]]:
    shape = i.primary_shape()
    return (i.tensor(shape), i.tensor(shape)), kw


def _class_target(i: Inputs, kw: Dict[str, Any]) -> Tuple[tuple, Dict[str, Any]]:
    shape = i.primary_shape()  # (N, C) or (N, C, d)
    target_shape = shape[:1] + shape[2:]
    return (i.tensor(shape), i.indices(target_shape, shape[1])), kw


def _matmul(i: Inputs, kw: dict[str, Any]) -> tuple[tuple, dict[str, Any]]:
    a_shape = i.primary_shape()
    lo, hi = i.row.rank
    b_shape = (a_shape[-1], i.side()) if lo == hi == 2 else exact.draw_matmul_rhs(i.draw, a_shape)  # mm: matrices
    return (i.tensor(a_shape), i.tensor(b_shape)), kw


def _bmm(i: Inputs, kw: Dict[str, Any]) -> Tuple[tuple, Dict[str, Any]]:
    b, n, k = i.primary_shape()
    return (i.tensor((b, n, k)), i.tensor((b, k, i.side()))), kw


def _einsum_bmm(i: Inputs, kw: Dict[str, Any]) -> Tuple[tuple, Dict[str, Any]]:
    b, n, k = i.primary_shape()
    return ("bij,bjk->bik", i.tensor((b, n, k)), i.tensor((b, k, i.side()))), kw


def _addmm(i: Inputs, kw: Dict[str, Any]) -> Tuple[tuple, Dict[str, Any]]:
    out = i.primary_shape()  # (n, m) or (b, n, m): the added input has the output's shape
    k = i.side()
    bias = i.tensor(out)
    return (bias, i.tensor(out[:-1] + (k,)), i.tensor(out[:-2] + (k, out[-1]))), kw


def _linear(i: Inputs, kw: Dict[str, Any]) -> Tuple[tuple, Dict[str, Any]]:
    x_shape = i.primary_shape()
    out = i.side()
    return (i.tensor(x_shape), i.tensor((out, x_shape[-1])), i.tensor((out,))), kw


def _attention(i: Inputs, kw: Dict[str, Any]) -> Tuple[tuple, Dict[str, Any]]:
    q_shape = i.primary_shape()  # (..., L, E)
    s, ev = i.side(), i.side()
    lead = q_shape[:-2]
    return (i.tensor(q_shape), i.tensor(lead + (s, q_shape[-1])), i.tensor(lead + (s, ev))), kw


def _pair(value: Any, n: int) -> Tuple[int, ...]:
    return tuple(value) if isinstance(value, (tuple, list)) else (value,) * n


def _conv(i: Inputs, kw: Dict[str, Any]) -> Tuple[tuple, Dict[str, Any]]:
    shape = i.primary_shape()  # (N, C, *spatial)
    n = len(shape) - 2
    groups = kw.get("groups", 1)
    if shape[1] % groups:
        raise ConfigError("shapes", shape, f"channels (dim 1) divisible by groups={groups} for {i.api}")
    padding = kw.get("padding", 0)
    dilation = _pair(kw.get("dilation", 1), n)
    pads = (0,) * n if padding == "valid" else (None,) * n if padding == "same" else _pair(padding, n)
    kernel = []
    for size, pad, dil in zip(shape[2:], pads, dilation):
        room = size if pad is None else size + 2 * pad  # padding="same" fits any kernel
        largest = (room - 1) // dil + 1
        if largest < 1:
            raise ConfigError("shapes", shape, f"spatial sizes that fit the kernel of {i.api}")
        kernel.append(i.side(1, min(3, largest)))
    c_out = groups * i.side(1, 3)
    weight = (c_out, shape[1] // groups, *kernel)
    return (i.tensor(shape), i.tensor(weight), i.tensor((c_out,))), kw


def _layer_norm(i: Inputs, kw: Dict[str, Any]) -> Tuple[tuple, Dict[str, Any]]:
    shape = i.primary_shape()
    normalized = tuple(kw.pop("normalized_shape", shape[-i.side(1, min(2, len(shape))):]))
    return (i.tensor(shape), normalized, i.tensor(normalized), i.tensor(normalized)), kw


def _group_norm(i: Inputs, kw: Dict[str, Any]) -> Tuple[tuple, Dict[str, Any]]:
    shape = i.primary_shape()
    channels = shape[1]
    groups = kw.pop("num_groups", None)
    if groups is None:
        per_channel = int(np.prod(shape[2:], dtype=np.int64))  # a group needs more than one value
        groups = i.draw(st.sampled_from(
            [g for g in range(1, channels + 1) if channels % g == 0 and channels // g * per_channel > 1]))
    elif channels % groups:
        raise ConfigError("shapes", shape, f"channels (dim 1) divisible by num_groups={groups} for {i.api}")
    return (i.tensor(shape), groups, i.tensor((channels,)), i.tensor((channels,))), kw


def _batch_norm(i: Inputs, kw: Dict[str, Any]) -> Tuple[tuple, Dict[str, Any]]:
    shape = i.primary_shape()
    c = (shape[1],)
    # input, running_mean, running_var (positive), weight, bias: the row's domains in this order
    return (i.tensor(shape), i.tensor(c), i.tensor(c), i.tensor(c), i.tensor(c)), kw


def _embedding(i: Inputs, kw: Dict[str, Any]) -> Tuple[tuple, Dict[str, Any]]:
    index_shape = i.primary_shape()
    rows, width = i.side(1, 16), i.side(1, 8)
    return (i.indices(index_shape, rows), i.tensor((rows, width))), kw


def _cat(i: Inputs, kw: Dict[str, Any]) -> Tuple[tuple, Dict[str, Any]]:
    shape = i.primary_shape()
    dim = kw.setdefault("dim", i.dim(len(shape)))
    parts = [i.tensor(shape)]
    for _ in range(i.side(1, 2)):
        other = list(shape)
        other[dim] = i.side(1, 4)
        parts.append(i.tensor(tuple(other)))
    return (parts,), kw


def _stack(i: Inputs, kw: Dict[str, Any]) -> Tuple[tuple, Dict[str, Any]]:
    shape = i.primary_shape()
    kw.setdefault("dim", i.draw(exact.integers(-len(shape) - 1, len(shape))))
    return ([i.tensor(shape) for _ in range(i.side(2, 3))],), kw


def _well_conditioned(i: Inputs, shape: Tuple[int, ...]) -> Any:
    """A square matrix (batch) with a dominant diagonal: invertible in every dtype."""
    import torch

    m = i.tensor(shape[:-1] + (shape[-2],))  # entries in [-8, 8] (the row's first domain)
    n = shape[-2]
    return m + torch.eye(n, dtype=m.dtype, device=m.device) * (8.0 * n + 1.0)


def _square(i: Inputs, kw: Dict[str, Any]) -> Tuple[tuple, Dict[str, Any]]:
    shape = i.primary_shape()
    return (_well_conditioned(i, shape),), kw


def _solve(i: Inputs, kw: Dict[str, Any]) -> Tuple[tuple, Dict[str, Any]]:
    shape = i.primary_shape()
    a = _well_conditioned(i, shape)
    return (a, i.tensor(shape[:-1] + (i.side(),))), kw


FORMS: Dict[str, Form] = {
    "unary": _unary, "unary_dim": _unary_dim, "reduce": _reduce, "binary": _nary(2), "ternary": _nary(3),
    "where": _where, "same": _same, "class_target": _class_target, "matmul": _matmul, "bmm": _bmm,
    "einsum_bmm": _einsum_bmm, "addmm": _addmm, "linear": _linear, "attention": _attention, "conv": _conv,
    "layer_norm": _layer_norm, "group_norm": _group_norm, "batch_norm": _batch_norm, "embedding": _embedding,
    "cat": _cat, "stack": _stack, "square": _square, "solve": _solve,
}

# the rank range of the first input for an API outside the table, by its form
FORM_RANK = {"class_target": (2, 3), "bmm": (3, 3), "einsum_bmm": (3, 3), "addmm": (2, 2), "attention": (3, 4),
             "conv": (3, 4), "group_norm": (2, 4), "batch_norm": (2, 4), "square": (2, 3), "solve": (2, 3),
             "matmul": (1, 4)}
