"""online_dispatch: PtdbgDispatch on the CPU, checked against a float64 reference."""

from __future__ import annotations

import logging
import math
import time

import numpy as np
import pytest
import seeded_dispatch  # noqa: F401  (registers the seeded_dispatch:: custom ops)
import torch
import torch.nn as nn
import torch.nn.functional as F
from dispatch_files import read_rows, summary

from probes.backends.torch_backend import BACKEND
from probes.core import dispatch_metrics as dm
from probes.core.errors import ConfigError
from probes.core.thresholds import DISPATCH_SCALED_THRESHOLD
from probes.online_dispatch import skip_list
from probes.online_dispatch.reference import reference_dtype
from probes.pytorch.common import seed_all
from probes.pytorch.online_dispatch import PtdbgDispatch

XP = BACKEND.namespace(None)


@pytest.fixture(autouse=True, params=["inline", "thread"])
def comparison_site(request, monkeypatch):
    """Every test runs with the comparison inline and in the reference thread: background="auto"
    picks one by the host's cores and the ops' measured cost, and both must behave the same."""
    from probes.online_dispatch import mode

    threaded = request.param == "thread"
    monkeypatch.setattr(mode, "use_reference_thread",
                        lambda background: threaded if background == "auto" else bool(background))
    monkeypatch.setattr(mode, "worth_a_thread", lambda seconds: threaded)
    return request.param


# helpers ------------------------------------------------------------------------------------------
def outputs(rows: list[dict[str, str]]) -> list[dict[str, str]]:
    return [r for r in rows if "_output" in r["NPU Name"]]


class SmallTransformer(nn.Module):
    """LayerNorm, attention written out (matmul/softmax) with separate q/k/v projections, GELU MLP."""

    def __init__(self, d: int = 16, classes: int = 5) -> None:
        super().__init__()
        self.ln = nn.LayerNorm(d)
        self.q, self.k, self.v = nn.Linear(d, d), nn.Linear(d, d), nn.Linear(d, d)
        self.fc1, self.fc2 = nn.Linear(d, 2 * d), nn.Linear(2 * d, classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.ln(x)
        a = torch.softmax(self.q(h) @ self.k(h).transpose(-1, -2) / h.shape[-1] ** 0.5, dim=-1)
        h = h + a @ self.v(h)
        return self.fc2(F.gelu(self.fc1(h)))


def train_pass(model: nn.Module, x: torch.Tensor, y: torch.Tensor, dispatch: PtdbgDispatch | None = None):
    """Forward in one context, backward in another (msprobe: one direction per context)."""
    model.zero_grad(set_to_none=True)
    if dispatch is None:
        out = model(x)
        loss = F.cross_entropy(out.reshape(-1, out.shape[-1]).float(), y)
        loss.backward()
    else:
        with dispatch:
            out = model(x)
            loss = F.cross_entropy(out.reshape(-1, out.shape[-1]).float(), y)
        with dispatch:
            loss.backward()
    return out.detach().clone(), {n: p.grad.clone() for n, p in model.named_parameters()}


def make_batch(dtype: torch.dtype = torch.float32, b: int = 2, t: int = 8, d: int = 16, classes: int = 5):
    torch.manual_seed(0)
    model = SmallTransformer(d, classes).to(dtype)
    x = torch.randn(b, t, d, dtype=dtype)
    y = torch.randint(0, classes, (b * t,))
    return model, x, y


# 1. arguments -------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    "kwargs, key",
    [
        ({"dump_mode": "off"}, "dump_mode"),
        ({"dump_mode": 3}, "dump_mode"),
        ({"dump_mode": "list"}, "api_list"),
        ({"dump_mode": "list", "api_list": []}, "api_list"),
        ({"dump_mode": "list", "api_list": ["matmull"]}, "api_list"),
        ({"api_list": "mm"}, "api_list"),
        ({"process_num": -1}, "process_num"),
        ({"process_num": 10_000}, "process_num"),
        ({"process_num": True}, "process_num"),
        ({"tag": "bad tag"}, "tag"),
        ({"tag": 5}, "tag"),
        ({"debug": "yes"}, "debug"),
        ({"background": "yes"}, "background"),
        ({"background": 1}, "background"),
        ({"dump_path": None}, "dump_path"),
    ],
)
def test_every_argument_is_validated(tmp_path, kwargs, key):
    kwargs = {"dump_path": str(tmp_path), **kwargs}
    with pytest.raises(ConfigError) as err:
        PtdbgDispatch(**kwargs)
    assert err.value.key == key
    assert list(tmp_path.iterdir()) == []  # nothing created on a bad argument (msprobe left an empty run directory)


def test_api_list_typo_gets_a_suggestion(tmp_path):
    with pytest.raises(ConfigError, match='did you mean "matmul"'):
        PtdbgDispatch(dump_mode="list", api_list=["matmull"], dump_path=str(tmp_path))


@pytest.mark.parametrize("dump_mode, hint", [("off", 'did you mean "OFF"'), ("atuo", 'did you mean "auto"')])
def test_dump_mode_typo_gets_a_suggestion(tmp_path, dump_mode, hint):
    with pytest.raises(ConfigError, match=hint):
        PtdbgDispatch(dump_mode=dump_mode, dump_path=str(tmp_path))


def test_unwritable_dump_path(tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("x")
    with pytest.raises(ConfigError) as err:
        PtdbgDispatch(dump_path=str(blocker / "sub"))
    assert err.value.key == "dump_path"


def test_public_imports():
    assert callable(seed_all)
    seed_all(7)
    a = torch.rand(3)
    seed_all(7)
    assert torch.equal(a, torch.rand(3))


# 2. the seeded device defect ---------------------------------------------------------------------
def test_seeded_float32_defect_is_flagged_dumped_and_nothing_else(tmp_path, caplog):
    torch.manual_seed(0)
    lin = nn.Linear(8, 8)
    x = torch.randn(4, 8)
    caplog.set_level(logging.WARNING, logger="probes")
    with PtdbgDispatch(dump_mode="auto", dump_path=str(tmp_path)) as d:
        y = torch.ops.seeded_dispatch.scaled_tanh(lin(x))
        z = (y * 2).sum()
    run = d.run_dir
    s = summary(run)
    assert [f["name"] for f in s["failed_ops"]] == ["scaled_tanh_1"]
    assert s["failed_ops"][0]["dumped"] is True
    assert s["ops_compared"] >= 4 and s["probe_errors"] == {}
    rows = outputs(read_rows(run))
    bad = [r for r in rows if r["Accuracy Reached or Not"] != "Yes"]
    assert [r["NPU Name"] for r in bad] == ["scaled_tanh_1_output"]
    assert bad[0]["Single Benchmark"] == "fail" and bad[0]["NPU_Stack_Info"].startswith("[[")
    assert "test_online_dispatch.py" in bad[0]["NPU_Stack_Info"]  # the user's frame, not torch's
    assert float(bad[0]["NPU min"]) >= 0 > float(bad[0]["Bench min"])  # evidence: the lost sign
    good = [r for r in rows if r["Accuracy Reached or Not"] == "Yes"]
    assert good and all(r["NPU max"] == r["MaxRelativeErr"] == r["Single Benchmark"] == "" for r in good)
    assert float(bad[0]["MaxRelativeErr"]) > 1.0
    assert float(bad[0]["MaxAbsErr"]) > 1e-3
    # dumps: that op only, inputs in npu/, both outputs in cpu/ and npu/
    assert sorted(p.name for p in (run / "npu").iterdir()) == ["scaled_tanh_1_input.0.npy", "scaled_tanh_1_output.npy"]
    assert sorted(p.name for p in (run / "cpu").iterdir()) == ["scaled_tanh_1_output.npy"]
    dev = np.load(run / "npu" / "scaled_tanh_1_output.npy")
    ref = np.load(run / "cpu" / "scaled_tanh_1_output.npy")
    assert dev.dtype == np.float32 and ref.dtype == np.float64
    np.testing.assert_allclose(dev, np.abs(ref), rtol=1e-6)
    np.testing.assert_array_equal(np.load(run / "npu" / "scaled_tanh_1_input.0.npy"), lin(x).detach().numpy())
    # printed once, with name and figures
    lines = [r.getMessage() for r in caplog.records if "Failed" in r.getMessage()]
    assert len(lines) == 1 and "scaled_tanh_1" in lines[0] and "Cosine=" in lines[0] and "MaxAbsErr=" in lines[0]
    assert torch.isfinite(z)


def test_debug_fills_every_column(tmp_path, caplog):
    caplog.set_level(logging.INFO, logger="probes")
    x = torch.randn(4, 4)
    with PtdbgDispatch(dump_path=str(tmp_path), debug=True) as d:
        torch.relu(x @ x)
    rows = read_rows(d.run_dir)
    assert rows and all(r["NPU max"] != "" for r in rows)
    assert all(r["MaxRelativeErr"] != "" for r in outputs(rows))
    assert all(r["Single Benchmark"] == "pass" for r in outputs(rows))
    assert any("mm_1" in r.getMessage() for r in caplog.records)


def test_seeded_defect_in_backward_and_float64_is_clean(tmp_path):
    """The defect lives in float32 only: a float64 model passes, the float32 one fails forward."""
    x64 = torch.randn(3, 4, dtype=torch.float64, requires_grad=True)
    with PtdbgDispatch(dump_mode="OFF", dump_path=str(tmp_path)) as d:
        loss = torch.ops.seeded_dispatch.scaled_tanh(x64).sum()
    with d:
        loss.backward()
    s = summary(d.run_dir)
    assert s["failed_op_count"] == 0 and s["ops_compared"] >= 3
    assert list((d.run_dir / "npu").iterdir()) == []  # OFF: no dumps


# 3. clean models, forward and backward, bit-identical results -------------------------------------
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_clean_model_passes_forward_and_backward_bit_identical(tmp_path, dtype):
    model, x, y = make_batch(dtype)
    plain_out, plain_grads = train_pass(model, x, y)
    d = PtdbgDispatch(dump_mode="auto", dump_path=str(tmp_path))
    probed_out, probed_grads = train_pass(model, x, y, d)
    assert torch.equal(plain_out, probed_out)
    assert plain_grads.keys() == probed_grads.keys()
    for name in plain_grads:
        assert torch.equal(plain_grads[name], probed_grads[name]), name
    s = summary(d.run_dir)
    assert s["failed_op_count"] == 0, s["failed_ops"]
    assert s["probe_errors"] == {}
    names = {r["NPU Name"].rsplit("_", 2)[0] for r in outputs(read_rows(d.run_dir))}
    assert {"native_layer_norm", "native_layer_norm_backward", "_softmax", "_softmax_backward_data", "mm",
            "gelu_backward"} <= names
    assert list((d.run_dir / "npu").iterdir()) == []  # auto: nothing failed, nothing dumped


# 4. output structures, in-place ops, errors -------------------------------------------------------
def test_tuple_list_none_and_integer_outputs(tmp_path):
    torch.manual_seed(1)
    x = torch.randn(4, 6)
    params = [torch.randn(3), torch.randn(5)]
    grads = [torch.randn(3), torch.randn(5)]
    before = [p.clone() for p in params]
    with PtdbgDispatch(dump_mode="all", dump_path=str(tmp_path)) as d:
        torch.ops.aten.native_layer_norm(x, [6], None, None, 1e-5)
        torch._foreach_add_(params, grads, alpha=0.5)  # returns None: written arguments compared
        torch._foreach_mul(params, 2.0)  # returns a list
        torch.topk(x, 2)  # values and int64 indices
        torch.max(x, dim=1)
        torch.empty(0).sum()
    for p, b, g in zip(params, before, grads):
        assert torch.equal(p, b + 0.5 * g)
    s = summary(d.run_dir)
    assert s["probe_errors"] == {} and s["failed_op_count"] == 0
    rows = {r["NPU Name"]: r for r in outputs(read_rows(d.run_dir))}
    for name in ("native_layer_norm_1_output.0", "native_layer_norm_1_output.1", "native_layer_norm_1_output.2",
                 "_foreach_add__1_output.0.0", "_foreach_add__1_output.0.1", "_foreach_mul_1_output.0",
                 "_foreach_mul_1_output.1", "topk_1_output.0", "topk_1_output.1", "max_1_output.1"):
        assert rows[name]["Accuracy Reached or Not"] == "Yes", name
    assert rows["topk_1_output.1"]["NPU Tensor Dtype"] == "torch.int64"
    assert (d.run_dir / "cpu" / "_foreach_add__1_output.0.1.npy").exists()
    assert (d.run_dir / "npu" / "native_layer_norm_1_output.0.npy").exists()


def test_inplace_op_dumps_the_input_it_received(tmp_path):
    x = torch.arange(6, dtype=torch.float32).reshape(2, 3)
    original = x.clone()
    with PtdbgDispatch(dump_mode="all", dump_path=str(tmp_path)) as d:
        x.mul_(2.0)
    assert torch.equal(x, original * 2)
    run = d.run_dir
    np.testing.assert_array_equal(np.load(run / "npu" / "mul__1_input.0.npy"), original.numpy())
    np.testing.assert_array_equal(np.load(run / "npu" / "mul__1_output.npy"), (original * 2).numpy())
    np.testing.assert_array_equal(np.load(run / "cpu" / "mul__1_output.npy"), (original * 2).double().numpy())
    assert np.load(run / "npu" / "mul__1_input.1.npy") == 2.0
    (row,) = outputs(read_rows(run))
    assert row["Accuracy Reached or Not"] == "Yes"


def test_probe_errors_are_recorded_never_raised(tmp_path, monkeypatch):
    from probes.online_dispatch import verdict

    def broken(*args, **kwargs):
        raise ValueError("boom")

    monkeypatch.setattr(verdict, "figures", broken)
    x = torch.randn(3, 3)
    with PtdbgDispatch(dump_path=str(tmp_path)) as d:
        y = x @ x
    assert torch.equal(y, x @ x)
    errors = summary(d.run_dir)["probe_errors"]
    assert any("boom" in k for k in errors)
    (row,) = [r for r in read_rows(d.run_dir) if r["NPU Name"] == "mm_1_output"]
    assert "boom" in row["Err_message"] and row["Accuracy Reached or Not"] == "Nan"


def test_reference_failure_is_a_row_then_a_skip(tmp_path):
    x = torch.randn(4)
    with PtdbgDispatch(dump_path=str(tmp_path)) as d:
        a = torch.ops.seeded_dispatch.float32_only(x)
        b = torch.ops.seeded_dispatch.float32_only(x)
    assert torch.equal(a, x * 2) and torch.equal(b, a)
    (row,) = [r for r in read_rows(d.run_dir) if r["NPU Name"].startswith("float32_only")]
    assert "reference run failed" in row["Err_message"] and row["Accuracy Reached or Not"] == "Nan"
    s = summary(d.run_dir)
    assert s["skipped_calls"][skip_list.NO_CPU_KERNEL] == 1


# 5. skip list -------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    "op, reason",
    [
        (torch.ops.aten.empty_like.default, skip_list.UNINITIALISED),
        (torch.ops.aten.empty_strided.default, skip_list.UNINITIALISED),
        (torch.ops.aten.zeros.default, skip_list.FACTORY),
        (torch.ops.aten.arange.start, skip_list.FACTORY),
        (torch.ops.aten.bernoulli_.float, skip_list.RNG),
        (torch.ops.aten.native_dropout.default, skip_list.RNG),
        (torch.ops.aten.multinomial.default, skip_list.RNG),
        (torch.ops.aten.normal_.default, skip_list.RNG),
        (torch.ops.aten.t.default, skip_list.VIEW),
        (torch.ops.aten.slice.Tensor, skip_list.VIEW),
        (torch.ops.aten.permute_copy.default, skip_list.VIEW),
        (torch.ops.aten._to_copy.default, skip_list.COPY),
        (torch.ops.aten.copy_.default, skip_list.COPY),
        (torch.ops.aten._local_scalar_dense.default, skip_list.HOST_SYNC),
        (torch.ops.aten.zeros_like.default, skip_list.CONSTANT_FILL),
        (torch.ops.aten.mm.default, None),
        (torch.ops.aten.add_.Tensor, None),
        (torch.ops.aten.max_pool2d_with_indices.default, None),
        (torch.ops.aten.native_batch_norm_backward.default, None),
    ],
)
def test_skip_reasons(op, reason):
    assert skip_list.skip_reason(op) == reason


def test_skips_are_counted_and_rng_stream_is_untouched(tmp_path):
    x = torch.randn(16, 16)
    torch.manual_seed(3)
    plain = F.dropout(x, 0.5, training=True) + torch.rand(2).sum()
    torch.manual_seed(3)
    with PtdbgDispatch(dump_path=str(tmp_path)) as d:
        probed = F.dropout(x, 0.5, training=True) + torch.rand(2).sum()
        x.sum().item()
    assert torch.equal(plain, probed)
    s = summary(d.run_dir)
    assert s["skipped_calls"][skip_list.RNG] >= 2
    assert s["skipped_calls"][skip_list.HOST_SYNC] == 1
    assert "aten.bernoulli_.float" in s["skipped"][skip_list.RNG]  # dropout, decomposed


# 6. the verdict: documented rule, edge cases, noise floor -----------------------------------------
def _judge(dev, ref, dtype="float32", floor=0.0):
    xp = XP
    d = torch.tensor(dev, dtype=torch.float64)
    r = torch.tensor(ref, dtype=torch.float64)
    figs = dm.leaf_figures(xp, d, r).tolist()
    if dm.needs_masked_pass(figs):
        figs = dm.masked_leaf_figures(xp, d, r).tolist()
    return dm.judge(figs, d.numel(), dtype, floor)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.int64, torch.bool])
def test_leaf_figures_over_several_chunks_match_the_direct_formula(dtype):
    """The chunked figures equal one float64 pass over the whole leaf, and the device leaf (which
    the chunk subtracts from in place, in its float64 copy) is never modified."""
    torch.manual_seed(0)
    n = 2 * dm.CHUNK_ELEMENTS + 12345
    dev = (torch.randn(n) * 3).to(dtype) if dtype != torch.bool else torch.rand(n) > 0.5
    ref = dev.to(torch.float64) + 1e-3 * torch.randn(n, dtype=torch.float64)
    before = dev.clone()
    figs = dm.leaf_figures(XP, dev, ref).tolist()
    assert torch.equal(dev, before)
    d = dev.to(torch.float64)
    want = [float(d @ ref), float(d @ d), float(ref @ ref), float((d - ref).abs().max()), 0.0, float(n)]
    assert figs == pytest.approx(want, rel=1e-9, abs=1e-12)


def test_documented_test_vector():
    v = _judge([1.0, 2.0, 3.0], [1.0, 2.0, 3.1])
    assert dm.format_figure(v.cosine) == "0.999877767048"
    assert dm.format_figure(v.max_abs_err) == "0.100000000000"
    assert v.max_rel_err == ""  # evidence: measured for failing leaves only
    rel = dm.max_relative_error(XP, torch.tensor([1.0, 2.0, 3.0]), torch.tensor([1.0, 2.0, 3.1], dtype=torch.float64))
    assert dm.format_figure(float(rel)) == "0.032258064516"
    assert v.accuracy == "Yes"


def test_rule_clauses_and_cosine_edge_cases():
    assert dm.rule_fails(0.98, 0.002) and not dm.rule_fails(0.98, 0.0005)
    assert dm.rule_fails(0.89, 0.0) and dm.rule_fails(1.0, 1.5) and not dm.rule_fails(0.995, 0.5)
    assert _judge([0.0, 0.0], [0.0, 0.0]).cosine == 1.0
    dev_zero = _judge([0.0, 0.0], [1.0, 2.0])
    assert dev_zero.cosine == "Nan" and "device data all zero" in dev_zero.message and dev_zero.accuracy == "No"
    assert "bench data all zero" in _judge([1.0, 2.0], [0.0, 0.0]).message
    assert _judge([1.0, 2.0], [1.0, 2.0 + 1e-12]).cosine == 1.0  # > 0.99999 reported as 1.0
    assert _judge([1.0, 2.0], [-1.0, -2.0]).accuracy == "No"
    assert _judge([1.0, float("nan"), float("inf")], [1.0, float("nan"), float("inf")]).accuracy == "Yes"
    mismatch = _judge([1.0, float("nan"), 2.0], [1.0, 3.0, 2.0])
    assert mismatch.accuracy == "No" and "inf/nan differ" in mismatch.message
    scalar = _judge([2.5], [2.6])
    assert scalar.cosine == "unsupported" and scalar.accuracy == "Yes"  # only MaxAbsErr > 1 fails a scalar
    assert _judge([2.5], [-2.6]).accuracy == "No"
    assert _judge([1.0, 2.0], [1.0, 3.0], dtype="int64").accuracy == "No"


def test_noise_floor_formula():
    assert dm.noise_floor("float32", 2.0, 16) == dm.NOISE_FLOOR_ULPS * 2.0**-23 * 2.0 * 4.0
    assert dm.noise_floor("int64", 2.0, 16) == 0.0
    assert dm.noise_floor("bfloat16", 1.0, 1) > dm.noise_floor("float32", 1.0, 1)


def _attention_key_bias(tmp_path, dump_mode="auto"):
    """The key projection's bias gradient is zero in exact arithmetic (softmax is shift-invariant),
    so the device and the float64 reference both hold rounding noise (~1e-10, the op's inputs
    ~1e-4). Its cosine is the ratio of two noises, the reference's (rounding inherited from the
    kernels upstream) and the device sum's own: with these shapes it is 0.81-0.99 over seeds and
    CPU kernels (0.897 with AVX-512 kernels, 0.953 with AVX2 ones for this seed), so whether the
    literal rule fails it is an accident of the CPU. At its own scale the difference is of the
    order of the value on every CPU: the scaled rule fails it by millions of ulps."""
    torch.manual_seed(1)
    d, t, b = 16, 64, 4
    k, q, v = nn.Linear(d, d), nn.Linear(d, d), nn.Linear(d, d)
    x = torch.randn(b, t, d)
    with PtdbgDispatch(dump_mode=dump_mode, dump_path=str(tmp_path)) as disp:
        a = torch.softmax(q(x) @ k(x).transpose(-1, -2) / d**0.5, -1)
        loss = (a @ v(x)).pow(2).mean()
    with disp:
        loss.backward()
    return disp, k


def test_noise_level_difference_passes(tmp_path):
    disp, k = _attention_key_bias(tmp_path)
    rows = {r["NPU Name"]: r for r in outputs(read_rows(disp.run_dir))}
    bias = rows["sum_2_output"]  # the key bias's gradient (sum over batch and tokens)
    assert bias["NPU Tensor Shape"] == "[1, 16]"
    floor = float(bias["Noise Floor"])
    assert 0.0 < floor < 1e-8
    # both sides are rounding noise: each within the floor of zero
    assert max(abs(float(bias[c])) for c in ("NPU max", "NPU min", "Bench max", "Bench min")) <= floor
    # a rule fails it: at its own scale the difference is as large as the value ...
    assert float(bias["Scaled Error (ulp)"]) > DISPATCH_SCALED_THRESHOLD["float32"] / 2.0**-23
    assert "scaled error" in bias["Err_message"]
    # ... the noise floor passes it
    assert float(bias["MaxAbsErr"]) <= floor
    assert bias["Accuracy Reached or Not"] == "Yes" and bias["FailedRule"] == ""
    assert "within the rounding-noise floor" in bias["Err_message"]
    assert summary(disp.run_dir)["failed_op_count"] == 0
    assert k.bias.grad.abs().max() < 1e-8


def _noise_sum_row(tmp_path, values) -> dict[str, str]:
    with PtdbgDispatch(dump_mode="auto", dump_path=str(tmp_path), rule="reference") as disp:
        values.sum(0)
    (row,) = [r for r in outputs(read_rows(disp.run_dir)) if r["NPU Name"] == "sum_1_output"]
    return row


def test_literal_rule_fails_unrelated_noise_and_the_floor_passes_it(tmp_path, noise_sum_input):
    """msprobe's rule alone, on a sum that is rounding noise on the device and an unrelated tiny
    value in the reference, whatever order the CPU's kernel adds in (tests/conftest.py)."""
    values, reference = noise_sum_input()
    row = _noise_sum_row(tmp_path, values)
    assert [float(row["Bench max"]), float(row["Bench min"])] == [float(reference.max()), 0.0]  # exact
    assert float(row["Cosine"]) < 1e-3  # two vectors with nothing in common: the literal rule fails it ...
    assert dm.rule_fails(float(row["Cosine"]), float(row["MaxAbsErr"]))
    floor = float(row["Noise Floor"])  # scale: the input's largest magnitude; reduction: 65 rows
    scale = float(values.abs().max())
    assert floor == pytest.approx(dm.NOISE_FLOOR_ULPS * 2.0**-23 * scale * math.sqrt(len(values)), rel=1e-9)
    assert 2.0**-24 <= float(row["MaxAbsErr"]) <= floor  # ... the noise floor passes it
    assert row["Accuracy Reached or Not"] == "Yes" and "within the rounding-noise floor" in row["Err_message"]


def test_noise_floor_is_what_passes_it(tmp_path, monkeypatch, noise_sum_input):
    monkeypatch.setattr(dm, "NOISE_FLOOR_ULPS", 0.0)
    disp, _ = _attention_key_bias(tmp_path / "model")
    assert [f["name"] for f in summary(disp.run_dir)["failed_ops"]] == ["sum_2"]
    row = _noise_sum_row(tmp_path / "sum", noise_sum_input()[0])
    assert row["Accuracy Reached or Not"] == "No" and row["FailedRule"] == "reference"


def test_real_defect_on_a_zero_gradient_still_fails(tmp_path):
    """The same near-zero key-bias gradient, summed by a float32 kernel that drops a row."""
    torch.manual_seed(1)
    d, t, b = 16, 64, 4
    k, q, v = nn.Linear(d, d), nn.Linear(d, d), nn.Linear(d, d)
    x = torch.randn(b, t, d)
    kx = k(x)
    kx.retain_grad()
    a = torch.softmax(q(x) @ kx.transpose(-1, -2) / d**0.5, -1)
    (a @ v(x)).pow(2).mean().backward()
    grad_k = kx.grad
    assert grad_k.sum(dim=(0, 1)).abs().max() < 1e-6  # zero in exact arithmetic
    with PtdbgDispatch(dump_mode="auto", dump_path=str(tmp_path)) as disp:
        torch.ops.seeded_dispatch.bias_grad(grad_k)
    s = summary(disp.run_dir)
    assert [f["name"] for f in s["failed_ops"]] == ["bias_grad_1"]
    row = [r for r in outputs(read_rows(disp.run_dir)) if r["NPU Name"] == "bias_grad_1_output"][0]
    assert float(row["MaxAbsErr"]) > 10 * float(row["Noise Floor"])


# 7. files -----------------------------------------------------------------------------------------
def test_files_names_encoding_and_unique_timestamps(tmp_path):
    x = torch.randn(3, 3)
    runs = []
    start = time.time()
    for _ in range(3):
        with PtdbgDispatch(dump_path=str(tmp_path), tag="unit") as d:
            x @ x
        runs.append(d.run_dir)
    assert time.time() - start < 5
    assert len({r.name for r in runs}) == 3
    for run in runs:
        assert run.name.startswith("msprobe_unit_rank0_") and len(run.name.rsplit("_", 1)[1]) == 17
        (csv_path,) = run.glob("*.csv")
        assert csv_path.name == f"compare_result_rank0_{run.name.rsplit('_', 1)[1]}.csv"
        raw = csv_path.read_bytes()
        assert raw.startswith(b"\xef\xbb\xbf") and b"\r\n" in raw and raw.count(b"\xef\xbb\xbf") == 1
        header = raw[3:].split(b"\r\n")[0].decode().split(",")
        assert header[:18] == [
            "NPU Name", "Bench Name", "NPU Tensor Dtype", "Bench Tensor Dtype", "NPU Tensor Shape",
            "Bench Tensor Shape", "NPU max", "NPU min", "NPU mean", "Bench max", "Bench min", "Bench mean",
            "Cosine", "MaxAbsErr", "MaxRelativeErr", "Accuracy Reached or Not", "NPU_Stack_Info", "Err_message"]
        assert (run / "cpu").is_dir() and (run / "npu").is_dir()
        assert summary(run)["csv"] == csv_path.name


def test_list_mode_dumps_listed_ops_only(tmp_path):
    x = torch.randn(3, 3)
    with PtdbgDispatch(dump_mode="list", api_list=["mm"], dump_path=str(tmp_path)) as d:
        torch.relu(x @ x + 1)
    names = sorted(p.name for p in (d.run_dir / "npu").iterdir())
    assert names == ["mm_1_input.0.npy", "mm_1_input.1.npy", "mm_1_output.npy"]


def test_process_num_gives_identical_results(tmp_path):
    model, x, y = make_batch(torch.float32, b=1, t=4, d=8)
    serial = PtdbgDispatch(dump_path=str(tmp_path / "a"))
    train_pass(model, x, y, serial)
    pooled = PtdbgDispatch(dump_path=str(tmp_path / "b"), process_num=1)
    train_pass(model, x, y, pooled)
    a, b = read_rows(serial.run_dir), read_rows(pooled.run_dir)
    assert len(a) == len(b) > 20
    assert a == b


def test_reference_thread_gives_the_inline_csv(tmp_path):
    """Same rows, same numbering, same figures, the same user frames for a failing op."""
    model, x, y = make_batch(torch.float32, b=1, t=4, d=8)
    runs = {}
    for background in (False, True):
        d = PtdbgDispatch(dump_path=str(tmp_path / str(background)), background=background)
        train_pass(model, x, y, d)
        with d:
            torch.ops.seeded_dispatch.scaled_tanh(x)
        runs[background] = d
    a, b = read_rows(runs[False].run_dir), read_rows(runs[True].run_dir)
    assert len(a) == len(b) > 20
    assert a == b
    assert [f["name"] for f in summary(runs[True].run_dir)["failed_ops"]] == ["scaled_tanh_1"]


def test_reference_thread_compares_what_the_op_returned(tmp_path):
    """The program changes the op's result in place right after the op; the thread, which may
    run later, still compares the value the op returned."""
    torch.manual_seed(0)
    a, b = torch.randn(64, 64), torch.randn(64, 64)
    with PtdbgDispatch(dump_path=str(tmp_path), background=True) as d:
        for _ in range(8):
            y = torch.mm(a, b)
            y.mul_(-3.0).add_(1e3)
    assert torch.equal(y, torch.mm(a, b).mul_(-3.0).add_(1e3))
    s = summary(d.run_dir)
    assert s["failed_op_count"] == 0 and s["probe_errors"] == {}
    assert s["ops_compared"] == 24


@pytest.mark.parametrize("raise_inside", [False, True])
def test_no_reference_thread_outlives_its_context(tmp_path, raise_inside):
    import threading

    x = torch.randn(8, 8)
    d = PtdbgDispatch(dump_path=str(tmp_path), background=True)
    try:
        with d:
            x @ x
            assert any(t.name.startswith("msprobe-online-dispatch") for t in threading.enumerate())
            if raise_inside:
                raise KeyError("user error")
    except KeyError:
        pass
    assert not any(t.name.startswith("msprobe-online-dispatch") for t in threading.enumerate())
    assert summary(d.run_dir)["ops_compared"] == 1
    with d:  # a second context starts a new thread and goes on numbering
        x @ x
    assert [r["NPU Name"] for r in outputs(read_rows(d.run_dir))] == ["mm_1_output", "mm_2_output"]


def test_background_auto_needs_idle_cores_or_an_accelerator(monkeypatch):
    from probes.online_dispatch import workers

    monkeypatch.setattr(workers, "accelerator_in_use", lambda: False)
    monkeypatch.setattr(workers, "available_cores", lambda: 8)
    threads = torch.get_num_threads()
    try:
        torch.set_num_threads(4)
        assert workers.use_reference_thread("auto")
        torch.set_num_threads(5)
        assert not workers.use_reference_thread("auto")
        assert workers.use_reference_thread(True) and not workers.use_reference_thread(False)
        monkeypatch.setattr(workers, "accelerator_in_use", lambda: True)
        assert workers.use_reference_thread("auto")
    finally:
        torch.set_num_threads(threads)


def test_reference_dtypes_for_other_devices():
    assert reference_dtype(torch.float32, device_is_cpu=True) == torch.float64
    assert reference_dtype(torch.bfloat16, device_is_cpu=True) == torch.float64
    assert reference_dtype(torch.bfloat16, device_is_cpu=False) == torch.float32
    assert reference_dtype(torch.float16, device_is_cpu=False) == torch.float32
    assert reference_dtype(torch.float32, device_is_cpu=False) == torch.float32
    assert reference_dtype(torch.int64, device_is_cpu=True) == torch.int64


@pytest.mark.parametrize("case", ["random", "zeros", "negzero", "inf", "nan", "neg_inf_diff", "int", "bool", "two_chunks"])
def test_figures_from_parts_equal_the_device_figures_bit_for_bit(case):
    """The per-op fast path (raw reductions finished on the host) gives exactly the figures of
    `leaf_figures`, including the NaN / inf propagation that sends a leaf to the masked pass and
    the sign of a zero MaxAbsErr: the CSV must not change by a digit."""
    torch.manual_seed(1)
    n = 2 * dm.CHUNK_ELEMENTS + 7 if case == "two_chunks" else 300
    dev = torch.randn(n)
    ref = dev.double() + 1e-4 * torch.randn(n, dtype=torch.float64)
    if case == "zeros":
        dev, ref = torch.zeros(n), torch.zeros(n, dtype=torch.float64)
    elif case == "negzero":
        dev, ref = -torch.zeros(n), torch.zeros(n, dtype=torch.float64)
    elif case == "inf":
        dev[3] = math.inf
    elif case == "nan":
        ref[5] = math.nan
    elif case == "neg_inf_diff":
        dev[7] = -math.inf
    elif case == "int":
        dev = torch.randint(-5, 5, (n,))
        ref = dev.clone()
        ref[2] += 1
    elif case == "bool":
        dev = torch.rand(n) > 0.5
        ref = dev.clone()
    want = dm.leaf_figures(XP, dev, ref).tolist()
    parts = torch.stack(dm.leaf_figure_parts(XP, dev, ref)).tolist()
    assert len(parts) == dm.part_count(n)
    got = dm.figures_from_parts(parts, n)
    assert [repr(v) for v in got] == [repr(v) for v in want]


def test_api_list_accepts_an_aten_op_this_process_never_touched():
    """dir(torch.ops.aten) lists only the packets already loaded: validation must not depend on
    what ran before. A fresh interpreter, an op nothing has called."""
    import subprocess
    import sys

    code = (
        "import torch\n"
        "assert '_foreach_addcdiv_' not in dir(torch.ops.aten)\n"
        "from probes.pytorch.online_dispatch import PtdbgDispatch\n"
        "import tempfile\n"
        "d = PtdbgDispatch(dump_mode='list', api_list=['_foreach_addcdiv_', 'native_layer_norm'],"
        " dump_path=tempfile.mkdtemp())\n"
        "try:\n"
        "    PtdbgDispatch(dump_mode='list', api_list=['_foreach_addcdiv'], dump_path=tempfile.mkdtemp())\n"
        "except Exception as exc:\n"
        "    print('REJECTED', exc)\n"
        "try:\n"
        "    PtdbgDispatch(dump_mode='list', api_list=['not_an_op_at_all'], dump_path=tempfile.mkdtemp())\n"
        "except Exception as exc:\n"
        "    print('REJECTED', exc)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    lines = [line for line in out.stdout.splitlines() if line.startswith("REJECTED")]
    assert len(lines) == 1 and "not_an_op_at_all" in lines[0] and "an aten op name" in lines[0]
