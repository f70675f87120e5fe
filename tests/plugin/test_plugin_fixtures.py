"""The plugin's fixtures (free_benchmark, grad_probe, msprobe_config, msprobe_device) and options
(--msprobe-device, -p no:msprobe), run as pytest would run a user's suite."""

from __future__ import annotations

import importlib.util

import pytest

TORCH_SUITE = '''
import pytest
import torch

_exp = torch.exp

def naive_expm1(x):
    return _exp(x) - 1

def test_fixture_catches_seeded_defect(free_benchmark, monkeypatch):
    monkeypatch.setattr(torch, "expm1", naive_expm1)
    x = torch.linspace(1e-3, 2e-2, 64).half()
    with free_benchmark() as fb:
        torch.expm1(x)
    assert fb.flagged_apis == ["Torch.expm1"]
    fb.assert_clean()

def test_fixture_passes_clean_api(free_benchmark):
    with free_benchmark(pert_mode="no_change") as fb:
        torch.nn.functional.softmax(torch.linspace(-1, 1, 64).reshape(8, 8), dim=-1)
    assert fb.summary["apis"]["Functional.softmax"]["checked"] == 1
    fb.assert_clean()
    assert fb.rows == []

def test_overrides_are_config_keys(free_benchmark, monkeypatch):
    monkeypatch.setattr(torch, "expm1", naive_expm1)
    x = torch.linspace(1e-3, 2e-2, 64).half()
    with free_benchmark(pert_mode="improve_precision", list=["softmax"]) as fb:
        torch.expm1(x)
        torch.softmax(x.float(), dim=0)
    assert fb.flagged_apis == []  # expm1 is not listed
    assert "Torch.expm1" not in fb.summary["apis"]

def test_bad_override_names_the_key(free_benchmark):
    free_benchmark(pert_mode="sideways")

def test_grad_runs_compare(grad_probe):
    def train(flip=False):
        torch.manual_seed(0)
        model = torch.nn.Sequential(torch.nn.Linear(6, 8), torch.nn.Tanh(), torch.nn.Linear(8, 1))
        opt = torch.optim.SGD(model.parameters(), lr=0.05)
        x = torch.linspace(-1, 1, 48).reshape(8, 6)
        for _ in range(3):
            opt.zero_grad()
            loss = model(x).square().mean()
            (-loss if flip else loss).backward()
            opt.step()
    with grad_probe() as a:
        train()
    with grad_probe() as b:
        train()
    with grad_probe() as c:
        train(flip=True)
    assert a.steps == 3
    a.assert_finite()
    a.assert_directions_close(b)
    with pytest.raises(AssertionError, match="0.97"):
        a.assert_directions_close(c)
    c.assert_directions_close(b)  # this one fails: the test reports it

def test_device_and_config(msprobe_device, msprobe_config):
    assert msprobe_device == "cpu"
    assert msprobe_config.task in ("free_benchmark", "grad_probe")

def test_hooks_removed_when_the_block_is_left_open(free_benchmark):
    run = free_benchmark()
    run.__enter__()
    torch.ones(3).exp()

def test_after_open_block_nothing_is_wrapped():
    assert torch.exp.__module__ != "probes.backends.patching"
    assert "probes" not in getattr(torch.exp, "__qualname__", "")
'''


@pytest.fixture
def suite(pytester):
    pytester.makepyfile(test_fixtures=TORCH_SUITE)
    return pytester


def test_fixtures_in_a_torch_suite(suite):
    result = suite.runpytest_subprocess("-p", "no:cacheprovider", f"--msprobe-dump-path={suite.path / 'out'}")
    result.assert_outcomes(passed=5, failed=3)
    out = result.stdout.str()
    result.stdout.fnmatch_lines([
        "*test_fixture_catches_seeded_defect*",
        "*free_benchmark (improve_precision, scaled rule) flagged 1 API(s) in "
        "test_fixtures.py::test_fixture_catches_seeded_defect [[]free_benchmark0[]]*",
        "*Torch.expm1.0.forward: max_rel * > threshold 0.00390625*",
    ])
    assert "free_benchmark.pert_mode" in out and "sideways" in out  # the bad override, named
    assert "FAILED test_fixtures.py::test_grad_runs_compare" in out
    assert "similarity" in out.lower()
    # each use is a run of its own folder
    tests = suite.path / "out" / "tests"
    assert (tests / "test_fixtures.py_test_grad_runs_compare" / "grad_probe2" / "rank0" / "grad_summary_2.csv").exists()


def test_fixture_tests_are_not_also_probed_by_the_session_task(suite):
    result = suite.runpytest_subprocess("-p", "no:cacheprovider", "--msprobe-task=free_benchmark",
                                        f"--msprobe-dump-path={suite.path / 'out'}",
                                        "-k", "catches_seeded or clean_api")
    result.assert_outcomes(passed=1, failed=1)  # the same verdicts as without the task
    assert "no test ran under the probe" in result.stdout.str()


@pytest.mark.parametrize("args, message", [
    (["--msprobe-device=tpu"], "--msprobe-device='tpu'; allowed: auto, npu, cuda, cpu"),
    (["--msprobe-device=cuda"], "--msprobe-device=cuda: no CUDA device here"),
    (["--msprobe-device=npu"], "--msprobe-device=npu: no NPU here"),
])
def test_device_usage_errors(suite, args, message):
    result = suite.runpytest_subprocess("-p", "no:cacheprovider", *args)
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    assert message in result.stderr.str()


def test_device_from_ini(suite):
    suite.makeini("[pytest]\nmsprobe_device = cpu\n")
    result = suite.runpytest_subprocess("-p", "no:cacheprovider", "-k", "device_and_config")
    result.assert_outcomes(passed=1)


def test_p_no_msprobe_disables_everything(suite):
    result = suite.runpytest_subprocess("-p", "no:cacheprovider", "-p", "no:msprobe", "-k", "clean_api or device")
    result.assert_outcomes(errors=2)
    result.stdout.fnmatch_lines(["*fixture 'free_benchmark' not found*"])
    assert suite.runpytest_subprocess("-p", "no:msprobe", "--msprobe-task=free_benchmark").ret == pytest.ExitCode.USAGE_ERROR


MS_SUITE = '''
import mindspore as ms
import numpy as np
from mindspore import nn, ops, Parameter, Tensor

from probes.backends.mindspore_xp import warm_up
warm_up()
ms.set_context(mode=ms.PYNATIVE_MODE, device_target="CPU")

def test_ms_free_benchmark_fixture(free_benchmark):
    x = Tensor(np.linspace(-1, 1, 64).astype(np.float32))
    with free_benchmark(pert_mode="no_change") as fb:
        ops.relu(x)
    assert fb.summary["framework"] == "mindspore"
    assert fb.summary["apis"]
    fb.assert_clean()

def test_ms_grad_probe_fixture(grad_probe):
    def train():
        w = Parameter(Tensor(np.linspace(-1, 1, 8).reshape(4, 2).astype(np.float32)), name="w")
        opt = nn.SGD([w], learning_rate=0.1)
        x = Tensor(np.linspace(-1, 1, 16).reshape(4, 4).astype(np.float32))
        grad_fn = ms.value_and_grad(lambda x: ops.mean(ops.matmul(x, w) ** 2), None, opt.parameters)
        for _ in range(2):
            _, grads = grad_fn(x)
            opt(grads)
    with grad_probe() as a:
        train()
    with grad_probe() as b:
        train()
    assert a.steps == 2
    a.assert_directions_close(b)
'''


def test_fixtures_in_a_mindspore_suite(pytester):
    if importlib.util.find_spec("mindspore") is None:
        pytest.skip("mindspore is not installed")
    pytester.makepyfile(test_ms_fixtures=MS_SUITE)
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider", f"--msprobe-dump-path={pytester.path / 'out'}")
    result.assert_outcomes(passed=2)
