"""Which operators draw random numbers, by name: one list for every tool that must not re-run or
compare them (a re-run draws other numbers, and a CPU reference another generator's).

free_benchmark's exclusions see public names (``Tensor.normal_``, ``mindspore.ops.gamma``),
online_dispatch aten overloads (``aten::bernoulli_.float``), the torch.compile hook FX targets
(``rand_like``, ``rrelu_with_noise``) and the OpInfo catalogue OpInfo names
(``nn.functional.dropout``, ``normal.number_mean``): `is_random` reduces each to the operator's
name first, so a list of base names covers the in-place, ``_like`` and functionalised variants
too. Names are matched whole, never as substrings: ``rand`` is in ``operand``, ``normal`` in
``normalize``, ``poisson`` in the deterministic ``poisson_nll_loss``.

The lists are tiered by where the numbers are drawn, because a name can be random at one level
and deterministic at another: ``fractional_max_pool2d`` draws its samples in Python and hands
them to an aten kernel of the same name that is deterministic; MindSpore's ``ops.gamma`` samples
while ``aten::gamma`` is the gamma function. Framework-free: names only.
"""

from __future__ import annotations

import re
from collections.abc import Collection

# The kernel itself draws: random as an aten (or torch_npu) op and as every public name over it.
RANDOM_KERNELS = frozenset({
    "rand", "randn", "randint", "randperm", "bernoulli", "multinomial", "normal", "uniform", "random",
    "exponential", "cauchy", "geometric", "log_normal", "poisson", "binomial", "_standard_gamma",
    "_sample_dirichlet",
    "dropout", "alpha_dropout", "feature_dropout", "feature_alpha_dropout", "native_dropout", "_fused_dropout",
    "_fill_mem_eff_dropout_mask", "_cudnn_init_dropout_state", "rrelu", "rrelu_with_noise",
    "_npu_dropout", "npu_dropout_with_add_softmax", "npu_random_choice_with_mask",
})

# torch's functions that draw before they reach a kernel (whose own name, where it has one, is
# deterministic) or that wrap a random kernel under another name; torch.nn.init's initialisers,
# which FX graphs can hold; the counter-based kernels, a function of the key tensor they are given
# (compared as kernels) but random in a graph that draws that key.
TORCH_RANDOM_FUNCTIONS = RANDOM_KERNELS | frozenset({
    "dropout1d", "dropout2d", "dropout3d", "gumbel_softmax",
    "fractional_max_pool2d", "fractional_max_pool3d",
    "fractional_max_pool2d_with_indices", "fractional_max_pool3d_with_indices",
    "philox_rand", "_philox_normal", "_philox_uniform",
    "trunc_normal", "kaiming_normal", "kaiming_uniform", "xavier_normal", "xavier_uniform",
    "_no_grad_normal", "_no_grad_trunc_normal", "_no_grad_uniform",
})

# MindSpore's random APIs whose names torch does not share (``gamma`` is aten's gamma function).
MINDSPORE_RANDOM_FUNCTIONS = frozenset({
    "choice_with_mask", "random_categorical", "uniform_candidate_sampler", "log_uniform_candidate_sampler",
    "standard_normal", "standard_laplace", "gamma", "laplace", "multinomial_with_replacement",
})

# public names of either framework: what free_benchmark's exclusions, framework-free, look up
RANDOM_FUNCTIONS = TORCH_RANDOM_FUNCTIONS | MINDSPORE_RANDOM_FUNCTIONS

# the variants of one operator that draw as it does: in-place, shaped like another tensor,
# functionalised (``normal_functional``: what functionalisation turns ``normal_`` into)
_VARIANT_SUFFIX = re.compile(r"(_like|_functional)$")
_SEPARATORS = re.compile(r"::|\.")


def operator_name(segment: str) -> str:
    """The base name of one name segment (``normal_`` -> ``normal``, ``randint_like`` -> ``randint``),
    so one entry covers the variants; dunders (``__rand__``, bitwise and) are left whole."""
    if segment.startswith("__"):
        return segment
    if segment.endswith("_"):
        segment = segment[:-1]
    return _VARIANT_SUFFIX.sub("", segment)


def is_random(name: str, names: Collection[str] = RANDOM_FUNCTIONS) -> bool:
    """Whether `name` (``aten::normal_.Tensor``, ``aten.rand.default``, ``nn.functional.dropout``,
    ``Tensor.random_``, ``rand_like``) is one of the random operators `names`. Every ``::``/``.``
    segment is tried: namespaces (torch, aten, nn.functional, Tensor) and overload names (default,
    Tensor_float, number_mean) are never operator names of the lists; a module path is no operator
    name (``torch.random.seed``): pass the operator's."""
    return any(operator_name(segment) in names for segment in _SEPARATORS.split(name) if segment)
