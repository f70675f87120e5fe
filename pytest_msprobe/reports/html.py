"""report.html: the session's self-contained HTML report, built from the summary.json dictionary.

One file that a CI artifact viewer or a mail attachment shows as is: inline CSS, plots as base64
PNG data URIs, no script and no external resource. It is built from the summary dictionary only
(never from live probe objects), so an old summary.json can be re-rendered, and the report of an
xdist run is the report of its merged summary. Every string from the session is escaped: API
names, test ids, paths and error messages come from user code. Evidence links are relative to the
report, so the dump directory can be moved or downloaded as a whole.

matplotlib is imported on the first plot and drawn through its Agg canvas (Figure +
FigureCanvasAgg, never pyplot), so the user's backend is untouched. `screenshot` renders the
report in headless Chromium: how the report's own test checks that it really displays.
"""

from __future__ import annotations

import base64
import datetime as _dt
import hashlib
import html
import io
import json
import math
import os
import shlex
import shutil
import signal
import subprocess
import tempfile
import urllib.parse
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

from probes.core.config import TASKS
from probes.core.dispatch_metrics import COS_MAX_THRESHOLD, COS_THRESHOLD
from probes.core.errors import ConfigError
from probes.core.number_format import short_number
from probes.core.thresholds import DIRECTION_FIRST_STEP_MIN, DIRECTION_MAX_DROP
from probes.core.writers import write_text_atomic
from probes.grad_probe.direction_rule import SUMMARY_ROW, Flag, flag_series
from pytest_msprobe.reports.tables import (
    CHECKED_LABELS,
    ApiRow,
    OpRow,
    ParamRow,
    ProbeAccount,
    ProbeError,
    read_table,
)

# Bounds that keep a report of a huge suite readable and small; what is left out is counted.
PLOT_MAX_BARS = 40
TABLE_MAX_ROWS = 500
SIMILARITY_MAX_PLOTS = 24
SIMILARITY_MAX_LINES = 8
FLAGS_LISTED = 8
CELL_LIST_MAX = 5
ERRORS_LISTED = 200
LABEL_MAX_CHARS = 56

CHROMIUM_NAMES = ("chromium", "chromium-browser", "google-chrome", "google-chrome-stable", "chrome")
SCREENSHOT_TIMEOUT_S = 60.0

# Per tool: the per-test key listing its findings, and what they are called.
FINDINGS = {
    "free_benchmark": ("flagged_apis", "flagged APIs"),
    "grad_probe": ("nonfinite_params", "non-finite gradients"),
    "online_dispatch": ("failing_ops", "failing ops"),
}
EVIDENCE_KEYS = ("csv_files", "dump_paths")

_RED, _BLUE, _DARK_RED = "#c0392b", "#3b6ea8", "#7b1010"
CATALOGUE = "catalogue"  # the "tool" of a session that ran the API precision catalogue only


# --------------------------------------------------------------------------------------------
# public API
# --------------------------------------------------------------------------------------------

def render_html(session: Mapping[str, Any], out_path: str | os.PathLike[str]) -> Path:
    """Write the report of one session (the summary.json dictionary) to ``out_path``.

    Sections: header, the tool's findings (table and plot), gradient similarities when the
    session has them, tests with links to their evidence, probe errors. Sections of the other
    tools appear too when the session carries their data (a merged summary).
    """
    tool = session.get("tool") if isinstance(session, Mapping) else None
    if tool not in TASKS and tool != CATALOGUE:
        raise ConfigError("tool", tool, f"one of {', '.join(TASKS)} or {CATALOGUE}",
                          hint="render_html takes the summary.json dictionary of a session")
    out = Path(out_path)
    if tool == CATALOGUE:  # a session without --msprobe-task: the catalogue and/or per-API checks
        parts = [_catalogue_header(session)]
        if session.get("api_checks"):
            parts.append(_api_checks_section(session.get("api_checks")))
        if session.get("catalogue"):
            parts.append(_catalogue(session.get("catalogue")))
        return _write_doc(out, "msprobe report", parts)
    base = out.parent.resolve()
    tests = _mapping(session.get("tests"))
    # what the per-"test" entries are: pytest tests, or the ranks of a merged multi-rank run
    unit = str(session.get("unit") or "test")
    parts = [_header(session, tool, tests, unit)]
    account = ProbeAccount.from_dict("probe", session["probe"]) if "probe" in session else None
    checked = account.checked if account is not None else None
    sections = {  # per tool: (summary key, section builder)
        "free_benchmark": [("apis", lambda d: _apis_section(read_table(ApiRow, d), bool(tests), unit))],
        "grad_probe": [("params", lambda d: _params_section(read_table(ParamRow, d), bool(tests), unit)),
                       ("similarities", lambda d: _similarities_section(_mapping(d)))],
        "online_dispatch": [("ops", lambda d: _ops_section(read_table(OpRow, d), bool(tests), unit,
                                                           checked if tool == "online_dispatch" else None))],
    }
    for owner in [tool] + [t for t in TASKS if t != tool]:  # the session's own tool first
        for key, build in sections[owner]:
            if owner == tool or session.get(key):
                parts.append(build(session.get(key)))
    if session.get("api_checks"):
        parts.append(_api_checks_section(session.get("api_checks")))
    if session.get("catalogue"):
        parts.append(_catalogue(session.get("catalogue")))
    if any(_mapping(t).get("graphs") for t in tests.values()):
        parts.append(_graphs_section(tests, base))
    parts.append(_tests_section(tests, tool, base, unit))
    if account is not None:
        parts.append(_account_section(account, tool, unit))
    parts.append(_errors_section(tests, unit))
    return _write_doc(out, f"msprobe report: {tool}", parts)


def _write_doc(out: Path, title: str, parts: list[str]) -> Path:
    from pytest_msprobe.catalogue.report_section import CSS as CATALOGUE_CSS

    doc = (f'<!DOCTYPE html>\n<html lang="en"><head><meta charset="utf-8">'
           f'<meta name="viewport" content="width=device-width, initial-scale=1">'
           f"<title>{_e(title)}</title><style>{_CSS}{CATALOGUE_CSS}</style></head>\n<body><main>\n"
           + "\n".join(parts) + "\n</main></body></html>\n")
    # atomic: a CI job reading the report never sees half of it; 0644: it is meant to be shared
    return write_text_atomic(out, doc, mode=0o644)


def _api_checks_section(results: Any) -> str:
    """The @pytest.mark.msprobe_api checks: flagged ones first, each with its figure (the failing
    example's message) and the command that reruns it (Hypothesis then replays the same example)."""
    entries = [_mapping(r) for r in _list(results)]
    flagged = sorted((r for r in entries if r.get("flagged")), key=lambda r: (str(r.get("api")), str(r.get("dtype"))))
    clean = [r for r in entries if not r.get("flagged")]
    title = "<h2>Per-API checks (@pytest.mark.msprobe_api)</h2>"
    summary = (f'<p class="{"bad" if flagged else "ok"}">{len(flagged)} of {len(entries)} API \u00d7 dtype \u00d7 mode '
               "checks flagged; the rest stayed within their thresholds on every example.</p>")
    parts = [title, summary]
    if flagged:
        rows = [(_code(r.get("api")), _e(r.get("dtype")), _e(r.get("pert_mode")), _e(r.get("device")),
                 f'<span class="bad">{_e(r.get("flagged"))}</span>', _inputs_cell(r.get("inputs")),
                 _code(f"pytest {shlex.quote(str(r.get('test')))}")) for r in flagged[:TABLE_MAX_ROWS]]
        parts.append(_table(("API", "dtype", "mode", "device", "figure (failing example)", "minimal failing inputs",
                             "reproduce"), rows, "wide"))
        parts.append(_more(len(flagged) - TABLE_MAX_ROWS, "flagged checks"))
    if clean:
        clean.sort(key=lambda r: (str(r.get("api")), str(r.get("dtype")), str(r.get("pert_mode"))))
        rows = [(_code(r.get("api")), _e(r.get("dtype")), _e(r.get("pert_mode")), _e(r.get("device")))
                for r in clean[:TABLE_MAX_ROWS]]
        parts.append(f"<details><summary>{len(clean)} checks within their thresholds</summary>"
                     f"{_table(('API', 'dtype', 'mode', 'device'), rows)}"
                     f"{_more(len(clean) - TABLE_MAX_ROWS, 'checks')}</details>")
    return '<section id="api-checks">' + "".join(parts) + "</section>"


def _inputs_cell(inputs: Any) -> str:
    from pytest_msprobe.api.marker import inputs_lines

    entries = [_mapping(i) for i in _list(inputs)]
    if not entries:
        return '<span class="muted">\u2014</span>'
    return "<br>".join(f"<code>{_e(line)}</code>" for line in inputs_lines(entries))


def _catalogue(results: Any) -> str:
    from pytest_msprobe.catalogue.report_section import catalogue_section

    return catalogue_section(_list(results), _e, _code, _table, _hbar_plot, (_RED, _BLUE))


def _catalogue_header(session: Mapping[str, Any]) -> str:
    label = "API precision catalogue" if session.get("catalogue") else "per-API checks"
    cards = _cards(_outcome_cards(session, [], "test")) if _mapping(session.get("session")) else ""
    return _page_header(session, label, cards)


def _page_header(session: Mapping[str, Any], label: str, body: str) -> str:
    """The report's header: what ran, when, where and with which versions, then `body` (cards)."""
    date = session.get("date") or _dt.datetime.now(_dt.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    versions = _mapping(session.get("versions"))
    meta = [("date", date), ("device", session.get("device") or "\u2014"),
            ("versions", ", ".join(f"{k} {v}" for k, v in versions.items()) or "\u2014")]
    dl = "".join(f"<dt>{_e(k)}</dt><dd>{_e(v)}</dd>" for k, v in meta)
    return (f'<header><h1>msprobe report <span class="tool">{_e(label)}</span></h1>'
            f'<dl class="meta">{dl}</dl>{body}</header>')


def find_chromium() -> str | None:
    """The first Chromium-like browser on PATH, or None."""
    for name in CHROMIUM_NAMES:
        found = shutil.which(name)
        if found:
            return found
    return None


def screenshot(html_path: str | os.PathLike[str], png_path: str | os.PathLike[str], width: int = 1280,
               height: int = 2000, timeout: float = SCREENSHOT_TIMEOUT_S, browser: str | None = None) -> Path:
    """Render ``html_path`` in headless Chromium into a ``width`` x ``height`` PNG.

    Raises FileNotFoundError when no browser is found, TimeoutError when it does not finish in
    ``timeout`` seconds (the browser and its helper processes are killed), RuntimeError when it
    writes no picture.
    """
    for key, value in (("width", width), ("height", height)):
        if isinstance(value, bool) or not isinstance(value, int) or not 0 < value <= 16384:
            raise ConfigError(key, value, "an integer in [1, 16384] (pixels)")
    exe = browser or find_chromium()
    if exe is None:
        raise FileNotFoundError(f"no headless Chromium on PATH (looked for {', '.join(CHROMIUM_NAMES)}); "
                                "install one, e.g. `apt-get install chromium`")
    png = Path(png_path).resolve()
    png.parent.mkdir(parents=True, exist_ok=True)
    if png.exists():
        png.unlink()  # a stale picture must not pass for a new one
    uri = Path(html_path).resolve().as_uri()
    with tempfile.TemporaryDirectory(prefix="msprobe-chromium-") as profile:
        cmd = [exe, "--headless", "--disable-gpu", "--no-sandbox", "--hide-scrollbars", "--no-first-run",
               "--no-default-browser-check", "--disable-extensions", "--force-device-scale-factor=1",
               f"--user-data-dir={profile}", f"--screenshot={png}", f"--window-size={width},{height}", uri]
        proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                start_new_session=(os.name == "posix"))
        try:
            _, err = proc.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            _kill_tree(proc)
            raise TimeoutError(f"{exe} did not finish the screenshot of {uri} in {timeout} s") from None
    if not png.is_file():
        tail = err.decode("utf-8", "replace").strip()[-2000:]
        raise RuntimeError(f"{exe} exited with {proc.returncode} and wrote no screenshot to {png}:\n{tail}")
    return png


def _kill_tree(proc: subprocess.Popen) -> None:
    """Chromium forks helpers (zygote, GPU, renderers): kill the session it leads, then reap it."""
    try:
        if os.name == "posix":
            os.killpg(proc.pid, signal.SIGKILL)
        else:
            proc.kill()
    except ProcessLookupError:
        pass
    proc.communicate()


# --------------------------------------------------------------------------------------------
# formatting
# --------------------------------------------------------------------------------------------

def _e(value: Any) -> str:
    return html.escape(str(value), quote=True)


def _mapping(value: Any) -> Mapping[str, Any]:
    return value if isinstance(value, Mapping) else {}


def _list(value: Any) -> list[Any]:
    if value is None or isinstance(value, (str, bytes, Mapping)):
        return [] if value is None or value == "" else [value]
    try:
        return list(value)
    except TypeError:
        return [value]


def _finite(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)


def _fmt(v: Any) -> str:
    return short_number(v, missing="\u2014")


def _shorten(text: str, limit: int = LABEL_MAX_CHARS) -> str:
    """Keep both ends of a long name: the module prefix and the call index both matter."""
    if len(text) <= limit:
        return text
    keep = limit - 1
    return text[: keep // 2] + "\u2026" + text[len(text) - (keep - keep // 2):]


def _plot_text(text: str) -> str:
    """A name as matplotlib must get it to draw it literally: every ``$`` escaped (a ``$…$`` pair
    is mathtext, and a malformed one raises and would cost the whole report), and a leading ``_``
    kept off the first character (legends drop such labels: torch.compile's ``_orig_mod.``)."""
    text = text.replace("$", r"\$")
    return " " + text if text.startswith("_") else text


def _int(v: Any) -> int:
    return int(v) if _finite(v) else 0


def _cell_list(items: Sequence[Any], limit: int = CELL_LIST_MAX, code: bool = True) -> str:
    shown = [_code(x) if code else _e(x) for x in items[:limit]]
    if len(items) > limit:
        shown.append(f'<span class="muted">+{len(items) - limit} more</span>')
    return "<br>".join(shown) if shown else '<span class="muted">\u2014</span>'


def _code(value: Any) -> str:
    """A name in monospace that may wrap after its separators (API names, test ids)."""
    text = _e(value)
    for sep in (".", "/", "::", "_"):
        text = text.replace(sep, sep + "<wbr>")
    return f"<code>{text}</code>"


def _more(n: int, what: str) -> str:
    return f'<p class="muted">\u2026 and {n} more {_e(what)} (all of them are in summary.json).</p>' if n > 0 else ""


def _table(header: Sequence[str], rows: Iterable[Sequence[str]], cls: str = "", raw_header: bool = False) -> str:
    """``rows`` hold HTML already escaped by the caller (``header`` too with ``raw_header``)."""
    head = "".join(f"<th>{h if raw_header else _e(h)}</th>" for h in header)
    body = "".join("<tr>" + "".join(f"<td>{c}</td>" for c in r) + "</tr>" for r in rows)
    return f'<table class="{cls}"><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>'


def _href(path: Any, base: Path) -> str:
    """A link to an evidence file relative to the report's folder (URL-quoted, so a path can
    never turn into a ``javascript:`` or other scheme)."""
    text = str(path)
    p = Path(text)
    if p.is_absolute():
        try:
            text = os.path.relpath(p, base)
        except ValueError:  # another drive (Windows): no relative path exists
            return _e(p.as_uri())
    return _e(urllib.parse.quote(text.replace(os.sep, "/"), safe="/"))


def _evidence_links(entry: Mapping[str, Any], base: Path) -> str:
    files = [f for key in EVIDENCE_KEYS for f in _list(entry.get(key))]
    links = [f'<a href="{_href(f, base)}">{_e(_shorten(_link_text(f, base), 80))}</a>' for f in files[:CELL_LIST_MAX]]
    if len(files) > CELL_LIST_MAX:
        links.append(f'<span class="muted">+{len(files) - CELL_LIST_MAX} more</span>')
    return "<br>".join(links) if links else '<span class="muted">\u2014</span>'


def _link_text(path: Any, base: Path) -> str:
    p = Path(str(path))
    if p.is_absolute():
        try:
            return os.path.relpath(p, base)
        except ValueError:
            return str(p)
    return str(p)


def _badge(text: str, kind: str) -> str:
    return f'<span class="badge {kind}">{_e(text)}</span>'


# --------------------------------------------------------------------------------------------
# plots
# --------------------------------------------------------------------------------------------

def _figure(width_in: float, height_in: float, margins_in: tuple[float, float, float, float]) -> tuple[Any, Any]:
    """A figure whose axes sit inside fixed margins (left, right, top, bottom; inches). The margins
    are computed from the label lengths (monospace text), which is as tidy as a layout engine and
    about twice as fast on a many-label plot."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    fig = Figure(figsize=(width_in, height_in), dpi=100)
    left, right, top, bottom = margins_in
    fig.subplots_adjust(left=left / width_in, right=1 - right / width_in, top=1 - top / height_in,
                        bottom=bottom / height_in)
    return fig, FigureCanvasAgg(fig)


def _png_img(fig: Any, canvas: Any, alt: str) -> str:
    buf = io.BytesIO()
    canvas.print_png(buf)
    data = base64.b64encode(buf.getvalue()).decode("ascii")
    w, h = (int(round(v)) for v in fig.get_size_inches() * fig.dpi)
    return f'<img class="plot" src="data:image/png;base64,{data}" width="{w}" height="{h}" alt="{_e(alt)}">'


# DejaVu Sans Mono (matplotlib's bundled monospace) is 0.6 em wide: at 8 pt, 4.8 pt a character.
_MONO_FONT = {"family": "monospace", "size": 8}
_MONO_CHAR_IN = 0.6 * 8 / 72


def _hbar_plot(entries: Sequence[tuple[str, float | None, str, str]], *, xlabel: str, log: bool,
               lines: Sequence[tuple[float, str, str]], alt: str) -> str:
    """Horizontal bars, first entry on top. ``entries``: (label, value, value text, colour); a
    value of None is off the scale (non-finite) and drawn as a hatched bar across the whole axis.
    The value texts sit in a right-hand column (a twin axis' tick labels), so they never overlap
    the bars or each other."""
    n = len(entries)
    labels = [_plot_text(_shorten(label)) for label, _, _, _ in entries]
    texts = [_plot_text(text) for _, _, text, _ in entries]
    left_in = 0.25 + _MONO_CHAR_IN * max(map(len, labels), default=0)
    right_in = 0.25 + _MONO_CHAR_IN * max(map(len, texts), default=0)
    width_in = max(10.0, left_in + right_in + 5.0)
    top_in, bottom_in = (0.4 if lines else 0.15), 0.6
    fig, canvas = _figure(width_in, 0.27 * n + top_in + bottom_in + 0.1, (left_in, right_in, top_in, bottom_in))
    ax = fig.add_subplot(1, 1, 1)
    values = [v for _, v, _, _ in entries if v is not None and (v > 0 or not log)]
    marks = [x for x, _, _ in lines]
    if log:
        span = values + marks or [1.0]
        lo, hi = min(span) / 3.0, max(span) * 3.0
        ax.set_xscale("log")
    else:
        lo = min(values + marks + [0.0]) - 0.02
        hi = max(values + marks + [1.0]) + 0.01
    on = [(y, v, colour) for y, (_, v, _, colour) in enumerate(entries) if v is not None]
    off = [y for y, (_, v, _, _) in enumerate(entries) if v is None]
    if on:
        ax.barh([y for y, _, _ in on], [max(v, lo) - lo for _, v, _ in on], left=lo,
                color=[c for _, _, c in on], height=0.7)
    if off:
        ax.barh(off, [hi - lo] * len(off), left=lo, color="#f3d6d6", edgecolor=_DARK_RED, hatch="///",
                height=0.7, linewidth=0.8)
    for x, style, label in lines:
        ax.axvline(x, color="black", linestyle=style, linewidth=1.1, label=_plot_text(label))
    ax.set_xlim(lo, hi)
    ys = list(range(n))
    for axis, tick_labels in ((ax, labels), (ax.twinx(), texts)):
        axis.set_ylim(n - 0.5, -0.5)
        axis.set_yticks(ys)
        axis.set_yticklabels(tick_labels, fontdict=_MONO_FONT)
        axis.tick_params(axis="y", length=0)
        axis.spines["top"].set_visible(False)
    ax.set_xlabel(xlabel, fontsize=9)
    ax.tick_params(axis="x", labelsize=8)
    ax.grid(axis="x", color="#dddddd", linewidth=0.6)
    ax.set_axisbelow(True)
    if lines:
        ax.legend(loc="lower left", bbox_to_anchor=(0.0, 1.0), ncol=len(lines), frameon=False, fontsize=8,
                  borderaxespad=0.2)
    return _png_img(fig, canvas, alt)


def _similarity_plot(steps: Sequence[int], rows: Sequence[tuple[str, Sequence[float], Sequence[int]]],
                     first_step_min: float, alt: str) -> str:
    """One test's similarity-per-step lines; the summary row (if any) is drawn last, black and bold.
    The legend goes under the axes, where it hides no line."""
    entries = len(rows) + 1 + any(bad for _, _, bad in rows)
    legend_rows = math.ceil(entries / 3)
    bottom_in = 0.55 + 0.17 * legend_rows + 0.1
    fig, canvas = _figure(6.2, 3.0 + bottom_in, (0.7, 0.15, 0.12, bottom_in))
    ax = fig.add_subplot(1, 1, 1)
    finite = [v for _, ys, _ in rows for v in ys if math.isfinite(v)]
    # a fixed [0, 1] range would flatten the drops of a few hundredths that the rule is about
    low = max(-1.05, min(finite + [first_step_min]) - 0.02)
    ax.set_ylim(low, 1.01 + 0.02 * (1.0 - low))
    ax.axhline(first_step_min, color=_RED, linestyle="--", linewidth=1, label=f"first-step min {first_step_min:g}")
    flagged_x: list[int] = []
    flagged_y: list[float] = []
    for name, ys, bad in rows:
        style = ({"color": "black", "linewidth": 2.0, "zorder": 3} if name == SUMMARY_ROW
                 else {"linewidth": 1.2, "marker": "o", "markersize": 3})
        ax.plot(steps, ys, label=_plot_text(_shorten(name, 34)), **style)
        at = dict(zip(steps, ys))
        for s in bad:
            if s in at and math.isfinite(at[s]):
                flagged_x.append(s)
                flagged_y.append(at[s])
    if flagged_x:
        ax.plot(flagged_x, flagged_y, linestyle="none", marker="X", color=_RED, markersize=10,
                markeredgecolor="white", markeredgewidth=0.8, label="flagged step", zorder=4)
    if steps:
        pad = max(0.3, 0.04 * (max(steps) - min(steps)))
        ax.set_xlim(min(steps) - pad, max(steps) + pad)
        if len(steps) <= 20:
            ax.set_xticks(list(steps))
    ax.set_xlabel("step", fontsize=9)
    ax.set_ylabel("cosine similarity", fontsize=9)
    ax.tick_params(labelsize=8)
    ax.grid(color="#e5e5e5", linewidth=0.6)
    handles, labels = ax.get_legend_handles_labels()
    fig.legend(handles, labels, loc="lower left", bbox_to_anchor=(0.7 / 6.2, 0.02), ncol=3, fontsize=7,
               frameon=False, handlelength=1.8, columnspacing=1.2)
    return _png_img(fig, canvas, alt)


# --------------------------------------------------------------------------------------------
# sections
# --------------------------------------------------------------------------------------------

def _header(session: Mapping[str, Any], tool: str, tests: Mapping[str, Any], unit: str = "test") -> str:
    entries = [_mapping(t) for t in tests.values()]
    findings_key = FINDINGS[tool][0]
    counts = _outcome_cards(session, [str(t.get("outcome", "")) for t in entries], unit)
    if _mapping(session.get("session")):
        counts.append((f"{unit}s under the probe", len(entries), ""))
    counts += [(f"with {FINDINGS[tool][1]}", sum(1 for t in entries if _list(t.get(findings_key))),
                "bad" if any(_list(t.get(findings_key)) for t in entries) else "good"),
               ("with probe errors", sum(1 for t in entries if _list(t.get("errors"))),
                "warn" if any(_list(t.get("errors")) for t in entries) else "")]
    nothing = sum(1 for t in entries if t.get("nothing_checked"))
    if nothing:
        counts.append(("gave the probe nothing to check", nothing, "warn"))
    return _page_header(session, tool, _config_summary(_mapping(session.get("config")), tool) + _cards(counts))


def _outcome_cards(session: Mapping[str, Any], outcomes: list[str], unit: str) -> list[tuple[str, int, str]]:
    """Cards of the tests the session ran, by outcome: pytest's own count when the session
    recorded it (summary.json's "session": every test, per-API and catalogue ones too), else the
    outcomes of the entries (a merged multi-rank summary, an older summary.json)."""
    ran = _mapping(session.get("session"))
    if ran:
        total = _int(ran.get("tests"))
        by = {k: _int(v) for k, v in ran.items() if k != "tests"}
    else:
        total = len(outcomes)
        by = {k: outcomes.count(k) for k in set(outcomes) if k}
    cards = [(f"{unit}s", total, ""), ("passed", by.get("passed", 0), "good"),
             ("failed", by.get("failed", 0), "bad" if by.get("failed") else "")]
    other = total - by.get("passed", 0) - by.get("failed", 0)
    if other and (ran or any(outcomes)):
        skipped = by.get("skipped", 0)
        cards.append(("skipped", skipped, "") if skipped == other else ("other outcome", other, ""))
    return cards


def _cards(counts: Sequence[tuple[str, int, str]]) -> str:
    inner = "".join(f'<div class="card {kind}"><div class="num">{n}</div><div>{_e(label)}</div></div>'
                    for label, n, kind in counts)
    return f'<div class="cards">{inner}</div>'



def _short_value(v: Any) -> str:
    if isinstance(v, (list, tuple)):
        items = [str(x) for x in v[:8]]
        return "[" + ", ".join(items) + (f", \u2026 +{len(v) - 8}" if len(v) > 8 else "") + "]"
    return _shorten(str(v), 80)


def _config_summary(config: Mapping[str, Any], tool: str) -> str:
    if not config:
        return ""
    top = [(k, v) for k, v in config.items() if not isinstance(v, Mapping)]
    own = _mapping(config.get(tool))
    # fuzz_device only matters to to_cpu (msprobe's default "npu" would read wrong on a CPU run)
    section = [(f"{tool}.{k}", v) for k, v in own.items() if not (k == "fuzz_device" and own.get("pert_mode") != "to_cpu")]
    chips = "".join(f'<span class="kv"><b>{_e(k)}</b> {_e(_short_value(v))}</span>' for k, v in top + section)
    full = _e(json.dumps(config, indent=2, sort_keys=True, default=str))
    return (f'<div class="config"><h3>config</h3>{chips}'
            f"<details><summary>full config</summary><pre>{full}</pre></details></div>")


def _api_figure(s: ApiRow) -> tuple[float | None, str, bool]:
    """(worst max_rel / threshold, or None when off the scale; its text; beyond the threshold?)"""
    worst, threshold = s.worst_max_rel, s.threshold
    if not _finite(worst):
        return None, f"non-finite ({_fmt(worst)})", True
    if not (_finite(threshold) and threshold > 0):
        return None, f"max_rel {_fmt(worst)} (threshold {_fmt(threshold)})", True
    ratio = float(worst) / float(threshold)
    return ratio, f"{_fmt(float(worst))}  ({ratio:.3g}\u00d7 threshold)", ratio > 1.0


def _api_order(item: tuple[str, ApiRow]) -> tuple[int, float, str]:
    ratio, _, _ = _api_figure(item[1])
    return (0 if ratio is None else 1, -(ratio or 0.0), item[0])


def _apis_section(stats: Mapping[str, ApiRow], ran: bool, unit: str = "test") -> str:
    title = "<h2>free_benchmark: worst max_rel per API</h2>"
    risky = sorted(((k, s) for k, s in stats.items() if s.flagged > 0 or s.worst_max_rel is not None), key=_api_order)
    clean = sorted(k for k, s in stats.items() if not (s.flagged > 0 or s.worst_max_rel is not None))
    checked = sum(s.checked for s in stats.values())
    if not stats:
        text = "Nothing flagged: no API was checked." if ran else f"No {unit} ran under the probe."
        return f'<section id="apis">{title}<p class="ok">{_e(text)}</p></section>'
    parts = [title]
    if not risky:
        parts.append(f'<p class="ok">Nothing flagged: {len(stats)} APIs, {checked} calls checked, '
                     "all within their thresholds. Bars: how close each API came, its largest error divided by "
                     "its threshold (log scale); the line is the threshold.</p>")
    else:
        parts.append(f'<p>{len(risky)} of {len(stats)} APIs inconsistent under perturbation '
                     f"({checked} calls checked). Bars: the worst max_rel divided by the API's threshold, and for "
                     "the APIs within their thresholds how close they came (log scale); right of the line is beyond "
                     "the threshold.</p>")
    parts.append(_worst_plot(risky, clean, stats))
    if risky:
        rows = []
        for api, s in risky[:TABLE_MAX_ROWS]:
            ratio, _, beyond = _api_figure(s)
            rows.append((_code(api), _e(_fmt(s.checked)), _e(_fmt(s.flagged)),
                         f'<span class="{"bad" if beyond else ""}">{_e(_fmt(s.worst_max_rel))}</span>',
                         _e(_fmt(s.threshold)), _e("\u2014" if ratio is None else f"{ratio:.3g}\u00d7"),
                         _code(s.first_flagged or "\u2014"),
                         f"{len(s.tests)}<br>{_cell_list(s.tests, 2)}"))
        parts.append(_table(("API", "calls checked", "inconsistent", "worst max_rel", "threshold", "\u00d7 threshold",
                             "first flagged call", f"{unit}s affected"), rows, "wide"))
        parts.append(_more(len(risky) - TABLE_MAX_ROWS, "APIs"))
    if clean:
        parts.append(_closest_table(clean, stats, open_=not risky))
    return '<section id="apis">' + "".join(parts) + "</section>"


def _score(s: ApiRow) -> float:
    """A clean API's closest approach (error / threshold), -1 where no call was checked."""
    return float(s.worst_score) if _finite(s.worst_score) else -1.0


def _worst_plot(risky: list[tuple[str, ApiRow]], clean: list[str], stats: Mapping[str, ApiRow]) -> str:
    """One plot of every API's worst figure against its threshold (1 on the axis): the flagged
    APIs' worst max_rel / threshold in red, then the clean APIs' closest approach in blue."""
    entries = []
    for api, s in risky:
        ratio, text, beyond = _api_figure(s)
        entries.append((api, ratio, text, _RED if beyond else _BLUE))
    # an API whose outputs did not move at all (score 0) has no bar on a log axis: the table lists it
    margins = [(a, _score(stats[a])) for a in clean if _score(stats[a]) > 0]
    for api, score in sorted(margins, key=lambda am: (-am[1], am[0])):
        entries.append((api, score, f"{score:.3g}\u00d7 threshold", _BLUE))
    shown = entries[:PLOT_MAX_BARS]
    if not shown:
        return ""
    # non-finite figures are hatched bars across the axis; the threshold line needs a finite one
    lines = [(1.0, "--", "threshold")] if any(v is not None for _, v, _, _ in shown) else []
    plot = _hbar_plot(shown, xlabel="worst error / threshold", log=True, lines=lines,
                      alt="worst error per API relative to its threshold")
    if len(entries) > PLOT_MAX_BARS:
        plot += (f'<p class="muted">The plot shows the {PLOT_MAX_BARS} APIs nearest or beyond their thresholds; '
                 f"{len(entries) - PLOT_MAX_BARS} more are in the tables.</p>")
    return plot


def _closest_table(clean: list[str], stats: Mapping[str, ApiRow], open_: bool) -> str:
    """The APIs within their thresholds, closest first: how near each came (its largest error /
    threshold over every checked call), so a clean run still shows its margins."""
    ordered = sorted(clean, key=lambda a: (-_score(stats[a]), a))
    rows = [(_code(a), _e(_fmt(stats[a].checked)),
             _e("\u2014" if _score(stats[a]) < 0 else f"{_score(stats[a]):.3g}\u00d7"),
             _e(", ".join(map(str, stats[a].dtypes)))) for a in ordered[:TABLE_MAX_ROWS]]
    table = _table(("API", "calls checked", "closest: error / threshold", "dtypes"), rows)
    never = sum(1 for a in clean if not stats[a].checked)
    what = f"{len(clean)} APIs within their thresholds" + (f" ({never} seen but never checked)" if never else "")
    return (f"<details{' open' if open_ else ''}><summary>{what}, closest first</summary>{table}"
            f"{_more(len(clean) - TABLE_MAX_ROWS, 'APIs')}</details>")


def _params_section(params: Mapping[str, ParamRow], ran: bool, unit: str = "test") -> str:
    title = "<h2>grad_probe: non-finite gradients</h2>"
    if not params:
        text = "Nothing flagged: every monitored gradient stayed finite." if ran else f"No {unit} ran under the probe."
        return f'<section id="params">{title}<p class="ok">{_e(text)}</p></section>'
    items = sorted(params.items(), key=lambda kv: (-kv[1].nonfinite_steps, kv[0]))
    rows = [(_code(p), _e(_fmt(t.nonfinite_steps)), _e(t.first or "\u2014"), f"{len(t.tests)}<br>{_cell_list(t.tests, 2)}")
            for p, t in items[:TABLE_MAX_ROWS]]
    return (f'<section id="params">{title}<p>{len(items)} parameter(s) with non-finite gradients.</p>'
            + _table(("parameter", "non-finite steps", "first", f"{unit}s affected"), rows, "wide")
            + _more(len(items) - TABLE_MAX_ROWS, "parameters") + "</section>")


def _series(values: Any, n: int) -> list[float]:
    out = [float(v) if _finite(v) else math.nan for v in _list(values)[:n]]
    return out + [math.nan] * (n - len(out))


def _similarity_figure(nodeid: str, entry: Mapping[str, Any]) -> tuple[bool, str]:
    steps = [int(s) for s in _list(entry.get("steps")) if _finite(s)]
    fsm = entry.get("first_step_min", DIRECTION_FIRST_STEP_MIN)
    fsm = float(fsm) if _finite(fsm) else DIRECTION_FIRST_STEP_MIN
    drop = entry.get("max_drop", DIRECTION_MAX_DROP)
    drop = float(drop) if _finite(drop) else DIRECTION_MAX_DROP
    n = len(steps)
    rows: list[tuple[str, list[float], list[Flag]]] = []
    for name, values in _mapping(entry.get("params")).items():
        ys = _series(values, n)
        rows.append((str(name), ys, flag_series(str(name), zip(steps, (None if math.isnan(y) else y for y in ys)),
                                                  fsm, drop)))
    # parameters that were flagged first, then the lowest ones: the lines worth seeing
    rows.sort(key=lambda r: (not r[2], min((y for y in r[1] if math.isfinite(y)), default=2.0), r[0]))
    drawn = rows[:SIMILARITY_MAX_LINES]
    summary = entry.get("summary")
    if summary is not None:
        ys = _series(summary, n)
        flags = flag_series(SUMMARY_ROW, zip(steps, (None if math.isnan(y) else y for y in ys)), fsm, drop)
        drawn.append((SUMMARY_ROW, ys, flags))
        rows.append((SUMMARY_ROW, ys, flags))
    all_flags = sorted((f for _, _, fl in rows for f in fl), key=lambda f: (f.step, f.param))
    flagged_steps = sorted({f.step for f in all_flags})
    status = (_badge(f"flagged at step {', '.join(map(str, flagged_steps))}", "bad") if flagged_steps
              else _badge("directions close", "good"))
    if n and drawn:
        plot = _similarity_plot(steps, [(name, ys, [f.step for f in fl]) for name, ys, fl in drawn], fsm,
                                alt=f"gradient similarity per step: {nodeid}")
    else:
        plot = '<p class="muted">no similarity values</p>'
    notes = []
    if len(rows) - (summary is not None) > SIMILARITY_MAX_LINES:
        notes.append(f'<p class="muted">{SIMILARITY_MAX_LINES} of {len(rows) - (summary is not None)} parameters '
                     "drawn (flagged and lowest first).</p>")
    if all_flags:
        items = "".join(f"<li>step {f.step} \u00b7 {_code(f.param)}: {_e(f.describe(fsm, drop))}</li>"
                        for f in all_flags[:FLAGS_LISTED])
        more = f"<li class=\"muted\">+{len(all_flags) - FLAGS_LISTED} more</li>" if len(all_flags) > FLAGS_LISTED else ""
        notes.append(f'<ul class="flags">{items}{more}</ul>')
    html_ = (f'<figure class="sim"><figcaption>{_code(nodeid)} {status}</figcaption>{plot}'
             + "".join(notes) + "</figure>")
    return bool(all_flags), html_


def _similarities_section(similarities: Mapping[str, Any]) -> str:
    title = "<h2>grad_probe: gradient direction similarity per step</h2>"
    if not similarities:
        return f'<section id="similarities">{title}<p class="muted">No gradient comparison in this session.</p></section>'
    figures = [(str(k), *_similarity_figure(str(k), _mapping(v))) for k, v in similarities.items()]
    figures.sort(key=lambda f: (not f[1], f[0]))
    flagged = sum(1 for f in figures if f[1])
    rule = (f"Rule (defaults; a comparison may set its own): a similarity below {DIRECTION_FIRST_STEP_MIN} at the "
            f"first compared step, or a drop of more than {DIRECTION_MAX_DROP} from one compared step to the next, "
            "flags the step.")
    summary = (f'<p><span class="{"bad" if flagged else "ok"}">{flagged} of {len(figures)} comparison(s) '
               f"flagged.</span> {_e(rule)}</p>")
    grid = "".join(h for _, _, h in figures[:SIMILARITY_MAX_PLOTS])
    return (f'<section id="similarities">{title}{summary}<div class="grid">{grid}</div>'
            + _more(len(figures) - SIMILARITY_MAX_PLOTS, "comparisons") + "</section>")


def _cosine_figure(op: OpRow) -> tuple[float | None, str]:
    cos, err = op.worst_cosine, op.worst_max_abs_err
    text = f"cos {_fmt(cos)}, max abs err {_fmt(err)}"
    return (float(cos) if _finite(cos) else None), text


def _ops_section(stats: Mapping[str, OpRow], ran: bool, unit: str = "test", compared: int | None = None) -> str:
    """Every op compared, with its calls (the failing ones first, plotted), so a clean session
    shows what it compared. ``compared``: the session's op calls compared (its account), which a
    summary holds even where the tool did not count calls per op."""
    title = "<h2>online_dispatch: ops that disagree with the reference</h2>"
    failing = sorted(((k, s) for k, s in stats.items() if s.failed > 0),
                     key=lambda kv: (_cosine_figure(kv[1])[0] is not None, _cosine_figure(kv[1])[0] or 0.0, kv[0]))
    per_op = bool(stats) and all(s.compared is not None for s in stats.values())
    total = compared if compared is not None else sum(s.compared or 0 for s in stats.values())
    unknown = "" if per_op else " (this online_dispatch does not count the calls of each op)"
    if not stats and not total:
        text = "Nothing flagged: no op was compared." if ran else f"No {unit} ran under the probe."
        return f'<section id="ops">{title}<p class="ok">{_e(text)}</p></section>'
    parts = [title]
    if not failing:
        ops = f" ({len(stats)} ops)" if per_op else ""
        parts.append(f'<p class="ok">{_e(f"Nothing flagged: {total} op calls compared{ops}, all within the rule{unknown}.")}</p>')
    else:
        parts.append(f"<p>{len(failing)} of {len(stats)} ops failed the comparison ({total} calls compared{_e(unknown)}). "
                     f"Rule: cosine &lt; {COS_THRESHOLD} with a large max abs error, or cosine &lt; {COS_MAX_THRESHOLD}, "
                     "or a max abs error above its limit.</p>")
        entries = [(op, cos, text, _RED) for op, s in failing[:PLOT_MAX_BARS] for cos, text in [_cosine_figure(s)]]
        parts.append(_hbar_plot(entries, xlabel="worst cosine similarity to the reference", log=False,
                                lines=[(COS_THRESHOLD, "--", f"cosine {COS_THRESHOLD}"),
                                       (COS_MAX_THRESHOLD, ":", f"cosine {COS_MAX_THRESHOLD}")],
                                alt="worst cosine per failing op"))
        if len(failing) > PLOT_MAX_BARS:
            parts.append(f'<p class="muted">The plot shows the {PLOT_MAX_BARS} worst ops; '
                         f"{len(failing) - PLOT_MAX_BARS} more are in the table.</p>")
    clean = sorted(((k, s) for k, s in stats.items() if not s.failed), key=lambda kv: (-(kv[1].compared or 0), kv[0]))
    rows = [(_code(op), _e(_fmt(s.compared)), _e(_fmt(s.failed)), _e(_fmt(s.worst_cosine)),
             _e(_fmt(s.worst_max_abs_err)), f"{len(s.tests)}<br>{_cell_list(s.tests, 2)}")
            for op, s in (failing + clean)[:TABLE_MAX_ROWS]]
    if rows:
        table = _table(("op", "calls compared", "failed", "worst cosine", "worst max abs err", f"{unit}s affected"),
                       rows, "wide")
        if failing:
            parts.append(table)
        else:
            parts.append(f"<details><summary>{len(stats)} ops compared, most calls first</summary>{table}</details>")
        parts.append(_more(len(failing) + len(clean) - TABLE_MAX_ROWS, "ops"))
    return '<section id="ops">' + "".join(parts) + "</section>"


def _tests_section(tests: Mapping[str, Any], tool: str, base: Path, unit: str = "test") -> str:
    title = f"<h2>{_e(unit)}s</h2>"
    if not tests:
        return f'<section id="tests">{title}<p class="muted">No {_e(unit)} ran under the probe.</p></section>'
    keys = [FINDINGS[tool][0]] + [k for k, _ in FINDINGS.values() if k != FINDINGS[tool][0]]

    def findings(t: Mapping[str, Any]) -> list[Any]:
        return [x for k in keys for x in _list(t.get(k))]

    items = [(str(k), _mapping(v)) for k, v in tests.items()]
    items.sort(key=lambda kv: (kv[1].get("outcome") != "failed", not findings(kv[1]),
                               not _list(kv[1].get("errors")), kv[0]))
    rows = []
    for nodeid, t in items[:TABLE_MAX_ROWS]:
        outcome = t.get("outcome")
        badge = (_badge(str(outcome), {"passed": "good", "failed": "bad"}.get(str(outcome), "warn"))
                 if outcome else '<span class="muted">\u2014</span>')
        errors = len(_list(t.get("errors")))
        rows.append((_code(nodeid), badge, _cell_list(findings(t)), _evidence_links(t, base),
                     f'<a href="#err-{_anchor(nodeid)}">{errors}</a>' if errors else "0"))
    return (f'<section id="tests">{title}'
            + _table((unit, "outcome", FINDINGS[tool][1], "evidence", "probe errors"), rows, "wide tests")
            + _more(len(items) - TABLE_MAX_ROWS, f"{unit}s") + "</section>")


def _graphs_section(tests: Mapping[str, Any], base: Path) -> str:
    """torch.compile graphs (probes.compiled): checked, sampled and flagged, the compiled error next
    to the eager kernels', the first failing node and its reproduction."""
    rows = []
    graphs = [(str(nodeid), _mapping(g)) for nodeid, t in tests.items() for g in _list(_mapping(t).get("graphs"))]
    graphs.sort(key=lambda ng: (-_int(ng[1].get("flagged")), ng[0]))
    for nodeid, g in graphs[:TABLE_MAX_ROWS]:
        figures = []
        for stage in ("forward", "backward"):
            f = _mapping(g.get(stage))
            if f:
                eager = f", eager {_fmt(f.get('eager_ulps'))}" if f.get("eager_ulps") is not None else ""
                figures.append(f"{stage}: {_fmt(f.get('compiled_ulps'))}{eager} / {_fmt(f.get('threshold_ulps'))} "
                               f"ulps ({f.get('dtype')})")
        found = _mapping(g.get("localisation"))
        node = "\u2014"
        if found:
            node = (f"{_code(found.get('node'))} {_e(found.get('target'))} {_e(found.get('source') or '')} "
                    f"({_e(found.get('where'))}): <a href=\"{_e(_href(found.get('repro'), base))}\">repro</a>")
        status = (_badge("flagged", "bad") if _int(g.get("flagged")) else
                  _badge("not checked", "warn") if g.get("not_checked") else _badge("clean", "good"))
        rows.append((_code(f"Graph.{g.get('graph')}"), _code(nodeid), _e(g.get("backend")),
                     _e(f"{_int(g.get('calls'))} / {_int(g.get('sampled'))} / {_int(g.get('checked'))}"), status,
                     _e("; ".join(figures) or (g.get("not_checked") or "\u2014")), node))
    return ('<section id="graphs"><h2>compiled graphs (torch.compile): compiled code against float64</h2>'
            "<p>Each graph Dynamo handed the backend, judged on its sampled calls against its eager program in "
            "float64; the eager kernels' error on the same calls is shown next to the compiled one.</p>"
            + _table(("graph", "test", "backend", "calls / sampled / checked", "status",
                      "worst output: compiled, eager / allowed", "first failing node"), rows, "wide", )
            + _more(len(graphs) - TABLE_MAX_ROWS, "graphs") + "</section>")


def _anchor(nodeid: str) -> str:
    return hashlib.sha1(nodeid.encode("utf-8", "replace")).hexdigest()[:12]


def _error_text(err: Any) -> str:
    if isinstance(err, Mapping):
        return ProbeError.from_dict("error", err).describe()
    return str(err)


def _account_section(account: ProbeAccount, tool: str, unit: str) -> str:
    """What the probe checked, what it left unchecked and why (the reasons in full), and the
    tests that gave it nothing to check."""
    parts = ["<h2>what the probe checked</h2>",
             f"<p>{account.checked} {_e(CHECKED_LABELS.get(tool, 'checked'))} in {account.tests} {_e(unit)}(s) under "
             f"the probe; {account.errors} probe error(s) in {account.tests_with_errors} {_e(unit)}(s).</p>"]
    if account.not_checked:
        total = sum(account.not_checked.values())
        rows = [(_e(reason), _e(_fmt(n))) for reason, n in list(account.not_checked.items())[:TABLE_MAX_ROWS]]
        parts.append(f"<p>{total} call(s) not checked, by reason:</p>" + _table(("reason", "calls"), rows))
    if account.nothing_checked:
        items = list(account.nothing_checked.items())
        rows = [(_code(nodeid), _e(why)) for nodeid, why in items[:TABLE_MAX_ROWS]]
        parts.append(f'<p class="bad">{len(items)} {_e(unit)}(s) ran under the probe but gave it nothing to '
                     "check:</p>" + _table((unit, "why"), rows, "wide") + _more(len(items) - TABLE_MAX_ROWS, f"{unit}s"))
    return '<section id="probe">' + "".join(parts) + "</section>"


def _errors_section(tests: Mapping[str, Any], unit: str = "test") -> str:
    title = "<h2>probe errors</h2>"
    with_errors = [(str(k), _list(_mapping(v).get("errors"))) for k, v in tests.items()]
    with_errors = [(k, errs) for k, errs in with_errors if errs]
    if not with_errors:
        return f'<section id="errors">{title}<p class="ok">No probe error.</p></section>'
    parts, listed = [], 0
    for nodeid, errs in sorted(with_errors):
        if listed >= ERRORS_LISTED:
            break
        room = ERRORS_LISTED - listed
        lis = "".join(f"<li><pre>{_e(_error_text(err))}</pre></li>" for err in errs[:room])
        more = f'<li class="muted">+{len(errs) - room} more</li>' if len(errs) > room else ""
        listed += min(len(errs), room)
        parts.append(f'<div class="errs" id="err-{_anchor(nodeid)}"><h3>{_code(nodeid)}</h3>'
                     f"<ul>{lis}{more}</ul></div>")
    total = sum(len(e) for _, e in with_errors)
    note = (f"<p>{total} error(s) recorded inside the probe in {len(with_errors)} {_e(unit)}(s); they were "
            f"recorded, not raised into the {_e(unit)}s.</p>")
    return f'<section id="errors">{title}{note}' + "".join(parts) + _more(total - listed, "errors") + "</section>"


_CSS = """
*{box-sizing:border-box}
body{margin:0;background:#f4f5f7;color:#1d2330;font:14px/1.45 -apple-system,"Segoe UI",Roboto,"DejaVu Sans",
Helvetica,Arial,sans-serif}
main{max-width:1240px;margin:0 auto;padding:20px 24px 40px}
header,section{background:#fff;border:1px solid #dfe2e8;border-radius:6px;padding:16px 20px;margin:0 0 16px}
h1{margin:0 0 10px;font-size:22px}
h1 .tool{font-family:"DejaVu Sans Mono",Menlo,Consolas,monospace;background:#e8eef8;color:#24497a;
border-radius:4px;padding:1px 8px;font-size:19px}
h2{margin:0 0 10px;font-size:17px;border-bottom:1px solid #eceef2;padding-bottom:6px}
h3{margin:12px 0 6px;font-size:13px;color:#445}
code,pre{font-family:"DejaVu Sans Mono",Menlo,Consolas,monospace;font-size:12px}
code{overflow-wrap:break-word}
pre{white-space:pre-wrap;overflow-wrap:anywhere;margin:0}
details pre{background:#f7f8fa;border:1px solid #eceef2;padding:8px;max-height:360px;overflow:auto}
summary{cursor:pointer;color:#24497a;margin:6px 0}
.meta{display:grid;grid-template-columns:max-content 1fr;gap:2px 14px;margin:0 0 8px}
.meta dt{color:#667;font-weight:600}.meta dd{margin:0}
.config .kv{display:inline-block;background:#f2f4f7;border:1px solid #e3e6eb;border-radius:4px;padding:1px 7px;
margin:2px 4px 2px 0;font-size:12px;overflow-wrap:anywhere}
.config .kv b{color:#556;font-weight:600}
.cards{display:flex;flex-wrap:wrap;gap:10px;margin-top:12px}
.card{min-width:120px;padding:8px 14px;border-radius:6px;background:#f2f4f7;border:1px solid #e3e6eb;color:#445}
.card .num{font-size:22px;font-weight:700;color:#1d2330}
.card.good{background:#eaf6ee;border-color:#bfe3ca}.card.good .num{color:#1e7a3d}
.card.bad{background:#fbecec;border-color:#efc4c4}.card.bad .num{color:#b02a2a}
.card.warn{background:#fdf5e6;border-color:#f0dcb0}.card.warn .num{color:#9a6400}
table{border-collapse:collapse;width:100%;margin:10px 0;font-size:13px}
th,td{border-bottom:1px solid #e6e8ec;padding:5px 8px;text-align:left;vertical-align:top}
th{background:#f2f4f7;font-weight:600;white-space:nowrap}
tbody tr:nth-child(even){background:#fafbfc}
table.tests td:first-child{max-width:460px}
td a{color:#24497a;overflow-wrap:anywhere}
.badge{display:inline-block;border-radius:10px;padding:0 8px;font-size:12px;font-weight:600}
.badge.good{background:#dff3e5;color:#1e7a3d}.badge.bad{background:#f9dede;color:#b02a2a}
.badge.warn{background:#fcefd2;color:#9a6400}
.ok{color:#1e7a3d}.bad{color:#b02a2a;font-weight:600}.muted{color:#778}
img.plot{display:block;max-width:100%;height:auto;margin:8px 0}
.grid{display:grid;grid-template-columns:repeat(auto-fill,minmax(560px,1fr));gap:14px}
figure.sim{margin:0;border:1px solid #e6e8ec;border-radius:6px;padding:10px}
figure.sim figcaption{font-size:13px}
ul.flags{margin:4px 0 0;padding-left:18px;font-size:12px}
.errs ul{padding-left:18px}.errs li{margin:3px 0}
"""
