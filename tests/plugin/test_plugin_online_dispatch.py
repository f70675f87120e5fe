"""`pytest --msprobe-task=online_dispatch` and the online_dispatch fixture: every aten op of a test
is compared with the CPU reference (float64 here); a seeded kernel defect fails the right test."""

from __future__ import annotations

import importlib.util
import json

import pytest
from repo_paths import SUPPORT

SUITE = '''
import pytest
import torch
import seeded_dispatch

def test_clean_mlp():
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.GELU(), torch.nn.Linear(16, 2))
    model(torch.randn(4, 8)).sum().backward()

def test_defective_kernel():
    x = torch.linspace(-1, 1, 16)
    torch.ops.seeded_dispatch.scaled_tanh(x)

def test_fixture(online_dispatch):
    with online_dispatch() as clean:
        torch.nn.functional.softmax(torch.linspace(-2, 2, 32).reshape(4, 8), dim=-1)
    clean.assert_clean()
    with online_dispatch(dump_mode="all") as bad:
        torch.ops.seeded_dispatch.scaled_tanh(torch.linspace(-1, 1, 8))
    assert [f["op"] for f in bad.failing_ops] == ["seeded_dispatch.scaled_tanh.default"]
    bad.assert_clean()

def test_block_left_open(online_dispatch):
    online_dispatch().__enter__()
    torch.ones(3).exp()

@pytest.mark.msprobe_off
def test_after_open_block_no_dispatch_mode_is_left():
    from torch.utils._python_dispatch import _get_current_dispatch_mode
    assert _get_current_dispatch_mode() is None
'''


MS_TEST = '''
import mindspore as ms

def test_mindspore_code():
    ms.ops.exp(ms.Tensor([1.0]))
'''


@pytest.fixture
def suite(pytester):
    pytester.makepyfile(test_od_suite=SUITE,
                        seeded_dispatch=(SUPPORT / "seeded_dispatch.py").read_text())
    if importlib.util.find_spec("mindspore") is not None:
        pytester.makepyfile(test_od_ms=MS_TEST)
    pytester.syspathinsert()
    return pytester


@pytest.mark.slow
def test_whole_suite_and_fixture(suite):
    dump = suite.path / "out"
    result = suite.runpytest_subprocess("-p", "no:cacheprovider", "--msprobe-task=online_dispatch",
                                        f"--msprobe-dump-path={dump}")
    mindspore = (suite.path / "test_od_ms.py").exists()
    result.assert_outcomes(passed=3 + mindspore, failed=2)
    result.stdout.fnmatch_lines([
        "*online_dispatch found 1 failing op call(s) in test_od_suite.py::test_defective_kernel*",
        "*seeded_dispatch.scaled_tanh.default*Cosine*MaxAbsErr*",
        "*evidence: *compare_result_rank0_*.csv*",
        "*msprobe online_dispatch: ops that disagree with the CPU reference*",
        "seeded_dispatch.scaled_tanh.default *1 *",
        "* op calls compared in * test(s) under the probe",
    ])
    out = result.stdout.str()
    assert "online_dispatch found 1 failing op call(s) in test_od_suite.py::test_fixture [online_dispatch1]" in out
    summary = json.loads((dump / "summary.json").read_text())
    assert summary["tool"] == "online_dispatch"
    assert [op for op, row in summary["ops"].items() if row["failed"]] == ["seeded_dispatch.scaled_tanh.default"]
    assert len(summary["ops"]) > 3  # every compared op is listed, the clean ones too
    assert summary["tests"]["test_od_suite.py::test_clean_mlp"]["failing_ops"] == []
    # the session's total is every test's op calls compared, shown in the terminal and the report
    compared = summary["probe"]["checked"]
    assert compared == sum(t["checked"] for t in summary["tests"].values()) > 10
    assert f"{compared} op calls compared in " in out
    page = (dump / "report.html").read_text(encoding="utf-8")
    assert f"({compared} calls compared" in page and "no op was compared" not in page
    if mindspore:  # a test that ran but gave the probe nothing: named, with why
        ms_test = "test_od_ms.py::test_mindspore_code"
        why = "a MindSpore test: online_dispatch compares PyTorch's aten ops only"
        assert summary["probe"]["nothing_checked"] == {ms_test: why}
        assert summary["tests"][ms_test]["outcome"] == "passed"
        assert f"  {ms_test}: {why}" in out and "1 test(s) ran under the probe but gave it nothing to check" in out
        assert "gave the probe nothing to check" in page and ms_test in page.replace("<wbr>", "")
