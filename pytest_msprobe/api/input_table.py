"""The input table: one row per named torch API, stating the facts its inputs must meet.

Why a table: which values an API accepts (log wants positives, acos [-1, 1]), how its inputs'
shapes relate (matmul, conv, layer_norm: the row's form, a key of `pytest_msprobe.api.input_forms.FORMS`)
and which kwargs it needs are facts about the API, not code; a row states them and
`pytest_msprobe.api.inputs.api_inputs` turns it into a strategy.

`no_cpu` names the dtypes the API has no CPU kernel for in the installed torch; the test suite
checks each mark by calling the API.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Dict, Mapping, Tuple

__all__ = ["Domain", "ANY", "POSITIVE", "UNIT", "AWAY_FROM_ZERO", "ApiSpec", "API_TABLE", "BY_NAME"]


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

BY_NAME: Dict[str, ApiSpec] = {name: row for row in API_TABLE for name in row.names}
