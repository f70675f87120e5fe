"""Tests for probes.free_benchmark.compare.compare_outputs on the torch backend.

Expected verdicts come from msprobe's ratio and single-benchmark rules, with its defects fixed
(every chunk counts, NaN/inf never masked, the real output never written, error balance judged
both ways, integer outputs exact, dict and nested outputs compared, Python numbers by the tensor
rule), applied by hand to chosen values.
"""

from __future__ import annotations

import collections
import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from probes.backends.torch_backend import BACKEND
from probes.core import metrics
from probes.core import thresholds as th
from probes.core.leaf_verdicts import StructureMismatch
from probes.core.scaled_comparison import scaled_at_once
from probes.core.trees import format_path
from probes.free_benchmark.compare import compare_outputs, equal_at_once, ratio_at_once


def cmp(original, perturbed, mode="add_noise", **kw):
    return compare_outputs(BACKEND, original, perturbed, pert_mode=mode, **kw)


def by_path(verdicts):
    out = {v.path: v for v in verdicts}
    assert len(out) == len(verdicts)
    return out


def only(verdicts):
    assert len(verdicts) == 1, verdicts
    return verdicts[0]


def t(values, dtype=torch.float32):
    return torch.tensor(values, dtype=dtype)


# ---------------------------------------------------------------------------------------------
# single tensors and the thresholds


def test_single_tensor_identical_is_consistent():
    v = only(cmp(t([1.0, -2.0, 0.0]), t([1.0, -2.0, 0.0])))
    assert v.consistent
    assert v.path == () and format_path(v.path) is None
    assert v.max_rel == 0.0
    assert v.dtype_repr == "torch.float32"
    assert v.shape_repr == str(torch.Size([3]))


@pytest.mark.parametrize(
    "dtype, base, inside, outside, threshold",
    [
        # fp32 T = 1.0002
        (torch.float32, 1.0, 1.0001, 1.0003, 0.0002),
        # fp64 T = 1.0002
        (torch.float64, 1.0, 1.0001, 1.0003, 0.0002),
        # fp16 T = 1.002: 1 ulp at 1.0 is 2^-10 (ratio 1.00098), 3 ulps 1.00293
        (torch.float16, 1.0, 1.0 + 2**-10, 1.0 + 3 * 2**-10, 0.002),
        # bf16 T = 1.004: in [128, 256) the ulp is 1, 255/254 = 1.00394, 255/253 = 1.0079
        (torch.bfloat16, 255.0, 254.0, 253.0, 0.004),
    ],
)
def test_threshold_per_original_dtype(dtype, base, inside, outside, threshold):
    ok = only(cmp(t([base, 3.0], dtype), t([inside, 3.0], dtype)))
    assert ok.consistent
    assert ok.threshold == pytest.approx(threshold, abs=1e-12)
    bad = only(cmp(t([base, 3.0], dtype), t([outside, 3.0], dtype)))
    assert not bad.consistent
    o = t(outside, dtype).item()  # the value as stored in the dtype
    expected = max(base / o, o / base) - 1
    assert bad.max_rel == pytest.approx(expected, abs=1e-6)  # the ratio is computed in float32
    assert bad.threshold == pytest.approx(threshold, abs=1e-12)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float32, torch.float64])
def test_no_change_threshold_is_zero(dtype):
    x = t([1.5, -255.0, 0.25], dtype)
    v = only(cmp(x, x.clone(), "no_change"))
    assert v.consistent and v.threshold == 0.0
    y = x.clone()
    y[1] = torch.nextafter(y[1], t(0.0, dtype))  # one ulp: below every other threshold (bf16: 1/255)
    bad = only(cmp(x, y, "no_change"))
    assert not bad.consistent
    assert bad.max_rel > 0
    assert only(cmp(x, y, "add_noise")).consistent


def test_spec_examples_through_compare_fp16():
    f16 = torch.float16
    ok = only(cmp(t([1.0, -0.0005, 3.0], f16), t([1.001, 0.0004, 3.0], f16)))
    assert ok.consistent
    assert ok.detail["tolerance"] == pytest.approx(1e-3)  # sqrt(1e-6), from b's dtype
    flip = only(cmp(t([1.0, -0.5], f16), t([1.0, 0.5], f16)))
    assert not flip.consistent and flip.max_rel == "symbol_flipping"
    zero = only(cmp(t([0.0, 2.0], f16), t([0.01, 2.0], f16)))
    assert not zero.consistent
    assert zero.max_rel == pytest.approx(8.996, rel=2e-3)  # ratio ~ 0.01 / 1e-3


def test_spec_example_nan_is_no_longer_masked():
    v = only(cmp(t([math.nan, 2.0], torch.float16), t([5.0, 2.0], torch.float16)))
    assert not v.consistent
    assert v.max_rel == "nan_mismatch"
    both = only(cmp(t([math.nan, 2.0]), t([math.nan, 2.0])))
    assert both.consistent
    inf = only(cmp(t([math.inf, 2.0]), t([3e38, 2.0])))
    assert not inf.consistent and inf.max_rel == "inf_mismatch"
    same_inf = only(cmp(t([math.inf, -math.inf, 2.0]), t([math.inf, -math.inf, 2.0]), "no_change"))
    assert same_inf.consistent


def test_tolerance_override_for_backward_stage():
    a, b = t([0.0, 2.0]), t([0.0005, 2.0])
    # forward fp32 clamp floor 1e-4: 0.0005 / 1e-4 = 5
    assert only(cmp(a, b)).max_rel == pytest.approx(4.0, rel=1e-5)
    # backward floor 1e-3: both sides clamp to 1e-3
    v = only(cmp(a, b, tolerance=1e-3))
    assert v.consistent and v.max_rel == 0.0


def test_chunked_difference_in_first_element(monkeypatch):
    monkeypatch.setattr(metrics, "CHUNK_ELEMENTS", 64)
    a = torch.linspace(1.0, 2.0, 1000)
    b = a.clone()
    b[0] = 1.01
    v = only(cmp(a, b))
    assert not v.consistent
    assert v.max_rel == pytest.approx(0.01, rel=1e-4)


def test_empty_tensor_gives_no_verdict():
    assert cmp(torch.empty(0), torch.empty(0)) == []


# ---------------------------------------------------------------------------------------------
# improve_precision: fp16/bf16 original vs float32 perturbed


def test_improve_precision_spec_example_flagged():
    v = only(cmp(t([1.0, 100.0], torch.float16), t([1.0004, 100.3]), "improve_precision"))
    assert not v.consistent
    assert v.max_rel == pytest.approx(0.003, rel=1e-3)
    assert v.threshold == pytest.approx(0.002)  # the fp16 original decides T
    assert v.dtype_repr == "torch.float16"
    assert v.detail["tolerance"] == pytest.approx(1e-4)  # b is fp32


def test_improve_precision_threshold_comes_from_original_dtype():
    # ratio 1.001: inside fp16's 1.002 although far outside fp32's 1.0002
    v = only(cmp(t([1.0, 100.0], torch.float16), t([1.0004, 100.1]), "improve_precision"))
    assert v.consistent
    w = only(cmp(t([1.0, 100.0], torch.bfloat16), t([1.0004, 100.3]), "improve_precision"))
    assert w.consistent and w.threshold == pytest.approx(0.004)


@settings(max_examples=80, deadline=None)
@given(st.lists(st.floats(-60000.0, 60000.0, allow_nan=False, width=32), min_size=1, max_size=50),
       st.sampled_from([torch.float16, torch.bfloat16]))
def test_improve_precision_rounding_to_half_is_consistent(values, half):
    exact = t(values)
    rounded = exact.to(half)  # within half an ulp: 2^-11 (fp16) / 2^-8 (bf16) relative, under T - 1
    v = only(cmp(rounded, exact, "improve_precision"))
    assert v.consistent, (v.max_rel, v.detail)


# ---------------------------------------------------------------------------------------------
# structures (dicts and nested containers count) and integer outputs (compared exactly)


def test_tuple_outputs_compare_every_element_with_output_index():
    a = (t([1.0, 2.0]), t([3.0, 4.0]), t([5.0]))
    b = (t([1.0, 2.0]), t([3.0, 4.4]), t([5.0]))
    verdicts = cmp(a, b)
    assert [v.path for v in verdicts] == [(0,), (1,), (2,)]
    assert [format_path(v.path) for v in verdicts] == [0, 1, 2]
    assert [v.consistent for v in verdicts] == [True, False, True]
    assert verdicts[1].max_rel == pytest.approx(0.1, rel=1e-5)
    assert verdicts[1].leaf is a[1]


def test_list_output_against_tuple_output():
    verdicts = cmp([t([1.0]), t([2.0])], (t([1.0]), t([2.0])))
    assert [v.consistent for v in verdicts] == [True, True]


def test_dict_and_nested_outputs_are_traversed():
    a = {"x": t([1.0]), "y": [t([2.0]), (t([3.0]), {"z": t([4.0])})]}
    b = {"x": t([1.0]), "y": [t([2.0]), (t([3.0]), {"z": t([-4.0])})]}
    verdicts = cmp(a, b)
    paths = [v.path for v in verdicts]
    assert paths == [("x",), ("y", 0), ("y", 1, 0), ("y", 1, 1, "z")]
    bad = [v for v in verdicts if not v.consistent]
    assert len(bad) == 1
    assert bad[0].path == ("y", 1, 1, "z")
    assert format_path(bad[0].path) == "y.1.1.z"
    assert bad[0].max_rel == "symbol_flipping"


NT = collections.namedtuple("NT", "out aux")


def test_named_tuple_outputs():
    verdicts = cmp(NT(t([1.0]), t([2.0])), NT(t([1.0]), t([2.5])))
    assert [v.consistent for v in verdicts] == [True, False]


def test_max_indices_compared_exactly():
    x = t([[1.0, 5.0, 2.0], [7.0, 0.0, 3.0]])
    same = cmp(torch.max(x, dim=1), torch.max(x.clone(), dim=1))
    assert len(same) == 2
    assert all(v.consistent for v in same)
    idx = same[1]
    assert idx.path == (1,) and idx.dtype_repr == "torch.int64"
    assert idx.max_rel is None

    # the max of row 0 moves from column 1 (5.0) to column 2 (6.0)
    y = t([[1.0, 5.0, 6.0], [7.0, 0.0, 3.0]])
    values, indices = cmp(torch.max(x, dim=1), torch.max(y, dim=1))
    assert not values.consistent
    assert values.max_rel == pytest.approx(0.2, rel=1e-5)  # 6 / 5
    assert not indices.consistent
    assert indices.max_rel == "value_mismatch"
    assert indices.detail["differing_elements"] == 1


def test_index_change_from_zero_is_not_a_huge_ratio():
    a = (t([1.0]), torch.tensor([0, 2]))
    b = (t([1.0]), torch.tensor([2, 2]))
    ok, idx = cmp(a, b)
    assert ok.consistent
    assert not idx.consistent and idx.max_rel == "value_mismatch"
    assert idx.figure == math.inf


def test_bool_outputs_compared_exactly():
    a = torch.tensor([True, False, True])
    assert only(cmp(a, a.clone())).consistent
    v = only(cmp(a, torch.tensor([True, True, True])))
    assert not v.consistent and v.detail["differing_elements"] == 1


@pytest.mark.parametrize(
    "a, b",
    [
        ((t([1.0]), t([2.0])), (t([1.0]),)),
        (t([1.0]), (t([1.0]),)),
        ((t([1.0]),), t([1.0])),
        ({"a": t([1.0])}, {"b": t([1.0])}),
        ({"a": t([1.0])}, [t([1.0])]),
        (t([1.0]), None),
        (None, t([1.0])),
        ([t([1.0]), 2.0], [t([1.0]), t([2.0])]),
    ],
)
def test_structure_mismatch_raises(a, b):
    with pytest.raises(StructureMismatch):
        cmp(a, b)
    with pytest.raises(StructureMismatch):
        cmp(a, b, "to_cpu")


@pytest.mark.parametrize("mode", ["add_noise", "to_cpu", "no_change"])
@pytest.mark.parametrize("a, b", [
    (t([2.0, 2.0, 2.0]), t([2.0])),  # broadcastable: used to be judged consistent
    (t([2.0, 2.0, 2.0]), t([2.0, 2.0])),  # used to raise a raw RuntimeError
    (t([[1.0, 2.0]]), t([1.0, 2.0])),
    (torch.tensor([1, 2, 3]), torch.tensor([1])),
])
def test_tensor_leaf_shape_change_is_a_structure_mismatch(mode, a, b):
    # regression: a float leaf whose shape changed was compared after broadcasting
    try:
        verdicts = cmp(a, b, mode)
    except StructureMismatch:
        return
    assert not all(v.consistent for v in verdicts)


# ---------------------------------------------------------------------------------------------
# Python numbers (the tensor rule on their values, not msprobe's isclose)


def test_float_outputs_use_the_tensor_rule():
    # isclose (rel 1e-9) would flag 1e-8; the ratio rule with T = 1.0002 does not
    assert only(cmp(1.0, 1.0 + 1e-8)).consistent
    assert only(cmp(1.0, 1.0001)).consistent
    v = only(cmp(1.0, 1.001))
    assert not v.consistent
    assert v.max_rel == pytest.approx(0.001, rel=1e-6)
    # ratio >= 1 in both directions: the reference's origin/perturbed gave a negative max_rel here
    w = only(cmp(1.001, 1.0))
    assert not w.consistent
    assert w.max_rel == pytest.approx(0.001, rel=1e-6)
    # the reference added 1e-8 to both sides when the perturbed value was 0; clamping handles it
    assert only(cmp(1e-9, 0.0)).consistent
    flip = only(cmp(2.0, -2.0))
    assert not flip.consistent and flip.max_rel == "symbol_flipping"


def test_float_in_tuple_and_special_values():
    got = by_path(cmp((t([1.0]), 0.5), (t([1.0]), 0.6)))
    assert set(got) == {(0,), (1,)}
    ok, bad = got[(0,)], got[(1,)]
    assert ok.consistent
    assert bad.path == (1,) and not bad.consistent
    assert bad.max_rel == pytest.approx(0.2, rel=1e-9)
    assert only(cmp(math.nan, math.nan)).consistent
    assert only(cmp(math.inf, math.inf)).consistent
    assert only(cmp(math.nan, 1.0)).max_rel == "nan_mismatch"
    assert only(cmp(math.inf, 1.0)).max_rel == "inf_mismatch"
    assert only(cmp(1.0, 1.0, "no_change")).consistent
    assert not only(cmp(1.0, math.nextafter(1.0, 2.0), "no_change")).consistent


def test_python_int_outputs_exact():
    got = by_path(cmp((t([1.0]), 3), (t([1.0]), 4)))
    assert got[(0,)].consistent
    assert not got[(1,)].consistent and got[(1,)].max_rel == "value_mismatch"
    assert all(v.consistent for v in cmp((t([1.0]), 3), (t([1.0]), 3)))


# ---------------------------------------------------------------------------------------------
# to_cpu: the single-benchmark rule (real output untouched, error balance judged both ways)


def test_to_cpu_identical_is_consistent_and_has_no_max_rel():
    v = only(cmp(t([2.0, 0.5], torch.float16), t([2.0, 0.5]), "to_cpu"))
    assert v.consistent
    assert v.max_rel is None
    assert v.threshold == pytest.approx(2.0**-11)  # picked by the actual (original) dtype
    assert v.detail["abs_err"] == 0.0 and v.detail["rel_err"] == 0.0 and v.detail["error_balance"] == 0.0


@pytest.mark.parametrize("dtype, rtol", [(torch.float32, 2.0**-14), (torch.float16, 2.0**-11),
                                          (torch.bfloat16, 2.0**-8)])
def test_to_cpu_limits_per_actual_dtype(dtype, rtol):
    n = 1000  # one differing element: the error balance stays tiny
    actual = torch.full((n,), 4.0, dtype=dtype)
    golden = torch.full((n,), 4.0, dtype=torch.float64)
    golden[5] = 4.0 * (1 + 0.5 * rtol)
    assert only(cmp(actual, golden, "to_cpu")).consistent
    golden[5] = 4.0 * (1 + 2 * rtol)
    v = only(cmp(actual, golden, "to_cpu"))
    assert not v.consistent
    assert v.detail["rel_err"] == pytest.approx(2 * rtol / (1 + 2 * rtol), rel=1e-6)
    small = torch.full((n,), 0.5, dtype=dtype)
    golden = torch.full((n,), 0.5, dtype=torch.float64)
    golden[5] = 0.5 + 2 * rtol  # atol == rtol in the table
    v = only(cmp(small, golden, "to_cpu"))
    assert not v.consistent
    assert v.detail["abs_err"] == pytest.approx(2 * rtol, rel=1e-6)


@pytest.mark.parametrize("sign", [1, -1])
def test_to_cpu_error_balance_is_two_sided(sign):
    actual = torch.full((10,), 2.0, dtype=torch.float16)
    golden = torch.full((10,), 2.0 * (1 + sign * 3e-4))
    g = golden[0].item()  # as stored in float32
    v = only(cmp(actual, golden, "to_cpu"))
    assert v.detail["rel_err"] <= 2.0**-11  # passes the rel test
    assert v.detail["error_balance"] == pytest.approx((2.0 - g) / g, rel=1e-9)
    assert not v.consistent


def test_to_cpu_figures_over_many_chunks_equal_one_pass(monkeypatch):
    """to_cpu works in small chunks to bound its float64 temporaries: the worst errors found in
    the first and last chunks and the error balance summed over all of them equal one pass."""
    from probes.free_benchmark import compare as compare_module

    torch.manual_seed(0)
    actual = torch.randn(1000)
    golden = actual * (1 + 1e-3 * torch.randn(1000))
    golden[0] += 0.5  # the worst relative error, in the first chunk
    golden[-1] = 1e-7 * torch.sign(golden[-1])  # a small value, in the last chunk
    whole = only(cmp(actual, golden, "to_cpu"))
    monkeypatch.setattr(compare_module, "SINGLE_BENCHMARK_CHUNK", 64)
    chunked = only(cmp(actual, golden, "to_cpu"))
    assert not whole.consistent and not chunked.consistent
    for key in ("abs_err", "rel_err", "error_balance"):
        assert chunked.detail[key] == pytest.approx(whole.detail[key], rel=1e-12), key


def test_to_cpu_golden_zero_under_big_actual_fails():
    v = only(cmp(t([5.0, 0.5]), t([0.0, 0.5]), "to_cpu"))
    assert not v.consistent
    assert v.detail["rel_err"] == math.inf


def test_to_cpu_does_not_modify_the_real_output():
    actual = t([math.inf, math.nan, -math.inf, 1.0])
    keep = actual.clone()
    v = only(cmp(actual, t([math.inf, math.nan, -math.inf, 1.0]), "to_cpu"))
    assert v.consistent
    assert torch.equal(actual.view(torch.int32), keep.view(torch.int32))
    w = only(cmp(actual, t([1.0, 1.0, 1.0, 1.0]), "to_cpu"))
    assert not w.consistent and w.detail["nonfinite_mismatch"]
    assert torch.equal(actual.view(torch.int32), keep.view(torch.int32))


def test_to_cpu_structures_and_integers():
    a = (t([1.0, 2.0], torch.float16), torch.tensor([0, 1]), {"k": t([3.0])})
    b = (t([1.0, 2.0]), torch.tensor([0, 2]), {"k": t([3.0])})
    verdicts = cmp(a, b, "to_cpu")
    assert [v.path for v in verdicts] == [(0,), (1,), (2, "k")]
    assert [v.consistent for v in verdicts] == [True, False, True]
    assert verdicts[1].max_rel == "value_mismatch"


def test_to_cpu_python_number_outputs_are_compared():
    # regression: the to_cpu path skipped every non-tensor leaf
    got = by_path(cmp((t([1.0]), 1.0, 3), (t([1.0]), 2.0, 4), "to_cpu"))
    assert got[(0,)].consistent
    assert not got[(1,)].consistent
    assert not got[(2,)].consistent
    same = cmp((t([1.0]), 1.0, 3), (t([1.0]), 1.0, 3), "to_cpu")
    assert all(v.consistent for v in same)


def test_verdicts_follow_output_order():
    # was a bug: Python-number verdicts came before the tensor verdicts of the batched transfer
    verdicts = cmp((t([1.0]), 0.5, t([2.0]), 3), (t([1.0]), 0.6, t([2.0]), 4))
    assert [v.path for v in verdicts] == [(0,), (1,), (2,), (3,)]


def _fields(verdicts):
    """A verdict as comparable values (the leaf itself is a tensor)."""
    return [(v.path, v.consistent, v.max_rel, v.threshold, v.figure, v.dtype_repr, v.shape_repr, v.detail,
             v.leaf is None or v.leaf.data_ptr()) for v in verdicts]


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float32, torch.float64, torch.int64,
                                   torch.bool])
@pytest.mark.parametrize("shape", [(), (0,), (3, 4), (70, 80)])
@pytest.mark.parametrize("tolerance", [None, th.BACKWARD_TOLERANCE])
@pytest.mark.parametrize("rule, stage", [("reference", "forward"), ("scaled", "forward"), ("scaled", "backward")])
def test_equal_at_once_gives_the_comparisons_verdicts(dtype, shape, tolerance, rule, stage):
    """no_change's verdicts made at the call for equal plain outputs are the comparison's, under
    either rule (twice: the second comes from what the first worked out)."""
    a = (torch.randn(shape) * 3).to(dtype)
    kw = {"tolerance": tolerance, "rule": rule, "stage": stage}
    for b in (a.clone(), a, a.clone()):
        fast = equal_at_once(BACKEND, a, b, pert_mode="no_change", **kw)
        assert fast is not None
        assert _fields(fast) == _fields(cmp(a, b, "no_change", **kw))
    t = torch.randn(70, 80)
    assert _fields(equal_at_once(BACKEND, t.t(), t.t().clone(), pert_mode="no_change", **kw)) == _fields(
        cmp(t.t(), t.t().clone(), "no_change", **kw))  # a transposed view


class _Sub(torch.Tensor):
    pass


def test_equal_at_once_leaves_everything_else_to_the_comparison():
    a = torch.randn(4, 5)
    changed = a.clone()
    changed[1, 1] += 1
    with_nan = a.clone()
    with_nan[0, 0] = math.nan
    for original, perturbed in [(a, changed), (with_nan, with_nan.clone()), ((a,), (a.clone(),)),
                                (a.as_subclass(_Sub), a.clone()), (torch.randn(3, dtype=torch.complex64),) * 2,
                                (a, a.double()), (2.0, 2.0)]:
        assert equal_at_once(BACKEND, original, perturbed, pert_mode="no_change") is None


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float32, torch.float64])
@pytest.mark.parametrize("shape", [(), (3, 4), (70, 80)])
@pytest.mark.parametrize("tolerance", [None, th.BACKWARD_TOLERANCE])
@pytest.mark.parametrize("mode", ["add_noise", "bit_noise", "change_value", "improve_precision"])
def test_ratio_at_once_gives_the_comparisons_verdicts(dtype, shape, tolerance, mode):
    """The ratio rule's verdict made at the call for small plain CPU outputs is the comparison's:
    a clean output, one a little off, one far off, one with a flipped sign and exact zeros, a
    transposed view, and improve_precision's float32 reference of a half-precision output."""
    g = torch.Generator().manual_seed(3)
    a = (torch.randn(shape, generator=g, dtype=torch.float64) * 3).to(dtype)
    near = (a.double() * (1 + 1e-3)).to(dtype)
    flipped = a.clone()
    flipped.reshape(-1)[0] = -flipped.reshape(-1)[0] if a.numel() else 0
    zeros = torch.where(a.double() > 0, a.double(), 0.0).to(dtype)
    cases = [(a, a.clone()), (a, near), (a, a * 2), (a, flipped), (zeros, zeros.clone()), (zeros, near)]
    if len(shape) == 2:
        cases.append((a.t(), near.t()))
    if mode == "improve_precision" and dtype in (torch.float16, torch.bfloat16):
        cases.append((a, a.float() * (1 + 1e-4)))
    for original, perturbed in cases:
        fast = ratio_at_once(BACKEND, original, perturbed, pert_mode=mode, tolerance=tolerance)
        assert fast is not None
        assert _fields(fast) == _fields(cmp(original, perturbed, mode, tolerance=tolerance))
    assert any(not v.consistent for o, p in cases for v in ratio_at_once(BACKEND, o, p, pert_mode=mode))


def test_ratio_at_once_leaves_everything_else_to_the_comparison():
    """Non-finite figures, large or device-less outputs, containers, subclasses, integer, complex
    and empty tensors, other shapes, and the modes with another rule go through the comparison."""
    from probes.backends import torch_kernels

    a = torch.randn(4, 5)
    with_nan = a.clone()
    with_nan[0, 0] = math.nan
    with_inf = a.clone()
    with_inf[1, 1] = math.inf
    big = torch.randn(torch_kernels.KERNEL_MAX_ELEMENTS + 1)  # beyond the host's limit (with or without C kernels)
    for original, perturbed in [(with_nan, with_nan.clone()), (a, with_inf), (big, big.clone()), ((a,), (a.clone(),)),
                                (a.as_subclass(_Sub), a.clone()), (torch.arange(3), torch.arange(3)),
                                (torch.randn(3, dtype=torch.complex64),) * 2, (torch.ones(0), torch.ones(0)),
                                (a, a.reshape(5, 4)), (a.to("meta"), a.to("meta")), (2.0, 2.0)]:
        assert ratio_at_once(BACKEND, original, perturbed, pert_mode="add_noise") is None
    for mode in ("no_change", "to_cpu"):
        assert ratio_at_once(BACKEND, a, a.clone(), pert_mode=mode) is None


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float32, torch.float64])
@pytest.mark.parametrize("shape", [(), (3, 4), (70, 80)])
@pytest.mark.parametrize("mode, move", [("improve_precision", None), ("add_noise", None), ("bit_noise", "eps"),
                                         ("change_value", None)])
@pytest.mark.parametrize("stage", ["forward", "backward"])
@pytest.mark.parametrize("elementwise", [False, True])
def test_scaled_at_once_gives_the_comparisons_verdicts(dtype, shape, mode, move, stage, elementwise):
    """The scaled rule's verdict made at the call for a small CPU output (settled by its host
    bound, or by its host measure where the bound does not settle it, by rows or element by
    element) is the comparison's, with the input's move when the mode knows it; a leaf over the
    threshold or with inf/NaN is left to the comparison, which measures it (NaN where the
    reference has it too is no mismatch)."""
    g = torch.Generator().manual_seed(5)
    a = (torch.randn(shape, generator=g, dtype=torch.float64) * 3).to(dtype)
    name = str(dtype).replace("torch.", "")
    eps = th.machine_eps(name)
    wide = torch.float32 if dtype in (torch.float16, torch.bfloat16) else torch.float64

    def reference(x):  # improve_precision's is wider than the output
        return x if mode == "improve_precision" else x.to(dtype)

    near = reference(a.to(wide) * (1 + 2 * eps))  # a few ulps off
    spiky = torch.ones(64, 64, dtype=dtype)
    spiky[0, 0] = 100.0  # an error at a large element: over the whole leaf's bound, within its row's
    spiky_ref = spiky.to(wide).clone()
    input_move = eps if move == "eps" else None
    spiky_ref[0, 0] *= 1 + th.scaled_threshold(name, mode, input_move or 0.0, stage) / 2
    kw = {"stage": stage, "elementwise": elementwise}
    cases = [(a, reference(a.to(wide))), (a, near), (spiky, reference(spiky_ref))]
    if len(shape) == 2:
        cases.append((a.t(), near.t()))
    measured = 0
    for original, perturbed in cases:
        fast = scaled_at_once(BACKEND, original, perturbed, pert_mode=mode, input_move=input_move, **kw)
        assert fast is not None
        measured += "bound" not in fast[0].detail
        pointwise = {"pointwise": True} if elementwise else {}
        if elementwise and (mode != "improve_precision" or stage != "forward"):  # the comparison judges by rows
            continue
        assert _fields(fast) == _fields(cmp(original, perturbed, mode, rule="scaled", input_move=input_move,
                                            stage=stage, **pointwise))
    assert measured >= 1  # the host measure, beyond the bound
    with_nan = a.clone()
    with_nan.reshape(-1)[0] = math.nan
    for original, perturbed, flagged in [(a, reference(a.to(wide) * 100 + 7), True), (a, reference(with_nan.to(wide)), True),
                                         (with_nan, reference(with_nan.to(wide)), False)]:
        assert scaled_at_once(BACKEND, original, perturbed, pert_mode=mode, input_move=input_move, **kw) is None
        assert only(cmp(original, perturbed, mode, rule="scaled", input_move=input_move,
                        stage=stage)).consistent is not flagged


def test_scaled_at_once_leaves_everything_else_to_the_comparison():
    """Large or device-less outputs, containers, subclasses, integer, complex and empty tensors,
    other shapes, a measured input move, and the modes judged otherwise go through the
    comparison."""
    from probes.backends import torch_host, torch_kernels

    a = torch.randn(4, 5)
    big = torch.randn(torch_kernels.KERNEL_MAX_ELEMENTS + 1)  # beyond the host's limit, with or without C kernels
    larger = torch.randn(torch_host.HOST_MAX_ELEMENTS + 1)
    # above NumPy's limit, a bound that settles the leaf is known at once where the C kernels are;
    # the fast measure (elementwise, or a bound over the threshold) is the comparison's
    assert (scaled_at_once(BACKEND, larger, larger.clone(), pert_mode="add_noise") is None) is (
        torch_kernels.host_kernels.kernels() is None)
    assert scaled_at_once(BACKEND, larger, larger.clone(), pert_mode="add_noise", elementwise=True) is None
    for original, perturbed in [(big, big.clone()), ((a,), (a.clone(),)), (a.as_subclass(_Sub), a.clone()),
                                (torch.arange(3), torch.arange(3)), (torch.randn(3, dtype=torch.complex64),) * 2,
                                (torch.ones(0), torch.ones(0)), (a, a.reshape(5, 4)), (a.to("meta"), a.to("meta")),
                                (2.0, 2.0)]:
        assert scaled_at_once(BACKEND, original, perturbed, pert_mode="add_noise") is None
        assert scaled_at_once(BACKEND, original, perturbed, pert_mode="add_noise", elementwise=True) is None
    assert scaled_at_once(BACKEND, a, a.clone(), pert_mode="add_noise", input_move=torch.zeros(3)) is None
    for mode in ("no_change", "to_cpu"):
        assert scaled_at_once(BACKEND, a, a.clone(), pert_mode=mode) is None


def test_host_figures_overflow_into_figures_not_warnings():
    """Products and quotients that overflow float32 on the host are inf in the figures, as on
    torch's kernels, and never a RuntimeWarning in the user's output (a suite run with -W error
    would make each one a probe error)."""
    import warnings

    a, b = torch.tensor([3e38, 1.0, -2.0]), torch.tensor([1e-30, -3e38, 3e38])
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert BACKEND.host_ratio_reductions(a, b, 1e-7)[0] == math.inf
        assert BACKEND.host_scaled_bound(a, b)[1] == math.inf  # squares overflow: the full measure decides
        assert not math.isfinite(BACKEND.host_scaled_figures(a, b, th.machine_eps("float32"))[0])
        assert not only(cmp(a, b, "improve_precision", rule="scaled")).consistent
