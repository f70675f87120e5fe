"""report.html, built from what real runs wrote: a small suite runs under each task (a subprocess
pytest per task) and each report is rendered from its summary.json. The page is self-contained
(escaped, no scripts, no external resources), its plots parse as SVG and draw the session's
figures (a bar per API or op, an off-scale one hatched, flagged steps marked), its evidence links
resolve, its figures are the session's (a clean API's margin, every op's calls compared, grad_probe's
FP8 health read back from its CSVs), a summary row missing a field fails by name, and a screenshot in headless Chromium is the
requested size and not blank."""

from __future__ import annotations

import copy
import csv
import html
import json
import os
import re
import stat
import subprocess
import sys
import textwrap
import time
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest
from grad_suites import TORCH_SUITE as GRAD_TORCH_SUITE
from repo_paths import REPO, SUPPORT
from svg_plots import NS, having, parsed, texts

from probes.core.errors import ConfigError
from probes.core.session_tables import COMPARED_BY_OP, SummaryFormatError
from pytest_msprobe.reports.html import render_html
from pytest_msprobe.reports.plots import PLOT_MAX_BARS
from pytest_msprobe.testing.browser import find_chromium, screenshot

Image = pytest.importorskip("PIL.Image")
np = pytest.importorskip("numpy")

SVG = re.compile(r"<svg\b.*?</svg>", re.S)
TESTS = SUPPORT

FB_SUITE = {
    "test_fb.py": """
import torch

def test_risky():
    torch.expm1(torch.linspace(1e-3, 2e-2, 32).half())

def test_clean_model():
    x = torch.linspace(-2, 2, 64).reshape(8, 8)
    torch.nn.functional.softsign(x)
    torch.softmax(x, dim=-1)
    torch.tanh(x.bfloat16())

def test_probe_fails_at_stop():
    torch.nn.functional.softsign(torch.linspace(-1, 1, 16))

def test_never_calls_torch():
    assert True
""",
    "seeded_defect.py": """
import torch
_exp = torch.exp
def naive_expm1(x):  # cancellation for small |x| in half precision
    return _exp(x) - 1
""",
    "conftest.py": """
import torch, seeded_defect
from pytest_msprobe.tools.free_benchmark import FreeBenchmarkRun

_finish = FreeBenchmarkRun.finish

def _finish_then_fail(self):  # the probe's stop raising (as under torch.func.vmap), hooks already off
    _finish(self)
    if "probe_fails_at_stop" in str(self.dump_path):
        raise RuntimeError("the tensor may have escaped from inside a function being vmapped")

FreeBenchmarkRun.finish = _finish_then_fail

def pytest_configure(config):
    torch.expm1 = seeded_defect.naive_expm1
""",
}

OD_SUITE = {
    "test_od.py": """
import torch
import seeded_dispatch

def test_clean_mlp():
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.GELU(), torch.nn.Linear(16, 2))
    model(torch.randn(4, 8)).sum().backward()

def test_defective_kernel():
    torch.ops.seeded_dispatch.scaled_tanh(torch.linspace(-1, 1, 16))

def test_no_aten_op():
    assert True
""",
    "seeded_dispatch.py": (TESTS / "seeded_dispatch.py").read_text(encoding="utf-8"),
}

GRAD_SUITE = {"test_grad.py": GRAD_TORCH_SUITE}  # a clean run, one blowing up at step 1, one without optimizer

SUITES = {"free_benchmark": FB_SUITE, "online_dispatch": OD_SUITE, "grad_probe": GRAD_SUITE}

FP8_FORMATS = ["float8_e4m3fn", "float8_e5m2"]
FP8_SUITE = {"test_fp8.py": """
import torch

def train(model, x, steps=3):
    opt = torch.optim.SGD(model.parameters(), lr=0.0)
    for _ in range(steps):
        opt.zero_grad()
        model(x).sum().backward()
        opt.step()

def test_outlier_feature():
    # one input feature 1e7 times the others: at its amax scale the rest of the first layer's
    # weight gradient is below float8_e4m3fn's smallest subnormal (not float8_e5m2's)
    torch.manual_seed(0)
    train(torch.nn.Sequential(torch.nn.Linear(4, 3), torch.nn.Linear(3, 2)),
          torch.tensor([[1e4, 1e-3, -1e-3, 2e-3]] * 4))

def test_plain_layer():
    torch.manual_seed(0)
    train(torch.nn.Sequential(torch.nn.Linear(4, 3)), torch.linspace(-1, 1, 8).reshape(2, 4))
"""}


def _run_suite(root: Path, task: str, files: dict[str, str] | None = None, config: dict | None = None,
               name: str | None = None) -> dict:
    """Run the task's suite (or `files`, under the probe config `config`) in a fresh folder; its
    summary.json (the dump is root/<name or task>/out)."""
    folder = root / (name or task)
    folder.mkdir()
    for file_name, text in (files or SUITES[task]).items():
        (folder / file_name).write_text(text, encoding="utf-8")
    dump = folder / "out"
    options = []
    if config is not None:
        (folder / "msprobe.json").write_text(json.dumps(config), encoding="utf-8")
        options = [f"--msprobe-config={folder / 'msprobe.json'}"]
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", f"--basetemp={folder / 'tmp'}",
         f"--msprobe-task={task}", "--msprobe-fail-on=never", f"--msprobe-dump-path={dump}", *options],
        cwd=folder, capture_output=True, text=True, timeout=600, env=dict(os.environ, PYTHONPATH=str(folder)))
    assert done.returncode == 0, (done.stdout + done.stderr)[-3000:]
    summary = json.loads((dump / "summary.json").read_text(encoding="utf-8"))
    summary["_terminal"] = done.stdout
    return summary


@pytest.fixture(scope="module")
def runs(tmp_path_factory) -> dict[str, dict]:
    """Each task's summary.json from a real run (with the terminal's text under "_terminal")."""
    root = tmp_path_factory.mktemp("runs")
    return {task: _run_suite(root, task) for task in SUITES}


@pytest.fixture(scope="module")
def fp8_run(tmp_path_factory) -> dict:
    """summary.json of a grad_probe run with grad_probe.fp8_health on."""
    config = {"task": "grad_probe", "grad_probe": {"grad_level": "L1", "fp8_health": FP8_FORMATS}}
    summary = _run_suite(tmp_path_factory.mktemp("fp8"), "grad_probe", FP8_SUITE, config, name="fp8")
    del summary["_terminal"]
    return summary


def _summary(runs: dict, task: str) -> dict:
    """A copy of the task's summary.json, to render (or to change, for a test of one feature)."""
    summary = copy.deepcopy(runs[task])
    del summary["_terminal"]
    return summary


def text_of(page: str) -> str:
    """The page's visible text, roughly: tags and word-break hints dropped."""
    return html.unescape(re.sub(r"<[^>]+>", "", page.replace("<wbr>", "")))


def section(page: str, name: str) -> str:
    match = re.search(rf'<section id="{name}">(.*?)</section>', page, re.S)
    assert match, f"no section {name}"
    return match.group(1)


def plots_of(page: str) -> list[ET.Element]:
    """Every plot of a page, parsed (svg_plots.parsed)."""
    return [parsed(text) for text in SVG.findall(page)]


def size(root: ET.Element) -> tuple[int, int]:
    return int(root.get("width")), int(root.get("height"))


def bar_end(bar: ET.Element) -> float:
    return float(bar.get("x")) + float(bar.get("width"))


def rows_of(sec: str) -> list[str]:
    return [r.replace("<wbr>", "") for r in re.findall(r"<tr><td><code>(.*?)</code>", sec)]


def cells_of(sec: str) -> dict[str, list[str]]:
    """A section's table rows by their first cell: the visible text of each cell."""
    rows = {}
    for row in re.findall(r"<tr>(.*?)</tr>", sec, re.S):
        cells = [text_of(c) for c in re.findall(r"<td>(.*?)</td>", row, re.S)]
        if cells:
            rows[cells[0]] = cells
    return rows


def render(summary: dict, path: Path) -> str:
    return render_html(summary, path).read_text(encoding="utf-8")


# what the reports show of real runs ----------------------------------------------------------------
@pytest.mark.slow
def test_free_benchmark_report_shows_every_apis_margin_and_the_probe_error(runs, tmp_path):
    summary = _summary(runs, "free_benchmark")
    page = render(summary, tmp_path / "report.html")
    apis = section(page, "apis")
    assert rows_of(apis)[0] == "Torch.expm1"  # the flagged one first
    clean = {api: row for api, row in summary["apis"].items() if not row["flagged"] and row["checked"]}
    assert {"Functional.softsign", "Torch.softmax", "Torch.tanh"} <= set(clean)
    shown = cells_of(apis)
    for api, row in clean.items():  # the closest approach of every clean API, not a dash
        assert row["worst_score"] is not None and row["dtypes"]
        assert shown[api][1:] == [str(row["checked"]), f"{row['worst_score']:.3g}\u00d7", ", ".join(row["dtypes"])]
    assert "torch.bfloat16" in text_of(apis)
    (plot,) = plots_of(apis)  # flagged and clean APIs on one axis, the flagged one on top
    assert texts(plot, "p-label") == ["Torch.expm1"] + sorted(clean, key=lambda a: -clean[a]["worst_score"])
    bars = having(plot, "p-bar")
    assert len(bars) == len(clean) + 1 and not having(plot, "p-off") and size(plot)[1] > 150
    (line,) = having(plot, "p-ref")  # right of the threshold line is beyond the threshold
    threshold = float(line.get("x1"))
    assert max(bar_end(b) for b in bars[1:]) < threshold < bar_end(bars[0])
    assert texts(plot, "p-legend") == ["threshold"]
    assert re.fullmatch(r"0\.\d+  \([0-9.]+\u00d7 threshold\)", texts(plot, "p-value")[0])
    errors = text_of(section(page, "errors"))
    assert "test_fb.py::test_probe_fails_at_stop" in errors
    assert "probe stop: RuntimeError: the tensor may have escaped" in errors
    account = text_of(section(page, "probe"))
    assert "test_fb.py::test_never_calls_torch" in account and "it called no API free_benchmark checks" in account
    assert f"{summary['probe']['checked']} API calls checked in 4 test(s)" in account
    tests = text_of(section(page, "tests"))
    assert all(t in tests for t in summary["tests"])  # the test whose probe failed too


def test_the_terminal_says_what_summary_json_holds(runs):
    fb, od = runs["free_benchmark"], runs["online_dispatch"]
    out = fb["_terminal"]
    assert "probe errors: 1 in 1 test(s)" in out
    assert "test_fb.py::test_probe_fails_at_stop: probe stop: RuntimeError: the tensor may have escaped" in out
    assert f"{fb['probe']['checked']} API calls checked in 4 test(s) under the probe" in out
    assert f"not checked: {sum(fb['probe']['not_checked'].values())} call(s): " in out
    assert f"{od['probe']['checked']} op calls compared in 3 test(s) under the probe" in od["_terminal"]
    assert "test_od.py::test_no_aten_op: it ran no aten op that could be compared" in od["_terminal"]


def test_online_dispatch_report_counts_what_the_session_compared(runs, tmp_path):
    summary = _summary(runs, "online_dispatch")
    compared = summary["probe"]["checked"]
    assert compared == sum(t["checked"] for t in summary["tests"].values()) > 10
    page = render(summary, tmp_path / "report.html")
    ops = text_of(section(page, "ops"))
    assert "no op was compared" not in ops
    assert f"1 of {len(summary['ops'])} ops failed the comparison ({compared} calls compared" in ops
    assert rows_of(section(page, "ops"))[0] == "seeded_dispatch.scaled_tanh.default"
    (plot,) = plots_of(section(page, "ops"))  # the failing op's worst cosine, against both thresholds
    assert texts(plot, "p-label") == ["seeded_dispatch.scaled_tanh.default"] and len(having(plot, "p-bar")) == 1
    assert texts(plot, "p-legend") == ["cosine 0.99", "cosine 0.9"]
    tight, loose = (float(r.get("x1")) for r in having(plot, "p-ref"))
    assert bar_end(having(plot, "p-bar")[0]) < loose < tight
    per_test = [json.loads(p.read_text()) for p in Path(summary["config"]["dump_path"]).glob("tests/*/msprobe_*/summary.json")]
    assert per_test and all(COMPARED_BY_OP in s for s in per_test)
    by_op: dict[str, int] = {}
    for s in per_test:
        for op, n in s[COMPARED_BY_OP].items():
            by_op[op] = by_op.get(op, 0) + n
    assert {op: row["compared"] for op, row in summary["ops"].items()} == by_op
    assert sum(by_op.values()) == compared and len(by_op) > 3  # every op, the clean ones too
    shown = cells_of(section(page, "ops"))
    assert {op: int(cells[1]) for op, cells in shown.items()} == by_op


def test_grad_probe_report_names_the_parameter_and_its_step(runs, tmp_path):
    summary = _summary(runs, "grad_probe")
    page = render(summary, tmp_path / "report.html")
    params = text_of(section(page, "params"))
    assert set(summary["params"]) == {"0.weight"} and "0.weight" in params
    assert summary["params"]["0.weight"]["first"].startswith("step 1: ") and summary["params"]["0.weight"]["first"] in params
    assert "test_grad.py::test_blows_up_at_step_1" in params
    assert 'id="apis"' not in page and 'id="ops"' not in page
    assert "test_grad.py::test_no_optimizer" in text_of(section(page, "probe"))  # it gave the probe nothing
    # gradient comparisons (a golden check's similarities) go after the table, one plot each
    summary["similarities"] = {"test_grad.py::test_clean vs golden": {
        "steps": [0, 1, 2, 3], "first_step_min": 0.9995, "params": {"0.weight": [0.999, 0.998, 0.93, 0.92]},
        "summary": [0.999, 0.998, 0.95, 0.94]}}
    page = render(summary, tmp_path / "report.html")
    assert page.index('id="params"') < page.index('id="similarities"') < page.index('id="tests"')
    sims = text_of(section(page, "similarities"))
    assert "1 of 1 comparison(s) flagged" in sims and "flagged at step 0, 2" in sims
    assert "step 2 \u00b7 0.weight: similarity 0.93 dropped by 0.068 > 0.03 from 0.998 at step 1" in sims
    (plot,) = plots_of(page)
    assert plot.get("aria-label") == "gradient similarity per step: test_grad.py::test_clean vs golden"
    assert len(having(plot, "p-series")) == 2 and len(having(plot, "p-summary")) == 1
    assert texts(plot, "p-legend") == ["first-step min 0.9995", "0.weight", "summary", "flagged step"]
    assert len(having(plot, "p-flag")) == 4  # both lines at step 0 (below 0.9995) and at step 2 (a drop)


def _csv_column(folder: str, column: str) -> dict[str, list[float]]:
    """A column of a dump's step summaries: parameter -> its value at steps 0, 1, 2."""
    out: dict[str, list[float]] = {}
    for step in range(3):
        with open(Path(folder) / "rank0" / f"grad_summary_{step}.csv", encoding="utf-8-sig", newline="") as f:
            for row in csv.DictReader(f):
                out.setdefault(row["param_name"], []).append(float(row[column]))
    return out


def test_grad_probe_report_plots_fp8_health_worst_parameter_first(fp8_run, tmp_path):
    page = render(copy.deepcopy(fp8_run), tmp_path / "report.html")
    fp8 = section(page, "fp8")
    assert page.index('id="params"') < page.index('id="fp8"') < page.index('id="tests"')
    (folder,) = fp8_run["tests"]["test_fp8.py::test_outlier_feature"]["dump_paths"]
    under = _csv_column(folder, "float8_e4m3fn underflow")
    assert under["0.weight"] == [0.75] * 3  # three of its four columns, at every step
    assert all(v == 0.0 for p, vs in under.items() if p != "0.weight" for v in vs)
    assert set(_csv_column(folder, "float8_e5m2 underflow")["0.weight"]) == {0.0}
    rows = [[text_of(c) for c in re.findall(r"<td>(.*?)</td>", r, re.S)] for r in re.findall(r"<tr>(.*?)</tr>", fp8, re.S)]
    rows = [r for r in rows if r]
    # the parameter that loses the most first, its largest fractions and their steps
    assert rows[0] == ["0.weight", "float8_e4m3fn", "test_fp8.py::test_outlier_feature", "0.75 (step 0)", "0 (step 0)"]
    assert all(r[3:] == ["0 (step 0)", "0 (step 0)"] for r in rows[1:])
    # every parameter of both tests, in each format
    expected = {(param, fmt, nodeid) for nodeid, entry in fp8_run["tests"].items() for f in entry["dump_paths"]
                for param in _csv_column(f, "float8_e5m2 saturated") for fmt in FP8_FORMATS}
    assert {tuple(r[:3]) for r in rows} == expected and len(rows) == len(expected) == (4 + 2) * 2
    assert "12 parameter \u00d7 format figures" in text_of(fp8)
    # a plot per optimizer and format that loses something; the others are named, not drawn flat
    (plot,) = plots_of(fp8)
    assert plot.get("aria-label") == "FP8 health per step: test_fp8.py::test_outlier_feature float8_e4m3fn"
    assert size(plot)[0] >= 400
    params = texts(plot, "p-legend")  # one legend, the parameter that loses the most first
    assert params[0] == "0.weight" and sorted(params) == sorted(_csv_column(folder, "float8_e4m3fn underflow"))
    panels = having(plot, "p-axes")  # underflow and saturated, a parameter's colour the same in both
    assert len(panels) == 2 and all(len(having(p, "p-series")) == len(params) for p in panels)
    colours = [[g.find(f"{NS}polyline").get("stroke") for g in having(p, "p-series")] for p in panels]
    assert colours[0] == colours[1] and len(set(colours[0])) == len(params)
    assert ("3 series lose no element at any step (test_fp8.py::test_outlier_feature float8_e5m2, "
            "test_fp8.py::test_plain_layer float8_e4m3fn, test_fp8.py::test_plain_layer float8_e5m2)") in text_of(fp8)
    # a dump that is gone costs the section, not the report
    moved = copy.deepcopy(fp8_run)
    for entry in moved["tests"].values():
        entry["dump_paths"] = [str(tmp_path / "gone" / Path(p).name) for p in entry["dump_paths"]]
    assert 'id="fp8"' not in render(moved, tmp_path / "moved.html")


def test_fp8_health_over_ranks_is_the_worst_rank(fp8_run, tmp_path):
    """Two ranks of one optimizer (rank1 a copy of rank0 with one figure raised): the worst rank's
    figure per step; a rank folder named directly (a merged multi-rank summary) reads the same."""
    import shutil

    from pytest_msprobe.reports.fp8_health import read_folder

    (folder,) = fp8_run["tests"]["test_fp8.py::test_outlier_feature"]["dump_paths"]
    dump = tmp_path / "dump"
    shutil.copytree(Path(folder) / "rank0", dump / "rank0")
    shutil.copytree(Path(folder) / "rank0", dump / "rank1")
    path = dump / "rank1" / "grad_summary_1.csv"
    with open(path, encoding="utf-8-sig", newline="") as f:
        rows = list(csv.reader(f))
    column = rows[0].index("float8_e5m2 saturated")
    (row,) = [r for r in rows if r[0] == "1.bias"]
    row[column] = "0.5"
    with open(path, "w", encoding="utf-8-sig", newline="") as f:
        csv.writer(f).writerows(rows)
    by_format = {h.format: h for h in read_folder("t", dump)}
    assert by_format["float8_e5m2"].params["1.bias"]["saturated"] == [0.0, 0.5, 0.0]
    assert by_format["float8_e4m3fn"].params["0.weight"]["underflow"] == [0.75] * 3
    (alone,) = [h for h in read_folder("t", dump / "rank0") if h.format == "float8_e5m2"]
    assert alone.params["1.bias"]["saturated"] == [0.0] * 3 and alone.steps == [0, 1, 2]


def test_without_fp8_health_the_report_has_no_fp8_section(runs, tmp_path):
    summary = _summary(runs, "grad_probe")
    folder = summary["tests"]["test_grad.py::test_clean"]["dump_paths"][0]
    with open(Path(folder) / "rank0" / "grad_summary_0.csv", encoding="utf-8-sig", newline="") as f:
        assert next(csv.reader(f))[-1] == "shape"  # msprobe's columns only
    page = render(summary, tmp_path / "report.html")
    assert 'id="params"' in page and 'id="fp8"' not in page and "FP8 health" not in page


def test_a_summary_row_missing_a_field_fails_naming_it(runs, tmp_path):
    summary = _summary(runs, "free_benchmark")
    del summary["apis"]["Torch.expm1"]["worst_score"]
    with pytest.raises(SummaryFormatError, match=r"apis\['Torch.expm1'\] lacks worst_score"):
        render_html(summary, tmp_path / "report.html")
    summary = _summary(runs, "online_dispatch")
    summary["ops"]["seeded_dispatch.scaled_tanh.default"]["checked"] = 1  # a key the reader does not know
    with pytest.raises(SummaryFormatError, match="has unknown checked"):
        render_html(summary, tmp_path / "report.html")
    assert not (tmp_path / "report.html").exists()


def test_a_clean_session_says_nothing_flagged_and_shows_its_margins(runs, tmp_path):
    summary = _summary(runs, "free_benchmark")
    summary["apis"] = {api: row for api, row in summary["apis"].items() if not row["flagged"]}
    page = render(summary, tmp_path / "report.html")
    apis = section(page, "apis")
    assert "Nothing flagged" in apis and "<details open>" in apis and "closest first" in apis
    scores = [row["worst_score"] for row in summary["apis"].values() if row["worst_score"] is not None]
    assert len(scores) >= 3
    shown = [float(x) for x in re.findall(r"<td>([0-9.e+-]+)\u00d7</td>", apis)]
    assert shown == sorted(shown, reverse=True) and len(shown) == len(scores)  # closest first
    (plot,) = plots_of(apis)
    assert plot.get("aria-label") == "worst error per API relative to its threshold"
    assert len(having(plot, "p-bar")) == len(scores) and max(map(bar_end, having(plot, "p-bar"))) < float(
        having(plot, "p-ref")[0].get("x1"))  # every bar short of the threshold


@pytest.fixture(scope="module")
def realistic_report(runs, tmp_path_factory) -> Path:
    """One report with every section: the free_benchmark run's, with the online_dispatch run's ops
    and gradient comparisons (as a merged summary carries them)."""
    summary = _summary(runs, "free_benchmark")
    summary["ops"] = _summary(runs, "online_dispatch")["ops"]
    summary["similarities"] = {
        "test_fb.py::test_clean_model vs golden": {
            "steps": [0, 1, 2, 3, 4, 5], "params": {"conv1.weight": [0.999, 0.998, 0.997, 0.93, 0.92, 0.91]},
            "summary": [0.998, 0.997, 0.996, 0.95, 0.94, 0.94]},
        "test_fb.py::test_risky vs golden": {
            "steps": [0, 1, 2], "params": {"attn.q.weight": [0.999, 0.999, 0.998]}, "summary": [0.999, 0.998, 0.998]}}
    return render_html(summary, Path(summary["config"]["dump_path"]) / "realistic.html")


def test_realistic_report_is_self_contained_with_valid_plots(realistic_report):
    page = realistic_report.read_text(encoding="utf-8")
    plots = plots_of(page)
    sim = "gradient similarity per step: test_fb.py::"
    assert [p.get("aria-label") for p in plots] == [
        "worst error per API relative to its threshold", f"{sim}test_clean_model vs golden",
        f"{sim}test_risky vs golden", "worst cosine per failing op"]
    for plot in plots:
        assert size(plot)[0] >= 400 and size(plot)[1] >= 100
        assert having(plot, "p-bar") or having(plot, "p-series")  # something is drawn
    assert "<script" not in page.lower()
    assert not re.search(r'(src|href)="(https?:)?//', page) and "<link" not in page and "<img" not in page
    # a plot's only references are to its own clip paths and patterns, never to another resource
    ids = re.findall(r' id="([^"]+)"', page)
    refs = re.findall(r"url\(([^)]*)\)", page)
    assert refs and all(r.startswith("#") and r[1:] in ids for r in refs) and len(ids) == len(set(ids))
    text = text_of(page)
    for expected in ("Torch.expm1", "flagged at step 3", "directions close", "seeded_dispatch.scaled_tanh.default",
                     "torch 2.", "improve_precision", "probe stop: RuntimeError"):
        assert expected in text, expected


@pytest.mark.skipif(find_chromium() is None, reason="headless Chromium not installed (.ci/run installs it)")
def test_screenshot_in_headless_chromium(tmp_path, realistic_report):
    png = screenshot(realistic_report, tmp_path / "report.png", width=1280, height=1800)
    shot = Image.open(png)
    assert shot.size == (1280, 1800)
    gray = np.asarray(shot.convert("L"), dtype=float)
    assert gray.std() > 20
    assert (gray < 200).mean() > 0.02  # text, bars and lines, not a white page
    # the same checks see a blank page as blank
    blank = tmp_path / "blank.html"
    blank.write_text("<!DOCTYPE html><html><body style='background:#fff'></body></html>")
    empty = np.asarray(Image.open(screenshot(blank, tmp_path / "blank.png", width=640, height=480)).convert("L"),
                       dtype=float)
    assert empty.shape == (480, 640) and empty.std() < 1


def _renamed(table: dict, old: str, new: str) -> dict:
    return {new if k == old else k: v for k, v in table.items()}


def test_hostile_strings_are_escaped(runs, tmp_path):
    """Names come from user code: a real summary with an API, a test, an op and an error renamed."""
    evil = "<script>alert(1)</script>"
    nodeid = 'tests/x.py::test_a["><img src=x onerror=alert(2)>]'
    summary = _summary(runs, "free_benchmark")
    summary["device"], summary["versions"] = evil, {evil: evil}
    summary["config"]["free_benchmark"]["list"] = [evil]
    summary["apis"] = _renamed(summary["apis"], "Torch.expm1", evil)
    summary["apis"][evil]["tests"] = [nodeid]
    summary["apis"][evil]["first_flagged"] = evil
    entry = summary["tests"].pop("test_fb.py::test_risky")
    entry.update(flagged_apis=[evil], csv_files=["javascript:alert(3)", f"a/{evil}.csv"],
                 errors=[{"call": evil, "error": f"ValueError: {evil}", "count": 2}])
    summary["tests"][nodeid] = entry
    summary["ops"] = _renamed(_summary(runs, "online_dispatch")["ops"], "seeded_dispatch.scaled_tanh.default", evil)
    summary["similarities"] = {nodeid: {"steps": [0, 1], "params": {evil: [0.5, 0.4]}}}
    page = render(summary, tmp_path / "report.html")
    assert "<script" not in page.lower()
    assert "<img src=x" not in page and "onerror=alert(2)>" not in page
    assert "&lt;script&gt;alert(1)&lt;/script&gt;" in page.replace("<wbr>", "")
    hrefs = re.findall(r'href="([^"]*)"', page)
    assert hrefs and not any(re.match(r"[a-z]+:", h) for h in hrefs)  # no scheme can be injected
    plots = plots_of(page)  # they parse: every name escaped in them too
    assert len(plots) == 3 and "</script>" not in page
    apis, sims, ops = plots
    assert evil in texts(apis, "p-label") and evil in texts(ops, "p-label") and evil in texts(sims, "p-legend")
    assert sims.get("aria-label") == f"gradient similarity per step: {nodeid}"


@pytest.mark.parametrize("tool", ["free_benchmark", "grad_probe", "online_dispatch"])
def test_empty_session(tmp_path, tool):
    page = render_html({"tool": tool}, tmp_path / "report.html").read_text(encoding="utf-8")
    assert "No test ran under the probe." in page
    assert "<svg" not in page and "<img" not in page
    assert f"msprobe report: {tool}" in page


def test_many_failing_ops_cap_the_plot_not_the_table(runs, tmp_path):
    summary = _summary(runs, "online_dispatch")
    (row,) = [r for r in summary["ops"].values() if r["failed"]]
    summary["ops"] = {f"aten.op{i}.default": dict(row, worst_cosine=0.5 + i / 100) for i in range(45)}
    summary["ops"]["aten.div.Tensor"] = dict(row, worst_cosine="nan")
    page = render(summary, tmp_path / "report.html")
    text = text_of(section(page, "ops"))
    assert "46 of 46 ops failed" in text
    assert f"The plot shows the {PLOT_MAX_BARS} worst ops; 6 more are in the table." in text
    rows = rows_of(section(page, "ops"))
    assert rows[:3] == ["aten.div.Tensor", "aten.op0.default", "aten.op1.default"] and len(rows) == 46
    (plot,) = plots_of(page)
    bars = having(plot, "p-bar")
    assert len(bars) == PLOT_MAX_BARS and texts(plot, "p-label") == rows[:PLOT_MAX_BARS]
    assert having(plot, "p-off") == bars[:1]  # the NaN cosine: hatched across the axis, not a bar of 0
    assert bar_end(bars[0]) > max(map(bar_end, bars[1:])) and bar_end(bars[1]) < bar_end(bars[2])


def test_large_free_benchmark_session_caps_the_plot(runs, tmp_path):
    summary = _summary(runs, "free_benchmark")
    row = summary["apis"]["Torch.expm1"]
    apis = {f"Torch.api_{i}": dict(row, worst_max_rel=row["threshold"] * (1 + i)) for i in range(100)}
    page = render(dict(summary, apis=apis), tmp_path / "report.html")
    text = text_of(section(page, "apis"))
    assert f"The plot shows the {PLOT_MAX_BARS} APIs nearest or beyond their thresholds; 60 more are in the tables." in text
    (plot,) = plots_of(section(page, "apis"))
    short = render(dict(summary, apis=dict(list(apis.items())[:5])), tmp_path / "short.html")
    (small,) = plots_of(section(short, "apis"))
    assert len(having(plot, "p-bar")) == PLOT_MAX_BARS and len(having(small, "p-bar")) == 5  # not 100
    assert texts(plot, "p-label")[0] == "Torch.api_99"  # the farthest beyond its threshold first
    assert size(plot)[1] > 4 * size(small)[1]


def test_evidence_links_resolve_from_the_report(runs, tmp_path):
    summary = _summary(runs, "free_benchmark")
    dump = Path(summary["config"]["dump_path"])
    report = render_html(summary, dump / "links.html")
    hrefs = re.findall(r'<a href="([^"#][^"]*)"', report.read_text(encoding="utf-8"))
    csvs = summary["tests"]["test_fb.py::test_risky"]["csv_files"]
    assert hrefs == ["tests/test_fb.py_test_risky/step0/rank0/free_benchmark.csv"] and len(csvs) == 1
    from urllib.parse import unquote

    assert (report.parent / unquote(hrefs[0])).resolve() == Path(csvs[0]).resolve()
    # a file outside the dump, under a name with a space: relative, quoted
    outside = tmp_path / "elsewhere" / "run dir" / "grad.csv"
    outside.parent.mkdir(parents=True)
    outside.write_text("x\n")
    summary["tests"]["test_fb.py::test_risky"]["csv_files"] = [str(outside)]
    page = render_html(summary, tmp_path / "out" / "r.html").read_text(encoding="utf-8")
    (href,) = re.findall(r'<a href="([^"#][^"]*)"', page)
    assert href == "../elsewhere/run%20dir/grad.csv"


def test_probe_errors_are_listed_and_linked(runs, tmp_path):
    page = render(_summary(runs, "free_benchmark"), tmp_path / "report.html")
    errors = section(page, "errors")
    assert "probe stop: RuntimeError: the tensor may have escaped" in errors
    anchor = re.search(r'<a href="#(err-[0-9a-f]+)">1</a>', page)
    assert anchor and f'id="{anchor.group(1)}"' in errors


@pytest.mark.parametrize("bad", [None, "free-benchmark", 3])
def test_unknown_tool_is_a_config_error(tmp_path, bad):
    with pytest.raises(ConfigError, match="tool") as info:
        render_html({"tool": bad}, tmp_path / "report.html")
    assert "free_benchmark" in str(info.value) and "online_dispatch" in str(info.value)
    assert not (tmp_path / "report.html").exists()


def test_the_report_never_imports_matplotlib(runs, tmp_path):
    """The plots are SVG text: a session's report must not pay for matplotlib's import and first
    render (~0.6 s, most of what the report cost a suite of small tests)."""
    summary = _summary(runs, "free_benchmark")
    summary["ops"] = _summary(runs, "online_dispatch")["ops"]
    summary["similarities"] = {"t vs golden": {"steps": [0, 1], "params": {"w": [1.0, 0.9]}}}
    path = tmp_path / "summary.json"
    path.write_text(json.dumps(summary))
    code = textwrap.dedent(f"""
        import json, sys
        from pytest_msprobe.reports.html import render_html
        page = render_html(json.load(open({str(path)!r})), {str(tmp_path / 'r.html')!r}).read_text()
        assert page.count("<svg ") == 3, page.count("<svg ")
        assert "matplotlib" not in sys.modules
    """)
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr


def test_names_are_drawn_literally(runs, tmp_path):
    """Names that matplotlib misread (a ``$…$`` pair was mathtext, a leading ``_`` dropped a legend
    entry: torch.compile's ``_orig_mod.``) and markup characters are drawn as they are."""
    nodeid = "tests/x.py::test_cost[$x$-$\\frac{1}{$ & <b>]"
    param = "_orig_mod.layers.0.weight"
    summary = _summary(runs, "free_benchmark")
    summary["apis"] = _renamed(summary["apis"], "Torch.expm1", "Functional.$gelu$")
    summary["apis"]["Functional.$gelu$"].update(tests=[nodeid], first_flagged="$bad")
    summary["similarities"] = {nodeid: {"steps": [0, 1, 2], "params": {param: [1.0, 0.99, 0.5],
                                                                       "$\\frac{1}{$": [1.0, 1.0, 1.0]}}}
    page = render(summary, tmp_path / "report.html")
    apis, sims = plots_of(page)
    assert texts(apis, "p-label")[0] == "Functional.$gelu$"
    assert texts(sims, "p-legend")[1:3] == [param, "$\\frac{1}{$"]
    assert sims.get("aria-label") == f"gradient similarity per step: {nodeid}"


def fake_browser(tmp_path: Path, body: str) -> str:
    script = tmp_path / "fake-chromium"
    script.write_text("#!/bin/sh\n" + body + "\n")
    script.chmod(script.stat().st_mode | stat.S_IEXEC)
    return str(script)


@pytest.mark.skipif(os.name != "posix", reason="shell-script stand-in for the browser")
def test_screenshot_timeout_kills_the_browser_and_its_helpers(tmp_path):
    pid_file = tmp_path / "helper.pid"
    browser = fake_browser(tmp_path, f"sleep 60 & echo $! > {pid_file}; wait")
    html_file = tmp_path / "r.html"
    html_file.write_text("<html></html>")
    start = time.monotonic()
    with pytest.raises(TimeoutError, match="did not finish"):
        screenshot(html_file, tmp_path / "r.png", timeout=1.0, browser=browser)
    assert time.monotonic() - start < 30
    helper = int(pid_file.read_text())
    status = Path(f"/proc/{helper}/status")
    deadline = time.monotonic() + 5
    while status.exists() and "zombie" not in status.read_text() and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not status.exists() or "zombie" in status.read_text()


@pytest.mark.skipif(os.name != "posix", reason="shell-script stand-in for the browser")
def test_screenshot_reports_a_browser_that_writes_nothing(tmp_path):
    browser = fake_browser(tmp_path, "echo 'cannot open display' >&2; exit 3")
    html_file = tmp_path / "r.html"
    html_file.write_text("<html></html>")
    stale = tmp_path / "r.png"
    stale.write_bytes(b"old")
    with pytest.raises(RuntimeError, match="exited with 3") as info:
        screenshot(html_file, stale, browser=browser)
    assert "cannot open display" in str(info.value)
    assert not stale.exists()  # a stale picture never passes for a new one


def test_screenshot_arguments(tmp_path, monkeypatch):
    with pytest.raises(ConfigError, match="width"):
        screenshot(tmp_path / "r.html", tmp_path / "r.png", width=0)
    with pytest.raises(ConfigError, match="height"):
        screenshot(tmp_path / "r.html", tmp_path / "r.png", height=1.5)
    monkeypatch.setenv("PATH", str(tmp_path))
    with pytest.raises(FileNotFoundError, match="apt-get install chromium"):
        screenshot(tmp_path / "r.html", tmp_path / "r.png")


def test_the_reproduce_command_quotes_the_test_id_for_the_shell(tmp_path):
    nodeid = "tests/x.py::test_api[it's $HOME]"
    session = {"tool": "catalogue", "api_checks": [{"api": "torch.exp", "dtype": "float16", "pert_mode": "add_noise",
                                                     "device": "cpu", "flagged": "max_rel 0.5", "test": nodeid}]}
    page = render_html(session, tmp_path / "report.html").read_text(encoding="utf-8")
    import html as _html
    import shlex

    assert _html.escape(f"pytest {shlex.quote(nodeid)}") in page.replace("<wbr>", "")


def test_the_config_chips_show_fuzz_device_only_where_it_matters(tmp_path):
    for mode, shown in (("add_noise", False), ("to_cpu", True)):
        config = {"task": "free_benchmark", "free_benchmark": {"pert_mode": mode, "fuzz_device": "npu"}}
        page = render_html({"tool": "free_benchmark", "config": config}, tmp_path / "r.html").read_text(encoding="utf-8")
        chips = page[page.index('<div class="config">'):page.index("<details><summary>full config")]
        assert ("fuzz_device" in chips) is shown


def test_the_report_style_is_package_data(tmp_path):
    """report.css is read as a package resource: a wheel without it would write unstyled reports,
    so setuptools must be told to ship every non-Python file of the reports package."""
    tomllib = pytest.importorskip("tomllib")
    root = REPO
    config = tomllib.loads((root / "pyproject.toml").read_text(encoding="utf-8"))
    shipped = set(config["tool"]["setuptools"]["package-data"]["pytest_msprobe.reports"])
    folder = root / "pytest_msprobe" / "reports"
    data = {p.name for p in folder.iterdir() if p.is_file() and p.suffix not in (".py", ".pyc")}
    assert data == {"report.css"} and data <= shipped
    page = render_html({"tool": "grad_probe"}, tmp_path / "r.html").read_text(encoding="utf-8")
    assert (folder / "report.css").read_text(encoding="utf-8") in page
