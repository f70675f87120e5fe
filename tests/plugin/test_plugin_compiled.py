"""`pytest --msprobe-task=...` on a suite that compiles (torch.compile): its graphs are judged at the
backend, a test whose vendor backend loses precision fails naming the graph and the node, a clean
compiled test passes, and the `msprobe_compiled` fixture checks one compiled function."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from repo_paths import SUPPORT

SUITE = """
import torch
from compiled_programs import mlp, vendor_backend


def _step(backend):
    model = mlp()
    x = torch.randn(16, 32, generator=torch.Generator().manual_seed(0))
    out = torch.compile(model, backend=backend)(x)
    out.square().mean().backward()


def test_clean_compiled_step():
    _step("aot_eager")


def test_vendor_backend_step():
    _step(vendor_backend("linear", occurrence=1))


def test_one_function(msprobe_compiled):
    from compiled_programs import rope, rope_inputs

    check = msprobe_compiled(rope, *rope_inputs(), backend="aot_eager", backward=True)
    check.assert_clean()
    graph, = check.graphs
    assert graph["forward"]["eager_ulps"] is not None and graph["backward"] is not None


def test_one_lossy_function(msprobe_compiled):
    check = msprobe_compiled(mlp(), torch.randn(4, 32), backend=vendor_backend("gelu"))
    assert check.flagged
    check.assert_clean()
"""


@pytest.fixture
def suite(pytester, monkeypatch):
    pytester.makepyfile(test_compiled_suite=SUITE)
    monkeypatch.setenv("PYTHONPATH", str(SUPPORT))  # compiled_programs, in the subprocess
    return pytester


@pytest.mark.slow
@pytest.mark.parametrize("task", ["free_benchmark", "online_dispatch"])
def test_a_compiled_suite_under_a_task_fails_the_lossy_backend_by_graph_and_node(suite, task):
    dump = suite.path / "out"
    result = suite.runpytest_subprocess(f"--msprobe-task={task}", f"--msprobe-dump-path={dump}", "-p",
                                        "no:cacheprovider", "-k", "step", f"--rootdir={suite.path}")
    result.assert_outcomes(passed=1, failed=1)
    result.stdout.fnmatch_lines(["*test_vendor_backend_step*", "*Graph.Sequential_*"])
    if task == "free_benchmark":  # the failure names the node and the reproduction
        result.stdout.fnmatch_lines(["*first failing node*linear*3 (Linear)*", "*reproduce: python *repro.py*"])
    session = json.loads((dump / "summary.json").read_text())
    graphs = [g for t in session["tests"].values() for g in t.get("graphs", [])]
    assert len(graphs) == 2 and {g["backend"] for g in graphs} == {"aot_eager", "vendor_linear"}
    lossy, = [g for g in graphs if g["flagged"]]
    assert lossy["localisation"]["target"].endswith("linear") and Path(lossy["localisation"]["repro"]).is_dir()
    page = (dump / "report.html").read_text()
    assert 'id="graphs"' in page and "vendor_linear" in page and ">repro</a>" in page


@pytest.mark.slow
def test_msprobe_compiled_checks_one_function_and_names_the_node(suite):
    result = suite.runpytest_subprocess("-p", "no:cacheprovider", "-k", "function", f"--rootdir={suite.path}")
    result.assert_outcomes(passed=1, failed=1)
    result.stdout.fnmatch_lines(["*1 compiled graph(s) lose precision against float64*",
                                 "*Graph.Sequential_*backend vendor_gelu*",
                                 "*first failing node*gelu*compiled*eager*",
                                 "*reproduce: python *repro.py*"])
