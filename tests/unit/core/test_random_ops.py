"""The random-operator list and its four readers: every name a reader treated as random before the
list was shared still is (the readers' former literal lists are copied below as the expectation),
and whole-name matching catches no deterministic name a substring would."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from probes.backends import api_exclusions
from probes.compiled.capture import random_operator
from probes.core.random_ops import (
    MINDSPORE_RANDOM_FUNCTIONS,
    RANDOM_FUNCTIONS,
    RANDOM_KERNELS,
    TORCH_RANDOM_FUNCTIONS,
    is_random,
    operator_name,
)
from probes.online_dispatch import skip_list
from pytest_msprobe.catalogue.opinfo_ops import is_random_name

# api_exclusions' public names (torch, MindSpore, torch_npu), matched exactly
OLD_API_NAMES = {
    "dropout", "dropout1d", "dropout2d", "dropout3d", "alpha_dropout", "feature_dropout", "feature_alpha_dropout",
    "native_dropout", "rrelu", "rrelu_with_noise", "gumbel_softmax", "bernoulli", "multinomial", "poisson",
    "normal", "rand", "rand_like", "randn", "randn_like", "randint", "randint_like", "randperm", "binomial",
    "fractional_max_pool2d", "fractional_max_pool3d", "fractional_max_pool2d_with_indices",
    "fractional_max_pool3d_with_indices", "random_", "uniform_", "cauchy_", "exponential_", "geometric_",
    "log_normal_", "normal_", "npu_dropout_with_add_softmax", "npu_random_choice_with_mask", "_npu_dropout",
    "choice_with_mask", "random_categorical", "uniform_candidate_sampler", "log_uniform_candidate_sampler",
    "standard_normal", "standard_laplace", "uniform", "gamma", "laplace", "multinomial_with_replacement",
}
# online_dispatch's aten op names, matched exactly
OLD_KERNEL_NAMES = (
    "rand rand_like randn randn_like randint randint_like randperm bernoulli bernoulli_ multinomial normal "
    "normal_ uniform_ exponential_ geometric_ cauchy_ log_normal_ random_ poisson binomial native_dropout "
    "dropout _fused_dropout rrelu_with_noise _standard_gamma _sample_dirichlet").split()
# the torch.compile hook's FX target substrings (plus `name == "normal"`)
OLD_FX_SUBSTRINGS = ("dropout", "rand", "bernoulli", "normal_", "multinomial", "poisson", "randperm", "uniform",
                     "exponential", "cauchy", "geometric", "log_normal", "random_", "rrelu",
                     "scaled_dot_product_attention")
# the FX targets torch 2.x has that those substrings caught and that do draw random numbers
OLD_FX_RANDOM_TARGETS = (
    "_cudnn_init_dropout_state", "_fill_mem_eff_dropout_mask_", "_fused_dropout", "_no_grad_normal_",
    "_no_grad_trunc_normal_", "_no_grad_uniform_", "_philox_normal_", "_philox_uniform", "_philox_uniform_",
    "alpha_dropout", "alpha_dropout_", "bernoulli", "bernoulli_", "cauchy", "cauchy_", "dropout", "dropout1d",
    "dropout2d", "dropout3d", "dropout_", "exponential", "exponential_", "feature_alpha_dropout",
    "feature_alpha_dropout_", "feature_dropout", "feature_dropout_", "geometric", "geometric_", "kaiming_normal_",
    "kaiming_uniform", "kaiming_uniform_", "log_normal", "log_normal_", "multinomial", "native_dropout", "normal",
    "normal_", "normal_functional", "philox_rand", "poisson", "rand", "rand_like", "randint", "randint_like",
    "randn", "randn_like", "random", "random_", "randperm", "rrelu", "rrelu_", "rrelu_with_noise",
    "rrelu_with_noise_", "rrelu_with_noise_functional", "trunc_normal_", "uniform", "uniform_", "xavier_normal_",
    "xavier_uniform", "xavier_uniform_",
    "rand.default", "normal.Tensor_float", "bernoulli_.float",  # aten overloads by their __name__
)
# the OpInfo catalogue's substrings and whole dotted tokens
OLD_OPINFO_SUBSTRINGS = ("dropout", "rand", "bernoulli", "multinomial", "uniform")
OLD_OPINFO_TOKENS = ("normal", "poisson", "nn.functional.rrelu", "gumbel_softmax", "fractional_max_pool2d",
                     "fractional_max_pool3d", "cauchy", "exponential", "geometric", "log_normal")
# the OpInfo names those caught in torch 2.x but __rand__ and native_dropout_backward (deterministic);
# signal.windows.exponential, a window, is still caught (its namespace is not hooked anyway)
OLD_OPINFO_RANDOM = (
    "bernoulli", "cauchy", "exponential", "geometric", "log_normal", "multinomial", "nn.functional.alpha_dropout",
    "nn.functional.dropout", "nn.functional.dropout2d", "nn.functional.dropout3d",
    "nn.functional.feature_alpha_dropout", "nn.functional.fractional_max_pool2d",
    "nn.functional.fractional_max_pool3d", "nn.functional.rrelu", "normal", "normal.number_mean", "rand_like",
    "randint", "randint_like", "randn", "randn_like", "uniform", "signal.windows.exponential",
)
# deterministic names a substring of a random name's would catch
NOT_RANDOM = ("operand", "grand", "brand", "normalize", "layer_norm", "batch_norm", "norm", "linalg.norm",
              "nn.functional.normalize", "poisson_nll_loss", "nn.functional.poisson_nll_loss", "special.log_ndtr",
              "__rand__", "native_dropout_backward", "rrelu_with_noise_backward", "randomize", "uniformity",
              "exponential_moving", "lgamma", "digamma", "mvlgamma", "empty_like", "zeros_like", "add_", "seed",
              "_flash_attention_forward_no_dropout_inplace", "scaled_dot_product_attention")


def test_variants_reduce_to_the_operator():
    assert operator_name("normal_") == "normal"
    assert operator_name("randint_like") == "randint"
    assert operator_name("normal_functional") == "normal"
    assert operator_name("__rand__") == "__rand__"
    for name in ("aten::normal_.Tensor", "aten.rand.default", "torch.ops.aten.bernoulli_.float",
                 "nn.functional.dropout", "Tensor.random_", "mindspore.mint.rand_like"):
        assert is_random(name), name


def test_the_tiers_nest():
    assert RANDOM_KERNELS < TORCH_RANDOM_FUNCTIONS < RANDOM_FUNCTIONS
    assert MINDSPORE_RANDOM_FUNCTIONS < RANDOM_FUNCTIONS


@pytest.mark.parametrize("name", sorted(OLD_API_NAMES))
def test_free_benchmark_still_excludes_every_random_api(name):
    assert api_exclusions.exclusion_reason(name) == api_exclusions.RANDOM
    assert api_exclusions.exclusion_reason(f"Torch.{name}") == api_exclusions.RANDOM


@pytest.mark.parametrize("name", OLD_KERNEL_NAMES)
def test_online_dispatch_still_skips_every_random_kernel(name):
    assert is_random(name, RANDOM_KERNELS)
    packet = getattr(torch.ops.aten, name)
    for overload in packet.overloads():
        assert skip_list.skip_reason(getattr(packet, overload)) == skip_list.RNG, f"{name}.{overload}"


@pytest.mark.parametrize("name", [s for s in OLD_FX_SUBSTRINGS if s != "scaled_dot_product_attention"]
                         + list(OLD_FX_RANDOM_TARGETS))
def test_the_compile_hook_still_finds_every_random_target(name):
    assert is_random(name, TORCH_RANDOM_FUNCTIONS)


@pytest.mark.parametrize("name", OLD_OPINFO_SUBSTRINGS + OLD_OPINFO_TOKENS + OLD_OPINFO_RANDOM)
def test_the_catalogue_still_leaves_out_every_random_opinfo(name):
    assert is_random_name(name)


@pytest.mark.parametrize("name", NOT_RANDOM)
def test_whole_names_catch_no_deterministic_op(name):
    assert not is_random(name, RANDOM_FUNCTIONS)
    assert not is_random_name(name)


def test_kernels_that_draw_nothing_are_compared():
    # the samples of fractional_max_pool2d are its input; aten::gamma is the gamma function
    for packet in (torch.ops.aten.fractional_max_pool2d, torch.ops.aten.gamma):
        for overload in packet.overloads():
            assert skip_list.skip_reason(getattr(packet, overload)) != skip_list.RNG
    assert skip_list.skip_reason(torch.ops.aten.native_dropout_backward.default) is None


def _graph(fn) -> torch.fx.GraphModule:
    return torch.fx.symbolic_trace(fn)


def test_the_compile_hook_finds_random_nodes_and_not_look_alikes():
    assert random_operator(_graph(lambda x: torch.rand_like(x) + x)) is not None
    assert random_operator(_graph(lambda x: x.normal_())) is not None
    assert random_operator(_graph(lambda x: F.gumbel_softmax(x))) is not None
    assert random_operator(_graph(lambda x: F.normalize(x) + F.layer_norm(x, (4,)))) is None
    assert random_operator(_graph(lambda x: F.dropout(x, 0.0))) is None
    assert random_operator(_graph(lambda x: F.dropout(x, 0.5, training=False))) is None
    assert random_operator(_graph(lambda x: F.dropout(x, 0.5))) is not None


def test_attention_is_random_only_with_dropout():
    assert random_operator(_graph(lambda q: F.scaled_dot_product_attention(q, q, q))) is None
    assert random_operator(_graph(lambda q: F.scaled_dot_product_attention(q, q, q, dropout_p=0.1))) is not None
    assert random_operator(_graph(lambda q: F.scaled_dot_product_attention(q, q, q, None, 0.0))) is None
