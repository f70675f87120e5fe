"""FP8 on the simulated NPU: float8 tensors and ``torch._scaled_mm`` on the device, torch_npu's
``npu_quant_matmul`` (an ``npu::`` op with no CPU kernel, its float64 reference, its seeded
bfloat16 accumulator), and the tools judging both there: online_dispatch, free_benchmark's
improve_precision (strict, so a probe that asks the device for float64 fails the test) and the
catalogue on device ``npu``.

Seeded defects: ``npu_quant_matmul`` with ``"reduced_precision"`` (running sum in bfloat16) and a
``_scaled_mm`` CPU kernel that accumulates in bfloat16 (tests/support/seeded_fp8.py), which the device
runs since its tensors compute with the CPU's kernels. Each must be caught; the clean kernels pass.
"""

from __future__ import annotations

import csv
import json
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")

from seeded_fp8 import narrow_scaled_mm_kernel  # noqa: E402

from probes.backends.npu_references import npu_quant_matmul as quant_matmul_reference  # noqa: E402
from probes.core.accumulation import RATIO_LIMIT  # noqa: E402
from probes.core.ulps import ulp_errors  # noqa: E402
from probes.pytorch import PrecisionDebugger  # noqa: E402
from probes.pytorch.online_dispatch import PtdbgDispatch  # noqa: E402
from pytest_msprobe.testing import simulated_npu  # noqa: E402
from pytest_msprobe.testing.simulated_npu import SUPPORTED_DEFECTS, SimulatedNPUError  # noqa: E402

E4M3, E5M2 = torch.float8_e4m3fn, torch.float8_e5m2
NARROW = {"npu_quant_matmul": "reduced_precision"}
OUT_NAMES = {torch.bfloat16: "bfloat16", torch.float16: "float16", torch.float32: "float32"}


def scaled_mm_operands(m: int = 32, k: int = 512, n: int = 64, seed: int = 0):
    """_scaled_mm's operands as FP8 training makes them (amax scaling per tensor, inverse scales;
    b column-major), on the CPU."""
    gen = torch.Generator().manual_seed(seed)
    a, b = torch.randn(m, k, generator=gen) * 3, torch.randn(n, k, generator=gen)
    sa, sb = torch.finfo(E4M3).max / a.abs().max(), torch.finfo(E4M3).max / b.abs().max()
    return (a * sa).to(E4M3), (b * sb).to(E4M3).t(), sa.reciprocal(), sb.reciprocal()


def quant_operands(per_token: bool, m: int = 16, k: int = 512, n: int = 32, fmt: torch.dtype = E4M3, seed: int = 0):
    """npu_quant_matmul's (x1, x2, scale, kwargs) as quantised inference makes them: one scale per
    tensor, or per token of x1 (pertoken_scale) and per channel of x2 (scale) with a bias."""
    gen = torch.Generator().manual_seed(seed)
    a, w = torch.randn(m, k, generator=gen) * 3, torch.randn(k, n, generator=gen)
    top = torch.finfo(fmt).max
    if not per_token:
        sa, sw = a.abs().max() / top, w.abs().max() / top
        return a.div(sa).to(fmt), w.div(sw).to(fmt), (sa * sw).reshape(1), {}
    sa, sw = a.abs().amax(dim=1) / top, w.abs().amax(dim=0) / top
    return a.div(sa[:, None]).to(fmt), w.div(sw).to(fmt), sw, {"pertoken_scale": sa, "bias": torch.randn(n, generator=gen)}


def on_device(tree):
    if isinstance(tree, torch.Tensor):
        return tree.to("npu")
    if isinstance(tree, dict):
        return {k: on_device(v) for k, v in tree.items()}
    return tuple(on_device(v) for v in tree)


def quant_call(per_token: bool, out_dtype: torch.dtype, **shape):
    import torch_npu

    x1, x2, scale, kwargs = on_device(quant_operands(per_token, **shape))
    return torch_npu.npu_quant_matmul(x1, x2, scale, output_dtype=out_dtype, **kwargs)


def max_ulp(out: torch.Tensor, ref: torch.Tensor) -> float:
    return float(ulp_errors(out.cpu().double().numpy(), ref.double().numpy(), OUT_NAMES[out.dtype]).max())


# ------------------------------------------------------------------------------- the device
@pytest.mark.parametrize("fmt", [E4M3, E5M2], ids=["e4m3fn", "e5m2"])
def test_fp8_tensors_live_on_the_device_and_scaled_mm_runs_there(fmt):
    x = torch.randn(8, 16, generator=torch.Generator().manual_seed(1)) * 4
    with simulated_npu() as npu:
        cast = x.to("npu").to(fmt)
        moved = x.to(fmt).to("npu")
        assert (cast.device.type, cast.dtype, moved.dtype) == ("npu", fmt, fmt)
        assert torch.empty(3, dtype=fmt, device="npu").dtype == fmt
        npu.reset_host_transfers()
        assert torch.equal(cast.cpu().float(), x.to(fmt).float())  # the device cast is the CPU's
        assert npu.host_transfers == 1
        a, b, sa, sb = scaled_mm_operands()
        on_npu = torch._scaled_mm(*on_device((a, b, sa, sb)), out_dtype=torch.bfloat16)
        assert on_npu.device.type == "npu" and on_npu.dtype == torch.bfloat16
        assert torch.equal(on_npu.cpu(), torch._scaled_mm(a, b, sa, sb, out_dtype=torch.bfloat16))


@pytest.mark.parametrize("name", [n for n in ("float8_e4m3fnuz", "float8_e5m2fnuz") if hasattr(torch, n)])
def test_the_device_refuses_fp8_formats_ascend_lacks(name):
    fmt = getattr(torch, name)
    with simulated_npu():
        with pytest.raises(SimulatedNPUError, match="not supported on the NPU.*AMD"):
            torch.zeros(4, dtype=fmt, device="npu")
        with pytest.raises(SimulatedNPUError, match=name):
            torch.ones(4, device="npu").to(fmt)
        with pytest.raises(SimulatedNPUError, match=name):
            torch.ones(4).to(fmt).to("npu")


# ------------------------------------------------------------------------- npu_quant_matmul
def test_npu_quant_matmul_is_a_device_op_seedable_in_bfloat16():
    assert SUPPORTED_DEFECTS["npu_quant_matmul"] == ("reduced_precision",)
    x1, x2, scale, _ = quant_operands(False)
    with simulated_npu():
        import torch_npu

        with pytest.raises(NotImplementedError, match="CPU"):  # no CPU kernel, as on the hardware
            torch.ops.npu.npu_quant_matmul(x1, x2, scale, output_dtype=torch.bfloat16)
        assert torch_npu.npu_quant_matmul.__module__ == "torch_npu"
    with pytest.raises(ValueError, match="wrong_backward"):
        with simulated_npu(defects={"npu_quant_matmul": "wrong_backward"}):
            pass


def test_the_reference_is_the_dequantised_product_in_float64():
    x1, x2, scale, kwargs = quant_operands(True)
    ref = quant_matmul_reference(x1, x2, scale, **kwargs)
    # written apart: dequantise each operand first, then multiply
    deq = (x1.double() * kwargs["pertoken_scale"].double()[:, None]) @ (x2.double() * scale.double())
    assert ref.dtype == torch.float64
    # the two orders differ by float64 roundings only (relative to the row's scale: outputs cancel)
    torch.testing.assert_close(ref, deq + kwargs["bias"].double(), rtol=0, atol=1e-13 * float(ref.abs().max()))
    with pytest.raises(NotImplementedError, match="offset"):
        quant_matmul_reference(x1, x2, scale, offset=torch.zeros(1))
    with pytest.raises(NotImplementedError, match="integer bias"):
        quant_matmul_reference(x1, x2, scale, bias=torch.zeros(x2.shape[-1], dtype=torch.int32))


@pytest.mark.parametrize("per_token", [False, True], ids=["per-tensor", "per-token"])
@pytest.mark.parametrize("out_dtype", list(OUT_NAMES), ids=list(OUT_NAMES.values()))
def test_a_clean_npu_quant_matmul_rounds_once_and_the_seeded_one_does_not(per_token, out_dtype):
    x1, x2, scale, kwargs = quant_operands(per_token)
    ref = quant_matmul_reference(x1, x2, scale, **kwargs)
    with simulated_npu():
        clean = quant_call(per_token, out_dtype)
    with simulated_npu(defects=NARROW):
        seeded = quant_call(per_token, out_dtype)
    assert clean.device.type == "npu" and clean.dtype == out_dtype and clean.shape == ref.shape
    # a float32 sum of exact FP8 products, rounded once: half an ulp in a half type; float32
    # outputs carry the sum's own rounding, a few ulps over K = 512 terms
    assert max_ulp(clean, ref) <= (0.51 if out_dtype != torch.float32 else 16.0)
    assert max_ulp(seeded, ref) > 8 * max(max_ulp(clean, ref), 1.0)


def test_npu_quant_matmul_broadcasts_batches_and_refuses_what_is_not_simulated():
    x1, x2, scale, _ = quant_operands(False, m=4, k=64, n=8)
    batched = x1.reshape(2, 2, 64)
    with simulated_npu():
        import torch_npu

        out = torch_npu.npu_quant_matmul(batched.npu(), x2.npu(), scale.npu(), output_dtype=torch.float32)
        ref = quant_matmul_reference(batched, x2, scale)
        assert out.shape == (2, 2, 8) and max_ulp(out, ref) <= 4.0
        d = {"x1": x1.npu(), "x2": x2.npu(), "scale": scale.npu()}
        refused = {
            "output_dtype=None": dict(d),
            "offset": dict(d, offset=torch.zeros(1, device="npu"), output_dtype=torch.bfloat16),
            "not int8": dict(d, x1=torch.ones(4, 64, dtype=torch.int8, device="npu"), output_dtype=torch.bfloat16),
            r"scale of shape \[3\]": dict(d, scale=torch.ones(3, device="npu"), output_dtype=torch.bfloat16),
            r"pertoken_scale of shape \[8\]": dict(d, pertoken_scale=torch.ones(8, device="npu"),
                                                    output_dtype=torch.bfloat16),
        }
        for why, call in refused.items():
            with pytest.raises(SimulatedNPUError, match=why):
                torch_npu.npu_quant_matmul(call.pop("x1"), call.pop("x2"), call.pop("scale"), **call)


# -------------------------------------------------------------------------- online_dispatch
def output_rows(run_dir: Path, prefix: str) -> list[dict[str, str]]:
    (path,) = Path(run_dir).glob("compare_result_rank*.csv")
    with open(path, encoding="utf-8-sig", newline="") as fh:
        return [r for r in csv.DictReader(fh) if r["NPU Name"].startswith(prefix) and "_output" in r["NPU Name"]]


def dispatched(tmp_path: Path, name: str, prefix: str, call) -> dict[str, str]:
    with PtdbgDispatch(dump_mode="OFF", dump_path=str(tmp_path / name), debug=True, background=False) as disp:
        out = call()
    assert out.device.type == "npu"
    (row,) = output_rows(disp.run_dir, prefix)
    return row


def test_online_dispatch_compares_scaled_mm_on_the_device_with_its_float64_reference(tmp_path):
    def call():
        return torch._scaled_mm(*on_device(scaled_mm_operands()), out_dtype=torch.bfloat16)

    with simulated_npu():
        clean = dispatched(tmp_path, "clean", "_scaled_mm_", call)
        with narrow_scaled_mm_kernel():
            seeded = dispatched(tmp_path, "seeded", "_scaled_mm_", call)
    assert clean["Accuracy Reached or Not"] == "Yes" and float(clean["Scaled Error (ulp)"]) <= 0.51, clean
    assert seeded["Accuracy Reached or Not"] == "No" and seeded["FailedRule"] in ("scaled", "both"), seeded


@pytest.mark.parametrize("out_dtype", [torch.bfloat16, torch.float32], ids=["bf16", "fp32"])
def test_online_dispatch_judges_npu_quant_matmul_by_its_float64_reference(tmp_path, out_dtype):
    rows = {}
    for name, defects in (("clean", {}), ("seeded", NARROW)):
        with simulated_npu(defects=defects):
            rows[name] = dispatched(tmp_path, name, "NPU.npu_quant_matmul_", lambda: quant_call(True, out_dtype))
    assert rows["clean"]["Accuracy Reached or Not"] == "Yes", rows["clean"]
    assert rows["seeded"]["Accuracy Reached or Not"] == "No", rows["seeded"]
    assert float(rows["seeded"]["Scaled Error (ulp)"]) > 8 * max(float(rows["clean"]["Scaled Error (ulp)"]), 1.0)


# ---------------------------------------------------------------------------- free_benchmark
def improve_precision(tmp_path: Path, call) -> tuple[torch.Tensor, dict]:
    dbg = PrecisionDebugger(config={"task": "free_benchmark", "dump_path": str(tmp_path), "strict": True,
                                    "free_benchmark": {"pert_mode": "improve_precision", "rule": "scaled"}})
    dbg.start()
    try:
        out = call()
    finally:
        dbg.stop()
    return out, dbg.summary()


def judged(tmp_path: Path, api: str, call) -> tuple[int, int]:
    """(checked, flagged) of `api` under improve_precision; the output must be the plain run's."""
    plain = call().cpu()
    out, summary = improve_precision(tmp_path, call)
    assert out.device.type == "npu" and torch.equal(out.cpu(), plain)  # the probe never changes outputs
    assert not summary.get("errors"), summary.get("errors")
    stats = summary["apis"][api]
    return stats["checked"], stats["flagged"]


def test_free_benchmark_judges_scaled_mm_on_the_device(tmp_path):
    def call():
        return torch._scaled_mm(*on_device(scaled_mm_operands()), out_dtype=torch.bfloat16)

    with simulated_npu():
        assert judged(tmp_path / "clean", "Torch._scaled_mm", call) == (1, 0)
        with narrow_scaled_mm_kernel():
            assert judged(tmp_path / "seeded", "Torch._scaled_mm", call) == (1, 1)


@pytest.mark.parametrize("per_token", [False, True], ids=["per-tensor", "per-token"])
def test_free_benchmark_judges_npu_quant_matmul_against_its_float64_reference(tmp_path, per_token):
    """Raising the FP8 operands to float32 (improve_precision's rule for narrow inputs) would re-run
    a kernel that takes no float32 operands: the re-run is the op's float64 reference on the CPU."""
    for name, defects, flagged in (("clean", {}, 0), ("seeded", NARROW, 1)):
        with simulated_npu(defects=defects) as npu:
            npu.reset_host_transfers()
            got = judged(tmp_path / name, "NPU.npu_quant_matmul", lambda: quant_call(per_token, torch.bfloat16))
            assert got == (1, flagged), (name, got)
            assert npu.host_transfers > 0  # the reference's inputs went to the host


# -------------------------------------------------------------------------------- catalogue
def quant_cases():
    from pytest_msprobe.catalogue.cases import npu_cases

    return [c for c in npu_cases() if c.api == "NPU.npu_quant_matmul"]


def test_the_catalogue_lists_npu_quant_matmul_only_where_torch_npu_imports():
    assert quant_cases() == []  # no torch_npu outside a simulation (nor on this machine)
    with simulated_npu():
        assert sorted(c.dtype for c in quant_cases()) == sorted(OUT_NAMES.values())


def test_the_catalogue_on_the_npu_measures_npu_quant_matmul_within_limits_and_fails_the_seeded_one():
    from pytest_msprobe.catalogue import gate
    from pytest_msprobe.catalogue.measure import measure_torch

    results = {}
    for name, defects in (("clean", {}), ("seeded", NARROW)):
        with simulated_npu(defects=defects):
            for case in quant_cases():
                r = measure_torch(case, "npu", verdict=False)
                judged_row = gate.judge(r.to_dict(), gate.Goldens("npu", "this-machine", None, {}), regen=False)
                results[name, case.dtype] = (r, judged_row)
    for dtype in OUT_NAMES.values():
        clean, clean_row = results["clean", dtype]
        seeded, seeded_row = results["seeded", dtype]
        assert clean.device == "npu" and clean.samples >= 4 and not clean.error
        # the machine-independent limit: the accumulation test ratio of a float32 accumulator
        assert clean.ratio is not None and clean.ratio <= RATIO_LIMIT[dtype], (dtype, clean.ratio)
        assert not gate.failing(clean_row), clean_row
        assert seeded.ratio > 10 * RATIO_LIMIT[dtype], (dtype, seeded.ratio)
        assert seeded_row["status"] == gate.OVER_LIMIT and gate.failing(seeded_row), seeded_row


def test_the_catalogue_verdict_of_npu_quant_matmul_is_free_benchmarks_on_the_device():
    from pytest_msprobe.catalogue.measure import measure_torch

    verdicts = {}
    for name, defects in (("clean", {}), ("seeded", NARROW)):
        with simulated_npu(defects=defects):
            (case,) = [c for c in quant_cases() if c.dtype == "bfloat16"]
            r = measure_torch(case, "npu", samples=2)
            verdicts[name] = (r.verdict, r.verdict_detail)
    assert verdicts["clean"][0] == "pass", verdicts
    assert verdicts["seeded"][0] == "flagged", verdicts


def test_a_run_dir_summary_names_the_failed_npu_quant_matmul(tmp_path):
    """online_dispatch's summary points at the seeded call by its NPU name."""
    with simulated_npu(defects=NARROW):
        with PtdbgDispatch(dump_mode="OFF", dump_path=str(tmp_path), debug=True, background=False) as disp:
            quant_call(True, torch.float32)
    summary = json.loads((Path(disp.run_dir) / "summary.json").read_text())
    assert [op["name"] for op in summary["failed_ops"]] == ["NPU.npu_quant_matmul_1"]
