"""report.html: a self-contained page (escaped, no scripts, no external resources) with the tool's
findings, plots that decode as PNGs, links to the evidence that resolve, and a screenshot in
headless Chromium that is the requested size and not blank."""

from __future__ import annotations

import base64
import html
import io
import os
import re
import stat
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from probes.core.errors import ConfigError
from pytest_msprobe.reports.html import PLOT_MAX_BARS, find_chromium, render_html, screenshot

Image = pytest.importorskip("PIL.Image")
np = pytest.importorskip("numpy")

T1 = "tests/test_model.py::test_train_bf16[resnet]"
T2 = "tests/test_model.py::test_attention_fp16"
T3 = "tests/test_ops.py::test_clean"
IMG = re.compile(r'src="data:image/png;base64,([A-Za-z0-9+/=]+)"')


def realistic_session(root: Path) -> dict:
    """A session with flagged APIs (one with a string worst figure), two gradient comparisons (one
    flagged at step 3), failing online_dispatch ops and a probe error."""
    csv1 = root / "tests" / "t1" / "step0" / "rank0" / "free_benchmark.csv"
    csv2 = root / "tests" / "t2" / "step0" / "rank0" / "free_benchmark.csv"
    for csv in (csv1, csv2):
        csv.parent.mkdir(parents=True, exist_ok=True)
        csv.write_text("rank,pert_mode,stage,step,api_name,max_rel,dtype,shape,output_index\n")
    return {
        "tool": "free_benchmark",
        "device": "cpu",
        "versions": {"torch": "2.13.0", "mindspore": "2.10.0"},
        "config": {"task": "free_benchmark", "dump_path": str(root), "rank": [], "step": [], "level": "L1",
                   "free_benchmark": {"pert_mode": "improve_precision", "handler_type": "check"}},
        "tests": {
            T1: {"outcome": "failed", "flagged_apis": ["Functional.softmax", "Torch.matmul", "Tensor.__add__"],
                 "csv_files": [str(csv1)], "errors": []},
            T2: {"outcome": "failed", "flagged_apis": ["Functional.scaled_dot_product_attention"],
                 "csv_files": [str(csv2)],
                 "errors": [{"api": "Torch.nonzero", "error": "RuntimeError: dynamic shape", "count": 3}]},
            T3: {"outcome": "passed", "flagged_apis": [], "csv_files": [], "errors": []},
        },
        "apis": {
            "Functional.softmax": {"checked": 40, "flagged": 12, "worst_max_rel": 0.0316, "threshold": 0.004,
                                   "tests": [T1], "first_flagged": "Functional.softmax.3.forward"},
            "Torch.matmul": {"checked": 88, "flagged": 2, "worst_max_rel": 0.0051, "threshold": 0.004,
                             "tests": [T1], "first_flagged": "Torch.matmul.7.forward"},
            "Tensor.__add__": {"checked": 300, "flagged": 1, "worst_max_rel": "nan_mismatch", "threshold": 0.004,
                               "tests": [T1], "first_flagged": "Tensor.__add__.41.forward"},
            "Functional.scaled_dot_product_attention": {
                "checked": 6, "flagged": 6, "worst_max_rel": 0.41, "threshold": 0.002, "tests": [T2],
                "first_flagged": "Functional.scaled_dot_product_attention.0.forward"},
            "Functional.gelu": {"checked": 40, "flagged": 0, "worst_max_rel": None, "threshold": None,
                                "tests": [], "first_flagged": None},
        },
        "similarities": {
            T1: {"steps": [0, 1, 2, 3, 4, 5], "first_step_min": 0.97, "max_drop": 0.03,
                 "params": {"conv1.weight": [0.999, 0.998, 0.997, 0.93, 0.92, 0.91],
                            "fc.weight": [0.995, 0.994, 0.993, 0.992, 0.99, 0.99]},
                 "summary": [0.998, 0.997, 0.996, 0.95, 0.94, 0.94]},
            T2: {"steps": [0, 1, 2, 3, 4, 5],
                 "params": {"attn.q.weight": [0.999, 0.999, 0.998, 0.998, 0.997, 0.997]},
                 "summary": [0.999, 0.998, 0.998, 0.997, 0.997, 0.996]},
        },
        "ops": {
            "aten.addmm.default": {"checked": 12, "failed": 2, "worst_cosine": 0.962, "worst_max_abs_err": 0.021,
                                   "tests": [T1]},
            "aten._softmax.default": {"checked": 12, "failed": 1, "worst_cosine": 0.71, "worst_max_abs_err": 0.4,
                                      "tests": [T2]},
            "aten.relu.default": {"checked": 30, "failed": 0, "worst_cosine": 1.0, "worst_max_abs_err": 0.0,
                                  "tests": []},
        },
    }


def text_of(page: str) -> str:
    """The page's visible text, roughly: tags and word-break hints dropped."""
    return html.unescape(re.sub(r"<[^>]+>", "", page.replace("<wbr>", "")))


def section(page: str, name: str) -> str:
    match = re.search(rf'<section id="{name}">(.*?)</section>', page, re.S)
    assert match, f"no section {name}"
    return match.group(1)


def decoded_pngs(page: str) -> list:
    images = []
    for data in IMG.findall(page):
        im = Image.open(io.BytesIO(base64.b64decode(data, validate=True)))
        assert im.format == "PNG"
        im.load()  # raises on a truncated or corrupt stream
        images.append(im)
    return images


@pytest.fixture(scope="module")
def realistic_report(tmp_path_factory) -> Path:
    dump = tmp_path_factory.mktemp("realistic") / "dump"
    return render_html(realistic_session(dump), dump / "report.html")


def test_realistic_report_is_self_contained_with_valid_plots(realistic_report):
    page = realistic_report.read_text(encoding="utf-8")
    images = decoded_pngs(page)
    assert len(images) == 4  # max_rel per API, two similarity plots, failing ops
    for im in images:
        assert im.size[0] >= 400 and im.size[1] >= 150
        assert np.asarray(im.convert("L")).std() > 10  # something is drawn
    assert "<script" not in page.lower()
    assert not re.search(r'(src|href)="(https?:)?//', page) and "<link" not in page and "url(" not in page
    text = text_of(page)
    for expected in ("Functional.softmax", "nan_mismatch", "flagged at step 3", "directions close",
                     "aten._softmax.default", "RuntimeError: dynamic shape", "torch 2.13.0", "improve_precision"):
        assert expected in text, expected
    assert "aten.relu.default" not in section(page, "ops")  # it passed the comparison
    # the string figure is off the scale: first in the table, then by ratio to the threshold
    apis = re.findall(r"<tr><td><code>(.*?)</code>", section(page, "apis"))
    assert [a.replace("<wbr>", "") for a in apis] == [
        "Tensor.__add__", "Functional.scaled_dot_product_attention", "Functional.softmax", "Torch.matmul",
        "Functional.gelu"]  # the last: within its threshold, in the "closest first" table


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


def test_hostile_strings_are_escaped(tmp_path):
    evil = "<script>alert(1)</script>"
    nodeid = 'tests/x.py::test_a["><img src=x onerror=alert(2)>]'
    session = {
        "tool": "free_benchmark",
        "device": evil,
        "versions": {evil: evil},
        "config": {"task": "free_benchmark", "dump_path": evil, "free_benchmark": {"list": [evil]}},
        "tests": {nodeid: {"outcome": "failed", "flagged_apis": [evil], "errors": [f"ValueError: {evil}"],
                           "csv_files": ["javascript:alert(3)", f"a/{evil}.csv"]}},
        "apis": {evil: {"checked": 1, "flagged": 1, "worst_max_rel": evil, "threshold": 0.004, "tests": [nodeid],
                        "first_flagged": evil}},
        "similarities": {nodeid: {"steps": [0, 1], "params": {evil: [0.5, 0.4]}}},
        "ops": {evil: {"checked": 1, "failed": 1, "worst_cosine": 0.1, "worst_max_abs_err": 2.0, "tests": [nodeid]}},
    }
    page = render_html(session, tmp_path / "report.html").read_text(encoding="utf-8")
    assert "<script" not in page.lower()
    assert "<img src=x" not in page and "onerror=alert(2)>" not in page
    assert "&lt;script&gt;alert(1)&lt;/script&gt;" in page.replace("<wbr>", "")
    hrefs = re.findall(r'href="([^"]*)"', page)
    assert hrefs and not any(re.match(r"[a-z]+:", h) for h in hrefs)  # no scheme can be injected
    assert len(decoded_pngs(page)) == 3


@pytest.mark.parametrize("tool", ["free_benchmark", "grad_probe", "online_dispatch"])
def test_empty_session(tmp_path, tool):
    page = render_html({"tool": tool}, tmp_path / "report.html").read_text(encoding="utf-8")
    assert "No test ran under the probe." in page
    assert "<img" not in page
    assert f"msprobe report: {tool}" in page


@pytest.mark.parametrize("tool, tests_entry, data", [
    ("free_benchmark", {"flagged_apis": [], "csv_files": [], "errors": []},
     {"apis": {"Functional.gelu": {"checked": 4, "flagged": 0, "worst_max_rel": None, "threshold": None,
                                   "tests": [], "first_flagged": None}}}),
    ("grad_probe", {"nonfinite_params": [], "dump_paths": [], "errors": []}, {"params": {}}),
    ("online_dispatch", {"failing_ops": [], "csv_files": [], "errors": []},
     {"ops": {"aten.add.Tensor": {"checked": 9, "failed": 0, "worst_cosine": 1.0, "worst_max_abs_err": 0.0,
                                  "tests": []}}}),
])
def test_clean_session_says_nothing_flagged(tmp_path, tool, tests_entry, data):
    session = {"tool": tool, "tests": {"t.py::test_ok": dict(tests_entry, outcome="passed")}, **data}
    page = render_html(session, tmp_path / "report.html").read_text(encoding="utf-8")
    assert "Nothing flagged" in page
    assert "<img" not in page
    assert "No probe error." in page
    assert "t.py::test_ok" in text_of(page)


def test_grad_probe_session(tmp_path):
    session = realistic_session(tmp_path)
    session = {"tool": "grad_probe", "similarities": session["similarities"],
               "tests": {T1: {"outcome": "failed", "nonfinite_params": ["conv1.weight"], "dump_paths": [],
                              "errors": []}},
               "params": {"conv1.weight": {"nonfinite_steps": 2, "first": "step 4: nan 3", "tests": [T1]}}}
    # a comparison may carry its own thresholds: 0.9995 flags the first step of T2
    session["similarities"][T2]["first_step_min"] = 0.9995
    page = render_html(session, tmp_path / "report.html").read_text(encoding="utf-8")
    assert page.index('id="params"') < page.index('id="similarities"') < page.index('id="tests"')
    assert 'id="apis"' not in page and 'id="ops"' not in page
    sims = text_of(section(page, "similarities"))
    assert "2 of 2 comparison(s) flagged" in sims
    assert "flagged at step 3" in sims and "flagged at step 0" in sims
    assert "conv1.weight: similarity 0.93 dropped by 0.067 > 0.03 from 0.997 at step 2" in sims
    assert "step 4: nan 3" in text_of(section(page, "params"))
    assert len(decoded_pngs(page)) == 2


def test_online_dispatch_session(tmp_path):
    ops = {f"aten.op{i}.default": {"checked": 3, "failed": 1, "worst_cosine": 0.5 + i / 100, "worst_max_abs_err": 0.1,
                                   "tests": ["t::a"]} for i in range(45)}
    ops["aten.div.Tensor"] = {"checked": 1, "failed": 1, "worst_cosine": "nan", "worst_max_abs_err": None,
                              "tests": ["t::a"]}
    page = render_html({"tool": "online_dispatch", "ops": ops, "tests": {"t::a": {"failing_ops": list(ops)}}},
                       tmp_path / "report.html").read_text(encoding="utf-8")
    text = text_of(section(page, "ops"))
    assert "46 of 46 ops failed" in text
    assert f"The plot shows the {PLOT_MAX_BARS} worst ops; 6 more are in the table." in text
    rows = re.findall(r"<tr><td><code>(.*?)</code>", section(page, "ops"))
    assert [r.replace("<wbr>", "") for r in rows[:3]] == ["aten.div.Tensor", "aten.op0.default", "aten.op1.default"]
    assert len(rows) == 46
    assert len(decoded_pngs(page)) == 1


def test_large_free_benchmark_session_caps_the_plot(tmp_path):
    apis = {f"Torch.api_{i}": {"checked": 2, "flagged": 1, "worst_max_rel": 0.004 * (1 + i), "threshold": 0.004,
                               "tests": ["t::a"], "first_flagged": f"Torch.api_{i}.0.forward"} for i in range(100)}
    page = render_html({"tool": "free_benchmark", "apis": apis}, tmp_path / "report.html").read_text(encoding="utf-8")
    text = text_of(section(page, "apis"))
    assert f"The plot shows the {PLOT_MAX_BARS} APIs nearest or beyond their thresholds; 60 more are in the tables." in text
    (plot,) = decoded_pngs(page)
    short = render_html({"tool": "free_benchmark", "apis": dict(list(apis.items())[:5])}, tmp_path / "short.html")
    (small,) = decoded_pngs(short.read_text(encoding="utf-8"))
    assert plot.size[1] > 4 * small.size[1]  # 40 bars, not 5, and not 100
    assert plot.size[1] < 16 * small.size[1]


def test_evidence_links_resolve_from_the_report(tmp_path):
    dump = tmp_path / "dump"
    inside = dump / "tests" / "t_a" / "step0" / "rank0" / "free_benchmark.csv"
    outside = tmp_path / "elsewhere" / "run dir" / "grad.csv"
    for f in (inside, outside):
        f.parent.mkdir(parents=True)
        f.write_text("x\n")
    session = {"tool": "free_benchmark",
               "tests": {"t::a": {"outcome": "failed", "flagged_apis": ["A"], "csv_files": [str(inside)]},
                         "t::b": {"outcome": "passed", "dump_paths": [str(outside)], "csv_files": []}}}
    report = render_html(session, dump / "report.html")
    hrefs = re.findall(r'<a href="([^"#][^"]*)"', report.read_text(encoding="utf-8"))
    assert hrefs == ["tests/t_a/step0/rank0/free_benchmark.csv", "../elsewhere/run%20dir/grad.csv"]
    from urllib.parse import unquote

    for href, target in zip(hrefs, (inside, outside)):
        assert (report.parent / unquote(href)).resolve() == target.resolve()


def test_probe_errors_are_listed_and_linked(tmp_path):
    session = {"tool": "grad_probe",
               "tests": {"t::a": {"outcome": "passed", "errors": ["OSError: disk full", {"step": 2, "error": "boom"}]}}}
    page = render_html(session, tmp_path / "report.html").read_text(encoding="utf-8")
    errors = section(page, "errors")
    assert "OSError: disk full" in errors and "step: 2; error: boom" in errors
    anchor = re.search(r'<a href="#(err-[0-9a-f]+)">2</a>', page)
    assert anchor and f'id="{anchor.group(1)}"' in errors


@pytest.mark.parametrize("bad", [None, "free-benchmark", 3])
def test_unknown_tool_is_a_config_error(tmp_path, bad):
    with pytest.raises(ConfigError, match="tool") as info:
        render_html({"tool": bad}, tmp_path / "report.html")
    assert "free_benchmark" in str(info.value) and "online_dispatch" in str(info.value)
    assert not (tmp_path / "report.html").exists()


def test_matplotlib_is_lazy_and_pyplot_untouched(tmp_path):
    code = textwrap.dedent(f"""
        import sys
        from pytest_msprobe.reports.html import render_html
        assert "matplotlib" not in sys.modules
        render_html({{"tool": "online_dispatch", "ops": {{"aten.add": {{"checked": 1, "failed": 1,
                     "worst_cosine": 0.5, "worst_max_abs_err": 1.0}}}}}}, {str(tmp_path / 'r.html')!r})
        assert "matplotlib" in sys.modules and "matplotlib.pyplot" not in sys.modules
    """)
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr


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


def test_names_matplotlib_would_misread_are_drawn_literally(tmp_path):
    """A ``$…$`` pair (mathtext; a malformed one raises) and a leading ``_`` (legends drop such
    labels: torch.compile's ``_orig_mod.``) must neither lose the report nor vanish from a plot."""
    from pytest_msprobe.reports import html as report_html

    nodeid = "tests/x.py::test_cost[$x$-$\\frac{1}{$]"
    param = "_orig_mod.layers.0.weight"
    session = {
        "tool": "free_benchmark",
        "tests": {nodeid: {"outcome": "failed", "flagged_apis": ["Functional.$gelu$"]}},
        "apis": {"Functional.$gelu$": {"checked": 1, "flagged": 1, "worst_max_rel": 0.5, "threshold": 0.004,
                                       "tests": [nodeid], "first_flagged": "$bad"}},
        "similarities": {nodeid: {"steps": [0, 1, 2], "params": {param: [1.0, 0.99, 0.5], "$\\frac{1}{$": [1.0, 1.0, 1.0]}}},
    }
    page = render_html(session, tmp_path / "report.html").read_text(encoding="utf-8")
    assert len(decoded_pngs(page)) == 2
    assert report_html._plot_text(param) != param and report_html._plot_text(param).strip() == param
    assert report_html._plot_text("$x$") == r"\$x\$"
    # the legend keeps the underscored name
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    fig = Figure()
    FigureCanvasAgg(fig)
    ax = fig.add_subplot(1, 1, 1)
    ax.plot([0, 1], [0, 1], label=report_html._plot_text(param))
    assert [t.get_text() for t in ax.legend().get_texts()] == [" " + param]


def test_the_reproduce_command_quotes_the_test_id_for_the_shell(tmp_path):
    nodeid = "tests/x.py::test_api[it's $HOME]"
    session = {"tool": "catalogue", "api_checks": [{"api": "torch.exp", "dtype": "float16", "pert_mode": "add_noise",
                                                     "device": "cpu", "flagged": "max_rel 0.5", "test": nodeid}]}
    page = render_html(session, tmp_path / "report.html").read_text(encoding="utf-8")
    import html as _html
    import shlex

    assert _html.escape(f"pytest {shlex.quote(nodeid)}") in page.replace("<wbr>", "")


def test_a_clean_run_shows_how_close_each_api_came(tmp_path):
    apis = {"Functional.gelu": {"checked": 4, "flagged": 0, "worst_max_rel": None, "worst_score": 0.25,
                                "dtypes": ["bfloat16"]},
            "Torch.exp": {"checked": 2, "flagged": 0, "worst_max_rel": None, "worst_score": 0.8, "dtypes": ["float16"]},
            "Torch.add": {"checked": 1, "flagged": 0, "worst_max_rel": None}}  # an older summary: no score
    page = render_html({"tool": "free_benchmark", "apis": apis, "tests": {"t::a": {"outcome": "passed"}}},
                       tmp_path / "report.html").read_text(encoding="utf-8")
    sec = section(page, "apis")
    assert "<details open>" in sec and "closest first" in sec
    names = [a.replace("<wbr>", "") for a in re.findall(r"<tr><td><code>(.*?)</code>", sec)]
    assert names == ["Torch.exp", "Functional.gelu", "Torch.add"]
    assert "0.8\u00d7" in sec and "0.25\u00d7" in sec
    # one plot of every API's margin against its threshold, also when nothing is flagged
    assert len(decoded_pngs(sec)) == 1 and 'alt="worst error per API relative to its threshold"' in sec


def test_the_config_chips_show_fuzz_device_only_where_it_matters(tmp_path):
    for mode, shown in (("add_noise", False), ("to_cpu", True)):
        config = {"task": "free_benchmark", "free_benchmark": {"pert_mode": mode, "fuzz_device": "npu"}}
        page = render_html({"tool": "free_benchmark", "config": config}, tmp_path / "r.html").read_text(encoding="utf-8")
        chips = page[page.index('<div class="config">'):page.index("<details><summary>full config")]
        assert ("fuzz_device" in chips) is shown
