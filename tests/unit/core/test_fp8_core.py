"""The FP8 formats in the framework-free core: their facts, their ulps, their range use.

The facts are checked against PyTorch's casts (the definition users train with), the ulp measure
against correctly rounded and truncating casts, and the saturation / underflow counts against
tensors whose fractions are known by construction: a scale from a stale amax and a tiny scale.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from probes.backends.torch_backend import BACKEND
from probes.core import dispatch_metrics as dm
from probes.core import fp8, scaled
from probes.core import thresholds as th
from probes.core.ulps import round_to, ulp_errors

XP = BACKEND.namespace(None)
ELEMENT_FORMATS = th.FLOAT8_DTYPES


@pytest.mark.parametrize("name", th.FLOAT8_DTYPES + th.SCALE_DTYPES)
def test_the_facts_are_those_of_torch(name):
    dtype = getattr(torch, name)
    info = torch.finfo(dtype)
    assert th.LARGEST_FINITE[name] == info.max
    assert th.SMALLEST_NORMAL[name] == info.smallest_normal
    # the spacing at 1, by casting (torch.finfo(float8_e5m2fnuz).eps says 0.125: not the format's)
    eps = th.MACHINE_EPS[name]
    if name != "float8_e8m0fnu":
        assert torch.tensor([1.0 + eps]).to(dtype).item() == 1.0 + eps
        assert torch.tensor([1.0 + eps / 2.0 * 0.99]).to(dtype).item() == 1.0
    if name != "float8_e5m2fnuz":
        assert eps == info.eps
    assert (name in th.HAS_INFINITY) == (torch.tensor([float("inf")]).to(dtype).float().isinf().item())


@pytest.mark.parametrize("name", ELEMENT_FORMATS)
def test_rounding_to_a_format_is_torchs_cast(name):
    """round_to (numpy, no FP8 dtype there) gives PyTorch's cast of float32 values over the whole
    range: normal, subnormal, ties, up to the largest value."""
    gen = torch.Generator().manual_seed(0)
    top = th.LARGEST_FINITE[name]
    x = torch.randn(100_000, generator=gen) * torch.exp2(torch.empty(100_000).uniform_(-20, 17, generator=gen))
    x = x.clamp(-top, top)
    ties = torch.tensor([1.0 + th.MACHINE_EPS[name] / 2, fp8.smallest_subnormal(name) / 2])
    x = torch.cat([x, ties, -ties])
    assert np.array_equal(round_to(x.double().numpy(), name), x.to(getattr(torch, name)).double().numpy())
    # from float64 PyTorch rounds twice (to float32, then to the format): 4.7499998 becomes the
    # float32 tie 4.75, then 5.0; the correct rounding, round_to's, is 4.5
    if name.startswith("float8_e4m3"):
        near_tie = torch.tensor([4.7499998], dtype=torch.float64)
        assert near_tie.to(getattr(torch, name)).item() == 5.0 and round_to(near_tie.numpy(), name)[0] == 4.5
    beyond = round_to(np.array([2 * top, -2 * top]), name)
    assert (np.isinf(beyond).all() and beyond[0] > 0) if name in th.HAS_INFINITY else np.isnan(beyond).all()


@pytest.mark.parametrize("name", ["float8_e4m3fn", "float8_e5m2"])
def test_a_correct_cast_scores_half_an_ulp_and_a_truncating_one_more(name):
    gen = torch.Generator().manual_seed(1)
    x = torch.randn(64, 64, generator=gen, dtype=torch.float64) * 8
    cast = x.to(getattr(torch, name)).double()
    errors = ulp_errors(cast.numpy(), x.numpy(), name)
    assert errors.max() <= 0.5
    # rounding toward zero: the format's value below |x| (one spacing down where the cast rounded up)
    step = torch.from_numpy(round_to(x.abs().numpy(), name)) > x.abs()
    spacing = torch.from_numpy(scaled_spacing(cast.abs().numpy(), name))
    truncated = torch.where(step, cast - cast.sign() * spacing, cast)
    assert ulp_errors(truncated.numpy(), x.numpy(), name).max() > 0.75


def scaled_spacing(values: np.ndarray, name: str) -> np.ndarray:
    """The spacing just below each value (a power of two steps down to the binade below)."""
    from probes.core.ulps import spacing

    return spacing(np.nextafter(values, 0.0), name)


def test_the_scaled_measure_knows_the_fp8_formats():
    for name in th.FLOAT8_DTYPES:
        eps = th.MACHINE_EPS[name]
        assert scaled.smallest_scale(eps) >= th.SMALLEST_NORMAL[name]
        assert th.dispatch_scaled_threshold(name) == eps  # one ulp
    x = torch.randn(32, 64, dtype=torch.float64) * 50
    cast = x.to(torch.float8_e4m3fn)
    err = scaled.finish(scaled.scaled_error(XP, cast, x, th.MACHINE_EPS["float8_e4m3fn"]).tolist())[0]
    assert 0.0 < err <= th.MACHINE_EPS["float8_e4m3fn"] / 2


def test_online_dispatch_judges_an_fp8_leaf_by_ulps_not_by_equality():
    figures = [0.999, 1.0, 1.0, 1.0, 0.0, 10.0, th.MACHINE_EPS["float8_e4m3fn"] * 0.4]
    verdict = dm.judge(figures, 10, "float8_e4m3fn", 0.0)
    assert verdict.accuracy == dm.YES and verdict.scaled_ulps == pytest.approx(0.4)
    figures[-1] = th.MACHINE_EPS["float8_e4m3fn"] * 1.5
    assert dm.judge(figures, 10, "float8_e4m3fn", 0.0, rule="scaled").accuracy == dm.NO
    # the noise floor of an FP8 result is half an ulp of the op's scale, not the 8 of wider dtypes
    assert dm.noise_floor("float8_e4m3fn", 448.0, 1.0) == 0.5 * 0.125 * 448.0
    assert dm.noise_floor("bfloat16", 1.0, 1.0) == dm.NOISE_FLOOR_ULPS * th.MACHINE_EPS["bfloat16"]


# saturation and underflow ------------------------------------------------------------------------
MAGNITUDES = torch.arange(1, 1001, dtype=torch.float64)  # 1 .. 1000: fractions known by construction


@pytest.mark.parametrize("xp", [XP, np], ids=["torch", "numpy"])
def test_a_scale_from_a_stale_amax_saturates_most_of_the_tensor(xp):
    """Delayed scaling: the scale was made when the amax was a tenth of today's."""
    x = MAGNITUDES * torch.where(MAGNITUDES % 2 == 0, 1.0, -1.0)
    stale_amax = 100.0
    scale = th.LARGEST_FINITE["float8_e4m3fn"] / stale_amax
    values = x * scale if xp is XP else (x * scale).numpy()
    use = fp8.RangeUse.of([float(v) for v in fp8.range_use_figures(xp, values, "float8_e4m3fn")])
    # k * 4.48 beyond 464 (448 + half its ulp, what rounds to 448 anyway): k = 104 .. 1000
    assert use == fp8.RangeUse(saturated=0.897, underflowed=0.0, flushed=0.0, elements=1000)
    # what the cast does to them: PyTorch saturates e4m3fn at 448; the counted ones all sit there
    cast = (x * scale).to(torch.float8_e4m3fn).double()
    assert (cast[103:].abs() == 448.0).all() and (cast[:96].abs() < 448.0).all()


def test_the_element_at_the_amax_is_not_saturated():
    x = torch.randn(4096, dtype=torch.float64)
    scale = th.LARGEST_FINITE["float8_e4m3fn"] / x.abs().max()
    assert fp8.range_use(XP, x * scale, "float8_e4m3fn").saturated == 0.0


@pytest.mark.parametrize("name", ["float8_e4m3fn", "float8_e5m2"])
def test_a_tiny_scale_flushes_most_of_the_tensor_to_zero(name):
    """An amax inflated by an outlier (or a wrong scale) puts most values below the smallest
    subnormal's half: they flush to zero; all of them are below the normal range."""
    half_step = fp8.smallest_subnormal(name) / 2
    scale = half_step / 900.0  # elements 1 .. 900 land at or below half the smallest subnormal
    values = MAGNITUDES * scale
    use = fp8.range_use(XP, values, name)
    normal_from = int(np.ceil(th.SMALLEST_NORMAL[name] / scale))
    assert use == fp8.RangeUse(saturated=0.0, underflowed=min(normal_from - 1, 1000) / 1000, flushed=0.9,
                               elements=1000)
    assert use.underflowed == 1.0  # e4m3: normal from 2^-6 = 8 steps of 2^-9; e5m2: from 4 steps
    cast = values.to(getattr(torch, name)).double()
    assert int((cast == 0).sum()) == 900  # the flushed ones are the zeros of the cast


def test_an_underflow_short_of_flushing_is_counted_as_underflow_only():
    name = "float8_e4m3fn"
    scale = th.SMALLEST_NORMAL[name] / 250.0  # 1 .. 249 below the normal range
    use = fp8.range_use(XP, MAGNITUDES * scale, name)
    # flushed: k * 2^-6 / 250 <= 2^-10, k <= 15.6
    assert (use.saturated, use.underflowed, use.flushed) == (0.0, 0.249, 0.015)


def test_zeros_nans_and_infinities():
    values = torch.tensor([0.0, -0.0, float("nan"), float("inf"), -float("inf"), 1.0], dtype=torch.float64)
    use = fp8.range_use(XP, values, "float8_e5m2")
    assert use == fp8.RangeUse(saturated=2 / 6, underflowed=0.0, flushed=0.0, elements=6)
    assert fp8.RangeUse.of([0.0, 0.0, 0.0, 0.0]).saturated == 0.0  # an empty tensor
    with pytest.raises(ValueError, match="range use is defined for"):
        fp8.range_use_figures(XP, values, "bfloat16")


@pytest.mark.parametrize("formats", [("float8_e4m3fn", "float8_e4m3fn"), ("float8_e4m3fn", "float8_e5m2")])
def test_the_input_rounding_floor_bounds_a_matmul_of_rounded_operands(formats):
    """Against the terms' magnitude |A| @ |B|, the rounding of normal-range operands never costs
    more than the floor; measured at the row's scale it reads about 1.3x larger (docstring)."""
    floor = fp8.input_rounding_floor(*formats)
    assert floor == pytest.approx((1 + th.MACHINE_EPS[formats[0]] / 2) * (1 + th.MACHINE_EPS[formats[1]] / 2) - 1)
    gen = torch.Generator().manual_seed(2)

    def normal_range(shape: tuple[int, int]) -> torch.Tensor:
        magnitude = torch.exp2(torch.empty(shape, dtype=torch.float64).uniform_(-5, 7, generator=gen))
        return magnitude * torch.where(torch.rand(shape, generator=gen) < 0.5, -1.0, 1.0)

    a, b = normal_range((32, 512)), normal_range((512, 48))
    exact = a @ b
    rounded = a.to(getattr(torch, formats[0])).double() @ b.to(getattr(torch, formats[1])).double()
    ratio = ((rounded - exact).abs() / (a.abs() @ b.abs())).max().item()
    assert 0.0 < ratio <= floor
