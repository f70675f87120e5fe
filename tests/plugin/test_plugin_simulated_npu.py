"""The plugin on the simulated NPU (--msprobe-simulated-npu): a user's NPU suite dry-run on a
CPU-only machine, as pytest runs it: --msprobe-device=npu resolves, whole-suite tasks, fixtures,
the per-API marker and a two-rank gloo job, with a seeded fused-op defect found by its name."""

from __future__ import annotations

import json

import pytest
from repo_paths import SUPPORT

pytestmark = pytest.mark.slow  # subprocess pytest sessions / multi-process jobs: minutes in all

pytest.importorskip("torch")

TESTS_DIR = SUPPORT

CONFTEST = f'''
import sys
sys.path.insert(0, {str(TESTS_DIR)!r})  # multirank_jobs, importable by the ranks too
'''

SUITE = '''
import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F


class Block(nn.Module):
    def __init__(self):
        super().__init__()
        self.inp = nn.Linear(16, 64)
        self.norm_weight = nn.Parameter(torch.rand(64) + 0.5)
        self.out = nn.Linear(32, 4)

    def forward(self, x):
        import torch_npu
        h, _ = torch_npu.npu_rms_norm(self.inp(x), self.norm_weight)
        return self.out(torch_npu.npu_swiglu(h))


def test_block_trains(msprobe_device):
    assert msprobe_device == "npu"
    torch.manual_seed(0)
    model = Block().to(msprobe_device)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    x = torch.randn(8, 16, device=msprobe_device)
    for _ in range(2):
        opt.zero_grad()
        F.cross_entropy(model(x), torch.arange(8, device=msprobe_device) % 4).backward()
        opt.step()
    assert model.inp.weight.device.type == "npu"
'''

FIXTURE_SUITE = '''
import torch


def test_fixture_names_the_fused_op(free_benchmark, msprobe_device):
    import torch_npu
    torch.manual_seed(0)
    x = torch.randn(4, 32, device=msprobe_device)
    gamma = torch.rand(32, device=msprobe_device) + 0.5
    with free_benchmark(pert_mode="to_cpu", fuzz_device="cpu") as fb:
        torch_npu.npu_rms_norm(x, gamma)
        torch_npu.npu_swiglu(x)
    assert fb.flagged_apis == ["NPU.npu_rms_norm"]


@pytest.mark.msprobe_api("torch.nn.functional.softmax", kwargs={"dim": -1}, dtypes=["float32"], examples=5)
def test_softmax(msprobe_api_case):
    assert msprobe_api_case.dtype == "float32"


def test_two_ranks(msprobe_distributed):
    import multirank_jobs
    run = msprobe_distributed(multirank_jobs.npu_fused_op_job)
    values = run.values
    assert [v["rank"] for v in values] == [0, 1] and {v["device"] for v in values} == {"npu"}
    assert all(v["flagged"] == ["NPU.npu_rms_norm.0.forward"] for v in values), values
    assert values[0]["total"] == values[1]["total"]
    assert run.flagged_ranks == [0, 1]
'''


def _run(pytester, *args):
    return pytester.runpytest_subprocess("-p", "no:cacheprovider", "--msprobe-device=npu",
                                         f"--msprobe-dump-path={pytester.path / 'out'}", *args)


@pytest.mark.parametrize("task", ["free_benchmark", "online_dispatch", "grad_probe"])
def test_whole_suite_on_the_simulated_npu_finds_the_fused_defect(pytester, task):
    pytester.makeconftest(CONFTEST)
    pytester.makepyfile(test_npu=SUITE)
    result = _run(pytester, f"--msprobe-task={task}", "--msprobe-simulated-npu-defect", "npu_rms_norm=reduced_precision")
    out = result.stdout.str()
    summary = json.loads((pytester.path / "out" / "summary.json").read_text())
    if task == "grad_probe":  # gradients are finite: the suite passes, statistics from device parameters
        result.assert_outcomes(passed=1)
        assert "all gradients finite" in out
        return
    result.assert_outcomes(failed=1)
    assert "NPU.npu_rms_norm" in out, out
    assert summary["device"] == "npu"
    test = summary["tests"]["test_npu.py::test_block_trains"]
    if task == "free_benchmark":
        assert test["flagged_apis"] == ["NPU.npu_rms_norm"], test
    else:
        assert test["failing_ops"] == ["npu.npu_rms_norm.default"], test


def test_clean_simulated_npu_suite_passes(pytester):
    pytester.makeconftest(CONFTEST)
    pytester.makepyfile(test_npu=SUITE)
    result = _run(pytester, "--msprobe-task=free_benchmark", "--msprobe-simulated-npu")
    result.assert_outcomes(passed=1)


def test_fixtures_marker_and_two_ranks_on_the_simulated_npu(pytester):
    pytester.makeconftest(CONFTEST)
    pytester.makepyfile(test_npu=FIXTURE_SUITE.replace("import torch\n", "import pytest\nimport torch\n", 1))
    result = _run(pytester, "--msprobe-simulated-npu-defect", "npu_rms_norm=reduced_precision", "-v")
    out = result.stdout.str()
    assert "test_fixture_names_the_fused_op PASSED" in out, out
    assert "test_two_ranks PASSED" in out, out
    # the marker's generated tests ran on the device (inputs drawn there; online_dispatch on too)
    assert "test_softmax[softmax-float32-" in out and "-add_noise] PASSED" in out, out
    checks = json.loads((pytester.path / "out" / "api_checks.json").read_text())["tests"]
    assert checks and all(c.get("device") == "npu" for c in checks), checks


def test_device_npu_without_simulation_is_a_usage_error(pytester):
    pytester.makepyfile(test_npu=SUITE)
    result = _run(pytester)
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    assert "--msprobe-device=npu" in result.stderr.str()


def test_bad_simulated_defect_is_a_usage_error(pytester):
    pytester.makepyfile(test_npu=SUITE)
    result = _run(pytester, "--msprobe-simulated-npu-defect", "npu_rms_norm=wobbly")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    assert "unknown defect 'wobbly'" in result.stderr.str()
