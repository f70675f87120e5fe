"""online_dispatch on FP8: ``aten._scaled_mm`` against the float64 product of its own FP8 operands
and scales, and the casts to and from FP8 (``aten._to_copy``) against the value they round.

The seeded defect is a ``_scaled_mm`` kernel that accumulates in bfloat16 (registered over the
CPU kernel with torch.library for the test's duration): it must fail; PyTorch's own kernel, on
the shapes and scales FP8 training uses and on OpInfo's samples, must pass. And a torchao
Float8Linear MLP trains under the mode with the losses of the plain run, its matmuls compared.
"""

from __future__ import annotations

import csv
import importlib.util
import json
import warnings
from pathlib import Path

import pytest
import torch
from seeded_fp8 import float8_mlp, fp8_batches, narrow_scaled_mm_kernel

from probes.core.thresholds import DISPATCH_SCALED_THRESHOLD, MACHINE_EPS
from probes.online_dispatch import skip_list
from probes.pytorch.online_dispatch import PtdbgDispatch

E4M3, E5M2 = torch.float8_e4m3fn, torch.float8_e5m2


def read_rows(run_dir: Path) -> list[dict[str, str]]:
    (path,) = run_dir.glob("compare_result_rank*.csv")
    with open(path, encoding="utf-8-sig", newline="") as fh:
        return [r for r in csv.DictReader(fh) if "_output" in r["NPU Name"]]


def summary(run_dir: Path) -> dict:
    return json.loads((run_dir / "summary.json").read_text())


def operands(m: int, k: int, n: int, a_dtype: torch.dtype = E4M3, b_dtype: torch.dtype = E4M3, seed: int = 0):
    """FP8 operands as training makes them: amax scaling per tensor; b column-major (the layout
    _scaled_mm wants for its right operand)."""
    gen = torch.Generator().manual_seed(seed)
    a = torch.randn(m, k, generator=gen) * 3
    b = torch.randn(n, k, generator=gen)
    sa = torch.finfo(a_dtype).max / a.abs().max()
    sb = torch.finfo(b_dtype).max / b.abs().max()
    return (a * sa).to(a_dtype), (b * sb).to(b_dtype).t(), sa.reciprocal(), sb.reciprocal()


def rowwise_scales(m: int, n: int, seed: int = 1) -> tuple[torch.Tensor, torch.Tensor]:
    gen = torch.Generator().manual_seed(seed)
    return torch.rand(m, 1, generator=gen) + 0.5, torch.rand(1, n, generator=gen) + 0.5


@pytest.fixture
def narrow_scaled_mm():
    with narrow_scaled_mm_kernel():
        yield


CASES = {
    "e4m3xe4m3-tensorwise-bf16": (E4M3, E4M3, "tensor", torch.bfloat16),
    "e4m3xe4m3-tensorwise-fp32": (E4M3, E4M3, "tensor", torch.float32),
    "e4m3xe5m2-tensorwise-bf16": (E4M3, E5M2, "tensor", torch.bfloat16),
    "e4m3xe4m3-one-element-bf16": (E4M3, E4M3, "one", torch.bfloat16),
    "e4m3xe4m3-rowwise-bf16": (E4M3, E4M3, "row", torch.bfloat16),
    "e4m3xe5m2-rowwise-fp32": (E4M3, E5M2, "row", torch.float32),
}


def call_case(case: tuple, m: int = 32, k: int = 512, n: int = 64, bias: bool = False) -> torch.Tensor:
    a_dtype, b_dtype, scaling, out_dtype = case
    a, b, sa, sb = operands(m, k, n, a_dtype, b_dtype)
    if scaling == "one":
        sa, sb = sa.reshape(1), sb.reshape(1)
    elif scaling == "row":
        sa, sb = rowwise_scales(m, n)
    extra = {"bias": torch.randn(n).to(out_dtype)} if bias else {}
    return torch._scaled_mm(a, b, sa, sb, out_dtype=out_dtype, **extra)


def scaled_mm_rows(run_dir: Path) -> list[dict[str, str]]:
    return [r for r in read_rows(run_dir) if r["NPU Name"].startswith("_scaled_mm_")]


@pytest.mark.parametrize("name", CASES)
def test_a_correct_scaled_mm_passes_and_a_bf16_accumulating_one_fails(tmp_path, name, request):
    case = CASES[name]
    out_name = "bfloat16" if case[3] == torch.bfloat16 else "float32"
    with PtdbgDispatch(dump_mode="OFF", dump_path=str(tmp_path / "clean"), debug=True) as disp:
        clean = call_case(case, bias=case[3] == torch.bfloat16)
    (row,) = scaled_mm_rows(disp.run_dir)
    assert row["Accuracy Reached or Not"] == "Yes", row
    clean_ulps = float(row["Scaled Error (ulp)"])
    # one rounding to the output dtype after an exact float32 sum of exact FP8 products
    assert clean_ulps <= (0.51 if out_name == "bfloat16" else 64.0), clean_ulps
    request.node.user_properties.append(("clean_ulps", clean_ulps))

    narrow = request.getfixturevalue("narrow_scaled_mm")  # noqa: F841 - installs the seeded kernel
    with PtdbgDispatch(dump_mode="OFF", dump_path=str(tmp_path / "seeded"), debug=True) as disp:
        seeded = call_case(case, bias=case[3] == torch.bfloat16)
    assert not torch.equal(seeded, clean)
    (row,) = scaled_mm_rows(disp.run_dir)
    assert row["Accuracy Reached or Not"] == "No" and row["FailedRule"] in ("scaled", "both"), row
    seeded_ulps = float(row["Scaled Error (ulp)"])
    limit = DISPATCH_SCALED_THRESHOLD[out_name] / MACHINE_EPS[out_name]
    assert seeded_ulps > 2 * limit, (seeded_ulps, limit)
    assert summary(disp.run_dir)["failed_ops"][0]["name"] == "_scaled_mm_1"
    request.node.user_properties.append(("seeded_ulps", seeded_ulps))


def test_opinfo_samples_of_scaled_mm_pass(tmp_path):
    """PyTorch's own samples: FP8 outputs (the default out_dtype), scales of several hundred that
    push most results beyond the format's range (e4m3fn saturates, e5m2 overflows to inf)."""
    pytest.importorskip("expecttest")
    from torch.testing._internal.common_methods_invocations import op_db

    (op,) = [o for o in op_db if o.name == "torch._scaled_mm"]
    samples = [s for dtype in (E4M3, E5M2) for s in op.sample_inputs("cpu", dtype)]
    assert len(samples) >= 6
    with PtdbgDispatch(dump_mode="OFF", dump_path=str(tmp_path), debug=True) as disp:
        for s in samples:
            op.op(s.input, *s.args, **s.kwargs)
    rows = scaled_mm_rows(disp.run_dir)
    assert len(rows) == len(samples)
    assert all(r["Accuracy Reached or Not"] == "Yes" for r in rows), [r for r in rows if r["Accuracy Reached or Not"] != "Yes"]
    assert summary(disp.run_dir)["failed_op_count"] == 0


def test_scale_result_and_block_scales_are_not_compared(tmp_path):
    a, b, sa, sb = operands(32, 256, 64)
    with PtdbgDispatch(dump_mode="OFF", dump_path=str(tmp_path)) as disp:
        torch._scaled_mm(a, b, sa, sb, out_dtype=E4M3, scale_result=torch.tensor(2.0))
    (row,) = scaled_mm_rows(disp.run_dir)
    assert row["Accuracy Reached or Not"] == "Nan" and "scale_result" in row["Err_message"]


def test_casts_to_and_from_fp8_are_compared_and_other_copies_are_not(tmp_path):
    gen = torch.Generator().manual_seed(3)
    x = torch.randn(64, 64, generator=gen) * 200  # beyond 464 too: e4m3fn's cast saturates there
    with PtdbgDispatch(dump_mode="OFF", dump_path=str(tmp_path), debug=True) as disp:
        q = x.to(E4M3)
        g = (x / 64).to(torch.bfloat16).to(E5M2)
        q.to(torch.bfloat16)  # from FP8: exact
        x.to(torch.float64)  # a plain cast: a copy, not compared
    rows = {r["NPU Name"]: r for r in read_rows(disp.run_dir) if r["NPU Name"].startswith("_to_copy")}
    # float32 -> e4m3fn, bfloat16 -> e5m2, e4m3fn -> bfloat16; not float32 -> bfloat16 / float64
    assert set(rows) == {"_to_copy_1_output", "_to_copy_2_output", "_to_copy_3_output"}
    assert all(r["Accuracy Reached or Not"] == "Yes" for r in rows.values()), rows
    assert float(rows["_to_copy_1_output"]["Scaled Error (ulp)"]) <= 0.5
    assert float(rows["_to_copy_2_output"]["Scaled Error (ulp)"]) <= 0.5
    assert float(rows["_to_copy_3_output"]["Scaled Error (ulp)"]) == 0.0
    assert q.dtype == E4M3 and g.dtype == E5M2
    assert summary(disp.run_dir)["skipped_calls"].get(skip_list.COPY) == 2


# torchao ------------------------------------------------------------------------------------------
def _torchao_available() -> bool:
    return importlib.util.find_spec("torchao") is not None


def train(model: torch.nn.Module, steps: int, disp: PtdbgDispatch | None) -> list[float]:
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    losses = []
    for x, target in fp8_batches(steps):
        opt.zero_grad(set_to_none=True)
        if disp is None:
            loss = (model(x).float() - target.float()).pow(2).mean()
            loss.backward()
        else:
            with disp:
                loss = (model(x).float() - target.float()).pow(2).mean()
                loss.backward()
        opt.step()
        losses.append(loss.item())
    return losses


@pytest.mark.skipif(not _torchao_available(), reason="torchao is a dev extra")
def test_a_torchao_float8_mlp_trains_under_online_dispatch_with_its_matmuls_compared(tmp_path):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        plain = train(float8_mlp(), 3, None)
        disp = PtdbgDispatch(dump_mode="OFF", dump_path=str(tmp_path))
        probed = train(float8_mlp(), 3, disp)
    assert probed == plain  # bit-identical: the mode returns the device results untouched
    s = summary(disp.run_dir)
    compared = s["ops_compared_by_op"]
    # per step: 2 layers x (forward, grad input, grad weight) matmuls; casts of x, w and grads
    assert compared.get("aten._scaled_mm.default") == 3 * 6, compared
    assert compared.get("aten._to_copy.default", 0) >= 3 * 6
    assert s["failed_op_count"] == 0, s["failed_ops"]


# the catalogue's FP8 cases -------------------------------------------------------------------------
def fp8_case(api: str, dtype: str):
    from pytest_msprobe.catalogue import fp8_ops

    (case,) = [c for c in fp8_ops.cases() if c.api == api and c.dtype == dtype]
    return case


def gated(result) -> dict:
    from pytest_msprobe.catalogue import gate

    return gate.judge(result.to_dict(), gate.Goldens(device="cpu", identity="test-machine", own=None), False)


@pytest.mark.parametrize("dtype", ["bfloat16", "float32"])
@pytest.mark.parametrize("api", ["Torch._scaled_mm[e4m3fn-e4m3fn-tensorwise]", "Torch._scaled_mm[e4m3fn-e5m2-rowwise]"])
def test_the_catalogue_passes_scaled_mm_and_fails_a_bf16_accumulating_one_on_any_machine(api, dtype, request):
    """No golden at all: the accumulation test ratio (a limit that holds on every machine) gates it."""
    from probes.core.accumulation import RATIO_LIMIT
    from pytest_msprobe.catalogue.measure import measure_torch

    case = fp8_case(api, dtype)
    clean = measure_torch(case, "cpu", verdict=False)
    assert clean.samples == 4 and clean.ratio < RATIO_LIMIT[dtype] / 2
    assert gated(clean)["status"] == "measured"
    if dtype == "bfloat16":
        assert clean.max_ulp <= 0.51
    request.getfixturevalue("narrow_scaled_mm")
    seeded = measure_torch(case, "cpu", verdict=False)
    assert seeded.ratio > 5 * RATIO_LIMIT[dtype]
    assert gated(seeded)["status"] == "over limit"


def test_the_catalogue_fails_a_cast_that_truncates(monkeypatch):
    from pytest_msprobe.catalogue import fp8_ops
    from pytest_msprobe.catalogue.measure import measure_torch

    case = fp8_case("Tensor.to[float8_e4m3fn]", "float32")
    clean = measure_torch(case, "cpu", verdict=False)
    assert clean.max_ulp <= 0.5 and gated(clean)["status"] == "measured"
    correct = fp8_ops.call(case.api)

    def truncating(inp, args, kwargs):  # round toward zero: one spacing down where the cast rounded up
        out = correct(inp, args, kwargs)
        if inp.dtype == torch.float64:
            return out
        up = out.double().abs() > inp.double().abs()
        below = out.double().abs() - torch.from_numpy(scaled_spacing_below(out.double().abs().numpy()))
        return torch.where(up, below * out.double().sign(), out.double()).to(out.dtype)

    monkeypatch.setattr(fp8_ops, "call", lambda api: truncating)
    seeded = measure_torch(case, "cpu", verdict=False)
    assert 0.5 < seeded.max_ulp < 1.0
    assert gated(seeded)["status"] == "over limit"


def scaled_spacing_below(values):
    import numpy as np

    from probes.core.ulps import spacing

    return spacing(np.nextafter(values, 0.0), "float8_e4m3fn")


def test_a_result_beyond_e4m3fn_range_may_be_saturated_or_nan_but_nothing_else():
    """The FP8 formats' two conversion modes are both held correct where the exact result
    overflows (CPU kernels differ: PyTorch's saturates, oneDNN's gives NaN); in range, or any
    other value beyond it, stays what it is and is compared as such."""
    from probes.online_dispatch.leaf_pairs import overflowed_as

    ref = torch.tensor([1e6, -1e6, 1e6, 100.0, 3.0], dtype=torch.float64)
    dev = torch.tensor([448.0, float("nan"), 96.0, float("nan"), 3.0]).to(E4M3)
    held = overflowed_as(ref, dev)
    assert held[0] == 448.0 and held[1].isnan()  # saturated, and non-saturating: both as the device
    assert held[2] == 448.0  # a wrong value beyond the range is compared with the saturated one
    assert held[3] == 100.0  # a NaN where the result is in range is not excused
    assert held[4] == 3.0
    inf = overflowed_as(ref, torch.zeros(5).to(E5M2))
    assert inf[0] == float("inf") and inf[1] == -float("inf")  # a format with infinity: that
