"""Tests for probes.free_benchmark.perturbations on the torch backend: msprobe's modes, with its
defects fixed (add_noise that rounds away, bit_noise turning inf into NaN, tuples rebuilt as
lists, cancelled perturbations re-run, keyword tensors ignored, fp8 not upcast).

The 16-bit dtypes are checked exhaustively (every bit pattern); float32/float64 with hypothesis over
random bit patterns plus ordinary values. Expected values come from torch.nextafter and msprobe's
arithmetic, never from the code under test.
"""

from __future__ import annotations

import collections
import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from probes.backends.torch_backend import BACKEND, TorchBackend
from probes.free_benchmark.perturbations import (
    PERT_MODES,
    Cancelled,
    PerturbedCall,
    make_perturbation,
)

DTYPES = [torch.float16, torch.bfloat16, torch.float32, torch.float64]
DTYPE_IDS = ["fp16", "bf16", "fp32", "fp64"]
INT_VIEW = {torch.float16: torch.int16, torch.bfloat16: torch.int16, torch.float32: torch.int32,
            torch.float64: torch.int64}
# msprobe's table: noise value v (the add_noise gate is sqrt(v)) and the bit_noise gate
NOISE = {torch.float16: 1e-6, torch.bfloat16: 1e-4, torch.float32: 1e-8, torch.float64: 1e-16}
SMALLEST_NORMAL = {torch.float16: 2.0**-14, torch.bfloat16: 2.0**-126, torch.float32: 2.0**-126,
                   torch.float64: 2.0**-1022}

dtype_param = pytest.mark.parametrize("dtype", DTYPES, ids=DTYPE_IDS)


def bits(t: torch.Tensor) -> torch.Tensor:
    return t.view(INT_VIEW[t.dtype])


def same_bits(a: torch.Tensor, b: torch.Tensor) -> bool:
    return a.dtype == b.dtype and a.shape == b.shape and torch.equal(bits(a), bits(b))


def next_up(x: torch.Tensor) -> torch.Tensor:
    return torch.nextafter(x, torch.full_like(x, math.inf))


def next_down(x: torch.Tensor) -> torch.Tensor:
    return torch.nextafter(x, torch.full_like(x, -math.inf))


def next_out(x: torch.Tensor) -> torch.Tensor:
    """One ulp away from zero (what add_noise's ulp style does)."""
    return torch.where(x >= 0, next_up(x), next_down(x))


def all_16bit(dtype: torch.dtype) -> torch.Tensor:
    return torch.arange(-(2**15), 2**15, dtype=torch.int32).to(torch.int16).view(dtype)


def perturb_one(mode: str, x: torch.Tensor, style: str = "ulp") -> torch.Tensor:
    out = make_perturbation(mode, BACKEND, style).build((x,), {})
    assert isinstance(out, PerturbedCall), out
    assert len(out.args) == 1
    return out.args[0]


def mixed_tensor(dtype: torch.dtype) -> torch.Tensor:
    vals = [0.0, -0.0, 1.0, -1.0, 0.003, -0.02, 0.3, 5.0, -700.0, 1e-5, math.inf, -math.inf, math.nan]
    t = torch.tensor(vals, dtype=torch.float64).to(dtype)
    tiny = torch.tensor([SMALLEST_NORMAL[dtype]], dtype=dtype) / 4  # a subnormal
    return torch.cat([t, tiny, torch.tensor([torch.finfo(dtype).max, -torch.finfo(dtype).max], dtype=dtype)])


@st.composite
def float_tensors(draw, dtype: torch.dtype) -> torch.Tensor:
    """Random bit patterns (every class of value: nan, inf, subnormal, huge) plus ordinary numbers."""
    ibits = torch.iinfo(INT_VIEW[dtype]).bits
    raw = draw(st.lists(st.integers(-(2 ** (ibits - 1)), 2 ** (ibits - 1) - 1), min_size=0, max_size=24))
    ordinary = draw(st.lists(st.floats(-4.0, 4.0, allow_nan=False), min_size=1, max_size=24))
    a = torch.tensor(raw, dtype=INT_VIEW[dtype]).view(dtype)
    b = torch.tensor(ordinary, dtype=torch.float64).to(dtype)
    return torch.cat([a, b])


# ---------------------------------------------------------------------------------------------
# general rules


def test_unknown_mode_is_rejected():
    with pytest.raises(ValueError, match="pert_mode"):
        make_perturbation("shuffle", BACKEND)
    assert set(PERT_MODES) == {"improve_precision", "add_noise", "bit_noise", "change_value", "no_change", "to_cpu"}


@pytest.mark.parametrize("mode", PERT_MODES)
@dtype_param
def test_inputs_are_never_modified(mode, dtype):
    x = mixed_tensor(dtype).reshape(4, 4)
    y = torch.linspace(-3, 3, 6, dtype=torch.float64).to(dtype)
    kw = torch.linspace(0.01, 0.02, 5, dtype=torch.float64).to(dtype)
    keep = (x.clone(), y.clone(), kw.clone())
    args, kwargs = (x, [y]), {"w": kw, "inplace": True}
    out = make_perturbation(mode, BACKEND).build(args, kwargs)
    for t, before in zip((x, y, kw), keep):
        assert same_bits(t, before)
    assert args[1] == [y] and kwargs == {"w": kw, "inplace": True}  # containers untouched too
    if isinstance(out, PerturbedCall):
        assert out.kwargs["inplace"] is False


@pytest.mark.parametrize("mode", PERT_MODES)
def test_inplace_is_forced_false_without_touching_callers_kwargs(mode):
    x = torch.tensor([0.5, 0.25, 2.0], dtype=torch.float16)
    kwargs = {"inplace": True, "alpha": 2}
    out = make_perturbation(mode, BACKEND).build((x,), kwargs)
    assert isinstance(out, PerturbedCall)
    assert out.kwargs["inplace"] is False
    assert out.kwargs["alpha"] == 2
    assert kwargs == {"inplace": True, "alpha": 2}


@pytest.mark.parametrize("mode", PERT_MODES)
def test_no_float_tensor_cancels(mode):
    out = make_perturbation(mode, BACKEND).build((torch.arange(4), "text", 3.5), {"k": torch.tensor([True])})
    assert isinstance(out, Cancelled)
    assert out.reason


@pytest.mark.parametrize("mode", ["add_noise", "bit_noise", "change_value", "no_change"])
def test_only_first_eligible_tensor_is_perturbed(mode):
    first = torch.tensor([0.5, 0.003, -2.0, 7.0])
    second = torch.tensor([0.5, 0.003, -2.0, 7.0])
    ints = torch.arange(4)
    out = make_perturbation(mode, BACKEND).build((ints, first, second), {"z": second})
    assert isinstance(out, PerturbedCall)
    assert out.args[0] is ints
    assert out.args[2] is second
    assert out.kwargs["z"] is second
    if mode != "no_change":
        assert not same_bits(out.args[1], first)


@pytest.mark.parametrize("mode", ["add_noise", "bit_noise", "change_value"])
def test_tensor_failing_precheck_does_not_stop_search(mode):
    empty = torch.empty(0)
    target = torch.tensor([0.5, 0.003, -2.0, 7.0])
    out = make_perturbation(mode, BACKEND).build((empty, target), {})
    assert isinstance(out, PerturbedCall)
    assert out.args[0] is empty
    assert not same_bits(out.args[1], target)


@pytest.mark.skipif(not hasattr(torch, "float8_e8m0fnu"), reason="no float8_e8m0fnu in this torch")
@pytest.mark.parametrize("mode", ["add_noise", "bit_noise", "change_value"])
def test_unsupported_float_dtype_is_skipped(mode):
    # the MX scale format (FP8 element formats are perturbed in their grid: test_free_benchmark_fp8.py)
    fp8 = torch.tensor([0.5, 2.0]).to(torch.float8_e8m0fnu)
    target = torch.tensor([0.5, 0.003, -2.0, 7.0])
    out = make_perturbation(mode, BACKEND).build((fp8, target), {})
    assert isinstance(out, PerturbedCall)
    assert out.args[0] is fp8
    assert not same_bits(out.args[1], target)


@pytest.mark.parametrize("mode", ["add_noise", "bit_noise", "change_value"])
def test_target_passed_by_keyword_is_found(mode):
    x = torch.tensor([0.5, 0.003, -2.0, 7.0])
    out = make_perturbation(mode, BACKEND).build((), {"input": x, "dim": 0})
    assert isinstance(out, PerturbedCall)
    assert out.args == ()
    assert out.kwargs["dim"] == 0
    assert not same_bits(out.kwargs["input"], x)
    # a keyword target nested in a container too
    out = make_perturbation(mode, BACKEND).build((1,), {"tensors": [torch.arange(3), (x,)]})
    assert isinstance(out, PerturbedCall)
    nested = out.kwargs["tensors"]
    assert type(nested) is list and type(nested[1]) is tuple
    assert not same_bits(nested[1][0], x)


Pair = collections.namedtuple("Pair", "left right")


@pytest.mark.parametrize("mode", ["add_noise", "bit_noise", "change_value", "improve_precision", "to_cpu"])
def test_container_types_are_kept(mode):
    x = torch.tensor([0.5, 0.003, -2.0, 7.0], dtype=torch.float16)
    y = torch.tensor([1.5, 3.0], dtype=torch.float16)
    args = ((x, y), [y], Pair(x, y))
    kwargs = {"d": {"t": (y,)}}
    out = make_perturbation(mode, BACKEND).build(args, kwargs)
    assert isinstance(out, PerturbedCall)
    assert type(out.args) is tuple
    assert type(out.args[0]) is tuple
    assert type(out.args[1]) is list
    assert type(out.args[2]) is Pair
    assert type(out.kwargs["d"]) is dict and type(out.kwargs["d"]["t"]) is tuple


# ---------------------------------------------------------------------------------------------
# add_noise, ulp style (default; msprobe's x + v rounds back to x for most magnitudes)


def check_add_noise_ulp(x: torch.Tensor, y: torch.Tensor) -> None:
    dtype = x.dtype
    gate = NOISE[dtype] ** 0.5
    up = next_out(x)
    finite = torch.isfinite(x)
    big = x.double().abs() > gate  # the gate in exact arithmetic, not rounded to the dtype
    eligible = finite & big & torch.isfinite(up)  # only ±max have no finite value further out
    assert torch.equal(bits(y)[eligible], bits(up)[eligible])
    assert torch.equal(bits(y)[~eligible], bits(x)[~eligible])
    # noise never creates a non-finite value out of a finite one
    assert bool(torch.isfinite(y)[finite].all())


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=["fp16", "bf16"])
def test_add_noise_ulp_exhaustive_16bit(dtype):
    x = all_16bit(dtype)
    y = perturb_one("add_noise", x)
    check_add_noise_ulp(x, y)
    # a real perturbation for every magnitude above the gate, not only in the reference's narrow band
    moved = ~same_bits_elementwise(x, y)
    below_max = x.abs() < torch.finfo(dtype).max  # ±max cannot move further out
    assert bool(moved[torch.isfinite(x) & (x.abs() > 1.0) & below_max].all())


def same_bits_elementwise(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    return bits(a) == bits(b)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64], ids=["fp32", "fp64"])
@settings(max_examples=60, deadline=None)
@given(data=st.data())
def test_add_noise_ulp_property(dtype, data):
    x = data.draw(float_tensors(dtype))
    y = perturb_one("add_noise", x)
    check_add_noise_ulp(x, y)


@dtype_param
def test_add_noise_ulp_examples(dtype):
    gate = NOISE[dtype] ** 0.5
    x = torch.tensor([2.0, -2.0, 0.75, 1000.0, -gate / 2, 0.0, gate / 10], dtype=torch.float64).to(dtype)
    y = perturb_one("add_noise", x)
    assert same_bits(y[:4], next_out(x[:4]))
    assert bool((y[:4].abs() > x[:4].abs()).all())  # away from zero, whatever the sign
    assert same_bits(y[4:], x[4:])


@dtype_param
def test_add_noise_keeps_non_finite(dtype):
    x = torch.tensor([math.inf, -math.inf, math.nan, 3.0], dtype=dtype)
    y = perturb_one("add_noise", x)
    assert same_bits(y[:3], x[:3])
    assert same_bits(y[3:], next_out(x[3:]))


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=["fp16", "bf16"])
def test_add_noise_ulp_moves_smallest_value_above_gate(dtype):
    # regression: the gate was compared in the half dtype, where sqrt(v) rounds up
    # (fp16 0.001 -> 0.0010004, bf16 0.01 -> 0.010010), so this value was left unperturbed
    gate = NOISE[dtype] ** 0.5
    x = torch.tensor([gate, -gate], dtype=dtype)
    assert bool((x.double().abs() > gate).all())  # eligible by the documented rule
    y = perturb_one("add_noise", x)
    assert same_bits(y, next_out(x))


@dtype_param
def test_add_noise_ulp_never_pushes_max_to_inf(dtype):
    top = torch.tensor([torch.finfo(dtype).max, -torch.finfo(dtype).max], dtype=dtype)
    assert same_bits(perturb_one("add_noise", top), top)
    below = torch.nextafter(top, torch.zeros_like(top))
    assert same_bits(perturb_one("add_noise", below), top)


# ---------------------------------------------------------------------------------------------
# add_noise, reference style (msprobe's: x + v in x's own dtype where |x| > sqrt(v))


def reference_noise(x: torch.Tensor) -> torch.Tensor:
    v = NOISE[x.dtype]
    v_in_dtype = torch.tensor(v, dtype=x.dtype).double()
    gate_in_dtype = torch.tensor(v**0.5, dtype=x.dtype)
    noisy = (x.double() + v_in_dtype).to(x.dtype)  # the exact sum, rounded once to the dtype
    return torch.where(x.abs() > gate_in_dtype, noisy, x)


@pytest.mark.parametrize("dtype, band", [(torch.float16, (0.001, 0.0039063)), (torch.bfloat16, (0.01, 0.03125))],
                         ids=["fp16", "bf16"])
def test_add_noise_reference_exhaustive_16bit(dtype, band):
    x = all_16bit(dtype)
    y = perturb_one("add_noise", x, "reference")
    assert same_bits(y, reference_noise(x))
    # msprobe's x + v rounds back to x outside a narrow band: only band[0] < |x| <~ band[1] really changes
    changed = ~same_bits_elementwise(x, y) & torch.isfinite(x)
    mags = x[changed].double().abs()
    assert mags.min().item() > band[0]
    assert mags.max().item() <= band[1]
    assert changed.sum().item() > 10


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64], ids=["fp32", "fp64"])
@settings(max_examples=60, deadline=None)
@given(data=st.data())
def test_add_noise_reference_property(dtype, data):
    x = data.draw(float_tensors(dtype))
    y = perturb_one("add_noise", x, "reference")
    assert same_bits(y, reference_noise(x))


def test_add_noise_reference_fp32_band():
    above = torch.linspace(0.2501, 1000.0, 4001, dtype=torch.float32)
    assert same_bits(perturb_one("add_noise", above, "reference"), above)  # fp32 values > 0.25 unchanged
    inside = torch.tensor([0.001, 0.01, -0.1, 0.2], dtype=torch.float32)
    y = perturb_one("add_noise", inside, "reference")
    assert bool((y > inside).all())
    below = torch.tensor([1e-4, -5e-5, 0.0], dtype=torch.float32)
    assert same_bits(perturb_one("add_noise", below, "reference"), below)


def test_add_noise_reference_fp64_band():
    above = torch.linspace(1.0, 1e6, 1001, dtype=torch.float64)
    assert same_bits(perturb_one("add_noise", above, "reference"), above)
    inside = torch.tensor([0.75, 1e-3, -0.5, 2e-8], dtype=torch.float64)
    y = perturb_one("add_noise", inside, "reference")
    assert bool((y > inside).all())
    assert y[3].item() == pytest.approx(2e-8 + 1e-16, rel=1e-12)


# ---------------------------------------------------------------------------------------------
# bit_noise (msprobe's, but infinities stay infinite)


def check_bit_noise(x: torch.Tensor, y: torch.Tensor) -> None:
    eligible = torch.isfinite(x) & (x.double().abs() > SMALLEST_NORMAL[x.dtype])
    # exactly one ulp, either direction: the lowest mantissa bit flipped
    assert torch.equal(bits(y)[eligible], bits(x)[eligible] ^ 1)
    ye, xe = y[eligible], x[eligible]
    assert bool(((ye == next_up(xe)) | (ye == next_down(xe))).all())
    assert bool((ye != xe).all())
    # zeros, subnormals, the smallest normal, inf and NaN keep their bits (inf stays inf; msprobe made it NaN)
    assert torch.equal(bits(y)[~eligible], bits(x)[~eligible])


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=["fp16", "bf16"])
def test_bit_noise_exhaustive_16bit(dtype):
    x = all_16bit(dtype)
    check_bit_noise(x, perturb_one("bit_noise", x))


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64], ids=["fp32", "fp64"])
@settings(max_examples=60, deadline=None)
@given(data=st.data())
def test_bit_noise_property(dtype, data):
    x = data.draw(float_tensors(dtype))
    check_bit_noise(x, perturb_one("bit_noise", x))


@dtype_param
def test_bit_noise_keeps_inf_and_nan(dtype):
    x = torch.tensor([math.inf, -math.inf, math.nan, 0.0, -0.0, 1.0], dtype=dtype)
    y = perturb_one("bit_noise", x)
    assert y[0].item() == math.inf
    assert y[1].item() == -math.inf
    assert math.isnan(y[2].item())
    assert same_bits(y[:5], x[:5])
    assert y[5].item() != 1.0


@dtype_param
def test_bit_noise_on_non_contiguous_input(dtype):
    base = torch.linspace(1, 12, 12, dtype=torch.float64).to(dtype).reshape(3, 4)
    for x in (base.t(), base[:, ::2]):
        keep = x.clone()
        y = perturb_one("bit_noise", x)
        assert y.shape == x.shape
        assert same_bits(x, keep)
        assert torch.equal(bits(y.contiguous()), bits(x.contiguous()) ^ 1)


# ---------------------------------------------------------------------------------------------
# change_value (msprobe's swap of x[0] / x[-1], or x[0][0] / x[-1][-1] from 2-D up)


@dtype_param
def test_change_value_1d_swaps_first_and_last(dtype):
    x = torch.arange(5, dtype=dtype)
    y = perturb_one("change_value", x)
    assert y.tolist() == [4.0, 1.0, 2.0, 3.0, 0.0]
    assert x.tolist() == [0.0, 1.0, 2.0, 3.0, 4.0]


@dtype_param
def test_change_value_2d_swaps_corner_scalars(dtype):
    x = torch.arange(12, dtype=dtype).reshape(3, 4)
    y = perturb_one("change_value", x)
    expected = x.clone()
    expected[0, 0], expected[2, 3] = 11.0, 0.0
    assert torch.equal(y, expected)


@dtype_param
def test_change_value_3d_swaps_trailing_slices(dtype):
    x = torch.arange(24, dtype=dtype).reshape(2, 3, 4)
    y = perturb_one("change_value", x)
    assert torch.equal(y[0, 0, :], x[1, 2, :])
    assert torch.equal(y[1, 2, :], x[0, 0, :])
    changed = y != x
    assert changed.sum().item() == 8
    assert bool(changed[0, 0, :].all()) and bool(changed[1, 2, :].all())


@pytest.mark.parametrize("shape, a, b", [((1, 5), (0, 0), (0, 4)), ((4, 1), (0, 0), (3, 0)),
                                         ((1, 3, 2), (0, 0), (0, 2))])
def test_change_value_thin_shapes(shape, a, b):
    x = torch.arange(math.prod(shape), dtype=torch.float32).reshape(shape)
    y = perturb_one("change_value", x)
    assert torch.equal(y[a], x[b]) and torch.equal(y[b], x[a])
    mask = torch.ones(shape, dtype=torch.bool)
    mask[a] = False
    mask[b] = False
    assert torch.equal(y[mask], x[mask])


@pytest.mark.parametrize("shape", [(), (1,), (1, 1), (1, 1, 3), (1, 1, 1, 2), (3, 0), (0, 3), (0,)])
def test_change_value_cancels_when_nothing_to_swap(shape):
    x = torch.ones(shape)
    out = make_perturbation("change_value", BACKEND).build((x,), {})
    assert isinstance(out, Cancelled)


# ---------------------------------------------------------------------------------------------
# improve_precision (nothing to upcast: nothing re-run; every narrow float, fp8 included, to float32)


def test_improve_precision_upcasts_every_half_tensor_anywhere():
    h1 = torch.tensor([1.5, -2.25], dtype=torch.float16)
    b1 = torch.tensor([0.1, 3.0], dtype=torch.bfloat16)
    f32 = torch.tensor([1.0, 2.0])
    f64 = torch.tensor([1.0], dtype=torch.float64)
    ints = torch.arange(3)
    h2 = torch.tensor([[7.0]], dtype=torch.float16)
    b2 = torch.tensor([0.5], dtype=torch.bfloat16)
    args = (h1, [b1, f32, (ints, h2)], {"k": f64}, 3)
    kwargs = {"w": b2, "nested": {"deep": [h1]}, "flag": True}
    out = make_perturbation("improve_precision", BACKEND).build(args, kwargs)
    assert isinstance(out, PerturbedCall)
    a = out.args
    for new, old in ((a[0], h1), (a[1][0], b1), (a[1][2][1], h2), (out.kwargs["w"], b2),
                     (out.kwargs["nested"]["deep"][0], h1)):
        assert new.dtype == torch.float32
        assert torch.equal(new, old.to(torch.float32))  # the upcast is exact
    assert a[1][1].dtype == torch.float32 and torch.equal(a[1][1], f32)
    assert a[2]["k"].dtype == torch.float64
    assert a[1][2][0].dtype == torch.int64
    assert a[3] == 3 and out.kwargs["flag"] is True
    assert type(a[1]) is list and type(a[1][2]) is tuple
    # inputs untouched
    assert h1.dtype == torch.float16 and b1.dtype == torch.bfloat16 and kwargs["w"] is b2


def test_improve_precision_target_by_keyword_only():
    h = torch.tensor([1.5], dtype=torch.float16)
    out = make_perturbation("improve_precision", BACKEND).build((), {"input": h})
    assert isinstance(out, PerturbedCall)
    assert out.kwargs["input"].dtype == torch.float32


@pytest.mark.parametrize("args", [
    (torch.tensor([1.0]),),
    (torch.tensor([1.0], dtype=torch.float64), torch.tensor([2.0])),
    (torch.tensor([1.0]), torch.arange(3)),
])
def test_improve_precision_cancels_when_nothing_to_raise(args):
    out = make_perturbation("improve_precision", BACKEND).build(args, {"other": torch.tensor([2.0])})
    assert isinstance(out, Cancelled)


@pytest.mark.skipif(not hasattr(torch, "float8_e4m3fn"), reason="no float8 in this torch")
@pytest.mark.parametrize("order", ["fp8_first", "fp8_last"])
def test_improve_precision_raises_fp8_regardless_of_order(order):
    fp8 = torch.tensor([0.5, 2.0]).to(torch.float8_e4m3fn)
    half = torch.tensor([1.0], dtype=torch.float16)
    args = (fp8, half) if order == "fp8_first" else (half, fp8)
    out = make_perturbation("improve_precision", BACKEND).build(args, {})
    assert isinstance(out, PerturbedCall)
    assert all(t.dtype == torch.float32 for t in out.args)
    alone = make_perturbation("improve_precision", BACKEND).build((fp8,), {})
    assert isinstance(alone, PerturbedCall)
    assert alone.args[0].dtype == torch.float32
    assert alone.args[0].tolist() == [0.5, 2.0]


# ---------------------------------------------------------------------------------------------
# no_change and to_cpu


def test_no_change_passes_the_same_inputs():
    x = torch.tensor([1.0, 2.0])
    out = make_perturbation("no_change", BACKEND).build((x, 3), {"y": x})
    assert isinstance(out, PerturbedCall)
    assert out.args[0] is x and out.args[1] == 3 and out.kwargs["y"] is x


def test_to_cpu_moves_everything_half_as_float32():
    h = torch.tensor([1.5, -0.1], dtype=torch.float16)
    b = torch.tensor([0.1, 3.0], dtype=torch.bfloat16)
    f32 = torch.tensor([1.0, 2.0])
    f64 = torch.tensor([1.0], dtype=torch.float64)
    ints = torch.arange(3)
    out = make_perturbation("to_cpu", BACKEND).build((h, [b, (ints, f64)], "s"), {"w": f32, "d": {"b": b}})
    assert isinstance(out, PerturbedCall)
    assert out.on_cpu
    a = out.args
    leaves = [a[0], a[1][0], a[1][1][0], a[1][1][1], out.kwargs["w"], out.kwargs["d"]["b"]]
    assert all(t.device.type == "cpu" for t in leaves)
    assert [t.dtype for t in leaves] == [torch.float32, torch.float32, torch.int64, torch.float64, torch.float32,
                                         torch.float32]
    assert torch.equal(a[0], h.to(torch.float32)) and torch.equal(a[1][0], b.to(torch.float32))
    assert torch.equal(a[1][1][1], f64) and torch.equal(out.kwargs["w"], f32)
    assert a[2] == "s"
    assert type(a[1]) is list and type(a[1][1]) is tuple
    assert not any(t.requires_grad for t in leaves)


def test_to_cpu_detaches_inputs_that_require_grad():
    x = torch.tensor([1.0, 2.0], requires_grad=True)
    out = make_perturbation("to_cpu", BACKEND).build((x,), {})
    assert isinstance(out, PerturbedCall)
    assert not out.args[0].requires_grad
    assert torch.equal(out.args[0], x.detach())


# ---------------------------------------------------------------------------------------------
# the band tests on the bits (integer clips instead of float comparisons and a where)


def _around(values: list[float], dtype: torch.dtype) -> torch.Tensor:
    """Each value in `dtype`, its neighbours on both sides and their negatives."""
    x = torch.tensor(values, dtype=torch.float64).to(dtype)
    up, down = torch.nextafter(x, torch.full_like(x, math.inf)), torch.nextafter(x, torch.full_like(x, -math.inf))
    both = torch.cat([x, up, down])
    return torch.cat([both, -both, torch.tensor([0.0, math.inf, -math.inf, math.nan], dtype=dtype)])


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float32, torch.float64])
def test_band_tests_pick_what_the_float_comparisons_pick(dtype):
    """add_noise moves |x| > gate (below the largest finite value) one ulp out, bit_noise flips the
    lowest bit of |x| > smallest normal (finite): the same elements the float comparisons choose,
    at and around every limit, including the gate as float32 rounds it for the half types."""
    finfo = torch.finfo(dtype)
    gate = NOISE[dtype] ** 0.5
    x = _around([gate, float(torch.tensor(gate, dtype=torch.float32)), finfo.tiny, finfo.max, 1.0, 1e-30], dtype)
    compared = x.abs().float() if dtype in (torch.float16, torch.bfloat16) else x.abs()
    moves = (compared > gate) & (x.abs() < finfo.max)
    assert torch.equal(bits(perturb_one("add_noise", x)) != bits(x), moves)
    flips = (x.abs() > finfo.tiny) & torch.isfinite(x)
    assert torch.equal(bits(perturb_one("bit_noise", x)) != bits(x), flips)


# ---------------------------------------------------------------------------------------------
# the host path (NumPy views of small plain CPU tensors) against torch's kernels


class _KernelsOnly(type(BACKEND)):
    """The torch backend without its NumPy workspace: every perturbation on torch's kernels."""

    def host_workspace(self, t, moves_only=False):
        return None


KERNELS = _KernelsOnly()
HOST_MODES = [("add_noise", "ulp"), ("add_noise", "reference"), ("bit_noise", "ulp"), ("change_value", "ulp")]


def perturbed_by(backend, mode: str, style: str, x: torch.Tensor) -> torch.Tensor | Cancelled:
    out = make_perturbation(mode, backend, style).build((x,), {})
    return out if isinstance(out, Cancelled) else out.args[0]


@pytest.mark.parametrize("mode, style", HOST_MODES, ids=[f"{m}-{s}" for m, s in HOST_MODES])
@dtype_param
def test_host_path_gives_the_kernels_bits(mode, style, dtype, monkeypatch, kernel_path):
    """Every 16-bit pattern (in halves the host takes), random float32/float64 bit patterns and
    the values around every limit: the same bits on NumPy views (through the host arrays' C
    kernels, and without them) as on torch's kernels, and the host path really taken (the
    workspace is asked and answers); with the C kernels, larger and transposed tensors too."""
    from probes.backends import torch_host

    if dtype in (torch.float16, torch.bfloat16):
        parts = all_16bit(dtype).split(torch_host.HOST_MAX_ELEMENTS)
    else:
        g = torch.Generator().manual_seed(7)
        ibits = torch.iinfo(INT_VIEW[dtype]).bits
        raw = (
            torch.randint(
                -(2 ** (ibits - 1)),
                2 ** (ibits - 1) - 1,
                (torch_host.HOST_MAX_ELEMENTS,),
                generator=g,
                dtype=torch.int64,
            )
            .to(INT_VIEW[dtype])
            .view(dtype)
        )
        parts = (
            raw,
            mixed_tensor(dtype),
            torch.randn(64, 48, generator=g, dtype=torch.float64).to(dtype).t(),
        )
    parts = (*parts, torch.tensor(3.0, dtype=dtype), torch.tensor(math.inf, dtype=dtype))  # 0-d too
    one_pass = kernel_path == "kernels" and mode in ("add_noise", "bit_noise") and style == "ulp"
    if one_pass:  # beyond NumPy's limit, and transposed: the C kernels walk them by address
        large = torch.randn(3 * torch_host.HOST_MAX_ELEMENTS, generator=torch.Generator().manual_seed(3),
                            dtype=torch.float64).to(dtype)
        large[:4] = torch.tensor([math.inf, -0.0, 1e-30, -65504.0])
        parts = (*parts, large, large.reshape(-1, 96).t())
    taken = []
    workspace, band_edited = torch_host.workspace, TorchBackend.band_edited

    def spied(t, moves_only=False):
        found = workspace(t, moves_only)
        taken.append("workspace" if found is not None else "torch")
        return found

    def spied_kernel(t, op, above, below):
        found = band_edited(t, op, above, below)
        if found is not None:
            taken.append("kernel")
        return found

    monkeypatch.setattr(torch_host, "workspace", spied)
    monkeypatch.setattr(TorchBackend, "band_edited", staticmethod(spied_kernel))
    for x in parts:
        keep = x.clone()
        host = perturbed_by(BACKEND, mode, style, x)
        kernels = perturbed_by(KERNELS, mode, style, x)
        if isinstance(kernels, Cancelled):  # change_value of a 0-d tensor: nothing to swap, on both paths
            assert host == kernels
            continue
        assert same_bits(x, keep)  # the input is never written through its view
        assert host.shape == kernels.shape and host.dtype == kernels.dtype
        assert host.stride() == kernels.stride()  # the same layout: a re-run's kernels see the same strides
        assert torch.equal(bits(host.contiguous()), bits(kernels.contiguous()))
        assert not host.requires_grad
    # the C kernel (bit edits, where built), NumPy's views (the other moves and bit edits), and
    # float arithmetic (the reference style) on torch's kernels
    expected = "kernel" if one_pass else "workspace" if style == "ulp" else "torch"
    assert taken and set(taken) == {expected}


def test_host_path_is_not_taken_where_torch_must_compute():
    """A large tensor, one that requires grad through a view, a subclass: torch's kernels."""
    from probes.backends import torch_host

    class Sub(torch.Tensor):
        pass

    big = torch.ones(torch_host.HOST_MAX_ELEMENTS + 1)
    assert torch_host.workspace(big) is None
    assert torch_host.workspace(torch.ones(4).as_subclass(Sub)) is None
    assert torch_host.workspace(torch.ones(4)) is None  # float arithmetic: torch's kernels
    assert torch_host.workspace(torch.ones(4, dtype=torch.bfloat16), moves_only=True) is not None  # its bits
    x = torch.ones(8, requires_grad=True)
    y = perturbed_by(BACKEND, "bit_noise", "ulp", x)
    assert not y.requires_grad and x.grad is None


def _flat_calls() -> list[tuple[tuple, dict]]:
    """Flat calls (plain tensors and scalar-like values, no container): what the usual path hands
    build_usual, with every kind of first floating input it must hand over to build()."""
    x = torch.randn(4, 8)
    calls = [((x, x.t()), {}), ((x.t(), 2.0), {}), ((3, x), {"alpha": 2}), ((torch.arange(4), x), {}),
             ((torch.arange(4),), {"other": x, "inplace": False}), ((torch.empty(0), x), {}),
             ((torch.nn.Parameter(x.clone()),), {}), ((torch.randn(3, dtype=torch.complex64), x), {}),
             ((x.to_sparse(), x), {}), ((torch.ones(3).to(torch.float8_e4m3fn), x), {}),
             ((torch.arange(3),), {}), ((), {}), ((x[:, ::2], x), {}), ((torch.randn(5, 3)[1:, :2],), {})]
    calls += [((x.to(dtype), x), {}) for dtype in DTYPES]
    calls += [((torch.tensor([0.0, 1e-30, -2.5, math.inf, -math.inf, math.nan, 65504.0], dtype=dtype),), {})
              for dtype in DTYPES]
    return calls


def _same_value(x, y) -> bool:
    """The same object, or tensors of one dtype, shape and layout holding the same bytes."""
    if x is y:
        return True
    if not (isinstance(x, torch.Tensor) and isinstance(y, torch.Tensor)):
        return x == y
    if (x.dtype, x.shape, x.layout) != (y.dtype, y.shape, y.layout):
        return False
    if x.layout != torch.strided:
        return torch.equal(x.to_dense(), y.to_dense())
    return torch.equal(x.contiguous().view(torch.uint8), y.contiguous().view(torch.uint8))


def _same_call(a, b) -> bool:
    if isinstance(a, Cancelled) or isinstance(b, Cancelled):
        return a == b
    return (len(a.args) == len(b.args) and list(a.kwargs) == list(b.kwargs)
            and all(map(_same_value, (*a.args, *a.kwargs.values()), (*b.args, *b.kwargs.values())))
            and (a.moved is None) == (b.moved is None)
            and (a.moved is None or all(map(_same_value, a.moved, b.moved)))
            and (a.move, a.on_cpu) == (b.move, b.on_cpu))


@pytest.mark.parametrize("mode", PERT_MODES)
@pytest.mark.parametrize("style", ["ulp", "reference"])
def test_build_usual_builds_what_build_builds(mode, style):
    """The usual path's shortcut (the backend's first float input, the band of its dtype worked
    out once) perturbs the same input the same way as the general search, and hands every
    other case to it."""
    for args, kwargs in _flat_calls():
        pert = make_perturbation(mode, BACKEND, style)
        general = make_perturbation(mode, BACKEND, style).build(args, kwargs)
        assert _same_call(pert.build_usual(args, kwargs), general), (mode, args, kwargs)
        assert _same_call(pert.build_usual(args, kwargs), general), (mode, args, kwargs)  # its cache, warm
    if mode in ("add_noise", "bit_noise", "no_change") and (style == "ulp" or mode != "add_noise"):
        pert = make_perturbation(mode, BACKEND, style)
        pert.build = None  # the usual call's plain float input never takes the general search
        x = torch.randn(4, 8)
        for args, kwargs in (((x, 2.0), {}), ((3, x.t()), {"alpha": 2}), ((torch.arange(4),), {"other": x})):
            assert isinstance(pert.build_usual(args, kwargs), PerturbedCall)


@pytest.mark.parametrize("mode", ["add_noise", "bit_noise"])
@dtype_param
def test_inputs_that_do_not_cover_their_memory_are_edited_in_one_pass_as_in_seven(mode, dtype, monkeypatch):
    """A slice of a transposed tensor, an expanded one, a strided one: the host's one pass walks a
    dense copy of their layout, with the bits and the layout (strides) that the seven strided
    passes give."""
    from probes.backends.host_arrays import HostArrays

    q = (torch.randn(4, 64, 4, 32, dtype=torch.float64) * 10).to(dtype).transpose(1, 2)
    q[0, 0, 0, :4] = torch.tensor([0.0, math.inf, -math.inf, math.nan], dtype=dtype)
    inputs = [q[..., :16], q[..., 16:], torch.randn(16, dtype=dtype).expand(4, 16), q[:, :, ::2], q.flip(0)[..., 3:9]]
    pert = make_perturbation(mode, BACKEND)
    one_pass = [pert.perturb(x) for x in inputs]
    monkeypatch.setattr(HostArrays, "edited_in_band", lambda self, *a: None)  # in_band's passes only
    for x, fast, slow in zip(inputs, one_pass, [pert.perturb(x) for x in inputs], strict=True):
        assert fast.stride() == slow.stride() and same_bits(fast, slow), (x.shape, x.stride())
