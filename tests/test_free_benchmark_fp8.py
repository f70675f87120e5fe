"""free_benchmark on FP8: torchao's Float8Linear matmuls and torch._scaled_mm judged under
improve_precision against the float64 product of their own dequantised inputs, and each FP8
input's range use at its cast judged beside them.

Seeded defects: a scale from a stale amax (most of the input saturates), a scale so small that
most of it flushes to zero, and a _scaled_mm kernel that accumulates in bfloat16 (registered over
the CPU kernel for the test's duration). The clean model must be quiet and bit-identical.
"""

from __future__ import annotations

import json
import warnings
from pathlib import Path

import pytest
import torch
from seeded_fp8 import float8_mlp, fp8_batches, narrow_scaled_mm_kernel

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


@pytest.mark.parametrize("mode", ["add_noise", "bit_noise", "change_value"])
def test_noise_modes_skip_fp8_inputs_with_the_reason(tmp_path, mode):
    s = judged_mm(tmp_path, x_scale=None, pert_mode=mode)
    assert s["errors"] == []
    assert any("FP8" in reason and "Torch.mm" in apis for reason, apis in s["not_checked"].items()), s["not_checked"]


def test_the_backward_stage_skips_fp8_calls_with_the_reason(tmp_path):
    plain = warn_free(lambda: train(float8_mlp(), 2, None))
    dbg = PrecisionDebugger(config=config(tmp_path, fuzz_stage="backward", list=["Torch.mm"]))
    probed = warn_free(lambda: train(float8_mlp(), 2, dbg))
    assert all(torch.equal(a, b) for a, b in zip(plain, probed))
    s = summary(tmp_path)
    assert s["errors"] == []
    assert any("FP8" in reason and "Torch.mm" in apis for reason, apis in s["not_checked"].items()), s["not_checked"]
