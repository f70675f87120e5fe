"""`pytest --msprobe-task=grad_probe`: every optimizer stepped in a test is monitored, a test whose
gradients go non-finite fails naming the parameter, step and file, clean tests pass, and the hooks
are gone after each test (PyTorch and MindSpore)."""

from __future__ import annotations

import importlib.util
import json

import pytest
from grad_suites import TORCH_SUITE

from probes.grad_probe.health import nonfinite_gradients

MS_SUITE = """
import mindspore as ms
import numpy as np
import pytest
from mindspore import nn, ops, Parameter, Tensor

from probes.backends.mindspore_xp import warm_up
warm_up()
ms.set_context(mode=ms.PYNATIVE_MODE, device_target="CPU")

class Net(nn.Cell):
    def __init__(self):
        super().__init__()
        self.w = Parameter(Tensor(np.linspace(-1, 1, 8).reshape(4, 2).astype(np.float32)), name="w")
        self.b = Parameter(Tensor(np.zeros(2, np.float32)), name="b")
    def construct(self, x):
        return ops.matmul(x, self.w) + self.b

def train(poison=False, steps=2):
    net = Net()
    opt = nn.Adam(net.trainable_params(), learning_rate=1e-2)
    x = Tensor(np.linspace(-1, 1, 16).reshape(4, 4).astype(np.float32))
    def loss_fn(x):
        loss = ops.mean(net(x) ** 2)
        if poison:
            loss = loss * Tensor(np.float32(np.inf))
        return loss
    grad_fn = ms.value_and_grad(loss_fn, None, opt.parameters)
    for _ in range(steps):
        _, grads = grad_fn(x)
        opt(grads)

def test_ms_clean():
    train()

def test_ms_blows_up():
    train(poison=True)

@pytest.mark.msprobe_off
def test_ms_hooks_are_gone():
    assert "__call__" not in nn.Optimizer.__dict__
    assert "__call__" not in nn.Adam.__dict__
"""


def _run(pytester, suite: str, name: str, *extra: str):
    pytester.makepyfile(**{name: suite})
    dump = pytester.path / "out"
    result = pytester.runpytest_subprocess("--msprobe-task=grad_probe", f"--msprobe-dump-path={dump}",
                                           "-p", "no:cacheprovider", *extra)
    return result, dump


@pytest.mark.slow
def test_torch_suite_under_grad_probe(pytester):
    result, dump = _run(pytester, TORCH_SUITE, "test_torch_suite")
    result.assert_outcomes(passed=4, failed=1)
    result.stdout.fnmatch_lines([
        "*grad_probe found non-finite gradients in test_torch_suite.py::test_blows_up_at_step_1*",
        "*0.weight: first at step 1 (*inf*threshold: finite)*",
        "*evidence: *grad_summary_1.csv*",
        "*msprobe grad_probe: non-finite gradients*",
        "0.weight *1 *step 1: max inf, min inf, norm inf *1*",
        "4 optimizer(s), 40 parameter-steps checked in 4 test(s)",
    ])
    tests = dump / "tests"
    clean = tests / "test_torch_suite.py_test_clean"
    # one optimizer: exactly the files of PrecisionDebugger(task="grad_probe").monitor(model)
    assert sorted(p.name for p in (clean / "rank0").glob("grad_summary_*.csv")) == [
        "grad_summary_0.csv", "grad_summary_1.csv", "grad_summary_2.csv"]
    header = (clean / "rank0" / "grad_summary_0.csv").read_bytes().split(b"\r\n")[0]
    assert header == b"\xef\xbb\xbfparam_name,max,min,norm,shape"
    # real parameter names, found from the model that owns the optimizer's parameters
    assert b"0.weight" in (clean / "rank0" / "grad_summary_0.csv").read_bytes()
    two = tests / "test_torch_suite.py_test_two_models"
    assert (two / "rank0" / "grad_summary_2.csv").exists()
    assert sorted(p.name for p in (two / "optimizer1" / "rank0").glob("grad_summary_*.csv")) == [
        "grad_summary_0.csv", "grad_summary_1.csv"]
    summary = json.loads((dump / "summary.json").read_text())
    assert summary["tool"] == "grad_probe"
    assert summary["tests"]["test_torch_suite.py::test_blows_up_at_step_1"]["nonfinite_params"] == ["0.weight"]
    assert summary["tests"]["test_torch_suite.py::test_clean"]["nonfinite_params"] == []
    assert set(summary["params"]) == {"0.weight"}
    assert "FutureWarning" not in result.stdout.str()


@pytest.mark.slow
def test_fail_on_never_reports_without_failing(pytester):
    result, _ = _run(pytester, TORCH_SUITE, "test_torch_suite", "--msprobe-fail-on=never")
    result.assert_outcomes(passed=5)
    result.stdout.fnmatch_lines(["*msprobe grad_probe: non-finite gradients*"])


@pytest.mark.slow
def test_mindspore_suite_under_grad_probe(pytester):
    if importlib.util.find_spec("mindspore") is None:
        pytest.skip("mindspore is not installed")
    result, dump = _run(pytester, MS_SUITE, "test_ms_suite")
    result.assert_outcomes(passed=2, failed=1)
    result.stdout.fnmatch_lines([
        "*grad_probe found non-finite gradients in test_ms_suite.py::test_ms_blows_up*",
        "*: first at step 0 (*threshold: finite)*",
    ])
    clean = dump / "tests" / "test_ms_suite.py_test_ms_clean" / "rank0"
    text = (clean / "grad_summary_1.csv").read_bytes()
    assert text.startswith(b"\xef\xbb\xbfparam_name,max,min,norm,shape\r\n")
    assert b"\r\nw," in text and b"\r\nb," in text  # Parameter.name


def test_nonfinite_rule_reads_every_rank_and_optimizer_folder(tmp_path):
    from probes.grad_probe import csv_format
    from probes.grad_probe.stats import GradStats

    def write(root, step, *rows):
        csv_format.write_summary_csv(csv_format.summary_csv_path(root, 0, step), "L1", (-1, 0, 1), list(rows))

    nan = float("nan")
    write(tmp_path, 0, GradStats("a", (2,), 1.0, -1.0, 1.4), GradStats("empty", (0, 3), nan, nan, nan))
    write(tmp_path / "optimizer1", 3, GradStats("b", (2,), float("inf"), 0.0, float("inf")))
    assert nonfinite_gradients(tmp_path / "nothing") == []
    found = nonfinite_gradients(tmp_path)
    assert [(f.param, f.step, f.figures) for f in found] == [("b", 3, {"max": "inf", "norm": "inf"})]
    assert found[0].describe() == "gradient of b is not finite at step 3 (max inf, norm inf)"
