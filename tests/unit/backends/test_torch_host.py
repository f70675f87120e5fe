"""The ratio figures of small plain CPU tensors, computed with NumPy on their memory: the same
numbers as torch's kernels and the core formula, on every float dtype and the values where the
rule turns (the clamp, signs, zeros, infinities, NaN); and what is not plain goes to torch."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from probes.backends import host_kernels, torch_host, torch_kernels
from probes.backends.host_arrays import bfloat16_as_float32, ratio_figures
from probes.backends.torch_backend import BACKEND
from probes.core import metrics

FLOATS = [torch.float16, torch.bfloat16, torch.float32, torch.float64]
# each test with the host arrays' C kernels and with NumPy's passes alone
pytestmark = pytest.mark.usefixtures("kernel_path")


def _pair(dtype, n, seed):
    g = torch.Generator().manual_seed(seed)
    a = (torch.randn(n, generator=g, dtype=torch.float64) * 10.0 ** torch.randint(-8, 4, (n,), generator=g)).to(dtype)
    b = (a.double() * (1 + 1e-2 * torch.randn(n, generator=g, dtype=torch.float64))).to(dtype)
    return a, b


def _torch_figures(a, b, tol):
    return BACKEND.host_floats([BACKEND.device_ratio_reductions(a, b, tol)])[0]


def _core_figures(a, b, tol):
    compute = b.dtype if b.dtype in (torch.float32, torch.float64) else torch.float32
    return metrics.ratio_reductions(BACKEND.namespace(b), a.to(compute), b.to(compute), tol).tolist()


@pytest.mark.parametrize("a_dtype", FLOATS)
@pytest.mark.parametrize("b_dtype", FLOATS)
@pytest.mark.parametrize("seed", range(3))
def test_host_figures_equal_torch_kernels_and_the_core_formula(a_dtype, b_dtype, seed):
    a, b = _pair(a_dtype, 257, seed)
    b = b.to(b_dtype)
    b[3] = -b[3]  # a flipped sign
    a[5], b[5] = 0.0, -0.0
    a[7] = 1e-9  # under the clamp
    for tol in (1e-6, 1e-4, 1e-3):
        host = BACKEND.ratio_reductions(a, b, tol)
        assert type(host) is list, "a small plain CPU pair is answered on the host"
        assert host == _torch_figures(a, b, tol) == _core_figures(a, b, tol)


@pytest.mark.parametrize("special", [math.inf, -math.inf, math.nan])
@pytest.mark.parametrize("dtype", FLOATS)
def test_non_finite_elements_give_the_same_non_finite_figures(special, dtype):
    a, b = _pair(dtype, 64, 1)
    a[10] = special
    host = BACKEND.ratio_reductions(a, b, 1e-4)
    device = _torch_figures(a, b, 1e-4)
    assert [repr(x) for x in host] == [repr(x) for x in device]  # NaN where torch gives NaN
    assert metrics.needs_nonfinite_pass(host)  # the masked pass follows, as on the device path


def test_non_contiguous_grad_and_zero_d_tensors():
    a = torch.randn(40, 30, requires_grad=True)
    b = (a * 1.001).detach()
    assert BACKEND.ratio_reductions(a.t(), b.t(), 1e-4) == _torch_figures(a.detach().t(), b.t(), 1e-4)
    assert BACKEND.ratio_reductions(a[:, ::3], b[:, ::3], 1e-4) == _torch_figures(a.detach()[:, ::3], b[:, ::3], 1e-4)
    s, t = torch.tensor(2.0), torch.tensor(-3.0)
    two_thirds = float(np.float32(2.0) / np.float32(3.0))  # computed in float32
    assert BACKEND.ratio_reductions(s, t, 1e-4) == _torch_figures(s, t, 1e-4) == [two_thirds, two_thirds, -6.0]


class Mine(torch.Tensor):
    pass


def test_what_is_not_plain_or_too_large_takes_the_torch_kernels():
    a = torch.randn(8)
    assert torch_host.compute_view(a.as_subclass(Mine), a) is None
    assert torch_host.compute_view(torch.randn(3, dtype=torch.complex64).conj(), a) is None
    assert torch_host.compute_view(torch.empty(3, device="meta"), a) is None
    assert torch_host.compute_view(torch.arange(3), a) is None  # not a float
    big = torch.randn(torch_host.HOST_MAX_ELEMENTS + 1)
    assert torch_host.host_view(big) is None
    kernels = host_kernels.kernels() is not None
    # larger float32/float64 pairs: the C kernel's one pass where it is loaded, else torch's kernels
    assert torch.is_tensor(BACKEND.ratio_reductions(big, big * 1.001, 1e-4)) is not kernels
    assert torch.is_tensor(BACKEND.ratio_reductions(big.half(), big.half() * 1.001, 1e-4))
    assert torch.is_tensor(BACKEND.ratio_reductions(big, big.double(), 1e-4))  # mixed dtypes
    strided = torch.randn(2 * big.numel())[::2]  # not dense: torch's kernels
    assert torch.is_tensor(BACKEND.ratio_reductions(strided, strided * 1.001, 1e-4))
    square = torch.randn(200, 200)
    assert torch.is_tensor(BACKEND.ratio_reductions(square.t(), square * 1.001, 1e-4))  # two memory orders
    huge = torch.randn(torch_kernels.KERNEL_MAX_ELEMENTS + 1)
    assert torch.is_tensor(BACKEND.ratio_reductions(huge, huge, 1e-4))


@pytest.mark.parametrize("layout", ["contiguous", "transposed"])
def test_kernel_sized_pairs_equal_torch_kernels(layout):
    a, b = _pair(torch.float32, 300 * 200, 4)
    a, b = a.reshape(300, 200), b.reshape(300, 200)
    if layout == "transposed":
        a, b = a.t(), b.t()
    a[7, 3], b[9, 1] = 1e-9, -b[9, 1]
    for tol in (1e-6, 1e-4):
        figures = BACKEND.ratio_reductions(a, b, tol)
        assert (type(figures) is list) is (host_kernels.kernels() is not None)  # else torch's kernels
        figures = figures if type(figures) is list else BACKEND.host_floats([figures])[0]
        assert figures == _torch_figures(a, b, tol) == _core_figures(a, b, tol)
    seen = []
    torch.func.vmap(lambda x: seen.append(torch_host.host_view(x)) or x)(torch.randn(2, 3))
    assert seen == [None]  # a transform's batched view holds other values than its memory


def test_views_are_read_only_and_share_memory():
    a = torch.randn(16)
    view = torch_host.host_view(a)
    assert not view.flags.writeable and np.shares_memory(view, a.numpy())
    with pytest.raises(ValueError):
        view[0] = 1.0


def test_bfloat16_bits_widen_exactly_and_figures_use_the_compute_dtype():
    every = torch.arange(-(1 << 15), 1 << 15, dtype=torch.int32).to(torch.int16).view(torch.bfloat16)
    wide = bfloat16_as_float32(every.view(torch.int16).numpy())
    assert np.array_equal(wide.view(np.int32), every.float().view(torch.int32).numpy())  # bit for bit, NaNs too
    # float64 against float32: compared in float32, as torch's to_compute casts
    a, b = _pair(torch.float64, 100, 2)
    assert BACKEND.ratio_reductions(a, b.float(), 1e-4) == _torch_figures(a, b.float(), 1e-4)
    assert ratio_figures(np.array([1e-9], np.float32), np.array([2e-9], np.float32), 1e-6) == [1.0, 1.0,
                                                                                           pytest.approx(2e-18)]


def test_the_kernels_work_by_address_only_where_the_memory_holds_the_values():
    """band_edited and ratio_figures answer for plain CPU tensors laid out densely (a transposed
    one too), never for a subclass, a transform's wrapper, a gapped view or another layout, and
    their result carries no autograd history."""
    x = torch.randn(64, 48, requires_grad=True)
    top = (1 << 31) - 1
    edited = torch_kernels.band_edited(x.t(), "bitwise_xor", 0, top)
    if host_kernels.kernels() is None:
        assert edited is None
        return
    assert edited.stride() == x.t().stride() and not edited.requires_grad
    assert torch.equal(edited.view(torch.int32) ^ x.t().detach().view(torch.int32), torch.ones(48, 64, dtype=torch.int32))
    assert torch_kernels.band_edited(torch.randn(10, 10)[:, ::2], "add", 0, top) is None
    assert torch_kernels.band_edited(torch.randn(4).as_subclass(Mine), "add", 0, top) is None
    assert torch_kernels.band_edited(torch.ones(0), "add", 0, top) is None
    assert torch_kernels.band_edited(torch.arange(4), "add", 0, top) is None  # not a float
    seen = []
    torch.func.vmap(lambda v: seen.append(torch_kernels.band_edited(v, "add", 0, top)) or v)(torch.randn(2, 3))
    assert seen == [None]
    a = torch.randn(30, 20)
    assert torch_kernels.ratio_figures(a.t(), (a * 1.001).t(), 1e-4) == _torch_figures(a.t(), (a * 1.001).t(), 1e-4)
    assert torch_kernels.ratio_figures(a.t(), a.t().contiguous(), 1e-4) is None  # two memory orders
    assert torch_kernels.ratio_figures(a.as_subclass(Mine), a, 1e-4) is None


@pytest.mark.parametrize("layout", ["contiguous", "transposed"])
def test_larger_scaled_bounds_are_the_device_paths_figures(layout):
    """Above NumPy's limit the scaled rule's bound comes from the C kernel (max |a - b|) and
    torch's own RMS: the device path's figures, at once; without the kernels, the device path."""
    from probes.backends.base import BackendDefaults

    a, b = _pair(torch.float32, 300 * 200, 5)
    a, b = a.reshape(300, 200), b.reshape(300, 200)
    if layout == "transposed":
        a, b = a.t(), b.t()
    device = BACKEND.host_floats([BackendDefaults.scaled_bound_figures(BACKEND, a, b)])[0]
    host = BACKEND.host_scaled_bound(a, b)
    assert (host is not None) is (host_kernels.kernels() is not None)
    if host is not None:
        assert host == device
        same = BACKEND.host_scaled_bound(a, a.clone())  # no difference: +0.0, whatever sign aminmax gives
        assert repr(same[0]) == "0.0" and same[1] == device_rms(a)


def device_rms(b):
    from probes.backends.base import BackendDefaults

    return BACKEND.host_floats([BackendDefaults.scaled_bound_figures(BACKEND, b, b)])[0][1]
