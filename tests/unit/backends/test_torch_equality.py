"""The CPU answer to "are these outputs equal": the semantics of `a != b`, on the host at once."""

from __future__ import annotations

import pytest
import torch

from probes.backends.torch_backend import BACKEND
from probes.backends.torch_equality import host_equal

SIZES = [7, 5000]  # below and above the size where NumPy takes over from torch.equal
# each test with the host arrays' C kernels and with NumPy / torch.equal alone
pytestmark = pytest.mark.usefixtures("kernel_path")


@pytest.mark.parametrize("n", SIZES)
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float32, torch.float64, torch.int64, torch.bool])
def test_equal_and_one_changed_element(n, dtype):
    a = (torch.arange(n) % 3).to(dtype)
    assert host_equal(a, a.clone()) is True
    b = a.clone()
    b[n // 2] = 5 if dtype != torch.bool else not bool(b[n // 2])
    assert host_equal(a, b) is False
    assert BACKEND.host_floats([BACKEND.any_differ(a, b)]) == [[1.0]]  # the count, as before
    assert BACKEND.host_floats([BACKEND.any_differ(a, a.clone())]) == [[0.0]]


@pytest.mark.parametrize("n", SIZES)
def test_nan_differs_from_nan_and_signed_zeros_are_equal(n):
    a = torch.zeros(n)
    assert host_equal(a, -a) is True  # -0.0 == 0.0, as a != b says
    a[0] = float("nan")
    assert host_equal(a, a.clone()) is False  # NaN != NaN: the ratio rule looks at it
    assert host_equal(a, a) is False


def test_non_contiguous_and_grad_tensors():
    a = torch.randn(80, 90, requires_grad=True)
    assert host_equal(a.t(), a.detach().t().clone()) is True
    assert host_equal(a[:, ::2], a.detach()[:, ::2].clone()) is True


class Mine(torch.Tensor):
    pass


def test_what_it_cannot_read_plainly_goes_to_the_device_path():
    a = torch.randn(8)
    assert host_equal(a.as_subclass(Mine), a.clone()) is None
    assert host_equal(a, a.to(torch.float64)) is None  # another dtype
    assert host_equal(a, a.reshape(2, 4)) is None  # another shape
    assert host_equal(a.to_sparse(), a.to_sparse()) is None
    assert host_equal(torch.randn(3, dtype=torch.complex64).conj(), torch.randn(3, dtype=torch.complex64)) is None
    assert host_equal(torch.empty(3, device="meta"), torch.empty(3, device="meta")) is None
    seen = []
    torch.func.vmap(lambda x: seen.append(host_equal(x, x + 0)) or x)(torch.randn(2, 3))
    assert seen == [None]  # a transform's batched view


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_every_half_bit_pattern_against_its_neighbour_and_negation_reads_as_a_ne_b(dtype):
    every = torch.arange(-(1 << 15), 1 << 15, dtype=torch.int32).to(torch.int16)
    for other in (every, every + 1, every ^ -(1 << 15)):
        x, y = every.view(dtype), other.view(dtype)
        expected = (~(x != y)).tolist()
        got = [host_equal(x[i : i + 1], y[i : i + 1]) for i in range(x.numel())]
        wrong = [i for i in range(x.numel()) if got[i] is not expected[i]]
        assert not wrong, [(x[i].item(), y[i].item(), got[i]) for i in wrong[:5]]


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_special_values_in_every_lane(dtype):
    specials = [0.0, -0.0, float("inf"), -float("inf"), float("nan"), 1e-45, 1.0]
    for n in (1, 8, 9, 17, 33):
        for i in range(n):
            for x in specials:
                for y in specials:
                    a, b = torch.ones(n, dtype=dtype), torch.ones(n, dtype=dtype)
                    a[i], b[i] = x, y
                    assert host_equal(a, b) is bool(~(a != b).any()), (n, i, x, y)
