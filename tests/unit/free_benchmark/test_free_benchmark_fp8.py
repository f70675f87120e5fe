"""free_benchmark on FP8: torchao's Float8Linear matmuls and torch._scaled_mm judged under
improve_precision against the float64 product of their own dequantised inputs, and each FP8
input's range use at its cast judged beside them; under the noise modes with an FP8 operand
moved in its own grid; under the backward stage through the FP8 matmuls of the gradients.

Seeded defects: a scale from a stale amax (most of the input saturates), a scale so small that
most of it flushes to zero, a _scaled_mm kernel that accumulates in bfloat16, one that fails one
ulp away from its operands (noise modes) and one wrong on the gradients' e5m2 operands only
(backward stage), each registered over the CPU kernel for the test's duration. The clean model
must be quiet and bit-identical.
"""

from __future__ import annotations

import contextlib
import json
import warnings
from pathlib import Path

import pytest
import torch
from seeded_fp8 import (
    e5m2_bias_off_scaled_mm,
    float8_mlp,
    fp8_batches,
    low_bits_dropped_scaled_mm,
    narrow_scaled_mm_kernel,
    scaled_mm_kernel,
    top_as_nonfinite_scaled_mm,
)

from probes.pytorch import PrecisionDebugger

pytest.importorskip("torchao.float8")
E4M3 = torch.float8_e4m3fn


def config(tmp_path: Path, **section) -> dict:
    return {"task": "free_benchmark", "dump_path": str(tmp_path / "dump"),
            "free_benchmark": {"pert_mode": "improve_precision", "rule": "scaled", **section}}


def summary(tmp_path: Path) -> dict:
    return json.loads((tmp_path / "dump" / "summary.json").read_text())


def train(model: torch.nn.Module, steps: int, dbg: PrecisionDebugger | None) -> list[torch.Tensor]:
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    losses = []
    for x, target in fp8_batches(steps):
        opt.zero_grad(set_to_none=True)
        if dbg is not None:
            dbg.start()
        loss = (model(x).float() - target.float()).pow(2).mean()
        loss.backward()
        if dbg is not None:
            dbg.stop()
            dbg.step()
        opt.step()
        losses.append(loss.detach().clone())
    return losses


def fp8_pair(x: torch.Tensor, w: torch.Tensor, x_scale: float | None = None):
    """torchao FP8 tensors of an input and a weight as Float8Linear makes them (tensorwise
    scales from their amax), the input's scale replaced by `x_scale` when given."""
    from torchao.float8.float8_training_tensor import (
        GemmInputRole,
        LinearMMConfig,
        hp_tensor_and_scale_to_float8,
    )

    cfg = LinearMMConfig()
    sx = torch.tensor(x_scale if x_scale is not None else 448.0 / float(x.abs().max()))
    sw = torch.tensor(448.0 / float(w.abs().max()))
    a = hp_tensor_and_scale_to_float8(x, sx, E4M3, cfg, GemmInputRole.INPUT)
    b = hp_tensor_and_scale_to_float8(w.t().contiguous().t(), sw, E4M3, cfg, GemmInputRole.WEIGHT)
    return a, b


def warn_free(fn):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return fn()


def test_a_clean_float8_mlp_is_judged_quiet_and_bit_identical(tmp_path):
    plain = warn_free(lambda: train(float8_mlp(), 3, None))
    dbg = PrecisionDebugger(config=config(tmp_path))
    probed = warn_free(lambda: train(float8_mlp(), 3, dbg))
    assert all(torch.equal(a, b) for a, b in zip(plain, probed))
    s = summary(tmp_path)
    assert s["errors"] == [], s["errors"]
    assert s["rows_total"] == 0, s["flagged"][:3]
    mm = s["apis"]["Torch.mm"]
    assert mm["checked"] == mm["calls"] == 3 * 2, mm  # the two layers' forward matmuls, every step
    assert not any("Float8" in reason or "FP8" in reason for reason in s["not_checked"]), s["not_checked"]
    assert mm["worst_score"] < 1.0
    fp8 = mm["fp8"]  # every input's cast was seen: its range use and error are from before it
    # elements tied with the amax (bf16 inputs repeat values) count as clipped: a few per tensor
    assert fp8["inputs"] == 3 * 2 * 2 and fp8["saturated"] < 0.005 and fp8["underflowed"] < 0.01
    assert 0.0 < fp8["cast_error"] < 0.04  # one e4m3 rounding: ~2.6 % of a Gaussian tensor


def judged_mm(tmp_path: Path, x_scale: float | None, **section) -> dict:
    gen = torch.Generator().manual_seed(1)
    x = torch.randn(64, 512, generator=gen).to(torch.bfloat16)
    w = torch.randn(512, 64, generator=gen).to(torch.bfloat16)
    with PrecisionDebugger(config=config(tmp_path, **section)):
        a, b = fp8_pair(x, w, x_scale)
        out = torch.mm(a, b)
    assert out.dtype == torch.bfloat16
    return summary(tmp_path)


def fp8_rows(s: dict, what: str) -> list[dict]:
    return [r for r in s["flagged"] if r["api"] == "Torch.mm" and r["max_rel"] == what]


def test_a_stale_amax_that_saturates_the_input_is_flagged_and_named(tmp_path):
    s = judged_mm(tmp_path, x_scale=448.0 / 0.5)  # an amax of 0.5 kept while the input grew to ~4
    assert s["errors"] == []
    (row,) = fp8_rows(s, "fp8_saturated")
    assert row["output_index"] == "fp8_input.args[0]"
    assert row["detail"]["saturated"] > 0.3 and "saturated in float8_e4m3fn" in row["detail"]["reason"]
    assert "too large" in row["detail"]["reason"]
    assert not fp8_rows(s, "fp8_underflowed")


def test_a_scale_so_small_that_the_input_flushes_is_flagged_and_named(tmp_path):
    s = judged_mm(tmp_path, x_scale=1e-4)
    assert s["errors"] == []
    (row,) = fp8_rows(s, "fp8_underflowed")
    assert row["detail"]["underflowed"] > 0.9 and row["detail"]["flushed"] > 0.5
    assert "too small" in row["detail"]["reason"] and "became zero" in row["detail"]["reason"]


def test_a_correct_scale_is_quiet_and_the_product_matches_float64(tmp_path):
    s = judged_mm(tmp_path, x_scale=None)
    assert s["errors"] == [] and s["rows_total"] == 0, s["flagged"]
    assert s["apis"]["Torch.mm"]["checked"] == 1


@pytest.fixture
def narrow_scaled_mm():
    with narrow_scaled_mm_kernel():
        yield


def test_a_scaled_mm_that_accumulates_in_bf16_is_flagged_through_torchao(tmp_path, narrow_scaled_mm):
    s = judged_mm(tmp_path, x_scale=None)
    assert s["errors"] == []
    rows = [r for r in s["flagged"] if r["api"] == "Torch.mm" and r["output_index"] is None]
    assert rows and rows[0]["detail"]["rule"] == "scaled", s["flagged"]
    assert not fp8_rows(s, "fp8_saturated") and not fp8_rows(s, "fp8_underflowed")


def _operands(seed: int = 0):
    gen = torch.Generator().manual_seed(seed)
    a, b = torch.randn(64, 512, generator=gen) * 3, torch.randn(64, 512, generator=gen)
    sa, sb = 448.0 / a.abs().max(), 448.0 / b.abs().max()
    return (a * sa).to(E4M3), (b * sb).to(E4M3).t(), sa.reciprocal(), sb.reciprocal()


@pytest.mark.parametrize("narrow", [False, True])
def test_torch_scaled_mm_called_directly_is_judged(tmp_path, narrow, request):
    if narrow:
        request.getfixturevalue("narrow_scaled_mm")
    a, b, sa, sb = _operands()
    with PrecisionDebugger(config=config(tmp_path, list=["_scaled_mm"])):
        out = torch._scaled_mm(a, b, sa, sb, out_dtype=torch.bfloat16)
    assert torch.equal(out, torch._scaled_mm(a, b, sa, sb, out_dtype=torch.bfloat16))
    s = summary(tmp_path)
    assert s["errors"] == [] and s["apis"]["Torch._scaled_mm"]["checked"] == 1, s
    flagged = [r for r in s["flagged"] if r["output_index"] is None]
    assert bool(flagged) == narrow, s["flagged"]


# --- the noise modes: FP8 data perturbed in its own grid --------------------------------------------


def _magnitude_codes(t: torch.Tensor) -> torch.Tensor:
    return (t.view(torch.uint8) & 0x7F).to(torch.int16)


def _perturbed_first(mode: str, *args):
    from probes.backends.torch_backend import BACKEND
    from probes.free_benchmark.perturbations import make_perturbation

    return make_perturbation(mode, BACKEND, rule="scaled").build(args, {})


@pytest.mark.parametrize("mode", ["add_noise", "bit_noise"])
@pytest.mark.parametrize("fmt", [E4M3, torch.float8_e5m2], ids=["e4m3fn", "e5m2"])
def test_noise_moves_every_normal_fp8_element_one_ulp_and_reports_it_in_fp8_ulps(mode, fmt):
    top = torch.finfo(fmt).max
    values = torch.tensor([0.0, -0.0, 2.0**-9, top, -top, 1.0, -1.125, 3.0, 0.015625, -200.0])
    data = values.to(fmt)
    pert = _perturbed_first(mode, data, torch.ones(2))
    new = pert.args[0]
    assert new.dtype == fmt and torch.equal(data.view(torch.uint8), values.to(fmt).view(torch.uint8))  # a copy
    step = _magnitude_codes(new) - _magnitude_codes(data)
    normal = data.float().abs() >= torch.finfo(fmt).smallest_normal
    assert torch.equal(step[~normal], torch.zeros_like(step[~normal]))  # zeros and subnormals stay
    at_top = data.float().abs() == top
    assert torch.all(step[normal & ~at_top].abs() == 1), step  # one ulp, for either sign
    assert torch.equal(torch.sign(new.float()), torch.sign(data.float()))
    assert torch.isfinite(new.float()).all()  # e4m3fn's 448 never becomes its NaN pattern
    if mode == "add_noise":  # away from zero, but for the largest value, which has no neighbour further out
        assert torch.all(step[normal & ~at_top] == 1) and torch.all(step[at_top] == 0)
    else:  # the lowest mantissa bit flipped; the largest value one ulp down where its flip is no number
        assert torch.all(step[at_top] == -1) and bool((step[normal] == 1).any())
    assert pert.move == {E4M3: 0.125, torch.float8_e5m2: 0.25}[fmt]  # one ulp of the input's own format


@pytest.mark.parametrize("mode", ["add_noise", "bit_noise", "change_value"])
def test_a_torchao_input_is_perturbed_through_its_data_around_the_same_scale(mode):
    gen = torch.Generator().manual_seed(3)
    a, b = fp8_pair(torch.randn(8, 32, generator=gen).to(torch.bfloat16),
                    torch.randn(32, 8, generator=gen).to(torch.bfloat16))
    before = a._data.clone()
    pert = _perturbed_first(mode, a, b)
    new = pert.args[0]
    assert type(new) is type(a) and new._scale is a._scale and new._data.dtype == E4M3
    assert new._gemm_input_role is a._gemm_input_role and new.dtype == a.dtype
    assert pert.args[1] is b  # the first FP8 input only, as msprobe perturbs the first float tensor
    assert torch.equal(a._data.view(torch.uint8), before.view(torch.uint8))  # the user's tensor is untouched
    moved = new._data.view(torch.uint8) != before.view(torch.uint8)
    if mode == "change_value":
        assert int(moved.sum()) == 2 or torch.equal(before[0, 0].view(torch.uint8), before[-1, -1].view(torch.uint8))
        assert torch.equal(new._data[0, 0].view(torch.uint8), before[-1, -1].view(torch.uint8))
        assert torch.equal(new._data[-1, -1].view(torch.uint8), before[0, 0].view(torch.uint8))
        assert pert.move is None
    else:
        assert moved.float().mean() > 0.9 and pert.move == 0.125  # one e4m3 ulp: the scaled rule's allowance
    out = torch.mm(new, b)  # the same FP8 kernel runs on it
    assert out.dtype == torch.bfloat16 and not torch.equal(out, torch.mm(a, b))


@pytest.mark.parametrize("mode", ["add_noise", "bit_noise", "change_value"])
def test_the_noise_modes_judge_a_clean_float8_mlp_and_leave_it_bit_identical(tmp_path, mode):
    plain = warn_free(lambda: train(float8_mlp(), 2, None))
    dbg = PrecisionDebugger(config=config(tmp_path, pert_mode=mode))
    probed = warn_free(lambda: train(float8_mlp(), 2, dbg))
    assert all(torch.equal(a, b) for a, b in zip(plain, probed))
    s = summary(tmp_path)
    assert s["errors"] == [], s["errors"]
    mm = s["apis"]["Torch.mm"]
    assert mm["checked"] == mm["calls"] == 2 * 2, mm
    assert not any("FP8" in reason for reason in s["not_checked"]), s["not_checked"]
    assert mm["fp8"]["inputs"] == 2 * 2 * 2  # the range use of both inputs, beside the output's verdict
    rows = [r for r in s["flagged"] if r["api"] == "Torch.mm"]
    if mode == "change_value":
        # a matmul is not invariant to swapping two of its inputs: flagged as every such API is
        # (docs/free_benchmark.md), at the plain limit
        assert rows and all(r["output_index"] is None and r["detail"]["rule"] == "scaled" for r in rows)
        assert all(r["figure"] > 1.0 + r["threshold"] for r in rows)
    else:  # one e4m3 ulp moved: within the allowance, yet the output did move
        assert rows == [] and 0.0 < mm["worst_score"] < 1.0, (rows[:2], mm)


def _headroom_operands():
    """Operands of a direct _scaled_mm whose scales leave one ulp of headroom: the amax of `a`
    (e5m2) lands one ulp below 57344, that of `b` (e4m3) one below 448."""
    gen = torch.Generator().manual_seed(2)
    x, y = torch.randn(64, 256, generator=gen), torch.randn(64, 256, generator=gen)
    sa, sb = 49152.0 / x.abs().max(), 416.0 / y.abs().max()
    return (x * sa).to(torch.float8_e5m2), (y * sb).to(E4M3).t(), sa.reciprocal(), sb.reciprocal()


@pytest.mark.parametrize("mode", ["add_noise", "bit_noise", "improve_precision"])
@pytest.mark.parametrize("seeded", [False, True], ids=["clean", "top_as_nonfinite"])
def test_a_kernel_that_fails_one_ulp_away_is_caught_by_the_noise_modes(tmp_path, mode, seeded):
    """The seeded kernel reads each format's largest value as NaN: silent on these operands,
    which stop one ulp short of it, so improve_precision (the float64 product of the same
    operands) cannot see it; a noise mode moves the amax onto it."""
    a, b, sa, sb = _headroom_operands()
    kernel = scaled_mm_kernel(top_as_nonfinite_scaled_mm) if seeded else contextlib.nullcontext()
    with kernel, PrecisionDebugger(config=config(tmp_path, pert_mode=mode, list=["_scaled_mm"])):
        out = torch._scaled_mm(a, b, sa, sb, out_dtype=torch.bfloat16)
    assert torch.isfinite(out.float()).all()
    s = summary(tmp_path)
    assert s["errors"] == [] and s["apis"]["Torch._scaled_mm"]["checked"] == 1, s
    rows = [r for r in s["flagged"] if r["output_index"] is None]
    assert bool(rows) == (seeded and mode != "improve_precision"), s["flagged"]
    assert all(r["max_rel"] == "nan_mismatch" for r in rows)


@pytest.mark.parametrize("mode", ["improve_precision", "bit_noise"])
def test_a_kernel_that_ignores_its_operands_low_bits_is_improve_precisions_to_catch(tmp_path, mode):
    """Which detector catches what: the kernel's own error is seen against the float64 product
    of the operands it was given; the noise modes, which compare two runs of the same kernel,
    see it only as far as it amplifies their move (here: not at all)."""
    with scaled_mm_kernel(low_bits_dropped_scaled_mm):
        s = judged_mm(tmp_path, x_scale=None, pert_mode=mode)
    assert s["errors"] == [] and s["apis"]["Torch.mm"]["checked"] == 1
    rows = [r for r in s["flagged"] if r["api"] == "Torch.mm" and r["output_index"] is None]
    assert bool(rows) == (mode == "improve_precision"), s["flagged"]


# --- the backward stage: the FP8 matmuls of the gradients ----------------------------------------


def backward_config(tmp_path: Path, mode: str) -> dict:
    return config(tmp_path, pert_mode=mode, fuzz_stage="backward", list=["Torch.mm"])


@pytest.mark.parametrize("mode", ["improve_precision", "add_noise", "bit_noise"])
def test_the_backward_stage_judges_the_gradients_fp8_matmuls_of_a_clean_mlp(tmp_path, mode):
    plain = warn_free(lambda: train(float8_mlp(), 2, None))
    dbg = PrecisionDebugger(config=backward_config(tmp_path, mode))
    probed = warn_free(lambda: train(float8_mlp(), 2, dbg))
    assert all(torch.equal(a, b) for a, b in zip(plain, probed))
    s = summary(tmp_path)
    assert s["errors"] == [], s["errors"]
    assert s["rows_total"] == 0, s["flagged"][:3]
    mm = s["apis"]["Torch.mm"]
    # per step and layer: the forward matmul (run unrecorded inside torchao's autograd Function,
    # skipped with why) and the two of its backward (grad_input, grad_weight), judged
    assert mm["calls"] == 2 * 2 * 3 and mm["checked"] == 2 * 2 * 2, mm
    (reason,) = [r for r, apis in s["not_checked"].items() if "Torch.mm" in apis]
    assert s["not_checked"][reason]["Torch.mm"] == 2 * 2 and "autograd Function's forward" in reason
    assert 0.0 < mm["worst_score"] < 1.0
    fp8 = mm["fp8"]  # the gradient cast to e5m2 was seen: its range use and cast error are reported
    assert fp8["formats"] == ["float8_e4m3fn", "float8_e5m2"] and 0.0 < fp8["cast_error"] < 0.1, fp8


@pytest.mark.parametrize("stage", ["forward", "backward"])
def test_a_kernel_wrong_on_the_gradients_matmuls_is_caught_by_the_backward_stage(tmp_path, stage):
    """The seeded kernel is right for the forward's e4m3 x e4m3 matmuls and doubles the e5m2
    operand of the gradients' matmuls."""
    with scaled_mm_kernel(e5m2_bias_off_scaled_mm):
        plain = warn_free(lambda: train(float8_mlp(), 1, None))
        section = backward_config(tmp_path, "improve_precision") if stage == "backward" else config(tmp_path)
        dbg = PrecisionDebugger(config=section)
        probed = warn_free(lambda: train(float8_mlp(), 1, dbg))
    assert all(torch.equal(a, b) for a, b in zip(plain, probed))
    s = summary(tmp_path)
    assert s["errors"] == [] and s["apis"]["Torch.mm"]["checked"] == 2 * (2 if stage == "backward" else 1)
    rows = [r for r in s["flagged"] if r["api"] == "Torch.mm"]
    if stage == "forward":
        assert rows == [], rows[:2]
        return
    assert len(rows) == 2 * 2 and all(r["stage"] == "backward" and r["api_name"].endswith(".backward") for r in rows)
    assert all(r["output_index"] is None and 0.9 < r["max_rel"] < 1.1 for r in rows)  # twice the gradient
