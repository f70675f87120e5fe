"""The three tools on the simulated NPU: device tensors, no float64 on the device,
torch_npu's fused operators with no CPU kernel, host transfers counted.

Every probe runs with ``strict: True`` here, so a probe that asks the device for float64 (the
simulated NPU refuses it, as the hardware does) or moves data the wrong way fails the test
instead of being recorded and skipped.
"""

from __future__ import annotations

import csv
import json
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")

import torch.nn as nn  # noqa: E402
import torch.nn.functional as F  # noqa: E402

from probes import GradComparator  # noqa: E402
from probes.pytorch import PrecisionDebugger  # noqa: E402
from probes.pytorch.online_dispatch import PtdbgDispatch  # noqa: E402
from pytest_msprobe.testing import simulated_npu  # noqa: E402

DEFECT = {"npu_rms_norm": "reduced_precision"}


class FusedBlock(nn.Module):
    """linear -> npu_rms_norm -> npu_swiglu -> linear -> softmax, as an NPU transformer's MLP."""

    def __init__(self) -> None:
        super().__init__()
        self.inp = nn.Linear(16, 64)
        self.norm_weight = nn.Parameter(torch.rand(64) + 0.5)
        self.out = nn.Linear(32, 8)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        import torch_npu

        h, _rstd = torch_npu.npu_rms_norm(self.inp(x), self.norm_weight)
        return F.softmax(self.out(torch_npu.npu_swiglu(h)), dim=-1)


def _model(dtype=torch.float32):
    torch.manual_seed(0)
    return FusedBlock().to("npu").to(dtype), torch.randn(6, 16, device="npu", dtype=dtype)


def _fb(tmp_path: Path, **section) -> dict:
    return {"task": "free_benchmark", "dump_path": str(tmp_path), "strict": True, "free_benchmark": section}


def _flagged(dbg: PrecisionDebugger) -> set[str]:
    return {row["api_name"] for row in dbg.summary()["flagged"]}


def _step(model, x, dbg=None, backward=True):
    if dbg is not None:
        dbg.start()
    try:
        y = model(x)
        if backward:
            (y.float() * torch.arange(8.0, device=y.device)).sum().backward()
    finally:
        if dbg is not None:
            dbg.stop()
    return y


# ------------------------------------------------------------------------------ free_benchmark
MODES = [
    ("improve_precision", "npu", "scaled"),
    ("improve_precision", "npu", "reference"),
    ("add_noise", "npu", "scaled"),
    ("add_noise", "npu", "reference"),
    ("bit_noise", "npu", "scaled"),
    ("change_value", "npu", "reference"),
    ("no_change", "npu", "reference"),
    ("to_cpu", "cpu", "scaled"),
    ("to_cpu", "cpu", "reference"),
]


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
@pytest.mark.parametrize("mode,fuzz_device,rule", MODES, ids=[f"{m}-{r}" for m, _d, r in MODES])
def test_free_benchmark_every_mode_runs_on_the_device(tmp_path, mode, fuzz_device, rule, dtype):
    with simulated_npu():
        model, x = _model(dtype)
        with torch.no_grad():
            plain = model(x).cpu()
        dbg = PrecisionDebugger(config=_fb(tmp_path, pert_mode=mode, fuzz_device=fuzz_device, rule=rule))
        y = _step(model, x, dbg)
        summary = dbg.summary()
        assert y.device.type == "npu"
        torch.testing.assert_close(y.detach().cpu(), plain, rtol=0, atol=0)  # check never changes outputs
        checked = {api: s["checked"] for api, s in summary["apis"].items()}
        if mode == "improve_precision" and rule == "reference" and dtype == torch.float32:
            # msprobe's improve_precision does not re-run float32 calls: skipped, with the reason
            assert not any(checked.values()) and "NPU.npu_rms_norm" in str(summary["not_checked"])
        else:
            assert checked.get("NPU.npu_rms_norm", 0) >= 1 and checked.get("NPU.npu_swiglu", 0) >= 1, checked
        assert not summary.get("errors"), summary.get("errors")
        flagged = _flagged(dbg)
        if mode == "change_value":  # the mode that must change outputs: the fused ops are seen to change
            assert "NPU.npu_rms_norm.0.forward" in flagged
        elif mode != "no_change" and rule == "scaled":
            assert not flagged, flagged  # a clean model on the device: nothing to report


@pytest.mark.parametrize("mode,fuzz_device", [("improve_precision", "npu"), ("to_cpu", "cpu")])
def test_free_benchmark_finds_the_seeded_fused_op_defect_by_name(tmp_path, mode, fuzz_device):
    """npu_rms_norm computing in bfloat16 behind a float32 API: judged against its CPU reference
    (probes/backends/npu_references.py, float64 for improve_precision), since torch_npu's operators
    have no CPU kernel."""
    for defects, expect in (({}, False), (DEFECT, True)):
        with simulated_npu(defects=defects) as npu:
            model, x = _model()
            dbg = PrecisionDebugger(config=_fb(tmp_path / str(expect), pert_mode=mode, fuzz_device=fuzz_device,
                                               rule="scaled"))
            _step(model, x, dbg)
            flagged = _flagged(dbg)
            assert ("NPU.npu_rms_norm.0.forward" in flagged) is expect, flagged
            assert flagged <= {"NPU.npu_rms_norm.0.forward"}, flagged
            assert npu.host_transfers > 0  # the CPU re-run copies the inputs to the host


def test_free_benchmark_fix_substitutes_on_the_device(tmp_path):
    with simulated_npu():
        model, x = _model(torch.bfloat16)
        with torch.no_grad():
            plain = model(x)
            dbg = PrecisionDebugger(config=_fb(tmp_path, pert_mode="improve_precision", handler_type="fix"))
            fixed = _step(model, x, dbg, backward=False)
        assert fixed.device.type == "npu" and fixed.dtype == torch.bfloat16
        apis = dbg.summary()["apis"]
        for api in ("Functional.linear", "NPU.npu_rms_norm", "NPU.npu_swiglu", "Functional.softmax"):
            assert apis[api]["fixed"] >= 1, apis
        # the float32 re-runs of bf16 inputs agree with the bf16 kernels (which accumulate in float32)
        torch.testing.assert_close(fixed.cpu(), plain.cpu(), rtol=2**-7, atol=2**-8)


@pytest.mark.parametrize("mode,fuzz_device", [("improve_precision", "npu"), ("to_cpu", "cpu"), ("add_noise", "npu")])
def test_free_benchmark_backward_stage_on_the_device(tmp_path, mode, fuzz_device):
    with simulated_npu():
        model, x = _model()
        dbg = PrecisionDebugger(config=_fb(tmp_path, pert_mode=mode, fuzz_device=fuzz_device, fuzz_stage="backward",
                                           rule="scaled", list=["linear", "npu_rms_norm", "npu_swiglu"]))
        _step(model, x, dbg)
        apis = dbg.summary()["apis"]
        for api in ("Functional.linear", "NPU.npu_rms_norm", "NPU.npu_swiglu"):
            assert apis[api]["checked"] >= 1, apis
        assert not _flagged(dbg)
        assert model.inp.weight.grad is not None and model.inp.weight.grad.device.type == "npu"


def test_free_benchmark_preheat_on_the_device(tmp_path):
    with simulated_npu(defects=DEFECT):
        model, x = _model(torch.bfloat16)
        dbg = PrecisionDebugger(config=_fb(tmp_path, pert_mode="improve_precision", if_preheat=True, preheat_step=2,
                                           max_sample=4))
        for _ in range(3):
            _step(model, x, dbg, backward=False)
            dbg.step()
        summary = dbg.summary()
        assert summary["apis"]["NPU.npu_rms_norm"]["checked"] >= 1
        assert not summary.get("errors")


def test_free_benchmark_figures_cross_once_per_checked_call(tmp_path):
    """add_noise keeps everything on the device: one host transfer per checked call at most (its
    figures, batched), never one per output element or per leaf."""
    with simulated_npu() as npu:
        model, x = _model()
        _step(model, x, backward=False)
        dbg = PrecisionDebugger(config=_fb(tmp_path, pert_mode="add_noise", rule="scaled"))
        npu.reset_host_transfers()
        _step(model, x, dbg, backward=False)
        checked = sum(s["checked"] for s in dbg.summary()["apis"].values())
        assert checked >= 4 and npu.host_transfers <= checked


# ----------------------------------------------------------------------------- online_dispatch
@pytest.mark.parametrize("background", [False, True])
def test_online_dispatch_compares_npu_ops_with_their_cpu_reference(tmp_path, background):
    runs = {}
    for name, defects in (("clean", {}), ("defect", DEFECT)):
        with simulated_npu(defects=defects):
            model, x = _model()
            disp = PtdbgDispatch(dump_mode="auto", dump_path=str(tmp_path / name), background=background)
            with disp:
                _step(model, x)
            runs[name] = json.loads((Path(disp.run_dir) / "summary.json").read_text())
    clean, bad = runs["clean"], runs["defect"]
    for s in (clean, bad):
        assert s["devices"] == {"npu": s["ops_compared"]} and s["ops_compared"] > 20
        assert not s.get("errors"), s.get("errors")
        assert not any("subclass" in reason for reason in s["skipped"])  # device tensors are compared
    assert not clean["failed_ops"]
    failed = {op["name"] for op in bad["failed_ops"]}
    assert failed == {"NPU.npu_rms_norm_1"}, failed
    assert bad["failed_ops"][0]["op"] == "npu.npu_rms_norm.default"


def test_online_dispatch_npu_op_without_reference_is_skipped_with_the_reason(tmp_path):
    from probes.online_dispatch import skip_list

    lib = torch.library.Library("npu", "FRAGMENT")  # noqa: TOR901
    try:
        with simulated_npu():
            lib.define("npu_unknown_op(Tensor self) -> Tensor")
            # (the simulated device runs an op's CPU kernel; the probe must not try it on the host)
            lib.impl("npu_unknown_op", lambda t: t * 2, "CPU")
            disp = PtdbgDispatch(dump_path=str(tmp_path), background=False)
            with disp:
                torch.ops.npu.npu_unknown_op(torch.ones(3, device="npu"))
            s = json.loads((Path(disp.run_dir) / "summary.json").read_text())
    finally:
        lib._destroy()
    assert s["skipped"][skip_list.NO_CPU_REFERENCE] == {"npu.npu_unknown_op.default": 1}


# --------------------------------------------------------------------------------- grad_probe
def _grad_run(dump: Path, defects: dict) -> list[int]:
    with simulated_npu(defects=defects) as npu:
        model, x = _model()
        target = torch.arange(6, device="npu") % 8
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        dbg = PrecisionDebugger(config={"task": "grad_probe", "dump_path": str(dump), "strict": True,
                                        "grad_probe": {"grad_level": "L1"}})
        dbg.monitor(model)
        per_step = []
        try:
            for _ in range(3):
                npu.reset_host_transfers()
                opt.zero_grad()
                F.nll_loss(model(x).log(), target).backward()
                opt.step()
                per_step.append(npu.host_transfers)
        finally:
            dbg.stop()
        assert model.inp.weight.device.type == "npu"
    return per_step


def test_grad_probe_on_device_parameters_finds_a_wrong_fused_backward(tmp_path):
    transfers = _grad_run(tmp_path / "a", {})
    _grad_run(tmp_path / "b", {})
    _grad_run(tmp_path / "bug", {"npu_rms_norm": "wrong_backward"})
    # statistics and signs of every parameter cross in one transfer per step
    assert transfers and max(transfers) <= 1, transfers
    rows = list(csv.reader(open(tmp_path / "a" / "rank0" / "grad_summary_0.csv")))
    assert len(rows) == 1 + 5  # a row per parameter
    clean = GradComparator.compare_distributed(tmp_path / "a", tmp_path / "b", tmp_path / "cmp_clean")
    assert clean.ok and not clean.flags
    bad = GradComparator.compare_distributed(tmp_path / "a", tmp_path / "bug", tmp_path / "cmp_bug")
    assert bad.first_flagged_step() == 0
    at_first = {flag.param for _rank, flag in bad.flags if flag.step == 0}
    # the fused op's own weight and everything upstream of it; not the layer after it
    assert {"norm_weight", "inp.weight", "inp.bias"} <= at_first
    assert not at_first & {"out.weight", "out.bias"}, at_first


# ------------------------------------------------------------------ a real model, clean
def test_a_real_transformer_step_on_the_device_is_clean_under_both_tools(tmp_path):
    """The clean case on a model nobody here wrote: a Hugging Face Llama step on the simulated NPU.
    float32 improve_precision re-runs every call in float64 on the CPU (the device has none) and
    online_dispatch compares every op with the CPU: neither flags anything, nothing errors."""
    pytest.importorskip("transformers")
    from llama_model import tiny_llama, token_batch

    with simulated_npu():
        model = tiny_llama(torch.float32).to("npu")
        ids = token_batch(batch=2, length=16).to("npu")
        dbg = PrecisionDebugger(config=_fb(tmp_path / "fb", pert_mode="improve_precision", rule="scaled"))
        with dbg:
            model(input_ids=ids, labels=ids).loss.backward()
        summary = dbg.summary()
        assert sum(s["checked"] for s in summary["apis"].values()) > 20
        assert not summary["flagged"] and not summary["errors"], (summary["flagged"][:3], summary["errors"])
        disp = PtdbgDispatch(dump_path=str(tmp_path / "od"), background=False)
        with disp:
            model(input_ids=ids, labels=ids).loss.backward()
        od = json.loads((Path(disp.run_dir) / "summary.json").read_text())
    assert od["ops_compared"] > 50 and od["devices"] == {"npu": od["ops_compared"]}
    assert not od["failed_ops"] and not od.get("errors"), od["failed_ops"][:3]
