"""Tests for probes.core.metrics (and the threshold table of probes.core.thresholds).

Every formula is run on two array namespaces, numpy and torch (both through array-api-compat), and
the expected values are derived by hand from msprobe's rules (with its defects fixed).
"""

from __future__ import annotations

import math

import array_api_compat.numpy as xp_numpy
import array_api_compat.torch as xp_torch
import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from probes.core import metrics
from probes.core import thresholds as th

# numpy warns about the inf/inf and 0*inf it is made to compute on purpose
pytestmark = pytest.mark.filterwarnings("ignore:invalid value encountered:RuntimeWarning")

INF = math.inf
NAN = math.nan


def _np_array(values, dtype="float64"):
    return np.asarray(values, dtype={"float64": np.float64, "float32": np.float32}[dtype])


def _torch_array(values, dtype="float64"):
    return torch.tensor(values, dtype={"float64": torch.float64, "float32": torch.float32}[dtype])


NAMESPACES = [
    pytest.param((xp_numpy, _np_array), id="numpy"),
    pytest.param((xp_torch, _torch_array), id="torch"),
]


@pytest.fixture(params=NAMESPACES)
def ns(request):
    return request.param


def host(arr) -> list[float]:
    return [float(v) for v in arr]


def ratio_verdict(xp, a, b, tol: float) -> metrics.RatioVerdict:
    """The documented two-pass protocol: fast reductions, the mask-aware pass when needed."""
    h = host(metrics.ratio_reductions(xp, a, b, tol))
    if metrics.needs_nonfinite_pass(h):
        h = host(metrics.nonfinite_ratio_reductions(xp, a, b, tol))
    return metrics.finish_ratio(h, tol)


def single_verdict(xp, actual, golden, limits: th.SingleBenchmarkThreshold) -> metrics.SingleBenchmarkVerdict:
    h = host(metrics.single_benchmark_reductions(xp, actual, golden, limits.small_value))
    return metrics.finish_single_benchmark(h, limits.rtol, limits.small_value_atol, limits.error_balance)


# ---------------------------------------------------------------------------------------------
# thresholds: msprobe's tables


def test_noise_values_and_forward_tolerances_match_spec_table():
    assert th.NOISE_VALUE == {"bfloat16": 1e-4, "float16": 1e-6, "float32": 1e-8, "float64": 1e-16}
    for name, tol in {"bfloat16": 1e-2, "float16": 1e-3, "float32": 1e-4, "float64": 1e-8}.items():
        assert th.forward_tolerance(name) == pytest.approx(tol, rel=1e-12)
    assert th.forward_tolerance("int64") == pytest.approx(1e-4, rel=1e-12)  # default v = 1e-8


@pytest.mark.parametrize(
    "name, expected",
    [("float16", 1.002), ("bfloat16", 1.004), ("float32", 1.0002), ("float64", 1.0002), ("int64", 1.0002)],
)
def test_ratio_threshold_per_dtype(name, expected):
    assert th.ratio_threshold(name, "add_noise") == expected
    assert th.ratio_threshold(name, "improve_precision") == expected
    assert th.ratio_threshold(name, "no_change") == 1.0


@pytest.mark.parametrize("name", th.FLOAT_DTYPES)
def test_dtype_facts_agree_with_the_frameworks_finfo(name):
    """Machine epsilon and the smallest normal number follow from the format table; a wrong
    significand width or exponent there would move every ulp figure and threshold."""
    info = torch.finfo(getattr(torch, name))
    assert th.MACHINE_EPS[name] == info.eps
    assert th.SMALLEST_NORMAL[name] == info.tiny
    assert th.machine_eps(name) == info.eps


def test_per_dtype_limits_in_ulps_are_whole_ulps_of_their_dtype():
    """The half dtypes' scaled limits are 4 (forward) and 16 (backward) ulps of the dtype."""
    for name in th.HALF_DTYPES:
        assert th.SCALED_THRESHOLD[name] / th.MACHINE_EPS[name] == 4.0
        assert th.DISPATCH_SCALED_THRESHOLD[name] / th.MACHINE_EPS[name] == 4.0
        assert th.SCALED_BACKWARD_THRESHOLD[name] / th.MACHINE_EPS[name] == 16.0


def test_single_benchmark_thresholds_match_spec_table():
    for name, rtol in {"float32": 2.0**-14, "float16": 2.0**-11, "bfloat16": 2.0**-8}.items():
        lim = th.single_benchmark_threshold(name)
        assert (lim.rtol, lim.small_value, lim.small_value_atol, lim.error_balance) == (rtol, 1.0, rtol, 1e-4)
    assert th.single_benchmark_threshold("float64") == th.single_benchmark_threshold("float32")


# ---------------------------------------------------------------------------------------------
# ratio rule: worked examples checked against msprobe's arithmetic


def test_spec_example_small_difference_is_consistent(ns):
    xp, arr = ns
    # a=[1, -0.0005, 3], b=[1.001, 0.0004, 3], tol 1e-3 (fp16): product -2e-7 >= -1e-6, no flip;
    # clamped a=[1, 1e-3, 3], b=[1.001, 1e-3, 3] -> ratio 1.001 <= 1.002
    v = ratio_verdict(xp, arr([1.0, -0.0005, 3.0]), arr([1.001, 0.0004, 3.0]), 1e-3)
    assert not v.symbol_flipping
    assert v.ratio == pytest.approx(1.001, rel=1e-9)
    assert v.consistent(1.002)
    assert v.max_rel == pytest.approx(0.001, rel=1e-6)
    # the same figures fail the fp32 threshold
    assert not v.consistent(1.0002)


def test_spec_example_sign_flip(ns):
    xp, arr = ns
    v = ratio_verdict(xp, arr([1.0, -0.5]), arr([1.0, 0.5]), 1e-3)
    assert v.symbol_flipping
    assert v.max_rel == "symbol_flipping"
    assert not v.consistent(1.002)
    assert v.figure == INF


def test_sign_flip_needs_product_below_minus_tol_squared(ns):
    xp, arr = ns
    tol = 1e-3
    # -0.0009 * 0.001 = -9e-7 >= -1e-6: values under the clamp floor may change sign freely
    assert not ratio_verdict(xp, arr([-0.0009, 1.0]), arr([0.001, 1.0]), tol).symbol_flipping
    # -0.002 * 0.001 = -2e-6 < -1e-6
    assert ratio_verdict(xp, arr([-0.002, 1.0]), arr([0.001, 1.0]), tol).symbol_flipping


def test_spec_example_value_from_zero(ns):
    xp, arr = ns
    # a=[0, 2], b=[0.01, 2]: max(|0|, 1e-3) vs 0.01 -> ratio 0.01 / 1e-3 = 10 (msprobe's documented 9.996 is fp16 rounding)
    v = ratio_verdict(xp, arr([0.0, 2.0]), arr([0.01, 2.0]), 1e-3)
    assert v.ratio == pytest.approx(10.0, rel=1e-9)
    assert not v.consistent(1.002)
    assert v.max_rel == pytest.approx(9.0, rel=1e-9)
    # symmetric: the value going to zero is caught through 1/min r
    w = ratio_verdict(xp, arr([0.01, 2.0]), arr([0.0, 2.0]), 1e-3)
    assert w.ratio == pytest.approx(10.0, rel=1e-9)


def test_spec_example_fp16_value_from_zero_with_fp16_inputs():
    # msprobe's figure uses fp16 values: b = fp16(0.01), compared in float32 here
    b = torch.tensor([0.01, 2.0], dtype=torch.float16).to(torch.float32)
    a = torch.tensor([0.0, 2.0], dtype=torch.float16).to(torch.float32)
    v = ratio_verdict(xp_torch, a, b, 1e-3)
    expected = float(b[0]) / 1e-3  # fp16(0.01) = 0.0100021..., so ~10.002
    assert v.ratio == pytest.approx(expected, rel=1e-6)
    assert v.ratio == pytest.approx(9.996, rel=1e-3)


def test_spec_example_improve_precision_flagged(ns):
    xp, arr = ns
    # a (fp16) = [1, 100] raised to fp32, b (fp32) = [1.0004, 100.3]; tol = 1e-4 (b is fp32)
    a = arr([1.0, 100.0], "float32")
    b = arr([1.0004, 100.3], "float32")
    v = ratio_verdict(xp, a, b, 1e-4)
    assert v.ratio == pytest.approx(1.003, rel=1e-6)
    assert not v.consistent(1.002)  # T of the fp16 original
    assert v.max_rel == pytest.approx(0.003, rel=1e-3)


def test_identical_arrays_have_ratio_exactly_one(ns):
    xp, arr = ns
    v = ratio_verdict(xp, arr([0.0, -3.5, 1e-30, 7.0, 1e30]), arr([0.0, -3.5, 1e-30, 7.0, 1e30]), 1e-4)
    assert v.ratio == 1.0
    assert v.consistent(1.0)  # the no_change threshold: identical passes
    assert v.max_rel == 0.0


def test_one_ulp_fails_no_change_threshold(ns):
    xp, arr = ns
    x = 1.5
    v = ratio_verdict(xp, arr([x, 2.0]), arr([math.nextafter(x, INF), 2.0]), 1e-8)
    assert v.ratio > 1.0
    assert not v.consistent(1.0)
    assert v.consistent(1.0002)


def test_threshold_bounds_are_inclusive():
    assert metrics.RatioVerdict(ratio=1.002).consistent(1.002)
    assert not metrics.RatioVerdict(ratio=1.0021).consistent(1.002)
    assert not metrics.RatioVerdict(ratio=NAN).consistent(1.002)
    assert metrics.RatioVerdict(ratio=1.0).consistent(1.0)


def test_ratio_reductions_keep_float32_and_work_on_0d(ns):
    xp, arr = ns
    v = ratio_verdict(xp, arr(2.0), arr(2.5), 1e-4)
    assert v.ratio == pytest.approx(1.25)


# ---------------------------------------------------------------------------------------------
# every chunk counts (msprobe kept the last chunk's verdict only)


@pytest.fixture
def small_chunks(monkeypatch):
    monkeypatch.setattr(metrics, "CHUNK_ELEMENTS", 16)
    return 16


@pytest.mark.parametrize("where", [0, 1, 50, 99])
def test_difference_in_any_chunk_is_caught(ns, small_chunks, where):
    xp, arr = ns
    base = [1.0 + i / 100 for i in range(100)]
    a = arr(base)
    assert len(list(metrics.iter_chunks(xp, a, a))) > 1  # the test really runs chunked
    pert = list(base)
    pert[where] *= 1.5
    v = ratio_verdict(xp, a, arr(pert), 1e-4)
    assert v.ratio == pytest.approx(1.5, rel=1e-9)
    assert not v.consistent(1.0002)
    # a value that shrinks in the first chunk (reaches the verdict through 1 / min r)
    pert = list(base)
    pert[where] /= 1.5
    assert ratio_verdict(xp, a, arr(pert), 1e-4).ratio == pytest.approx(1.5, rel=1e-9)


def test_first_element_only_and_sign_flip_in_first_chunk(ns, small_chunks):
    xp, arr = ns
    base = [2.0] * 100
    pert = list(base)
    pert[0] = 2.01
    assert ratio_verdict(xp, arr(base), arr(pert), 1e-4).ratio == pytest.approx(1.005, rel=1e-9)
    pert[0] = -2.0
    assert ratio_verdict(xp, arr(base), arr(pert), 1e-4).symbol_flipping
    # identical chunked arrays stay consistent
    assert ratio_verdict(xp, arr(base), arr(base), 1e-4).ratio == 1.0


def test_chunked_and_unchunked_agree(ns, monkeypatch):
    xp, arr = ns
    rng = np.random.default_rng(0)
    a = rng.uniform(-5, 5, 300)
    b = a * (1 + rng.uniform(-1e-3, 1e-3, 300))
    whole = host(metrics.ratio_reductions(xp, arr(a.tolist()), arr(b.tolist()), 1e-4))
    monkeypatch.setattr(metrics, "CHUNK_ELEMENTS", 7)
    chunked = host(metrics.ratio_reductions(xp, arr(a.tolist()), arr(b.tolist()), 1e-4))
    assert chunked == pytest.approx(whole, rel=1e-12)


# ---------------------------------------------------------------------------------------------
# non-finite values are never masked (msprobe counted NaN as agreeing)


def test_nan_only_in_perturbed_is_reported(ns):
    xp, arr = ns
    v = ratio_verdict(xp, arr([1.0, 2.0]), arr([NAN, 2.0]), 1e-3)
    assert v.nan_mismatch
    assert v.max_rel == "nan_mismatch"
    assert not v.consistent(1.002)
    assert v.figure == INF


def test_nan_only_in_original_is_reported(ns):
    xp, arr = ns
    # a=[NaN, 2], b=[5, 2] was consistent in the reference (NaN ratios counted as 1)
    v = ratio_verdict(xp, arr([NAN, 2.0]), arr([5.0, 2.0]), 1e-3)
    assert v.nan_mismatch
    assert not v.consistent(1.002)


@pytest.mark.parametrize(
    "a, b",
    [([INF, 2.0], [1.0, 2.0]), ([1.0, 2.0], [-INF, 2.0]), ([INF, 2.0], [-INF, 2.0]), ([0.0, 2.0], [INF, 2.0])],
)
def test_inf_vs_other_value_is_inf_mismatch(ns, a, b):
    xp, arr = ns
    v = ratio_verdict(xp, arr(a), arr(b), 1e-3)
    assert v.inf_mismatch
    assert not v.nan_mismatch
    assert v.max_rel == "inf_mismatch"
    assert not v.consistent(1.002)


def test_inf_vs_nan_is_a_mismatch(ns):
    xp, arr = ns
    v = ratio_verdict(xp, arr([INF, 1.0]), arr([NAN, 1.0]), 1e-3)
    assert v.nan_mismatch or v.inf_mismatch
    assert not v.consistent(1.002)


@pytest.mark.parametrize("special", [[INF], [-INF], [NAN], [NAN, INF, -INF]])
def test_identical_non_finite_values_are_consistent(ns, special):
    xp, arr = ns
    vals = special + [1.0, -2.0, 3.0]
    v = ratio_verdict(xp, arr(vals), arr(vals), 1e-3)
    assert not (v.nan_mismatch or v.inf_mismatch or v.symbol_flipping)
    assert v.ratio == 1.0
    assert v.consistent(1.0)


def test_finite_differences_beside_matching_nan_are_still_caught(ns):
    xp, arr = ns
    v = ratio_verdict(xp, arr([NAN, 1.0, 2.0]), arr([NAN, 1.0, 3.0]), 1e-3)
    assert not v.nan_mismatch
    assert v.ratio == pytest.approx(1.5, rel=1e-9)
    assert not v.consistent(1.002)
    # and a NaN does not disable the sign-flip test
    w = ratio_verdict(xp, arr([NAN, 1.0]), arr([NAN, -1.0]), 1e-3)
    assert w.symbol_flipping


def test_all_nan_both_sides_is_consistent(ns):
    xp, arr = ns
    v = ratio_verdict(xp, arr([NAN, NAN]), arr([NAN, NAN]), 1e-3)
    assert v.consistent(1.0)


def test_max_rel_precedence():
    v = metrics.RatioVerdict(1.0, symbol_flipping=True, nan_mismatch=True, inf_mismatch=True)
    assert v.max_rel == "nan_mismatch"
    assert metrics.RatioVerdict(1.0, symbol_flipping=True, inf_mismatch=True).max_rel == "inf_mismatch"


# ---------------------------------------------------------------------------------------------
# properties


finite64 = st.floats(min_value=-1e6, max_value=1e6, allow_nan=False, allow_infinity=False)


@settings(max_examples=60, deadline=None)
@given(st.lists(st.tuples(finite64, finite64), min_size=1, max_size=30))
def test_ratio_properties_numpy_and_torch_agree(pairs):
    a = [p[0] for p in pairs]
    b = [p[1] for p in pairs]
    tol = 1e-4
    vn = ratio_verdict(xp_numpy, _np_array(a), _np_array(b), tol)
    vt = ratio_verdict(xp_torch, _torch_array(a), _torch_array(b), tol)
    assert vn.ratio >= 1.0
    assert vn.ratio == pytest.approx(vt.ratio, rel=1e-12)
    assert vn.symbol_flipping == vt.symbol_flipping
    # the ratio from first principles
    rs = [max(abs(x), tol) / max(abs(y), tol) for x, y in pairs]
    assert vn.ratio == pytest.approx(max(max(rs), 1 / min(rs)), rel=1e-12)
    assert vn.symbol_flipping == (min(x * y for x, y in pairs) < -tol * tol)
    # symmetric in its arguments
    assert ratio_verdict(xp_numpy, _np_array(b), _np_array(a), tol).ratio == pytest.approx(vn.ratio, rel=1e-12)
    # and a compared with itself is exactly 1
    assert ratio_verdict(xp_numpy, _np_array(a), _np_array(a), tol).ratio == 1.0


# ---------------------------------------------------------------------------------------------
# single benchmark (to_cpu)

FP16 = th.single_benchmark_threshold("float16")
FP32 = th.single_benchmark_threshold("float32")


def test_single_benchmark_identical_is_consistent(ns):
    xp, arr = ns
    vals = [0.0, 0.25, -0.75, 1.0, -3.0, 1e6]
    v = single_verdict(xp, arr(vals), arr(vals), FP32)
    assert (v.abs_err, v.rel_err, v.error_balance, v.nonfinite_mismatch, v.consistent) == (0.0, 0.0, 0.0, False, True)


def test_single_benchmark_figures_from_first_principles(ns):
    xp, arr = ns
    actual = [0.5, -0.25, 2.0, -4.0]
    golden = [0.5001, -0.25, 2.002, -4.0]
    v = single_verdict(xp, arr(actual), arr(golden), FP32)
    assert v.abs_err == pytest.approx(1e-4, rel=1e-6)  # |0.5 - 0.5001|, |actual| < 1
    assert v.rel_err == pytest.approx(0.002 / 2.002, rel=1e-6)  # |actual| >= 1
    # eb = mean(d / s), s = |golden| if >= 1 else 1
    assert v.error_balance == pytest.approx((-1e-4 + 0 + -0.002 / 2.002 + 0) / 4, rel=1e-6)
    assert not v.consistent


def test_single_benchmark_abs_and_rel_limits(ns):
    xp, arr = ns
    n = 1000  # one differing element among many keeps the error balance far below its limit
    small = [0.5] * n
    near = list(small)
    near[3] = 0.5 + 0.5 * FP32.small_value_atol
    assert single_verdict(xp, arr(small), arr(near), FP32).consistent
    near[3] = 0.5 + 2 * FP32.small_value_atol
    assert not single_verdict(xp, arr(small), arr(near), FP32).consistent
    big = [3.0] * n
    near = list(big)
    near[7] = 3.0 * (1 + 0.5 * FP32.rtol)
    assert single_verdict(xp, arr(big), arr(near), FP32).consistent
    near[7] = 3.0 * (1 + 2 * FP32.rtol)
    assert not single_verdict(xp, arr(big), arr(near), FP32).consistent


@pytest.mark.parametrize("sign", [1, -1])
def test_error_balance_fails_in_both_directions(ns, sign):
    xp, arr = ns
    # fp16 limits: rtol 4.88e-4 lets a 3e-4 relative bias through the rel test; the eb limit is 1e-4
    actual = [2.0] * 10
    golden = [2.0 * (1 + sign * 3e-4)] * 10
    v = single_verdict(xp, arr(actual), arr(golden), FP16)
    assert v.rel_err <= FP16.rtol
    assert v.error_balance == pytest.approx(-sign * 3e-4 / (1 + sign * 3e-4), rel=1e-6)
    assert not v.consistent
    # a bias under the limit passes either way
    golden = [2.0 * (1 + sign * 5e-5)] * 10
    assert single_verdict(xp, arr(actual), arr(golden), FP16).consistent


def test_golden_zero_under_big_actual_fails(ns):
    xp, arr = ns
    v = single_verdict(xp, arr([5.0, 1.0]), arr([0.0, 1.0]), FP32)
    assert v.rel_err == INF
    assert not v.consistent


def test_actual_is_not_modified(ns):
    xp, arr = ns
    actual = arr([INF, NAN, -INF, 1.0, 0.5])
    golden = arr([INF, NAN, -INF, 1.0, 0.5])
    before = np.array(actual, copy=True) if isinstance(actual, np.ndarray) else actual.clone()
    v = single_verdict(xp, actual, golden, FP32)
    assert v.consistent
    assert not v.nonfinite_mismatch
    if isinstance(actual, np.ndarray):
        assert actual.tobytes() == before.tobytes()
    else:
        assert torch.equal(actual.view(torch.int64), before.view(torch.int64))


@pytest.mark.parametrize(
    "actual, golden",
    [([INF, 1.0], [1.0, 1.0]), ([NAN, 1.0], [1.0, 1.0]), ([1.0, 1.0], [NAN, 1.0]), ([INF, 1.0], [-INF, 1.0])],
)
def test_single_benchmark_non_finite_mismatch_fails(ns, actual, golden):
    xp, arr = ns
    a = arr(actual)
    v = single_verdict(xp, a, arr(golden), FP32)
    assert v.nonfinite_mismatch
    assert not v.consistent
    # the figures of the finite part are not poisoned
    assert math.isfinite(v.abs_err) and math.isfinite(v.rel_err) and math.isfinite(v.error_balance)
    # and the actual values are untouched
    assert [float(x) if not math.isnan(float(x)) else "nan" for x in a] == [
        x if not math.isnan(x) else "nan" for x in actual
    ]


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("small_chunks", [False, True])
def test_torch_fast_ratio_path_equals_core_formula(dtype, small_chunks, monkeypatch):
    """The backend's in-place ratio kernel (and its host path for small CPU tensors, a list of
    host numbers) must give the core formula's figures exactly."""
    from probes.backends.torch_backend import BACKEND

    if small_chunks:
        monkeypatch.setattr(metrics, "CHUNK_ELEMENTS", 7)
    g = torch.Generator().manual_seed(3)
    a = torch.randn(5, 11, generator=g, dtype=dtype)
    b = a * (1 + 1e-3 * torch.randn(5, 11, generator=g, dtype=dtype))
    b[0, 0] = -b[0, 0]
    a[4, 10] = 1e-7
    a_before, b_before = a.clone(), b.clone()
    for tol in (1e-4, 1e-3):
        core = metrics.ratio_reductions(BACKEND.namespace(a), a, b, tol)
        assert torch.equal(BACKEND.device_ratio_reductions(a, b, tol), core)
        assert BACKEND.ratio_reductions(a, b, tol) == core.tolist()
    assert torch.equal(a, a_before) and torch.equal(b, b_before)  # inputs untouched
    # a half-precision original against a float32 re-run: cast per chunk, same figures
    h = a.to(torch.bfloat16)
    core = metrics.ratio_reductions(BACKEND.namespace(b), h.float(), b.float(), 1e-4)
    assert torch.equal(BACKEND.device_ratio_reductions(h, b.float(), 1e-4), core)
    assert BACKEND.ratio_reductions(h, b.float(), 1e-4) == core.tolist()


@pytest.mark.parametrize("seed", range(5))
def test_single_benchmark_fast_chunks_equal_the_masked_formula(seed, monkeypatch):
    """The finite fast path, chunked and combined, gives the masked formula's figures."""
    monkeypatch.setattr(metrics, "CHUNK_ELEMENTS", 13)
    g = torch.Generator().manual_seed(seed)
    golden = torch.randn(7, 9, generator=g, dtype=torch.float64) * 3
    golden[0, 0] = 0.0
    actual = golden * (1 + 1e-4 * torch.randn(7, 9, generator=g, dtype=torch.float64))
    actual[0, 0] = 0.5  # small, golden zero
    flat_a, flat_g = actual.reshape(-1), golden.reshape(-1)
    parts = [metrics.single_benchmark_chunk(xp_torch, ca, cg, 1.0).tolist()
             for ca, cg in metrics.iter_chunks(xp_torch, flat_a, flat_g)]
    assert len(parts) > 1
    fast = metrics.combine_single_chunks(parts, actual.numel())
    slow = metrics.single_benchmark_reductions(xp_torch, actual, golden, 1.0).tolist()
    assert fast[:2] == pytest.approx(slow[:2], rel=1e-12) and fast[2] == pytest.approx(slow[2], rel=1e-9, abs=1e-15)
    assert not metrics.needs_nonfinite_single(fast)
    actual[1, 1] = math.inf
    chunk = metrics.single_benchmark_chunk(xp_torch, actual.reshape(-1), golden.reshape(-1), 1.0).tolist()
    assert metrics.needs_nonfinite_single(chunk)
