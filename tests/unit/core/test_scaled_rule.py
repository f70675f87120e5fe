"""The scale-aware rule (probes/core/scaled.py) and free_benchmark's float32 -> float64
improve_precision: each judged on seeded defects it must catch and clean kernels it must pass."""

from __future__ import annotations

import json
import math

import array_api_compat.numpy as np_xp
import numpy as np
import pytest
import seeded
import seeded_reduced
import torch
import torch.nn as nn
import torch.nn.functional as F

from probes.backends import torch_xp
from probes.core import scaled
from probes.core import thresholds as th
from probes.core.errors import ConfigError
from probes.pytorch import PrecisionDebugger

FP32_EPS = 2.0**-23
BF16_EPS = 2.0**-7


def err(a, b, eps=FP32_EPS, **kw) -> float:
    return scaled.finish(scaled.scaled_error(torch_xp, a.double(), b.double(), eps, tuple(b.shape), **kw).tolist())[0]


def run(config: dict, fn):
    dbg = PrecisionDebugger(config=config)
    with dbg:
        out = fn()
    return dbg, out


# --- the measure ---------------------------------------------------------------------------------


def test_the_smallest_scale_is_the_one_of_the_dtype_named_by_its_eps():
    """The measure's floor per dtype, looked up by the machine epsilon callers pass; an epsilon of
    no known dtype falls back by its size."""
    for name, eps in th.MACHINE_EPS.items():
        assert scaled.smallest_scale(eps) == scaled.SMALLEST_SCALE[name]
        assert scaled.SMALLEST_SCALE[name] >= th.SMALLEST_NORMAL[name]  # never below the normal range
        assert scaled.scaled_threshold_for_eps(eps) == th.SCALED_THRESHOLD[name]
    assert scaled.smallest_scale(1e-12) == scaled.SMALLEST_SCALE["float64"]
    assert scaled.smallest_scale(1e-3) == scaled.SMALLEST_SCALE["float32"]
    assert scaled.scaled_threshold_for_eps(1e-3) == th.SCALED_THRESHOLD_DEFAULT


def test_correctly_rounded_results_score_at_most_half_an_ulp():
    torch.manual_seed(0)
    exact = torch.randn(64, 128, dtype=torch.float64) * torch.logspace(-3, 3, 128, dtype=torch.float64)
    for dtype, eps in ((torch.bfloat16, BF16_EPS), (torch.float16, 2.0**-10), (torch.float32, FP32_EPS)):
        e = err(exact.to(dtype), exact, eps)
        assert 0 < e <= eps / 2 * (1 + 1e-9), dtype


def test_cancellation_near_zero_is_judged_at_the_row_scale_not_elementwise():
    torch.manual_seed(0)
    x, w = torch.randn(256, 128), torch.randn(64, 128) / 128**0.5
    ref = F.linear(x.double(), w.double())
    out = F.linear(x, w)  # an honest fp32 kernel: its smallest outputs are off by many of their own ulps
    rel = ((out.double() - ref).abs() / ref.abs()).max().item()
    assert rel > 1e-4  # msprobe's element-wise view would flag it (fp32 threshold 2e-4 is near)
    assert err(out, ref) < 20 * FP32_EPS  # at the row's scale: a few ulps


def test_reduced_precision_matmul_is_thousands_of_ulps_off():
    torch.manual_seed(0)
    a, b = torch.randn(64, 256), torch.randn(256, 64)
    ref = a.double() @ b.double()
    assert err(a @ b, ref) < 20 * FP32_EPS
    tf32 = seeded_reduced.reduced_precision_matmul(a, b)
    assert err(tf32, ref) > th.SCALED_THRESHOLD["float32"]
    bf16_math = seeded_reduced.reduced_precision_matmul(a, b, mantissa_bits=7)
    assert err(bf16_math, ref) > 10 * th.SCALED_THRESHOLD["float32"]


def test_scale_errors_and_small_outputs_are_caught():
    ref = torch.linspace(0.5, 2.0, 64, dtype=torch.float64)
    assert err(ref * 1.01, ref) == pytest.approx(0.01, rel=1e-6)  # 1 % everywhere is 1 %
    small = torch.linspace(1e-3, 2e-2, 64)  # all outputs small: real cancellation at their own scale
    naive = (torch.exp(small.half()) - 1).double()
    assert err(naive, torch.expm1(small.double()), 2.0**-10) > th.SCALED_THRESHOLD["float16"]


def test_a_wrong_row_far_below_the_tensor_scale_is_still_caught_in_fp32():
    ref = torch.randn(8, 64, dtype=torch.float64)
    ref[3] *= 0.2  # a small row (one token, one sample)
    bad = ref.clone()
    bad[3] *= 1.001  # 0.1 % off in that row only: 5x fp32's threshold at the row's scale
    assert err(bad, ref) == pytest.approx(1e-3, rel=1e-6)


def test_structural_zero_row_noise_is_judged_at_the_tensor_scale():
    """The first query of causal attention attends to one key: its gradient is zero in exact
    arithmetic and rounding noise of tensor-scale terms in float32."""
    torch.manual_seed(0)
    q, k, v = (torch.randn(2, 4, 64, 32, requires_grad=True) for _ in range(3))
    grads = []
    for dtype in (torch.float32, torch.float64):
        qq, kk, vv = (t.detach().to(dtype).requires_grad_() for t in (q, k, v))
        out = F.scaled_dot_product_attention(qq, kk, vv, is_causal=True)
        g = torch.ones_like(out)
        grads.append(torch.autograd.grad(out, (qq,), g)[0])
    dq32, dq64 = grads
    assert dq64[:, :, 0].abs().max() < 1e-12 < dq32[:, :, 0].abs().max()  # the row is pure noise
    assert err(dq32, dq64) < th.SCALED_THRESHOLD["float32"]
    assert err(dq32, dq64, floor=0.0) > th.SCALED_THRESHOLD["float32"]  # without the floor it would fail


def test_elementwise_mode_judges_every_element_by_its_own_magnitude():
    ref = torch.tensor([1.0, 1e-3], dtype=torch.float64)
    off = torch.tensor([1.0, 1.1e-3], dtype=torch.float64)
    assert err(off, ref, floor=0.0, min_row=1) == pytest.approx(0.1, rel=1e-6)
    assert err(off, ref) < 0.01  # at the row's scale the small element hardly matters


def test_non_finite_values_match_by_identity():
    ref = torch.tensor([1.0, float("inf"), float("nan"), 2.0], dtype=torch.float64)
    same = scaled.finish(scaled.scaled_error(torch_xp, ref.clone(), ref, FP32_EPS).tolist())
    assert same == (0.0, False, False)
    other = ref.clone()
    other[1], other[2] = 5.0, 3.0
    e, nan_mm, inf_mm = scaled.finish(scaled.scaled_error(torch_xp, other, ref, FP32_EPS).tolist())
    assert nan_mm and inf_mm


def test_chunked_measure_equals_one_pass_and_numpy_agrees():
    rng = np.random.default_rng(0)
    b = rng.standard_normal((300, 40)) * rng.uniform(0.01, 10, (300, 1))
    a = b * (1 + rng.standard_normal(b.shape) * 1e-6)
    one = scaled.scaled_error(np_xp, a, b, FP32_EPS)
    many = scaled.scaled_error(np_xp, a, b, FP32_EPS, chunk=40 * 7)
    assert float(one[0]) == pytest.approx(float(many[0]), rel=1e-12)
    on_torch = scaled.scaled_error(torch_xp, torch.from_numpy(a), torch.from_numpy(b), FP32_EPS)
    assert float(one[0]) == pytest.approx(on_torch[0].item(), rel=1e-12)


def test_figures_ignore_user_patches_of_the_torch_module(monkeypatch):
    ref = torch.linspace(0.5, 2.0, 64, dtype=torch.float64).reshape(4, 16)
    monkeypatch.setattr(torch, "sum", seeded.off_by_one_sum)
    monkeypatch.setattr(torch, "maximum", lambda *a, **k: 1 / 0)
    assert err(ref * 1.01, ref) == pytest.approx(0.01, rel=1e-6)


# --- configuration -----------------------------------------------------------------------------


def test_rule_key_is_validated(fb_config):
    with pytest.raises(ConfigError, match=r"free_benchmark\.rule.*reference.*scaled"):
        PrecisionDebugger(config=fb_config(rule="loose"))
    assert PrecisionDebugger(config=fb_config()).config.free_benchmark.rule == "reference"  # msprobe's, for config.json


def test_preheat_needs_the_reference_rule(fb_config):
    with pytest.raises(ConfigError, match="if_preheat"):
        PrecisionDebugger(config=fb_config(rule="scaled", if_preheat=True))


# --- improve_precision in float32 --------------------------------------------------------------


def _mlp(dtype=torch.float32):
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(16, 32), nn.LayerNorm(32), nn.GELU(), nn.Linear(32, 4)).to(dtype)


def _step(model, dtype=torch.float32):
    x = torch.randn(8, 16, generator=torch.Generator().manual_seed(1)).to(dtype)
    loss = model(x).float().softmax(-1).log().mean()
    loss.backward()
    return loss


def test_fp32_improve_precision_catches_a_reduced_precision_linear(fb_config, monkeypatch):
    seeded_reduced.install_reduced_linear(monkeypatch)
    model = _mlp()
    dbg, _ = run(fb_config(pert_mode="improve_precision", rule="scaled"), lambda: _step(model))
    flagged = {r.api for r in dbg.rows}
    assert flagged == {"Functional.linear"}
    row = dbg.rows[0]
    assert row.max_rel > th.SCALED_THRESHOLD["float32"] and row.dtype == "torch.float32"
    assert row.detail["ulps"] > 1000 and "reference_max_rel" in row.detail  # both rules' figures
    flagged_summary = dbg.summary()["flagged"][0]["detail"]
    assert flagged_summary["rule"] == "scaled" and "reference_consistent" in flagged_summary


def test_fp32_improve_precision_is_msprobes_skip_under_the_reference_rule(fb_config, monkeypatch):
    seeded_reduced.install_reduced_linear(monkeypatch)
    model = _mlp()
    dbg, _ = run(fb_config(pert_mode="improve_precision"), lambda: _step(model))
    summary = dbg.summary()
    assert dbg.rows == [] and "inputs are already float32/float64" in summary["not_checked"]


def test_fp32_improve_precision_clean_model_is_quiet_and_really_checked(fb_config):
    model = _mlp()
    dbg, _ = run(fb_config(pert_mode="improve_precision", rule="scaled"), lambda: _step(model))
    apis = dbg.summary()["apis"]
    assert dbg.rows == []
    assert apis["Functional.linear"]["checked"] == 2 and apis["Functional.layer_norm"]["checked"] == 1


def test_fp32_re_run_is_float64_and_fix_substitutes_it(fb_config, monkeypatch):
    seeded_reduced.install_reduced_linear(monkeypatch)
    torch.manual_seed(0)
    x, w = torch.randn(16, 64), torch.randn(32, 64)
    exact = F.linear(x.double(), w.double()).float()
    cfg = fb_config(pert_mode="improve_precision", rule="scaled", handler_type="fix", list=["linear"])
    _, fixed = run(cfg, lambda: F.linear(x, w))
    assert torch.equal(fixed, exact)  # the float64 result, rounded once to float32
    _, plain = run(fb_config(pert_mode="improve_precision", rule="scaled", list=["linear"]), lambda: F.linear(x, w))
    assert not torch.equal(plain, exact)  # check mode leaves the user's (defective) output alone


def test_dtype_arguments_are_raised_with_the_inputs(fb_config):
    x = torch.linspace(-2, 2, 64)
    cases = ((torch.linalg, "vector_norm", "Torch.linalg.vector_norm", x.bfloat16(), torch.bfloat16),  # -> float32
             (torch, "cumsum", "Torch.cumsum", x, torch.float32))  # float32 -> float64
    for owner, name, key, inp, dtype in cases:
        kwargs = {"dim": 0} if name == "cumsum" else {}
        dbg, out = run(fb_config(pert_mode="improve_precision", rule="scaled", list=[key]),
                       lambda owner=owner, name=name, inp=inp, dtype=dtype, kwargs=kwargs:
                       getattr(owner, name)(inp, dtype=dtype, **kwargs))
        summary = dbg.summary()
        assert summary["errors"] == [], summary["errors"]
        assert summary["apis"][key]["checked"] == 1 and dbg.rows == []
        assert out.dtype == dtype


def test_half_inputs_are_raised_to_float32_only(fb_config, monkeypatch):
    seen = []
    real = torch.mul

    def spy(a, b):
        seen.append((a.dtype, b.dtype))
        return real(a, b)

    monkeypatch.setattr(torch, "mul", spy)
    a, b = torch.ones(4, dtype=torch.bfloat16), torch.ones(4)
    run(fb_config(pert_mode="improve_precision", rule="scaled", list=["mul"]), lambda: torch.mul(a, b))
    assert seen == [(torch.bfloat16, torch.float32), (torch.float32, torch.float32)]


# --- noise modes ----------------------------------------------------------------------------------


def test_noise_modes_weigh_the_output_move_against_the_input_move(fb_config):
    angles = torch.linspace(0, 63, 4096)  # rotary angles: outputs near cos's zeros swing elementwise
    for mode in ("add_noise", "bit_noise"):
        dbg, _ = run(fb_config(pert_mode=mode, rule="scaled", list=["cos"]), lambda: torch.cos(angles))
        assert dbg.rows == [] and dbg.summary()["apis"]["Torch.cos"]["checked"] == 1
        ref, _ = run(fb_config(pert_mode=mode, list=["cos"]), lambda: torch.cos(angles))
        assert ref.rows, "msprobe's element-wise rule flags it"


def test_noise_modes_flag_an_ill_conditioned_api_with_its_input_move(fb_config, monkeypatch):
    monkeypatch.setattr(F, "softsign", seeded.ill_conditioned)
    x = torch.linspace(0.5, 1.0, 64).bfloat16()
    dbg, _ = run(fb_config(pert_mode="bit_noise", rule="scaled", list=["softsign"]), lambda: F.softsign(x))
    assert dbg.rows
    detail = dbg.rows[0].detail
    assert detail["input_move"] == pytest.approx(BF16_EPS, rel=0.01)  # one bf16 ulp at the input's scale
    assert dbg.rows[0].threshold == pytest.approx(th.SCALED_THRESHOLD["bfloat16"] + th.NOISE_AMPLIFICATION * BF16_EPS,
                                                  rel=0.01)


def test_no_change_stays_exact(fb_config):
    defect = seeded.nondeterministic()
    x = torch.linspace(-2, 2, 64)
    dbg, _ = run(fb_config(pert_mode="no_change", rule="scaled", list=["softsign"]),
                 lambda: torch.nn.functional.softsign(x))
    assert dbg.rows == []
    import torch.nn.functional as fn

    old = fn.softsign
    fn.softsign = defect
    try:
        dbg, _ = run(fb_config(pert_mode="no_change", rule="scaled", list=["softsign"]), lambda: fn.softsign(x))
    finally:
        fn.softsign = old
    assert dbg.rows and dbg.rows[0].threshold == 0.0


def test_backward_stage_catches_a_reduced_precision_linear_gradient(fb_config, monkeypatch):
    seeded_reduced.install_reduced_linear(monkeypatch)
    model = _mlp()
    cfg = fb_config(pert_mode="improve_precision", rule="scaled", fuzz_stage="backward", list=["linear"])
    dbg, _ = run(cfg, lambda: _step(model))
    assert {r.api for r in dbg.rows} == {"Functional.linear"} and all(r.stage == "backward" for r in dbg.rows)


# --- a real model -------------------------------------------------------------------------------


@pytest.mark.parametrize("dtype, mode", [(torch.float32, "improve_precision"), (torch.bfloat16, "improve_precision"),
                                         (torch.float32, "add_noise"), (torch.bfloat16, "bit_noise")])
def test_small_llama_training_steps_give_zero_rows(fb_config, dtype, mode):
    llama_model = pytest.importorskip("llama_model")
    pytest.importorskip("transformers")
    model = llama_model.tiny_llama(dtype)
    ids = llama_model.token_batch()
    dbg = PrecisionDebugger(config=fb_config(pert_mode=mode, rule="scaled"))
    for _ in range(2):
        dbg.start()
        llama_model.training_step(model, ids)
        dbg.stop()
        dbg.step()
    summary = dbg.summary()
    assert summary["rows_total"] == 0, json.dumps(summary["flagged"][:3], default=str)
    assert summary["errors"] == []
    checked = {api for api, s in summary["apis"].items() if s["checked"]}
    assert {"Functional.linear", "Functional.scaled_dot_product_attention", "Functional.silu"} <= checked


def test_small_llama_with_a_reduced_precision_linear_is_flagged_by_name(fb_config, monkeypatch):
    llama_model = pytest.importorskip("llama_model")
    pytest.importorskip("transformers")
    seeded_reduced.install_reduced_linear(monkeypatch)
    model = llama_model.tiny_llama(torch.float32, layers=1)
    dbg, _ = run(fb_config(pert_mode="improve_precision", rule="scaled"),
                 lambda: llama_model.training_step(model, llama_model.token_batch()))
    assert {r.api for r in dbg.rows} == {"Functional.linear"}
    assert all(math.isfinite(r.max_rel) and r.max_rel > 1e-3 for r in dbg.rows)


# --- the fast pass and its robust retry ----------------------------------------------------------


_EXP2 = torch.special.exp2


@pytest.mark.parametrize("defect, expected", [
    (lambda y: torch.where(y > 5e19, torch.full_like(y, float("nan")), y), "nan_mismatch"),
    (lambda y: y * 1.05, 0.05),
])
def test_fast_pass_falls_back_for_non_finite_and_overflowing_values(fb_config, monkeypatch, defect, expected):
    """bf16 outputs near 1e19..1e20: their squares overflow float32, where the fast pass works."""

    def api(t):
        y = _EXP2(t.float())
        return defect(y).to(t.dtype) if t.dtype == torch.bfloat16 else y.to(t.dtype)

    monkeypatch.setattr(torch.special, "exp2", api)
    x = torch.linspace(63.0, 67.0, 64).bfloat16()
    dbg, _ = run(fb_config(pert_mode="improve_precision", rule="scaled", list=["Torch.special.exp2"]),
                 lambda: torch.special.exp2(x))
    assert len(dbg.rows) == 1
    got = dbg.rows[0].max_rel
    if isinstance(expected, str):
        assert got == expected
    else:
        assert got == pytest.approx(expected, rel=0.2)


def test_measured_input_move_for_msprobes_add_noise_style(fb_config):
    x = torch.linspace(0.01, 0.02, 64).bfloat16()  # x + 1e-4 moves these by one or two bf16 ulps
    dbg, _ = run(fb_config(pert_mode="add_noise", rule="scaled", add_noise_style="reference", list=["softsign"]),
                 lambda: F.softsign(x))
    assert dbg.rows == []
    dbg.stop()
    monkey = seeded.ill_conditioned
    old = F.softsign
    F.softsign = monkey
    try:
        dbg, _ = run(fb_config(pert_mode="add_noise", rule="scaled", add_noise_style="reference", list=["softsign"]),
                     lambda: F.softsign(x))
    finally:
        F.softsign = old
    assert dbg.rows
    move = dbg.rows[0].detail["input_move"]
    assert 0 < move <= 2 * 1e-4 / 0.01  # measured: at most about v / |x|


@pytest.mark.parametrize("shape", [(7,), (3, 50), (4, 8, 33), (1000, 3)])
def test_the_cheap_bound_never_undercuts_the_measure(shape):
    g = torch.Generator().manual_seed(sum(shape))
    for _ in range(5):
        b = torch.randn(shape, generator=g, dtype=torch.float64) * torch.rand(shape, generator=g, dtype=torch.float64).pow(4)
        a = b + torch.randn(shape, generator=g, dtype=torch.float64) * 1e-6
        exact = scaled.finish(scaled.scaled_error(torch_xp, a, b, FP32_EPS, shape).tolist())[0]
        bound = scaled.finish_bound(scaled.bound_figures(torch_xp, a, b).tolist(), FP32_EPS)
        assert exact <= bound * (1 + 1e-9)
    b[0] = float("nan")
    assert scaled.finish_bound(scaled.bound_figures(torch_xp, b.clone(), b).tolist(), FP32_EPS) == math.inf


def test_complex_outputs_are_compared_by_their_parts(fb_config):
    x = torch.randn(256, generator=torch.Generator().manual_seed(0))
    dbg, out = run(fb_config(pert_mode="improve_precision", rule="scaled", list=["Torch.fft.fft"]),
                   lambda: torch.fft.fft(x))
    assert out.dtype == torch.complex64
    assert dbg.rows == [] and dbg.summary()["apis"]["Torch.fft.fft"]["checked"] == 1


def test_a_device_without_float64_re_runs_on_the_cpu(fb_config, monkeypatch):
    """NPU / MPS have no float64 kernels: the float32 call is re-run on the CPU with every input
    copied there (simulated by declaring the CPU such a device; no NPU here)."""
    from probes.backends.torch_backend import BACKEND, TorchBackend
    from probes.free_benchmark.perturbations import make_perturbation

    monkeypatch.setattr(TorchBackend, "lacks_float64", lambda self, t: True)
    x, idx = torch.randn(4, 8), torch.tensor([0, 2])
    call = make_perturbation("improve_precision", BACKEND, rule="scaled").build((x, idx), {"dtype": torch.float32})
    assert call.on_cpu and call.args[0].dtype == torch.float64 and call.args[0].device.type == "cpu"
    assert call.args[1].dtype == torch.int64 and call.kwargs["dtype"] == torch.float64
    seeded_reduced.install_reduced_linear(monkeypatch)
    model = _mlp()
    dbg, _ = run(fb_config(pert_mode="improve_precision", rule="scaled", list=["linear"]), lambda: _step(model))
    assert {r.api for r in dbg.rows} == {"Functional.linear"}
