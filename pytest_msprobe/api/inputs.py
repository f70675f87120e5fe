"""Inputs for named torch APIs: one table row per API, a few shape relations ("forms") shared by all.

Why a table: which values an API accepts (log wants positives, acos [-1, 1]), how its inputs'
shapes relate (matmul, conv, layer_norm) and which kwargs it needs are facts about the API, not
code; a row states them and `api_inputs` turns a row into a Hypothesis strategy of `(args,
kwargs)` such that `api(*args, **kwargs)` runs. Every tensor comes from
`pytest_msprobe.api.exact_tensors` (what `pytest_msprobe.api.strategies.tensors` draws), so its
values are exact in the dtype, and the whole input shrinks towards small shapes and simple values.

`no_cpu` names the dtypes the API has no CPU kernel for in the installed torch; the test suite
checks each mark by calling the API. torch is imported when a strategy is drawn, not on import.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable, Dict, Mapping, Tuple

import numpy as np
from hypothesis import strategies as st

from probes.core.errors import ConfigError
from probes.core.hints import close_matches, did_you_mean
from pytest_msprobe.api import exact_tensors as exact

__all__ = ["Domain", "ApiSpec", "API_TABLE", "FORMS", "api_inputs", "api_spec", "known_apis", "canonical_name",
           "resolve_api", "suggest_api"]

_PRIMARY_MAX_SIDE = 8


@dataclass(frozen=True)
class Domain:
    """Values in [lo, hi]; symmetric: in [-hi, -lo] or [lo, hi] (a divisor away from zero)."""

    lo: float
    hi: float
    symmetric: bool = False


D = Domain
ANY = D(-8.0, 8.0)  # wide enough to exercise rounding, small enough that fp16 sums of 4096 values stay finite
POSITIVE = D(1 / 64, 64.0)
UNIT = D(0.0, 1.0)
AWAY_FROM_ZERO = D(0.25, 8.0, symmetric=True)


@dataclass(frozen=True)
class ApiSpec:
    """One row: the API's names (catalog spelling, first is canonical), its form (shape relation,
    a key of FORMS), the value domain of each float tensor input in argument order (missing
    ones: ANY), fixed kwargs, the rank range of the first input, and the dtypes without a CPU
    kernel."""

    names: Tuple[str, ...]
    form: str
    domains: Tuple[Domain, ...] = ()
    kwargs: Mapping[str, Any] = field(default_factory=dict)
    rank: Tuple[int, int] = (1, 3)
    min_side: int = 1
    no_cpu: frozenset = frozenset()

    @property
    def name(self) -> str:
        return self.names[0]

    def domain(self, i: int) -> Domain:
        return self.domains[i] if i < len(self.domains) else ANY


def _row(names: str, form: str, *domains: Domain, rank: Tuple[int, int] = (1, 3), min_side: int = 1,
         no_cpu: Tuple[str, ...] = (), **kwargs: Any) -> ApiSpec:
    return ApiSpec(tuple(names.split()), form, domains, kwargs, rank, min_side, frozenset(no_cpu))


_LOW = ("float16", "bfloat16")  # torch's CPU LAPACK kernels take float32/float64 only

API_TABLE: Tuple[ApiSpec, ...] = (
    # elementwise, one input
    _row("Torch.exp Tensor.exp", "unary"),
    _row("Torch.log Tensor.log", "unary", POSITIVE),
    _row("Torch.sqrt Tensor.sqrt", "unary", D(0.0, 64.0)),
    _row("Torch.rsqrt Tensor.rsqrt", "unary", POSITIVE),
    _row("Torch.sin Tensor.sin", "unary"),
    _row("Torch.cos Tensor.cos", "unary"),
    _row("Torch.tanh Tensor.tanh", "unary"),
    _row("Torch.sigmoid Tensor.sigmoid", "unary"),
    _row("Torch.abs Tensor.abs Tensor.__abs__", "unary"),
    _row("Torch.neg Tensor.neg Tensor.__neg__", "unary"),
    _row("Torch.reciprocal Tensor.reciprocal", "unary", AWAY_FROM_ZERO),
    _row("Torch.acos Tensor.acos", "unary", D(-1.0, 1.0)),
    _row("Torch.asin Tensor.asin", "unary", D(-1.0, 1.0)),
    _row("Torch.atan Tensor.atan", "unary"),
    _row("Torch.erf Tensor.erf", "unary"),
    _row("Torch.log1p Tensor.log1p", "unary", D(-0.9375, 64.0)),
    _row("Torch.expm1 Tensor.expm1", "unary"),
    _row("Torch.square Tensor.square", "unary"),
    _row("Torch.clamp Tensor.clamp", "unary", min=-1.0, max=1.0),
    _row("Functional.relu Torch.relu Tensor.relu", "unary"),
    _row("Functional.gelu", "unary"),
    _row("Functional.silu", "unary"),
    _row("Functional.leaky_relu", "unary", negative_slope=0.01),
    _row("Functional.elu", "unary"),
    _row("Functional.softplus", "unary"),
    _row("Functional.hardtanh", "unary"),
    _row("Functional.logsigmoid", "unary"),
    _row("Functional.mish", "unary"),
    # one input and a dim
    _row("Functional.softmax Torch.softmax Tensor.softmax", "unary_dim"),
    _row("Functional.log_softmax Torch.log_softmax Tensor.log_softmax", "unary_dim"),
    _row("Functional.normalize", "unary_dim", AWAY_FROM_ZERO),  # its eps underflows in fp16: 0/0
    _row("Torch.cumsum Tensor.cumsum", "unary_dim"),
    _row("Torch.logsumexp Tensor.logsumexp", "unary_dim"),
    # reductions: whole tensor or one dim
    _row("Torch.sum Tensor.sum", "reduce"),
    _row("Torch.mean Tensor.mean", "reduce"),
    _row("Torch.var Tensor.var", "reduce", min_side=2),  # one value: no variance
    _row("Torch.std Tensor.std", "reduce", min_side=2),
    _row("Torch.amax Tensor.amax", "reduce"),
    _row("Torch.linalg.vector_norm", "reduce"),
    # elementwise, broadcasting operands
    _row("Torch.add Tensor.add Tensor.__add__ Tensor.__radd__", "binary"),
    _row("Torch.sub Tensor.sub Tensor.__sub__", "binary"),
    _row("Torch.mul Tensor.mul Tensor.__mul__ Tensor.__rmul__", "binary"),
    _row("Torch.div Tensor.div Tensor.__truediv__", "binary", ANY, AWAY_FROM_ZERO),
    _row("Torch.maximum Tensor.maximum", "binary"),
    _row("Torch.minimum Tensor.minimum", "binary"),
    _row("Torch.pow Tensor.pow Tensor.__pow__", "binary", D(0.25, 4.0), D(-3.0, 3.0)),
    _row("Torch.atan2 Tensor.atan2", "binary"),
    _row("Torch.addcmul Tensor.addcmul", "ternary", value=0.5),
    _row("Torch.addcdiv Tensor.addcdiv", "ternary", ANY, ANY, AWAY_FROM_ZERO, value=0.5),
    _row("Torch.lerp Tensor.lerp", "ternary", ANY, ANY, UNIT),
    _row("Torch.where", "where"),
    # losses and pairs of same-shape inputs
    _row("Functional.mse_loss", "same"),
    _row("Functional.l1_loss", "same"),
    _row("Functional.smooth_l1_loss", "same"),
    _row("Functional.binary_cross_entropy", "same", D(1 / 64, 63 / 64), UNIT),
    _row("Functional.kl_div", "same", D(-8.0, 0.0), UNIT, reduction="batchmean"),
    _row("Functional.cosine_similarity", "same", AWAY_FROM_ZERO, AWAY_FROM_ZERO, dim=-1),
    _row("Functional.cross_entropy", "class_target", rank=(2, 3)),
    _row("Functional.nll_loss", "class_target", D(-8.0, 0.0), rank=(2, 3)),
    # matrix products
    _row("Torch.matmul Tensor.matmul Tensor.__matmul__", "matmul", rank=(1, 4)),
    _row("Torch.mm Tensor.mm", "matmul", rank=(2, 2)),
    _row("Torch.bmm Tensor.bmm", "bmm", rank=(3, 3)),
    _row("Torch.addmm Tensor.addmm", "addmm", rank=(2, 2)),
    _row("Torch.baddbmm Tensor.baddbmm", "addmm", rank=(3, 3)),
    _row("Torch.einsum", "einsum_bmm", rank=(3, 3)),
    _row("Functional.linear", "linear", rank=(1, 3)),
    _row("Functional.scaled_dot_product_attention", "attention", rank=(3, 4)),
    # convolutions, normalisations, pooling, lookup
    _row("Functional.conv1d", "conv", rank=(3, 3)),
    _row("Functional.conv2d", "conv", rank=(4, 4)),
    _row("Functional.layer_norm", "layer_norm", rank=(1, 3)),
    _row("Functional.group_norm", "group_norm", rank=(2, 4), min_side=2),
    _row("Functional.batch_norm", "batch_norm", ANY, ANY, POSITIVE, rank=(2, 4), training=False),
    _row("Functional.avg_pool2d", "unary", rank=(3, 4), min_side=2, kernel_size=2),
    _row("Functional.max_pool2d", "unary", rank=(3, 4), min_side=2, kernel_size=2),
    _row("Functional.interpolate", "unary", rank=(3, 4), scale_factor=2.0, mode="nearest"),
    _row("Functional.embedding", "embedding", rank=(1, 2)),
    _row("Torch.cat", "cat"),
    _row("Torch.stack", "stack"),
    # linear algebra: CPU LAPACK has no half-precision kernels
    _row("Torch.linalg.inv", "square", rank=(2, 3), no_cpu=_LOW),
    _row("Torch.linalg.det", "square", rank=(2, 3), no_cpu=_LOW),
    _row("Torch.linalg.solve", "solve", rank=(2, 3), no_cpu=_LOW),
)

_BY_NAME: Dict[str, ApiSpec] = {name: row for row in API_TABLE for name in row.names}


# ----------------------------------------------------------------------------------------------
# names
_PREFIXES = (
    ("torch.nn.functional.", "Functional."), ("nn.functional.", "Functional."), ("F.", "Functional."),
    ("functional.", "Functional."), ("torch.Tensor.", "Tensor."), ("tensor.", "Tensor."), ("torch.", "Torch."),
)


def canonical_name(api: str) -> str:
    """The catalog spelling ("Functional.softmax") of a public dotted name
    ("torch.nn.functional.softmax") or of a catalog name; other strings come back unchanged."""
    if api.startswith(("Torch.", "Functional.", "Tensor.", "NPU.")):
        return api
    for prefix, family in _PREFIXES:
        if api.startswith(prefix):
            return family + api[len(prefix):]
    return api


def known_apis() -> Tuple[str, ...]:
    """Every name of the table (catalog spelling), sorted."""
    return tuple(sorted(_BY_NAME))


def api_spec(api: str) -> ApiSpec:
    """The table row of `api` (a public dotted name, a catalog name, or a bare name naming one
    row). Unknown: ConfigError naming the API and the close known ones."""
    name = canonical_name(api)
    row = _BY_NAME.get(name)
    if row is not None:
        return row
    if "." not in name:
        rows = {r.name: r for r in API_TABLE for n in r.names if n.rsplit(".", 1)[-1] == name}
        if len(rows) == 1:
            return next(iter(rows.values()))
    close = suggest_api(api)
    hint = (f"{close} " if close else "") + (
        f"For an API outside the table pass form= (one of {', '.join(sorted(FORMS))}) and kwargs= "
        "to api_inputs, or give the test an explicit strategy of (args, kwargs) built with "
        "pytest_msprobe.api.strategies.tensors")
    raise ConfigError("api", api, f"an API of the input table ({len(_BY_NAME)} names, see known_apis())", hint=hint)


_PUBLIC_PREFIX = {"Torch": "torch.", "Functional": "torch.nn.functional.", "Tensor": "torch.Tensor."}


def suggest_api(api: str) -> str:
    """``did you mean "..."?`` for a name the table does not know, else "".

    The suggestions are spelled the way the user spelled the family (``torch.nn.functional.sofmax``
    gets ``torch.nn.functional.softmax``, ``F.sofmax`` gets ``F.softmax``, ``Functional.sofmax``
    the catalog name), so the fix is a copy of the hint; other families get their public names."""
    spelling = dict(_PUBLIC_PREFIX)
    if api.startswith(tuple(f"{family}." for family in spelling)):
        spelling = {family: f"{family}." for family in spelling}
    else:
        for prefix, family in _PREFIXES:
            if api.startswith(prefix):
                spelling[family.rstrip(".")] = prefix
                break
    spelled = [spelling[family] + rest for family, _, rest in (n.partition(".") for n in known_apis())]
    if "." in api:
        return did_you_mean(api, spelled)
    by_last: dict[str, list[str]] = {}  # a bare name: matched on the last dotted part
    for name in spelled:
        by_last.setdefault(name.rsplit(".", 1)[-1], []).append(name)
    return did_you_mean(api, [n for last in close_matches(api, by_last) for n in by_last[last]])


def resolve_api(api: str) -> Callable[..., Any]:
    """The torch callable named by a public dotted name or a catalog name (in the table or not)."""
    import torch
    import torch.nn.functional as F

    name = canonical_name(api)
    family, _, rest = name.partition(".")
    roots = {"Torch": torch, "Functional": F, "Tensor": torch.Tensor}
    obj: Any = roots.get(family)
    try:
        if obj is None:
            raise AttributeError(family)
        for part in rest.split("."):
            obj = getattr(obj, part)
    except AttributeError:
        raise ConfigError("api", api, "a torch API: torch.X, torch.nn.functional.X, torch.Tensor.X "
                          "or a catalog name Torch.X / Functional.X / Tensor.X") from None
    return obj


# ----------------------------------------------------------------------------------------------
# drawing
class _Inputs:
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
Form = Callable[[_Inputs, Dict[str, Any]], Tuple[tuple, Dict[str, Any]]]


def _unary(i: _Inputs, kw: Dict[str, Any]) -> Tuple[tuple, Dict[str, Any]]:
    return (i.tensor(i.primary_shape()),), kw


def _unary_dim(i: _Inputs, kw: Dict[str, Any]) -> Tuple[tuple, Dict[str, Any]]:
    shape = i.primary_shape()
    kw.setdefault("dim", i.dim(len(shape)))
    return (i.tensor(shape),), kw


def _reduce(i: _Inputs, kw: Dict[str, Any]) -> Tuple[tuple, Dict[str, Any]]:
    shape = i.primary_shape()
    if "dim" not in kw and i.draw(_BOOLEANS):
        kw["dim"] = i.dim(len(shape))
        kw.setdefault("keepdim", i.draw(_BOOLEANS))
    return (i.tensor(shape),), kw


def _nary(count: int) -> Form:
    def form(i: _Inputs, kw: Dict[str, Any]) -> Tuple[tuple, Dict[str, Any]]:
        shape = i.primary_shape()
        first = i.tensor(shape)
        return (first, *(i.tensor(i.broadcastable(shape)) for _ in range(count - 1))), kw

    return form


def _where(i: _Inputs, kw: Dict[str, Any]) -> Tuple[tuple, Dict[str, Any]]:
    shape = i.primary_shape()
    cond = i.mask(i.broadcastable(shape))
    return (cond, i.tensor(shape), i.tensor(i.broadcastable(shape))), kw


def _same(i: _Inputs, kw: Dict[str, Any]) -> Tuple[tuple, Dict[str, Any]]:
    shape = i.primary_shape()
    return (i.tensor(shape), i.tensor(shape)), kw


def _class_target(i: _Inputs, kw: Dict[str, Any]) -> Tuple[tuple, Dict[str, Any]]:
    shape = i.primary_shape()  # (N, C) or (N, C, d)
    target_shape = shape[:1] + shape[2:]
    return (i.tensor(shape), i.indices(target_shape, shape[1])), kw


def _matmul(i: _Inputs, kw: dict[str, Any]) -> tuple[tuple, dict[str, Any]]:
    a_shape = i.primary_shape()
    lo, hi = i.row.rank
    b_shape = (a_shape[-1], i.side()) if lo == hi == 2 else exact.draw_matmul_rhs(i.draw, a_shape)  # mm: matrices
    return (i.tensor(a_shape), i.tensor(b_shape)), kw


def _bmm(i: _Inputs, kw: Dict[str, Any]) -> Tuple[tuple, Dict[str, Any]]:
    b, n, k = i.primary_shape()
    return (i.tensor((b, n, k)), i.tensor((b, k, i.side()))), kw


def _einsum_bmm(i: _Inputs, kw: Dict[str, Any]) -> Tuple[tuple, Dict[str, Any]]:
    b, n, k = i.primary_shape()
    return ("bij,bjk->bik", i.tensor((b, n, k)), i.tensor((b, k, i.side()))), kw


def _addmm(i: _Inputs, kw: Dict[str, Any]) -> Tuple[tuple, Dict[str, Any]]:
    out = i.primary_shape()  # (n, m) or (b, n, m): the added input has the output's shape
    k = i.side()
    bias = i.tensor(out)
    return (bias, i.tensor(out[:-1] + (k,)), i.tensor(out[:-2] + (k, out[-1]))), kw


def _linear(i: _Inputs, kw: Dict[str, Any]) -> Tuple[tuple, Dict[str, Any]]:
    x_shape = i.primary_shape()
    out = i.side()
    return (i.tensor(x_shape), i.tensor((out, x_shape[-1])), i.tensor((out,))), kw


def _attention(i: _Inputs, kw: Dict[str, Any]) -> Tuple[tuple, Dict[str, Any]]:
    q_shape = i.primary_shape()  # (..., L, E)
    s, ev = i.side(), i.side()
    lead = q_shape[:-2]
    return (i.tensor(q_shape), i.tensor(lead + (s, q_shape[-1])), i.tensor(lead + (s, ev))), kw


def _pair(value: Any, n: int) -> Tuple[int, ...]:
    return tuple(value) if isinstance(value, (tuple, list)) else (value,) * n


def _conv(i: _Inputs, kw: Dict[str, Any]) -> Tuple[tuple, Dict[str, Any]]:
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


def _layer_norm(i: _Inputs, kw: Dict[str, Any]) -> Tuple[tuple, Dict[str, Any]]:
    shape = i.primary_shape()
    normalized = tuple(kw.pop("normalized_shape", shape[-i.side(1, min(2, len(shape))):]))
    return (i.tensor(shape), normalized, i.tensor(normalized), i.tensor(normalized)), kw


def _group_norm(i: _Inputs, kw: Dict[str, Any]) -> Tuple[tuple, Dict[str, Any]]:
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


def _batch_norm(i: _Inputs, kw: Dict[str, Any]) -> Tuple[tuple, Dict[str, Any]]:
    shape = i.primary_shape()
    c = (shape[1],)
    # input, running_mean, running_var (positive), weight, bias: the row's domains in this order
    return (i.tensor(shape), i.tensor(c), i.tensor(c), i.tensor(c), i.tensor(c)), kw


def _embedding(i: _Inputs, kw: Dict[str, Any]) -> Tuple[tuple, Dict[str, Any]]:
    index_shape = i.primary_shape()
    rows, width = i.side(1, 16), i.side(1, 8)
    return (i.indices(index_shape, rows), i.tensor((rows, width))), kw


def _cat(i: _Inputs, kw: Dict[str, Any]) -> Tuple[tuple, Dict[str, Any]]:
    shape = i.primary_shape()
    dim = kw.setdefault("dim", i.dim(len(shape)))
    parts = [i.tensor(shape)]
    for _ in range(i.side(1, 2)):
        other = list(shape)
        other[dim] = i.side(1, 4)
        parts.append(i.tensor(tuple(other)))
    return (parts,), kw


def _stack(i: _Inputs, kw: Dict[str, Any]) -> Tuple[tuple, Dict[str, Any]]:
    shape = i.primary_shape()
    kw.setdefault("dim", i.draw(exact.integers(-len(shape) - 1, len(shape))))
    return ([i.tensor(shape) for _ in range(i.side(2, 3))],), kw


def _well_conditioned(i: _Inputs, shape: Tuple[int, ...]) -> Any:
    """A square matrix (batch) with a dominant diagonal: invertible in every dtype."""
    import torch

    m = i.tensor(shape[:-1] + (shape[-2],))  # entries in [-8, 8] (the row's first domain)
    n = shape[-2]
    return m + torch.eye(n, dtype=m.dtype, device=m.device) * (8.0 * n + 1.0)


def _square(i: _Inputs, kw: Dict[str, Any]) -> Tuple[tuple, Dict[str, Any]]:
    shape = i.primary_shape()
    return (_well_conditioned(i, shape),), kw


def _solve(i: _Inputs, kw: Dict[str, Any]) -> Tuple[tuple, Dict[str, Any]]:
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


def _shapes_strategy(shapes: Any) -> st.SearchStrategy | None:
    if shapes is None or isinstance(shapes, st.SearchStrategy):
        return shapes
    if isinstance(shapes, tuple) and all(isinstance(s, int) for s in shapes):
        return st.just(shapes)
    if isinstance(shapes, (list, tuple)) and shapes and all(
            isinstance(s, (list, tuple)) and all(isinstance(d, int) for d in s) for s in shapes):
        return st.sampled_from([tuple(s) for s in shapes])
    raise ConfigError("shapes", shapes, "None, a shape tuple, a list of shape tuples (one is drawn per example) "
                      "or a Hypothesis strategy of shapes, for the API's first input")


def api_inputs(api: str, dtype: Any, *, shapes: Any = None, kwargs: Mapping[str, Any] | None = None,
               device: str = "cpu", form: str | None = None) -> st.SearchStrategy[Tuple[tuple, Dict[str, Any]]]:
    """A strategy of `(args, kwargs)` such that `resolve_api(api)(*args, **kwargs)` runs.

    api: a public dotted name ("torch.nn.functional.softmax", "torch.Tensor.add") or a catalog
    name ("Functional.softmax", "Tensor.__add__"). dtype: a float dtype (name or torch dtype) of
    the float inputs. shapes: the first input's shape (a tuple, a list of tuples, or a strategy);
    the other inputs' shapes follow from it. kwargs: added to the row's kwargs and overriding them;
    a value that is a strategy is drawn per example. form: for an API outside the table, the shape
    relation to use (a key of FORMS); inputs then take the default domain.
    """
    if form is not None:
        if form not in FORMS:
            raise ConfigError("form", form, f"one of {', '.join(sorted(FORMS))}")
        try:
            base = api_spec(api)
            row = ApiSpec(base.names, form, base.domains, base.kwargs, base.rank, base.min_side, base.no_cpu)
        except ConfigError:
            row = ApiSpec((canonical_name(api),), form, rank=_FORM_RANK.get(form, (1, 3)))
    else:
        row = api_spec(api)
    name = exact.dtype_name(dtype)
    if name not in exact.FLOAT_DTYPES:
        raise ConfigError("dtype", dtype, f"a float dtype for API inputs: {', '.join(exact.FLOAT_DTYPES)}")
    root = type(dtype).__module__.partition(".")[0]
    if root == "mindspore":
        raise ConfigError("dtype", dtype, "a dtype name or a torch dtype: the input table describes torch APIs")
    user = dict(kwargs or {})
    shape_strategy = _shapes_strategy(shapes)
    build = FORMS[row.form]

    @st.composite
    def draw_inputs(draw: Callable[[st.SearchStrategy], Any]) -> Tuple[tuple, Dict[str, Any]]:
        merged = dict(row.kwargs)
        merged.update({k: draw(v) if isinstance(v, st.SearchStrategy) else v for k, v in user.items()})
        return build(_Inputs(draw, row, name, device, shape_strategy, api), merged)

    return draw_inputs()


_FORM_RANK = {"class_target": (2, 3), "bmm": (3, 3), "einsum_bmm": (3, 3), "addmm": (2, 2), "attention": (3, 4),
              "conv": (3, 4), "group_norm": (2, 4), "batch_norm": (2, 4), "square": (2, 3), "solve": (2, 3),
              "matmul": (1, 4)}
