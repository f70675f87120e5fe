"""README's main job, run as README says, and what README says of it checked against what it did.

One run of the job (the module's fixture) answers every claim that can be checked: the examples'
dtypes and counts, what the job prints, the files it writes, that the report and ``probes summary``
count what pytest counted, and that a later session never leaves an older ``summary.json`` next
to its own report. The output must also hold nothing a newcomer has to decode: no traceback, no
framework warning, no pytest warnings summary.
"""

from __future__ import annotations

import json
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest
from repo_paths import REPO

pytestmark = pytest.mark.slow  # subprocess pytest sessions / multi-process jobs: minutes in all

ROOT = REPO
README = (ROOT / "README.md").read_text(encoding="utf-8")
NAMES = {"fp32": "float32", "fp16": "float16", "bf16": "bfloat16"}


def _readme_main_command() -> list[str]:
    """The pytest part of README's first command: the main job."""
    block = README.split("## Two commands on a fresh machine", 1)[1].split("```bash", 1)[1].split("```", 1)[0]
    job = block.strip().split("&&")[-1].strip()
    args = shlex.split(job)
    assert args[0] == "pytest", job
    return args[1:]


def _readme_phrase(pattern: str) -> re.Match[str]:
    match = re.search(pattern, " ".join(README.split()))
    assert match, f"README no longer says {pattern!r}: update this test with the claim"
    return match


def _dtypes(text: str) -> set[str]:
    return {NAMES[d.strip()] for d in re.split(r",|\band\b", text) if d.strip()}


def _pytest_counts(text: str) -> dict[str, int]:
    line = [ln for ln in text.splitlines() if re.search(r"\d+ passed", ln)][-1]
    return {k: int(n) for n, k in re.findall(r"(\d+) (passed|failed|skipped|error)", line)}


@pytest.fixture(scope="module")
def main_job(tmp_path_factory):
    pytest.importorskip("mindspore")
    out = tmp_path_factory.mktemp("main_job") / "out"
    cmd = [sys.executable, "-m", "pytest", *_readme_main_command(), "-q", "-p", "no:cacheprovider",
           f"--msprobe-dump-path={out}"]
    done = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=900)
    text = done.stdout + done.stderr
    assert done.returncode == 0, text[-3000:]
    return text, out, json.loads((out / "summary.json").read_text(encoding="utf-8"))


def test_output_has_no_traceback_and_no_warning(main_job):
    text, _, _ = main_job
    for marker in ("Traceback", "[WARNING]", "warnings summary", "compiled using NumPy 1.x", "could not be written"):
        assert marker not in text, f"{marker!r} in the main job's output:\n{text[-3000:]}"


def test_the_examples_run_the_dtypes_readme_names(main_job):
    _, _, summary = main_job
    ids = list(summary["tests"]) + [c["test"] for c in summary["api_checks"]]

    def param_ids(module: str) -> set[str]:
        return {NAMES[m] for t in ids if t.startswith(module) for m in re.findall(r"\[(\w+)\]", t)}

    torch_models = _readme_phrase(r"a PyTorch MLP and transformer block \(([^)]*)\)").group(1)
    assert param_ids("examples/test_models.py") == _dtypes(torch_models)
    ms_models = _readme_phrase(r"a MindSpore MLP \(([^)]*)\)").group(1)
    assert param_ids("examples/mindspore/test_ms_mlp.py") == _dtypes(ms_models)
    assert sum(t.startswith("examples/mindspore/test_ms_graph_mode.py") for t in ids) == 2  # "two compiled MindSpore steps"
    _readme_phrase(r"two compiled MindSpore steps")
    apis = _readme_phrase(r"(\d+) torch APIs in ([a-z0-9, ]+?) as generated per-API tests")
    checks = summary["api_checks"]
    assert len({c["api"] for c in checks}) == int(apis.group(1))
    assert {c["dtype"] for c in checks} == _dtypes(apis.group(2))


def test_it_prints_what_readme_says(main_job):
    text, out, summary = main_job
    _readme_phrase(r"prints the flagged per-API checks and the risky-API table \(one line when no API is flagged\)")
    assert "msprobe per-API checks" in text
    flagged = [c for c in summary["api_checks"] if c["flagged"]]
    for check in flagged:
        assert f"{check['api']} [{check['dtype']}, {check['pert_mode']}]: " in text
    assert f"{len(summary['api_checks']) - len(flagged)} of {len(summary['api_checks'])} API x dtype x mode checks" in text
    section = text.split("msprobe free_benchmark: risky APIs", 1)[1]
    risky = [api for api, s in summary["apis"].items() if s["flagged"]]
    if risky:
        assert all(api in section for api in risky)
    else:
        assert section.split("\n", 2)[1].startswith("no risky API: ")
    assert f"report: {out / 'report.html'}" in text


def test_it_writes_the_files_readme_names_and_they_count_what_pytest_counted(main_job):
    text, out, summary = main_job
    _readme_phrase(r"writes `summary.json` and `report.html` under `.msprobe/`: every API checked, with its calls "
                   r"and how close it came to its threshold; a test with an inconsistent call also gets a "
                   r"`free_benchmark.csv` of its rows")
    checked = {api: row for api, row in summary["apis"].items() if row["checked"]}
    assert checked and all(row["calls"] >= row["checked"] and row["worst_score"] is not None for row in checked.values())
    csvs = {p.resolve() for p in out.rglob("free_benchmark.csv")}
    flagged = [t for t in summary["tests"].values() if t["flagged_apis"]]
    assert all(Path(f).resolve() in csvs for t in flagged for f in t["csv_files"]) and all(t["csv_files"] for t in flagged)
    counts = _pytest_counts(text)
    assert summary["session"]["tests"] == sum(counts.values())
    assert summary["session"]["passed"] == counts["passed"]
    page = (out / "report.html").read_text(encoding="utf-8")
    cards = {label: int(n) for n, label in re.findall(r'<div class="num">(\d+)</div><div>([^<]+)</div>', page)}
    assert cards["tests"] == sum(counts.values()) and cards["passed"] == counts["passed"]


def test_readmes_notebook_lines_show_every_api(main_job):
    """README's notebook block, run on the main job's folder: the per-API table has every API the
    session checked, a clean run included; free_benchmark.csv's rows are the inconsistent calls."""
    from probes.results import load

    _, out, summary = main_job
    block = README.split("**Read the results in a notebook:**", 1)[1].split("```python", 1)[1].split("```", 1)[0]
    lines = [ln.split("#", 1)[0].strip() for ln in block.strip().splitlines() if ln.strip()]
    assert lines[0] == 'from probes.results import load' and lines[1] == 'res = load(".msprobe")'
    res = load(out)
    table = eval(lines[2], {"res": res})  # noqa: S307 - README's own line
    assert set(table["api"]) == set(summary["apis"]) and len(table) == len(summary["apis"])
    assert table["worst_score"].notna().sum() == sum(r["worst_score"] is not None for r in summary["apis"].values())
    worst = eval(lines[3], {"res": res})  # noqa: S307
    flagged = {api for t in summary["tests"].values() for api in t["flagged_apis"]}
    assert set(worst.index) >= flagged


def test_probes_summary_says_what_the_report_says(main_job):
    _, out, summary = main_job
    _readme_phrase(r"`python -m probes summary .msprobe` prints the same counts")
    done = subprocess.run([sys.executable, "-m", "probes", "summary", str(out)], capture_output=True, text=True,
                          timeout=300)
    assert done.returncode == 0, done.stderr
    checks = summary["api_checks"]
    flagged = [c for c in checks if c["flagged"]]
    assert f"per-API checks: {len(checks)} run, {len(flagged)} flagged" in done.stdout
    assert f": {summary['session']['tests']} tests: {summary['session']['passed']} passed" in done.stdout
    for check in flagged:
        assert f"{check['api']} [{check['dtype']}, {check['pert_mode']}]" in done.stdout
    # the per-API checks' Hypothesis examples are not findings of the tests under the probe
    per_api = {c["test"] for c in checks}
    tested = {f"  {t}: " for t in per_api}
    assert not any(line.startswith(tuple(tested)) for line in done.stdout.splitlines())


def test_a_later_session_leaves_no_older_summary_next_to_its_report(main_job):
    """A session of per-API checks only (no --msprobe-task) writes its own summary.json."""
    _, out, first = main_job
    cmd = [sys.executable, "-m", "pytest", "examples/test_apis.py", "-k", "test_relu", "-q", "-p", "no:cacheprovider",
           f"--msprobe-dump-path={out}"]
    done = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, (done.stdout + done.stderr)[-3000:]
    summary = json.loads((out / "summary.json").read_text(encoding="utf-8"))
    assert summary["date"] >= first["date"]
    assert summary["session"]["tests"] == sum(_pytest_counts(done.stdout).values()) == 3
    assert {c["api"] for c in summary["api_checks"]} == {"torch.nn.functional.relu"}
    page = (out / "report.html").read_text(encoding="utf-8")
    assert "per-API checks" in page and "torch.nn.functional.gelu" not in page
