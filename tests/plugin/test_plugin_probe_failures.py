"""A probe that fails is the probe's failure, not the test's: the test keeps its own outcome (unless
"strict": true), the failure is a probe error of that test in the terminal, summary.json and
report.html, and a test that gave the probe nothing to check is named as such. Also: a test's
folder holds only the latest session's files, and results of earlier sessions are marked earlier."""

from __future__ import annotations

import json
import re

import pytest

from probes.results import folder_of_test, load

pytestmark = pytest.mark.slow  # subprocess pytest sessions / multi-process jobs: minutes in all

SUITE = """
import torch

def test_clean():
    torch.nn.functional.softsign(torch.linspace(-1, 1, 32))

def test_vmap_like():
    torch.nn.functional.softsign(torch.linspace(-1, 1, 32))

def test_never_calls_torch():
    assert 1 + 1 == 2
"""

# the tool run's stop raises, as free_benchmark's deferred verdicts did under torch.func.vmap
CONFTEST = """
import pathlib
from pytest_msprobe.tools.free_benchmark import FreeBenchmarkRun

FAIL_AT = (pathlib.Path(__file__).parent / "fail_at").read_text()

_finish, _start = FreeBenchmarkRun.finish, FreeBenchmarkRun.start

def _failing_finish(self):
    _finish(self)  # hooks removed, then the failure
    if "vmap_like" in str(self.dump_path) and FAIL_AT == "stop":
        raise RuntimeError("the tensor may have escaped from inside a function being vmapped")

def _failing_start(self):
    if "vmap_like" in str(self.dump_path) and FAIL_AT == "start":
        raise RuntimeError("no hook could be installed")
    _start(self)

FreeBenchmarkRun.finish = _failing_finish
FreeBenchmarkRun.start = _failing_start
"""

VMAP = "test_suite.py::test_vmap_like"
ESCAPED = "RuntimeError: the tensor may have escaped from inside a function being vmapped"


@pytest.fixture
def suite(pytester):
    pytester.makepyfile(test_suite=SUITE)
    pytester.makeconftest(CONFTEST)
    return pytester


def _run(suite, *args, fail_at="stop"):
    (suite.path / "fail_at").write_text(fail_at)
    dump = suite.path / "out"
    result = suite.runpytest_subprocess("-p", "no:cacheprovider", "--msprobe-task=free_benchmark",
                                        f"--msprobe-dump-path={dump}", *args)
    summary = json.loads((dump / "summary.json").read_text(encoding="utf-8"))
    return result, summary, (dump / "report.html").read_text(encoding="utf-8")


@pytest.mark.parametrize("fail_on", ["risk", "never"])
def test_a_failing_probe_stop_neither_fails_the_test_nor_drops_it(suite, fail_on):
    result, summary, page = _run(suite, f"--msprobe-fail-on={fail_on}")
    result.assert_outcomes(passed=3)
    result.stdout.fnmatch_lines([
        "*msprobe free_benchmark: risky APIs*",
        "no risky API: *",
        "probe errors: 1 in 1 test(s)*strict*",
        f"  {VMAP}: probe stop: {ESCAPED}",
        "2 test(s) ran under the probe but gave it nothing to check:",
    ])
    out = result.stdout.str()
    assert "no test ran under the probe" not in out
    assert "test_suite.py::test_never_calls_torch: it called no API free_benchmark checks" in out
    entry = summary["tests"][VMAP]
    assert entry["outcome"] == "passed"
    assert entry["errors"] == [{"call": "probe stop", "error": ESCAPED, "count": 1}]
    assert entry["nothing_checked"].startswith("the probe failed at its stop")
    assert summary["probe"]["errors"] == 1 and summary["probe"]["first_errors"][0]["test"] == VMAP
    assert set(summary["probe"]["nothing_checked"]) == {VMAP, "test_suite.py::test_never_calls_torch"}
    assert summary["tests"]["test_suite.py::test_clean"]["checked"] >= 1
    text = re.sub(r"<[^>]+>", "", page.replace("<wbr>", ""))
    assert VMAP in text and "probe stop: " + ESCAPED in text
    assert "2 gave the probe nothing to check" in re.sub(r"\s+", " ", text) or "gave the probe nothing" in text


def test_when_every_probed_test_fails_so_the_report_still_lists_them(suite):
    result, summary, page = _run(suite, "-k", "vmap_like")
    result.assert_outcomes(passed=1)
    out = result.stdout.str()
    assert "no test ran under the probe" not in out
    assert f"{VMAP}: probe stop: {ESCAPED}" in out
    assert list(summary["tests"]) == [VMAP] and "report: " in out
    assert VMAP in page.replace("<wbr>", "")


def test_a_probe_that_fails_to_start_is_a_probe_error_too(suite):
    result, summary, _ = _run(suite, fail_at="start")
    result.assert_outcomes(passed=3)
    assert summary["tests"][VMAP]["errors"] == [{"call": "probe start", "error": "RuntimeError: no hook could be "
                                                 "installed", "count": 1}]
    assert summary["tests"]["test_suite.py::test_clean"]["errors"] == []  # the next test is probed as usual
    assert summary["tests"]["test_suite.py::test_clean"]["checked"] >= 1


def test_strict_mode_fails_the_test_whose_probe_failed(suite):
    config = suite.path / "strict.json"
    config.write_text(json.dumps({"task": "free_benchmark", "strict": True}))
    result, summary, _ = _run(suite, f"--msprobe-config={config}")
    result.assert_outcomes(passed=2, failed=1)
    result.stdout.fnmatch_lines([f"*msprobe free_benchmark: the probe failed in {VMAP}: {ESCAPED}*",
                                 "*\"strict\": true in the config makes a probe failure fail its test*"])
    assert summary["tests"][VMAP]["outcome"] == "failed"


def test_no_test_ran_under_the_probe_says_why(pytester):
    pytester.makepyfile(test_plain="def test_a():\n    assert True\n")
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider", "--msprobe-task=free_benchmark",
                                           f"--msprobe-dump-path={pytester.path / 'out'}")
    result.assert_outcomes(passed=1)
    result.stdout.fnmatch_lines(["no test ran under the probe: 1 imported neither torch nor mindspore*"])
    summary = json.loads((pytester.path / "out" / "summary.json").read_text())
    assert summary["tests"] == {} and summary["unprobed"] == {"imported neither torch nor mindspore": 1}


GRAD_SUITE = """
import torch

def test_a():
    model = torch.nn.Linear(4, 2)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    model(torch.ones(3, 4)).sum().backward()
    opt.step()

def test_b():
    torch.nn.functional.softsign(torch.linspace(-1, 1, 8))
"""


def test_results_of_earlier_sessions_are_marked_earlier(pytester, capsys):
    """grad_probe on both tests, then free_benchmark on one, then on both: the rows of a test the
    latest session did not run are marked earlier, and a test that ran again holds its latest
    run's files only."""
    from probes.__main__ import main

    pytester.makepyfile(test_two=GRAD_SUITE)
    dump = pytester.path / "out"

    def session(*args, passed=2):
        pytester.runpytest_subprocess("-p", "no:cacheprovider", f"--msprobe-dump-path={dump}", *args
                                      ).assert_outcomes(passed=passed)
        return load(dump)

    res = session("--msprobe-task=grad_probe")
    assert set(res.grad_stats["test"]) == {"test_two.py::test_a"} and set(res.grad_stats["session"]) == {"latest"}
    res = session("--msprobe-task=free_benchmark", "-k", "test_b", passed=1)
    assert len(res.grad_stats) and set(res.grad_stats["session"]) == {"earlier"}
    assert list(res.apis["api"]) == ["Functional.softsign", "Torch.linspace"]  # every API, clean ones too
    assert res.apis.set_index("api").loc["Functional.softsign", "worst_score"] >= 0  # checked: a margin
    capsys.readouterr()
    assert main(["summary", str(dump)]) == 0
    out = capsys.readouterr().out
    assert f"not findings of the latest session: {len(res.grad_stats)} rows of earlier sessions" in out
    assert "grad_stats: " in out and "none of them findings of the latest session" in out
    res = session("--msprobe-task=free_benchmark")
    assert res.grad_stats.empty  # test_a ran again: its folder holds this session's files only
    assert set(res.apis["tests"].map(len)) == {0}


def test_the_summary_names_the_rows_of_earlier_sessions(tmp_path, capsys):
    from probes.__main__ import main

    session = {"tool": "grad_probe", "date": "2026-12-01 10:00:00 UTC", "session": {"tests": 1, "passed": 1},
               "tests": {"t.py::now": {"nonfinite_params": [], "errors": [], "checked": 8, "not_checked": {},
                                       "nothing_checked": None, "dump_paths": []}},
               "params": {}, "test_folders": ["t.py::now"],
               "catalogue": [{"api": "Torch.add", "dtype": "float32", "status": "measured", "max_ulp": 1.0,
                              "test": "cat.py::test_api[Torch.add-float32]"}]}
    (tmp_path / "summary.json").write_text(json.dumps(session))
    for test in ("t.py::now", "t.py::before"):
        folder = tmp_path / "tests" / folder_of_test(test) / "rank0"
        folder.mkdir(parents=True)
        (folder / "grad_summary_0.csv").write_text("param_name,MD5,max,min,norm,shape\nw,x,1,0,1,[2]\n")
    assert main(["summary", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert "grad_stats: 6 rows, 2 tests" in out
    assert "not findings of the latest session: 3 rows of earlier sessions" in out
    res = load(tmp_path)
    assert dict(zip(res.grad_stats["test"], res.grad_stats["session"])) == {"t.py::now": "latest",  # an earlier test: its folder
                                                                            "t.py_before": "earlier"}
