"""@pytest.mark.msprobe_api: generated per-API tests with Hypothesis inputs and the free_benchmark
rule; a seeded defect fails the right item with a shrunk, reproducible example."""

from __future__ import annotations

import pytest
from repo_paths import SUPPORT

SUITE = '''
import pytest
import torch

@pytest.mark.msprobe_api("torch.nn.functional.softmax", kwargs={"dim": -1}, examples=15)
def test_softmax():
    pass

@pytest.mark.msprobe_api("torch.expm1", dtypes=["float16"], examples=40)
def test_expm1(msprobe_api_case):
    assert msprobe_api_case.pert_mode == "improve_precision"

@pytest.mark.msprobe_api("torch.tanh", dtypes=["float32"], pert_modes=["improve_precision", "bit_noise"], examples=10)
def test_tanh():
    pass
'''

CONFTEST = '''
import torch

_exp = torch.exp

def naive_expm1(x):  # the seeded defect: cancellation for small |x| in half precision
    return _exp(x) - 1

def pytest_configure(config):
    torch.expm1 = naive_expm1
'''


@pytest.fixture
def suite(pytester):
    pytester.makepyfile(test_apis=SUITE)
    pytester.makeconftest(CONFTEST)
    return pytester


@pytest.mark.slow
def test_generated_items_and_verdicts(suite):
    result = suite.runpytest_subprocess("-p", "no:cacheprovider", "-v", "-rs")
    result.assert_outcomes(passed=5, failed=1)
    result.stdout.fnmatch_lines_random([
        "*test_apis.py::test_softmax[[]softmax-float32-add_noise[]] PASSED*",
        "*test_apis.py::test_softmax[[]softmax-float16-improve_precision[]] PASSED*",
        "*test_apis.py::test_softmax[[]softmax-bfloat16-improve_precision[]] PASSED*",
        "*test_apis.py::test_expm1[[]expm1-float16-improve_precision[]] FAILED*",
        "*test_apis.py::test_tanh[[]tanh-float32-improve_precision[]] PASSED*",  # float32 against float64
        "*test_apis.py::test_tanh[[]tanh-float32-bit_noise[]] PASSED*",
    ])
    out = result.stdout.str()
    assert "Torch.expm1" in out and "(float16, improve_precision): max_rel" in out and "> threshold 0.00390625" in out
    assert "msprobe's ratio rule: max_rel" in out  # both rules' figures for the flagged call
    assert "inputs=((tensor(" in out and "@reproduce_failure" in out  # shrunk and reproducible (any Hypothesis wording)


@pytest.mark.slow
def test_reference_rule_skips_float32_improve_precision_as_msprobe(suite):
    result = suite.runpytest_subprocess("-p", "no:cacheprovider", "-rs", "--msprobe-rule=reference", "-k", "tanh")
    result.assert_outcomes(passed=1, skipped=1)
    assert "improve_precision under the reference rule has nothing to upcast in float32" in result.stdout.str()


def collection_error(result) -> list[str]:
    """The lines pytest prints under "ERROR collecting ...": what the user reads of a bad marker."""
    lines = result.stdout.lines
    start = next(i for i, line in enumerate(lines) if "ERROR collecting" in line)
    end = next(i for i, line in enumerate(lines) if "short test summary info" in line)
    return [line for line in lines[start + 1:end] if line.strip()]


@pytest.mark.parametrize("marker, message", [
    ('@pytest.mark.msprobe_api("torch.exp", dtypes=["float8"])',
     "dtypes entry 'float8'; allowed: float16, bfloat16, float32, float64 (or bf16, fp16, half, fp32, float, fp64, "
     "double, in any case)"),
    ('@pytest.mark.msprobe_api("torch.exp", dtypes=["bfloat15"])', 'did you mean "bfloat16"'),
    ('@pytest.mark.msprobe_api("torch.exp", pert_modes=["loud"])', "pert_modes entry 'loud'; allowed: improve_precision"),
    ('@pytest.mark.msprobe_api("torch.exp", example=3)', "unknown argument(s) ['example']; allowed: dtypes, examples"),
    ('@pytest.mark.msprobe_api()', "give exactly one API name"),
    ('@pytest.mark.msprobe_api("torch.nn.functional.sofmax")', 'did you mean "torch.nn.functional.softmax"'),
    ('@pytest.mark.msprobe_api("F.sofmax")', 'did you mean "F.softmax"'),
])
def test_a_bad_marker_argument_fails_collection_in_one_line(pytester, marker, message):
    pytester.makepyfile(test_bad=f"import pytest\n\n{marker}\ndef test_x():\n    pass\n")
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider")
    result.assert_outcomes(errors=1)
    shown = collection_error(result)
    assert len(shown) == 1, shown  # no traceback through pluggy and pytest's collection
    assert shown[0].startswith("test_bad.py::test_x: @pytest.mark.msprobe_api") and message in shown[0], shown


def test_a_misspelt_api_is_suggested_in_the_users_spelling():
    from pytest_msprobe.api.marker import MarkerError, cases_from_marker

    with pytest.raises(MarkerError) as info:
        cases_from_marker(pytest.mark.msprobe_api("torch.nn.functional.sofmax").mark)
    text = str(info.value)
    assert 'did you mean "torch.nn.functional.softmax"' in text and '"Functional.' not in text
    with pytest.raises(MarkerError, match='did you mean "Functional.softmax"'):  # a catalog name gets catalog names
        cases_from_marker(pytest.mark.msprobe_api("Functional.sofmax").mark)


def test_dtype_aliases_name_the_canonical_dtypes():
    from pytest_msprobe.api.marker import cases_from_marker

    mark = pytest.mark.msprobe_api("torch.exp", dtypes=["bf16", "FP16", "half", "float", "fp32", "Double", "fp64",
                                                        "bfloat16"]).mark
    cases = cases_from_marker(mark)
    # one test per canonical dtype, in the order first given, named canonically
    assert [c.id for c in cases] == ["exp-bfloat16-improve_precision", "exp-float16-improve_precision",
                                     "exp-float32-add_noise", "exp-float64-add_noise"]


def test_a_test_marked_with_dtype_aliases_runs_in_the_canonical_dtypes(pytester):
    pytester.makepyfile(test_alias='''
import pytest

@pytest.mark.msprobe_api("torch.exp", dtypes=["BF16", "half", "float"], examples=3)
def test_exp(msprobe_api_case):
    assert msprobe_api_case.dtype in ("bfloat16", "float16", "float32")
''')
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider", "-v")
    result.assert_outcomes(passed=3)
    result.stdout.fnmatch_lines_random([
        "*test_alias.py::test_exp[[]exp-bfloat16-improve_precision[]] PASSED*",
        "*test_alias.py::test_exp[[]exp-float16-improve_precision[]] PASSED*",
        "*test_alias.py::test_exp[[]exp-float32-add_noise[]] PASSED*",
    ])


@pytest.mark.slow
def test_fail_on_never_reports_and_xdist_merges(suite):
    import json

    dump = suite.path / "out"
    result = suite.runpytest_subprocess("-p", "no:cacheprovider", "--msprobe-fail-on=never", "-n", "2",
                                        f"--msprobe-dump-path={dump}")
    result.assert_outcomes(passed=6)
    result.stdout.fnmatch_lines([
        "*msprobe per-API checks*",
        "torch.expm1 [[]float16, improve_precision[]]: Torch.expm1.* > threshold 0.00390625*",
        "5 of 6 API x dtype x mode checks within their thresholds",
    ])
    checks = json.loads((dump / "api_checks.json").read_text())["tests"]
    assert len(checks) == 6  # both workers' results, merged by the controller
    assert [c["api"] for c in checks if c["flagged"]] == ["torch.expm1"]
    # the report shows them too (issue 18): the flagged one with its figure and how to rerun it
    page = (dump / "report.html").read_text(encoding="utf-8").replace("<wbr>", "")
    assert 'id="api-checks"' in page and "1 of 6 API" in page
    assert "torch.expm1" in page and "&gt; threshold 0.00390625" in page
    assert "pytest &#x27;test_apis.py::test_expm1[expm1-float16-improve_precision]&#x27;" in page
    result.stdout.fnmatch_lines(["report: *report.html"])


@pytest.mark.slow
def test_online_dispatch_on_request_catches_a_kernel_defect(pytester):
    pytester.makepyfile(
        test_od_api='''
import pytest

@pytest.mark.msprobe_api("torch.tanh", dtypes=["float32"], online_dispatch=True, examples=10)
def test_tanh():
    pass

@pytest.mark.msprobe_api("torch.tanh", dtypes=["float32"], online_dispatch=True, examples=25)
def test_tanh_defective():
    pass
''',
        conftest='''
import torch

_tanh = torch.tanh

@torch.library.custom_op("seeded_api::bad_tanh", mutates_args=())
def bad_tanh(x: torch.Tensor) -> torch.Tensor:  # the float32 kernel loses the sign of negative inputs
    return _tanh(x.abs()) if x.dtype == torch.float32 else _tanh(x)

@bad_tanh.register_fake
def _(x):
    return torch.empty_like(x)

def pytest_runtest_setup(item):
    if "defective" in item.name:
        torch.tanh = torch.ops.seeded_api.bad_tanh

def pytest_runtest_teardown(item):
    torch.tanh = _tanh
''')
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider", f"--msprobe-dump-path={pytester.path / 'out'}")
    result.assert_outcomes(passed=1, failed=1)
    out = result.stdout.str()
    assert "online_dispatch: bad_tanh" in out and "disagrees with the CPU reference" in out
    assert "inputs=((tensor(" in out and "@reproduce_failure" in out


@pytest.mark.slow
def test_generated_tests_run_their_own_probe_under_a_session_task(suite):
    result = suite.runpytest_subprocess("-p", "no:cacheprovider", "--msprobe-task=free_benchmark",
                                        f"--msprobe-dump-path={suite.path / 'out'}", "-k", "softmax or expm1")
    result.assert_outcomes(passed=3, failed=1)  # the same verdicts as without the session task
    assert "already running" not in result.stdout.str()


REDUCED_SUITE = '''
import pytest


@pytest.mark.msprobe_api("torch.nn.functional.linear", dtypes=["float32"], pert_modes=["improve_precision"],
                         examples=20)
def test_linear():
    pass
'''

REDUCED_CONFTEST = '''
import sys
sys.path.insert(0, {tests!r})
import seeded_reduced
import torch.nn.functional as F


def pytest_configure(config):
    F.linear = lambda input, weight, bias=None: seeded_reduced.reduced_linear(input, weight, bias)
'''


@pytest.mark.slow
@pytest.mark.parametrize("seeded", [True, False], ids=["reduced", "clean"])
def test_float32_improve_precision_catches_a_reduced_precision_kernel(pytester, seeded):

    pytester.makepyfile(test_reduced=REDUCED_SUITE)
    pytester.makeconftest(REDUCED_CONFTEST.format(tests=str(SUPPORT)) if seeded else "")
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider")
    if seeded:
        result.assert_outcomes(failed=1)
        result.stdout.fnmatch_lines(["*Functional.linear.* (float32, improve_precision): max_rel * > threshold 0.0002*"])
    else:
        result.assert_outcomes(passed=1)


MODEL_TESTS = '''
import pytest
import torch

def test_model():
    assert torch.nn.functional.gelu(torch.randn(4, 8)).shape == (4, 8)

def test_plain_python():
    assert 1 + 1 == 2

@pytest.mark.skip(reason="not here")
def test_skipped():
    pass
'''


def test_the_reports_test_count_equals_pytests(suite):
    """Model tests, per-API checks and skipped tests all count: the report's cards show what
    pytest's own summary line says."""
    import re

    suite.makepyfile(test_model=MODEL_TESTS)
    result = suite.runpytest_subprocess("-p", "no:cacheprovider", "--msprobe-task=free_benchmark",
                                        "--msprobe-fail-on=never")
    outcomes = result.parseoutcomes()
    page = (suite.path / ".msprobe" / "report.html").read_text(encoding="utf-8")
    cards = {label: int(n) for n, label in re.findall(r'<div class="num">(\d+)</div><div>([^<]+)</div>', page)}
    assert cards["tests"] == sum(outcomes.get(k, 0) for k in ("passed", "failed", "skipped")) == 9
    assert cards["passed"] == outcomes["passed"] and cards["failed"] == outcomes.get("failed", 0)
    assert cards["skipped"] == outcomes["skipped"] == 1


def test_a_flagged_check_shows_its_minimal_inputs_on_one_screen_and_in_the_report(suite):
    result = suite.runpytest_subprocess("-p", "no:cacheprovider", "-k", "expm1")
    result.assert_outcomes(failed=1)
    out = result.stdout.str()
    failure = out[out.index("test_expm1[expm1-float16-improve_precision] __"):out.index("Captured log")]
    assert "minimal failing inputs:" in failure and "args[0]: float16 (" in failure
    assert "rerun: pytest 'test_apis.py::test_expm1[expm1-float16-improve_precision]'" in failure
    # no traceback through the plugin or Hypothesis, no search jargon
    assert "plugin.py" not in failure and "Traceback" not in failure and "During handling" not in failure
    assert "Highest target score" not in failure and len(failure.splitlines()) < 20
    import json

    entry = json.loads((suite.path / ".msprobe" / "api_checks.json").read_text())["tests"][0]
    assert entry["inputs"][0]["dtype"] == "float16" and entry["inputs"][0]["values"].startswith("[")
    page = (suite.path / ".msprobe" / "report.html").read_text(encoding="utf-8")
    assert "minimal failing inputs" in page and "args[0]: float16" in page
