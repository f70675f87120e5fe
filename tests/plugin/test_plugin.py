"""The pytest plugin, first cut: whole-suite free_benchmark runs, verdicts, table, usage errors."""

from __future__ import annotations

import json

import pytest

SUITE = """
import torch

def naive_expm1(x):
    return torch.exp(x) - 1

def test_clean():
    x = torch.linspace(-1, 1, 32)
    assert torch.nn.functional.softsign(x).shape == x.shape

def test_risky(monkeypatch):
    x = torch.linspace(1e-3, 2e-2, 32).half()
    torch.expm1(x)

def test_no_torch_work():
    assert 1 + 1 == 2
"""

CONFTEST = """
import torch, seeded_defect

def pytest_configure(config):
    torch.expm1 = seeded_defect.naive_expm1
"""

SEEDED = """
import torch
_exp = torch.exp
def naive_expm1(x):
    return _exp(x) - 1
"""


@pytest.fixture
def suite(pytester):
    pytester.makepyfile(seeded_defect=SEEDED, test_suite=SUITE)
    pytester.makeconftest(CONFTEST)
    pytester.syspathinsert()
    return pytester


def test_risky_test_fails_with_api_figure_threshold_and_evidence(suite):
    dump = suite.path / "out"
    result = suite.runpytest_subprocess("--msprobe-task=free_benchmark", f"--msprobe-dump-path={dump}", "-p", "no:cacheprovider")
    result.assert_outcomes(passed=2, failed=1)
    result.stdout.fnmatch_lines([
        "*free_benchmark (improve_precision, scaled rule) flagged 1 API(s) in test_suite.py::test_risky*",
        "*Torch.expm1.0.forward: max_rel * > threshold 0.00390625 (torch.float16*",
        "*ulps of each element (a pointwise API); msprobe's ratio rule: max_rel * vs 0.002, flagged*",
        "*evidence: *free_benchmark.csv*",
        "*msprobe free_benchmark: risky APIs*",
        "Torch.expm1 * 1 * 1 * 0.00390625 * 1*",
    ])
    summary = json.loads((dump / "summary.json").read_text())
    assert summary["tests"]["test_suite.py::test_risky"]["flagged_apis"] == ["Torch.expm1"]
    assert summary["tests"]["test_suite.py::test_clean"]["flagged_apis"] == []
    csvs = list((dump / "tests").rglob("free_benchmark.csv"))
    assert len(csvs) == 1 and "test_risky" in str(csvs[0])


def test_fail_on_never_reports_without_failing(suite):
    result = suite.runpytest_subprocess("--msprobe-task=free_benchmark", "--msprobe-fail-on=never", "-p", "no:cacheprovider")
    result.assert_outcomes(passed=3)
    result.stdout.fnmatch_lines(["*risky APIs*", "Torch.expm1 *"])
    assert (suite.path / ".msprobe" / "summary.json").exists()


def test_config_file_and_ini_options(suite):
    cfg = suite.path / "config.json"
    cfg.write_text(json.dumps({"task": "free_benchmark", "dump_path": str(suite.path / "from_cfg"),
                               "free_benchmark": {"pert_mode": "no_change"}}))
    suite.makeini("[pytest]\nmsprobe_task = free_benchmark\n")
    result = suite.runpytest_subprocess(f"--msprobe-config={cfg}", "-p", "no:cacheprovider")
    result.assert_outcomes(passed=3)  # the naive expm1 is deterministic: no_change finds nothing
    result.stdout.fnmatch_lines(["*no risky API*"])
    assert (suite.path / "from_cfg" / "summary.json").exists()


def test_without_task_nothing_is_probed(suite):
    result = suite.runpytest_subprocess("-p", "no:cacheprovider")
    result.assert_outcomes(passed=3)
    assert "risky APIs" not in result.stdout.str()


@pytest.mark.parametrize("args, message", [
    (["--msprobe-task=statistics"], "--msprobe-task='statistics' is not a task; allowed: free_benchmark"),
    (["--msprobe-task=free_benchmark", "--msprobe-fail-on=sometimes"], "--msprobe-fail-on='sometimes'; allowed: risk"),
    (["--msprobe-task=free_benchmark", "--msprobe-config=preheat.json"], "free_benchmark.if_preheat=true does not fit"),
    (["--msprobe-task=grad_probe", "--msprobe-config=fb.json"],
     "is a 'free_benchmark' config (its \"task\" key) but --msprobe-task=grad_probe"),
])
def test_usage_errors_name_the_option(suite, args, message):
    (suite.path / "fb.json").write_text('{"task": "free_benchmark"}')
    (suite.path / "preheat.json").write_text('{"task": "free_benchmark", "free_benchmark": {"if_preheat": true}}')
    result = suite.runpytest_subprocess(*args, "-p", "no:cacheprovider")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    assert message in result.stderr.str()


def test_bad_config_is_a_usage_error_before_tests_run(suite):
    cfg = suite.path / "config.json"
    cfg.write_text(json.dumps({"task": "free_benchmark", "dump_path": "x",
                               "free_benchmark": {"pert_mode": "add_noise", "handler_type": "fix"}}))
    result = suite.runpytest_subprocess("--msprobe-task=free_benchmark", f"--msprobe-config={cfg}", "-p", "no:cacheprovider")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    assert "free_benchmark" in result.stderr.str() and "add_noise" in result.stderr.str()


@pytest.mark.slow
def test_xdist_workers_write_their_own_files_and_the_controller_merges(suite):
    pytest.importorskip("xdist")
    dump = suite.path / "out"
    result = suite.runpytest_subprocess("-n", "2", "--msprobe-task=free_benchmark", f"--msprobe-dump-path={dump}",
                                        "--msprobe-fail-on=never", "-p", "no:cacheprovider")
    result.assert_outcomes(passed=3)
    result.stdout.fnmatch_lines(["*risky APIs*", "Torch.expm1 *"])
    summary = json.loads((dump / "summary.json").read_text())
    assert set(summary["tests"]) == {"test_suite.py::test_clean", "test_suite.py::test_risky",
                                     "test_suite.py::test_no_torch_work"}
    assert summary["apis"]["Torch.expm1"]["tests"] == ["test_suite.py::test_risky"]
    assert len(list((dump / "tests").rglob("free_benchmark.csv"))) == 1


@pytest.mark.slow
def test_junit_xml_carries_the_worst_figure(suite):
    xml = suite.path / "junit.xml"
    result = suite.runpytest_subprocess("--msprobe-task=free_benchmark", f"--msprobe-dump-path={suite.path / 'out'}",
                                        f"--junitxml={xml}", "-p", "no:cacheprovider")
    result.assert_outcomes(passed=2, failed=1)
    import xml.etree.ElementTree as ET

    cases = {c.get("name"): {p.get("name"): p.get("value") for p in c.iter("property")}
             for c in ET.parse(xml).getroot().iter("testcase")}
    risky = cases["test_risky"]
    assert risky["msprobe_flagged_apis"] == "Torch.expm1"
    assert risky["msprobe_worst_api"] == "Torch.expm1"
    assert float(risky["msprobe_worst_max_rel"]) > float(risky["msprobe_threshold"]) == 4 * 2.0**-10
    assert "msprobe_flagged_apis" not in cases["test_clean"]
    # fp32 under improve_precision: re-run in float64 by the scaled rule, and clean
    assert int(cases["test_clean"]["msprobe_apis_checked"]) >= 1
    assert int(risky["msprobe_apis_checked"]) >= 1


@pytest.mark.slow
def test_reference_rule_option_restores_msprobe_verdicts(suite):
    dump = suite.path / "out"
    result = suite.runpytest_subprocess("--msprobe-task=free_benchmark", "--msprobe-rule=reference",
                                        f"--msprobe-dump-path={dump}", "-p", "no:cacheprovider")
    result.assert_outcomes(passed=2, failed=1)
    result.stdout.fnmatch_lines([
        "*free_benchmark (improve_precision, reference rule) flagged 1 API(s) in test_suite.py::test_risky*",
        "*Torch.expm1.0.forward: max_rel * > threshold 0.002 (torch.float16*",
    ])
    clean = json.loads((dump / "summary.json").read_text())["tests"]["test_suite.py::test_clean"]
    assert clean["flagged_apis"] == []


def test_bad_rule_option_names_the_allowed_values(suite):
    result = suite.runpytest_subprocess("--msprobe-task=free_benchmark", "--msprobe-rule=loose", "-p", "no:cacheprovider")
    assert result.ret != 0
    result.stderr.fnmatch_lines(["*--msprobe-rule='loose'; allowed: reference, scaled*"])


@pytest.mark.slow
def test_session_summary_and_html_report(suite):
    dump = suite.path / "out"
    result = suite.runpytest_subprocess("--msprobe-task=free_benchmark", f"--msprobe-dump-path={dump}", "-p", "no:cacheprovider")
    result.assert_outcomes(passed=2, failed=1)
    summary = json.loads((dump / "summary.json").read_text())
    assert summary["device"] == "cpu" and summary["versions"]["torch"].startswith("2.")
    assert summary["tests"]["test_suite.py::test_risky"]["outcome"] == "failed"
    assert summary["tests"]["test_suite.py::test_clean"]["outcome"] == "passed"
    html = (dump / "report.html").read_text()
    assert "expm1" in html and '<svg class="plot"' in html and "worst error per API relative to its threshold" in html
    result.stdout.fnmatch_lines([f"report: {dump / 'report.html'}"])
