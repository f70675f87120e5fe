"""Golden regression through the plugin: @pytest.mark.msprobe_golden on whole-suite tests and the
msprobe_golden fixture; missing goldens fail with the command that makes them,
--msprobe-regen-golden writes them and fails once, a regression fails with its figures."""

from __future__ import annotations

import json

import pytest

pytestmark = pytest.mark.slow  # subprocess pytest sessions: minutes in all

SUITE = '''
import os
import pytest
import torch

@pytest.mark.msprobe_golden("fb/expm1")
def test_expm1_baseline():
    lo = float(os.environ.get("LOW", "1e-2"))
    torch.expm1(torch.linspace(lo, 2e-2, 64).half())

def test_grads(grad_probe, msprobe_golden):
    lr = float(os.environ.get("LR", "0.05"))
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(4, 6), torch.nn.Tanh(), torch.nn.Linear(6, 1))
    opt = torch.optim.SGD(model.parameters(), lr=lr)
    x = torch.linspace(-1, 1, 32).reshape(8, 4)
    with grad_probe() as run:
        for _ in range(3):
            opt.zero_grad()
            model(x).square().mean().backward()
            opt.step()
    msprobe_golden.check(run, "grads/mlp")
'''


CONFTEST = '''
import torch

_exp = torch.exp

def naive_expm1(x):  # the seeded defect: cancellation, worse for smaller |x|
    return _exp(x) - 1

def pytest_configure(config):
    torch.expm1 = naive_expm1
'''


def _run(pytester, *args, **env):
    for k, v in env.items():
        pytester._monkeypatch.setenv(k, v)
    return pytester.runpytest_subprocess("-p", "no:cacheprovider", "--msprobe-task=free_benchmark",
                                         f"--msprobe-dump-path={pytester.path / 'out'}", *args)


def test_golden_lifecycle(pytester):
    pytester.makepyfile(test_golden_suite=SUITE)
    pytester.makeconftest(CONFTEST)
    first = _run(pytester)
    first.assert_outcomes(failed=2)
    out = first.stdout.str()
    assert "--msprobe-regen-golden" in out and "golden/fb/expm1" in out.replace("\\", "/")

    regen = _run(pytester, "--msprobe-regen-golden")
    regen.assert_outcomes(failed=2)  # fails once, like pytest-regressions
    assert "rerun without --msprobe-regen-golden" in regen.stdout.str()
    meta = json.loads((pytester.path / "golden" / "fb" / "expm1" / "meta.json").read_text())
    assert meta["kind"] == "free_benchmark" and meta["made_with"]["device"] == "cpu"
    assert "torch" in meta["made_with"]
    assert (pytester.path / "golden" / "grads" / "mlp" / "grad_directions.npz").exists()

    same = _run(pytester)  # the flagged API is within its baseline: the golden test passes
    same.assert_outcomes(passed=2)

    worse = _run(pytester, LOW="1e-4", LR="0.5")
    worse.assert_outcomes(failed=2)
    text = worse.stdout.str()
    assert "Torch.expm1" in text and "regressed" in text
    assert "grads/mlp" in text


def test_marker_without_any_result_says_what_to_do(pytester):
    pytester.makepyfile(test_nothing='import pytest\n\n@pytest.mark.msprobe_golden("x")\n'
                                     'def test_x():\n    pass\n')
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider")
    result.assert_outcomes(failed=1)
    assert "produced no probe result to compare" in result.stdout.str()


def test_grad_golden_feeds_the_report_similarity_plot(pytester):
    pytester.makepyfile(test_g='''
import pytest, torch

@pytest.mark.msprobe_golden("g/mlp")
def test_train():
    torch.manual_seed(0)
    m = torch.nn.Sequential(torch.nn.Linear(4, 6), torch.nn.Tanh(), torch.nn.Linear(6, 1))
    opt = torch.optim.SGD(m.parameters(), lr=0.1)
    x = torch.linspace(-1, 1, 32).reshape(8, 4)
    for _ in range(3):
        opt.zero_grad()
        m(x).square().mean().backward()
        opt.step()
''')
    args = ("-p", "no:cacheprovider", "--msprobe-task=grad_probe", f"--msprobe-dump-path={pytester.path / 'out'}")
    pytester.runpytest_subprocess(*args, "--msprobe-regen-golden").assert_outcomes(failed=1)
    pytester.runpytest_subprocess(*args).assert_outcomes(passed=1)
    summary = json.loads((pytester.path / "out" / "summary.json").read_text())
    series = summary["similarities"]["g/mlp rank0 vs golden"]
    assert series["steps"] == [0, 1, 2] and series["summary"] == [1.0, 1.0, 1.0]
    assert "gradient direction similarity per step" in (pytester.path / "out" / "report.html").read_text()
