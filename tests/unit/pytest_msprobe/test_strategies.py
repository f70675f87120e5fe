"""Strategies: exact values in fp16/bf16, special values only on request, bounds, shrinking, and
inputs that every API of the table accepts."""

from __future__ import annotations

import subprocess
import sys
import warnings

import hypothesis
import numpy as np
import pytest
import torch
from hypothesis import HealthCheck, Phase, find, given, settings
from hypothesis import strategies as st

from probes.core.errors import ConfigError
from pytest_msprobe.api import strategies as S
from pytest_msprobe.api.exact_tensors import round_inward, round_to_bf16
from pytest_msprobe.api.inputs import API_TABLE, api_inputs, api_spec, canonical_name, known_apis, resolve_api
from pytest_msprobe.api.strategies import shapes, tensors

NO_EXPLAIN = [Phase.generate, Phase.shrink]  # the explain phase reruns a found example hundreds of times
FAST = settings(max_examples=20, deadline=None, database=None, derandomize=True, phases=NO_EXPLAIN,
                suppress_health_check=list(HealthCheck))
SEARCH = settings(max_examples=400, deadline=None, database=None, derandomize=True, phases=NO_EXPLAIN,
                  suppress_health_check=list(HealthCheck))
FIRST = settings(SEARCH, phases=[Phase.generate])  # "does it ever appear": the first example will do
HALF = ["float16", "bfloat16"]
TORCH_DTYPE = {"float16": torch.float16, "bfloat16": torch.bfloat16, "float32": torch.float32,
               "float64": torch.float64}


def _bits_equal(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Bit-identical, NaN aside: torch's casts rewrite NaN payloads (fp16 NaN -> fp32 0x7FFFFFFF)."""
    width = {2: torch.int16, 4: torch.int32, 8: torch.int64}[a.element_size()]
    nan = torch.isnan(a)
    return torch.equal(nan, torch.isnan(b)) and torch.equal(a.view(width)[~nan], b.view(width)[~nan])


def _subnormal(t: torch.Tensor) -> torch.Tensor:
    tiny = torch.finfo(t.dtype).tiny
    f = t.double()
    return (f != 0) & (f.abs() < tiny)


# ------------------------------------------------------------------------------------------------
# exactness
@pytest.mark.parametrize("dtype", HALF)
def test_half_values_survive_a_float32_round_trip_bit_for_bit(dtype):
    @FAST
    @given(tensors(dtype, allow_nan=True, allow_infinity=True, allow_subnormal=True))
    def check(x):
        assert x.dtype == TORCH_DTYPE[dtype]
        assert _bits_equal(x, x.to(torch.float32).to(x.dtype))

    check()


def test_bfloat16_values_are_float32_with_zero_low_16_bits():
    @FAST
    @given(tensors("bfloat16", allow_subnormal=True, min_value=-1e30, max_value=1e30))
    def check(x):
        low = x.to(torch.float32).view(torch.int32) & 0xFFFF
        assert not low.any()

    check()


def test_bfloat16_rounding_of_float32_is_to_nearest_and_inside_the_bounds():
    # 0.1 is not a bf16 value: the bounds round inwards to the bf16 values just inside
    assert round_inward("bfloat16", 0.1, up=True) == 0.10009765625
    assert round_inward("bfloat16", 0.1, up=False) == 0.099609375
    assert round_inward("bfloat16", -0.1, up=True) == -0.099609375
    assert round_inward("float16", 0.1, up=True) == 0.10003662109375
    assert round_inward("float16", 0.5, up=True) == 0.5
    a = np.array([1.0, 1.00390625, 1.01171875, 3.0e38], dtype=np.float32)  # ties go to even
    assert round_to_bf16(a.copy()).tolist()[:3] == [1.0, 1.0, 1.015625]


def test_elements_that_bfloat16_cannot_hold_are_refused_by_name():
    with pytest.raises(ConfigError, match="elements=0.1"):
        find(tensors("bfloat16", shape=(3,), elements=st.just(0.1)), lambda t: True, settings=SEARCH)
    with pytest.raises(ConfigError, match="min_value"):
        tensors("float16", elements=st.just(1.0), min_value=0.0)


def test_elements_strategy_values_are_used_as_given():
    @FAST
    @given(tensors("bfloat16", shape=(5,), elements=st.sampled_from([0.5, 2.0, -3.0])))
    def check(x):
        assert set(x.tolist()) <= {0.5, 2.0, -3.0}

    check()


# ------------------------------------------------------------------------------------------------
# special values and bounds
@pytest.mark.parametrize("dtype", ["float16", "bfloat16", "float32"])
def test_no_nan_inf_or_subnormal_unless_allowed(dtype):
    @FAST
    @given(tensors(dtype))
    def check(x):
        assert torch.isfinite(x).all()
        assert not _subnormal(x).any()

    check()


@pytest.mark.parametrize("dtype", ["float16", "bfloat16", "float32"])
def test_nan_inf_and_subnormals_appear_when_allowed(dtype):
    found_nan = find(tensors(dtype, allow_nan=True), lambda t: bool(torch.isnan(t).any()), settings=FIRST)
    assert torch.isnan(found_nan).any()
    found_inf = find(tensors(dtype, allow_infinity=True), lambda t: bool(torch.isinf(t).any()), settings=FIRST)
    assert torch.isinf(found_inf).any()
    found_sub = find(tensors(dtype, allow_subnormal=True), lambda t: bool(_subnormal(t).any()), settings=FIRST)
    assert _subnormal(found_sub).any()


@pytest.mark.parametrize("dtype", ["float16", "bfloat16", "float32", "float64"])
@pytest.mark.parametrize(("lo", "hi"), [(-0.1, 0.3), (0.1, 0.2), (-7.7, -1.01), (None, 2.5), (1e-3, None)])
def test_values_stay_inside_the_bounds_after_rounding(dtype, lo, hi):
    @settings(FAST, max_examples=8)
    @given(tensors(dtype, min_value=lo, max_value=hi, shape=shapes(max_side=6)))
    def check(x):
        f = x.double()
        if lo is not None:
            assert (f >= lo).all(), f.min()
        if hi is not None:
            assert (f <= hi).all(), f.max()

    check()


def test_a_range_the_dtype_holds_no_value_of_is_a_config_error():
    with pytest.raises(ConfigError, match="min_value"):
        tensors("float16", min_value=0.10004, max_value=0.10008)


def test_bounds_are_reached_and_values_vary():
    lows = find(tensors("float16", shape=(8,), min_value=-2.0, max_value=3.0),
                lambda t: bool((t == -2.0).any()), settings=FIRST)
    assert (lows == -2.0).any()
    varied = find(tensors("bfloat16", shape=(64,), min_value=-4.0, max_value=4.0),
                  lambda t: len(set(t.tolist())) > 20, settings=FIRST)
    assert len(set(varied.tolist())) > 20


@pytest.mark.parametrize("dtype", ["int8", "int64", "uint8"])
def test_integer_tensors_respect_dtype_and_bounds(dtype):
    @FAST
    @given(tensors(dtype, min_value=-3, max_value=100))
    def check(x):
        assert x.dtype == getattr(torch, dtype)
        assert (x >= max(-3, 0 if dtype == "uint8" else -3)).all() and (x <= 100).all()

    check()


def test_bool_tensors():
    x = find(tensors("bool"), lambda t: bool(t.any() and not t.all()), settings=SEARCH)
    assert x.dtype == torch.bool and x.shape == (2,) and x.sum() == 1  # shrunk: one True, one False


# ------------------------------------------------------------------------------------------------
# dtypes, frameworks, shapes
def test_torch_dtype_and_name_give_the_same_kind_of_tensor():
    a = find(tensors(torch.bfloat16, shape=(2, 3)), lambda t: True, settings=SEARCH)
    b = find(tensors("bfloat16", shape=(2, 3)), lambda t: True, settings=SEARCH)
    assert a.dtype == b.dtype == torch.bfloat16 and a.shape == b.shape == (2, 3)
    assert S.dtype_name(torch.float16) == "float16" and S.dtype_name(np.float32) == "float32"


def test_dtype_aliases_give_the_canonical_dtype():
    aliases = {"bf16": torch.bfloat16, "BF16": torch.bfloat16, "fp16": torch.float16, "half": torch.float16,
               "fp32": torch.float32, "float": torch.float32, "FLOAT32": torch.float32, "fp64": torch.float64,
               "double": torch.float64}
    for alias, dtype in aliases.items():
        assert S.dtype_name(alias) == str(dtype).replace("torch.", "")
        x = find(tensors(alias, shape=(2,)), lambda t: True, settings=SEARCH)
        assert x.dtype == dtype, alias


def test_bad_dtype_framework_shape_and_device_name_the_argument():
    with pytest.raises(ConfigError, match=r'dtype=\'flaot16\'.*did you mean "float16"'):
        tensors("flaot16")
    with pytest.raises(ConfigError, match="framework='jax'"):
        tensors("float16", framework="jax")
    with pytest.raises(ConfigError, match="framework='mindspore'"):
        tensors(torch.float16, framework="mindspore")
    with pytest.raises(ConfigError, match="shape"):
        tensors("float16", shape="big")
    with pytest.raises(ConfigError, match="device"):
        tensors("float16", device="")
    with pytest.raises(ConfigError, match="dtype"):
        tensors(torch.complex64)


def test_mindspore_dtypes_give_exact_mindspore_tensors():
    ms = pytest.importorskip("mindspore")

    @settings(max_examples=10, deadline=None, database=None, derandomize=True, phases=NO_EXPLAIN)
    @given(tensors(ms.bfloat16, shape=shapes(max_side=4), min_value=-3.0, max_value=3.0))
    def check(x):
        assert isinstance(x, ms.Tensor) and x.dtype == ms.bfloat16
        f = x.astype(ms.float32).asnumpy()
        assert not (f.view(np.uint32) & 0xFFFF).any()
        assert (f >= -3).all() and (f <= 3).all()

    check()
    h = find(tensors("float16", shape=(3,), framework="mindspore"), lambda t: True, settings=SEARCH)
    assert isinstance(h, ms.Tensor) and h.dtype == ms.float16


def test_shape_forms():
    assert find(tensors("float32", shape=(2, 3)), lambda t: True, settings=SEARCH).shape == (2, 3)
    assert find(tensors("float32", shape=5), lambda t: True, settings=SEARCH).shape == (5,)
    big = find(tensors("float32", shape=shapes(min_dims=2, max_dims=2, min_side=3, max_side=4)), lambda t: True, settings=SEARCH)
    assert big.dim() == 2 and min(big.shape) >= 3

    @FAST
    @given(shapes(min_dims=2, max_dims=4, min_side=2, max_side=5))
    def check(shape):
        assert 2 <= len(shape) <= 4 and all(2 <= s <= 5 for s in shape)

    check()


def test_shape_helpers_give_shapes_the_ops_accept():
    @FAST
    @given(S.matmul_shapes(), st.data())
    def check(pair, data):
        a, b = pair
        torch.matmul(torch.zeros(a), torch.zeros(b))
        other = data.draw(S.broadcastable_shapes(a))
        assert torch.broadcast_shapes(a, other) == a

    check()


def test_importing_the_strategies_imports_no_framework():
    code = ("import sys; import pytest_msprobe.api.strategies, pytest_msprobe.api.inputs; "
            "assert 'torch' not in sys.modules and 'mindspore' not in sys.modules, sorted(sys.modules)")
    subprocess.run([sys.executable, "-c", code], check=True)


TENSOR_MODULES = ["bfloat16_bits", "exact_tensors", "exact_values", "framework_tensors", "tensor_dtypes",
                  "tensor_shapes"]
INPUT_MODULES = ["api_names", "input_forms", "input_table", "inputs"]


def test_the_tensor_modules_are_a_leaf_and_the_input_table_needs_only_them():
    # each module imported alone: a cycle would load the other side too
    code = ("import sys; import pytest_msprobe.api.{0}; "
            "loaded = sorted(m for m in sys.modules if m.startswith('pytest_msprobe.api.')); "
            "assert loaded == {1!r}, loaded")
    for module, loaded in [("exact_tensors", TENSOR_MODULES), ("inputs", sorted(TENSOR_MODULES + INPUT_MODULES))]:
        expected = [f"pytest_msprobe.api.{m}" for m in loaded]
        subprocess.run([sys.executable, "-c", code.format(module, expected)], check=True)
    assert S.api_inputs is api_inputs and S.tensors is tensors  # the public module gathers both


# ------------------------------------------------------------------------------------------------
# shrinking
def test_a_failing_tensor_shrinks_to_zeros_and_one_simple_value():
    # seeded property "no value exceeds 100" fails; minimal: 101.0, alone among zeros or as the fill
    x = find(tensors("float32", shape=(64,)), lambda t: bool((t > 100).any()), settings=SEARCH)
    assert set(x.tolist()) in ({0.0, 101.0}, {101.0})
    # "no value reaches 1 unless all do": two cells are the smallest shape that fails
    y = find(tensors("float16"), lambda t: bool((t >= 1).any() and (t < 1).any()), settings=SEARCH)
    assert y.shape == (2,)
    z = find(tensors("bfloat16"), lambda t: t.numel() >= 6, settings=SEARCH)
    assert z.shape == (6,) and not z.any()


def test_a_seeded_api_defect_shrinks_to_a_minimal_input():
    def defective_relu(x):  # wrong above 2: the seeded defect
        return torch.where(x > 2, x + 1, torch.relu(x))

    def fails(args_kwargs):
        (x,), _ = args_kwargs
        return not torch.equal(defective_relu(x), torch.relu(x))

    (x,), _ = find(api_inputs("Functional.relu", "bfloat16"), fails, settings=SEARCH)
    assert x.shape == (1,) and 2 < x.item() <= 8  # one value, just past the defect's threshold


# ------------------------------------------------------------------------------------------------
# the API table
def test_the_table_describes_at_least_forty_apis():
    assert len(API_TABLE) >= 40
    assert len({row.name for row in API_TABLE}) == len(API_TABLE)
    assert len(known_apis()) == sum(len(r.names) for r in API_TABLE)  # no name in two rows


def _run_examples(name: str, dtype: str, count: int) -> None:
    row = api_spec(name)
    fn = resolve_api(name)

    @settings(max_examples=count, deadline=None, database=None, derandomize=True, phases=NO_EXPLAIN,
              suppress_health_check=list(HealthCheck))
    @given(api_inputs(name, dtype))
    def check(args_kwargs):
        args, kwargs = args_kwargs
        if dtype in row.no_cpu:  # the mark says: no CPU kernel; calling must fail
            with pytest.raises((RuntimeError, NotImplementedError)):
                fn(*args, **kwargs)
            return
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            out = fn(*args, **kwargs)
        for leaf in out if isinstance(out, (tuple, list)) else [out]:
            if isinstance(leaf, torch.Tensor) and leaf.is_floating_point():
                assert leaf.dtype == TORCH_DTYPE[dtype]
                assert torch.isfinite(leaf).all(), (name, dtype, args, kwargs, leaf)

    check()


@pytest.mark.parametrize("name", [row.name for row in API_TABLE])
def test_every_table_api_runs_on_its_inputs_in_fp32_fp16_bf16(name):
    for dtype in ("float32", "float16", "bfloat16"):
        _run_examples(name, dtype, 3)


def test_every_alias_resolves_to_a_callable_that_runs():
    for row in API_TABLE:
        for alias in row.names[1:]:
            assert callable(resolve_api(alias))
            _run_examples(alias, "float32", 1)


def test_public_dotted_names_and_catalog_names_are_the_same_row():
    assert api_spec("torch.nn.functional.softmax") is api_spec("Functional.softmax") is api_spec("softmax")
    assert api_spec("torch.matmul") is api_spec("Torch.matmul") is api_spec("torch.Tensor.__matmul__")
    assert api_spec("torch.Tensor.add") is api_spec("Tensor.__add__")
    assert canonical_name("torch.linalg.inv") == "Torch.linalg.inv"
    assert resolve_api("torch.linalg.inv") is torch.linalg.inv
    assert resolve_api("Tensor.__add__") is torch.Tensor.__add__


def test_an_unknown_api_names_itself_the_close_ones_and_the_way_out():
    with pytest.raises(ConfigError) as info:
        api_inputs("torch.nn.functional.sofmax", "float16")
    message = str(info.value)
    assert "sofmax" in message and 'did you mean "torch.nn.functional.softmax"' in message  # the user's spelling
    assert "kwargs=" in message and "form=" in message and "strategy" in message


def test_an_api_outside_the_table_runs_with_an_explicit_form():
    x = find(api_inputs("torch.special.erfc", "float16", form="unary"), lambda ak: True, settings=SEARCH)
    assert resolve_api("torch.special.erfc")(*x[0], **x[1]).dtype == torch.float16
    with pytest.raises(ConfigError, match="form='triangle'"):
        api_inputs("torch.special.erfc", "float16", form="triangle")


def test_user_kwargs_override_the_table_and_strategies_are_drawn():
    @FAST
    @given(api_inputs("Torch.clamp", "float32", kwargs={"min": 0.0}),
           api_inputs("Functional.softmax", "float16", kwargs={"dim": st.sampled_from([-1, 0])}))
    def check(clamp, softmax):
        assert clamp[1] == {"min": 0.0, "max": 1.0}
        assert softmax[1]["dim"] in (-1, 0)

    check()


def test_shapes_set_the_first_input_and_others_follow():
    @FAST
    @given(api_inputs("Torch.matmul", "float32", shapes=(2, 3)),
           api_inputs("Torch.exp", "bfloat16", shapes=[(1, 2), (4,)]),
           api_inputs("Functional.conv2d", "float16", shapes=st.just((1, 2, 5, 5))))
    def check(mm, exp, conv):
        assert mm[0][0].shape == (2, 3) and mm[0][1].shape[0] == 3
        assert exp[0][0].shape in ((1, 2), (4,))
        assert conv[0][0].shape == (1, 2, 5, 5) and conv[0][1].shape[1] == 2

    check()
    with pytest.raises(ConfigError, match="shapes=\\(2, 3\\)"):
        find(api_inputs("Functional.conv2d", "float32", shapes=(2, 3)), lambda ak: True, settings=SEARCH)
    with pytest.raises(ConfigError, match="dtype"):
        api_inputs("Torch.exp", "int32")


def test_domains_keep_inputs_where_the_api_is_defined():
    @FAST
    @given(api_inputs("Torch.log", "float16"), api_inputs("Torch.acos", "bfloat16"),
           api_inputs("Torch.div", "float16"), api_inputs("Torch.pow", "bfloat16"))
    def check(log, acos, div, pow_):
        assert (log[0][0] > 0).all()
        assert (acos[0][0].abs() <= 1).all()
        assert (div[0][1].abs() >= 0.25).all()
        assert (pow_[0][0] > 0).all() and (pow_[0][1].abs() <= 3).all()

    check()


def test_negative_divisors_occur():
    found = find(api_inputs("Torch.div", "float32"), lambda ak: bool((ak[0][1] < 0).any()), settings=FIRST)
    assert (found[0][1] < 0).any()


def test_seeded_draws_do_not_depend_on_what_else_the_process_imported(tmp_path, monkeypatch):
    """Hypothesis mixes the literals of imported local modules into its generation; the catalogue's
    draws (and the per-API search) leave them out, so a new import does not move them, while the
    same import does move a plain seeded Hypothesis draw."""
    import importlib

    from hypothesis import strategies as st

    from pytest_msprobe.catalogue.draws import draw_examples

    strategy = st.lists(st.floats(allow_nan=False, allow_infinity=False), min_size=1, max_size=8)

    def raw() -> list:
        from hypothesis import given, settings
        from hypothesis import seed as hseed

        out = []

        @hseed(1234)
        @settings(max_examples=100, database=None, phases=[hypothesis.Phase.generate], deadline=None)
        @given(strategy)
        def collect(x):
            out.append(x)

        collect()
        return out

    guarded, plain = draw_examples(strategy, 100, 1234), raw()
    monkeypatch.syspath_prepend(str(tmp_path))
    (tmp_path / "msprobe_constants_probe.py").write_text(
        "A = 2.0512345678\nB = -7.2519\nC = 3.14159e-05\nD = 1234.5678\nE = 9.87654321e12\n", encoding="utf-8")
    importlib.import_module("msprobe_constants_probe")
    assert draw_examples(strategy, 100, 1234) == guarded
    assert raw() != plain  # the effect the guard removes is real
