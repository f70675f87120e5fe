"""A test suite made of torch.func transforms and tensor subclasses, under each task of the
plugin: every test that passes plain passes probed, every test is in summary.json, and the
probes record no error of their own."""

from __future__ import annotations

import json

import pytest

pytestmark = pytest.mark.slow  # subprocess pytest sessions / multi-process jobs: minutes in all

pytest.importorskip("torch")

SUITE = '''
import warnings

import torch
import torch.nn as nn
import torch.nn.functional as F

torch.manual_seed(0)
W = torch.randn(4, 16)
X = torch.randn(8, 16)


def test_vmap():
    y = torch.vmap(lambda r: torch.tanh(F.linear(r, W)))(X)
    assert torch.allclose(y, torch.tanh(F.linear(X, W)))


def test_vmap_nested_chunks_and_randomness():
    y = torch.vmap(torch.vmap(lambda r: F.softmax(r * 2, -1)), chunk_size=1)(X.reshape(2, 4, 16))
    assert y.shape == (2, 4, 16)
    z = torch.vmap(lambda r: torch.tanh(r) + torch.rand(()), randomness="different")(X)
    assert z.shape == X.shape


def test_jacrev_matches_jacfwd():
    f = lambda v: torch.tanh(F.linear(X[:2], v))  # noqa: E731
    assert torch.allclose(torch.func.jacrev(f)(W), torch.func.jacfwd(f)(W), atol=1e-6)


def test_hessian_of_a_sum():
    h = torch.func.hessian(lambda v: torch.tanh(v).sum())(X[0])
    assert h.shape == (16, 16)


def test_functional_call_and_an_ensemble():
    model = nn.Linear(16, 4)
    out = torch.func.functional_call(model, dict(model.named_parameters()), (X,))
    assert torch.equal(out, model(X))
    models = [nn.Linear(16, 4) for _ in range(3)]
    params, buffers = torch.func.stack_module_state(models)
    outs = torch.vmap(lambda p, b: torch.func.functional_call(model, (p, b), (X,)))(params, buffers)
    assert outs.shape == (3, 8, 4)


def test_calls_after_a_transform():
    torch.vmap(torch.tanh)(X)
    for _ in range(300):
        F.softmax(F.linear(X, W), dim=-1)


def test_nested_and_masked():
    from torch.masked import masked_tensor

    warnings.filterwarnings("ignore", category=UserWarning)
    jagged = torch.nested.nested_tensor([torch.randn(3, 16), torch.randn(5, 16)], layout=torch.jagged)
    assert F.linear(torch.tanh(jagged), W).values().shape == (8, 4)
    masked = masked_tensor(torch.randn(8, 16), torch.rand(8, 16) > 0.3)
    torch.tanh(masked)


def test_a_training_step_with_per_sample_gradients():
    model = nn.Sequential(nn.Linear(16, 8), nn.Tanh(), nn.Linear(8, 1))
    params = {k: v.detach() for k, v in model.named_parameters()}

    def loss(p, xb, yb):
        return ((torch.func.functional_call(model, p, (xb,)) - yb) ** 2).mean()

    grads = torch.vmap(torch.func.grad(loss), in_dims=(None, 0, 0))(params, X.unsqueeze(1), torch.ones(8, 1, 1))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    for name, p in model.named_parameters():
        p.grad = grads[name].mean(0)
    opt.step()
'''

TESTS = 8


@pytest.fixture
def suite(pytester):
    pytester.makepyfile(test_transformed=SUITE)
    return pytester


def test_the_suite_passes_plain(suite):
    suite.runpytest_subprocess("-p", "no:cacheprovider").assert_outcomes(passed=TESTS)


@pytest.mark.parametrize("task", ["free_benchmark", "online_dispatch", "grad_probe"])
def test_every_test_passes_under_the_probe_with_no_probe_error(suite, task):
    dump = suite.path / "out"
    result = suite.runpytest_subprocess("-p", "no:cacheprovider", f"--msprobe-task={task}",
                                        f"--msprobe-dump-path={dump}", "--msprobe-fail-on=never")
    result.assert_outcomes(passed=TESTS)
    summary = json.loads((dump / "summary.json").read_text())
    assert len(summary["tests"]) == TESTS
    assert all(t["outcome"] == "passed" for t in summary["tests"].values())
    text = json.dumps(summary)
    assert "escaped" not in text and "Traceback" not in text
    errors = summary.get("probe", {}).get("errors") or []
    assert errors == [], errors
    if task == "free_benchmark":
        after = summary["tests"]["test_transformed.py::test_calls_after_a_transform"]
        assert after.get("checked", 0) >= 601, after
