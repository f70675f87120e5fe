"""The catalogue's section of report.html: status counts, a plot of the worst ulp errors, and a
table sortable without any script (one pre-sorted copy per order, picked by radio buttons in CSS:
the report stays script-free, as CI artifact viewers and mail clients want it)."""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Mapping, Sequence
from typing import Any

from pytest_msprobe.catalogue import gate
from pytest_msprobe.reports.plots import PLOT_MAX_BARS, hbar_plot
from pytest_msprobe.reports.primitives import BLUE, RED, code, esc, table

ROWS_MAX = 2500  # per order; the rest are in catalogue.csv
ORDERS = (("max ulp", "max"), ("p99 ulp", "p99"), ("API", "api"), ("status", "status"))

CSS = """
.sorts>input{position:absolute;opacity:0;pointer-events:none}
.sorts>label{display:inline-block;margin:0 6px 4px 0;padding:1px 9px;border:1px solid #cfd5df;border-radius:10px;
cursor:pointer;font-size:12px;color:#24497a}
.sorts .views>div{display:none}
""" + "".join(f"#catsort-{key}:checked~label[for=catsort-{key}]{{background:#24497a;color:#fff}}"
              f"#catsort-{key}:checked~.views .by-{key}{{display:block}}" for _, key in ORDERS) + """
th label{cursor:pointer;color:#24497a}
.sorts .views table{table-layout:auto;width:100%}
.sorts .views td:last-child{overflow-wrap:anywhere;min-width:16em;max-width:32em}
"""


def _text(v: Any) -> str:
    return gate.ulp_text(v, missing="\u2014")


def _sorted(rows: list[Mapping[str, Any]], key: str) -> list[Mapping[str, Any]]:
    if key == "max":
        return sorted(rows, key=lambda r: (-gate.ulp_sort_value(r.get("max_ulp")), str(r.get("api")), str(r.get("dtype"))))
    if key == "p99":
        return sorted(rows, key=lambda r: (-gate.ulp_sort_value(r.get("p99_ulp")), str(r.get("api")), str(r.get("dtype"))))
    if key == "status":
        return sorted(rows, key=lambda r: (gate.STATUS_RANK.get(str(r.get("status")), 99), -gate.ulp_sort_value(r.get("max_ulp")),
                                           str(r.get("api"))))
    return sorted(rows, key=lambda r: (str(r.get("api")), str(r.get("dtype"))))


def catalogue_section(results: Sequence[Any]) -> str:
    """The section of the catalogue's rows (the summary's "catalogue" list), drawn with the
    report's own pieces so that it reads like the other sections."""
    rows = [r for r in results if isinstance(r, Mapping)]
    title = "<h2>API precision catalogue: error in ulps against a float64 CPU reference</h2>"
    if not rows:
        return f'<section id="catalogue">{title}<p class="muted">No catalogue test ran.</p></section>'
    counts = Counter(str(r.get("status", "")) for r in rows)
    cards = "".join(
        f'<div class="card {"bad" if s in gate.FAILING else ("good" if s == gate.OK else "")}">'
        f'<div class="num">{n}</div><div>{esc(s)}</div></div>' for s, n in sorted(counts.items(),
                                                                               key=lambda kv: gate.STATUS_RANK.get(kv[0], 99)))
    worst = gate.worst(rows, PLOT_MAX_BARS)
    parts = [title, f'<div class="cards">{cards}</div>',
             "<p>Per API and dtype: the largest and the 99th-percentile error of the device's outputs, in ulps "
             "of the output dtype (0.5 = correctly rounded; near-zero elements measured at their row's scale), "
             "for accumulating APIs the test ratio (error over what any summation order may add; limit "
             f"{gate.ratio_limit('float32'):g}), free_benchmark's improve_precision verdict, and the status against "
             "the goldens.</p>"]
    if worst:
        entries = [(f"{r.get('api')} {r.get('dtype')}",
                    float(r["max_ulp"]) if math.isfinite(r["max_ulp"]) else None,
                    f"max {_text(r.get('max_ulp'))} / p99 {_text(r.get('p99_ulp'))}",
                    RED if gate.failing(r) else BLUE) for r in worst]
        parts.append(hbar_plot(entries, xlabel="max ulp error (log scale)", log=True,
                               lines=[(0.5, "--", "0.5 ulp: correctly rounded")],
                               alt="worst API x dtype by max ulp error"))
    radios = "".join(f'<input type="radio" name="catsort" id="catsort-{key}"{" checked" if i == 0 else ""}>'
                     f'<label for="catsort-{key}">by {esc(label)}</label>' for i, (label, key) in enumerate(ORDERS))
    header = ['<label for="catsort-api">API</label>', "dtype", "device", "samples",
              '<label for="catsort-max">max ulp</label>', '<label for="catsort-p99">p99 ulp</label>',
              "accumulation ratio", "golden max / p99", "free_benchmark", '<label for="catsort-status">status</label>', "message"]
    views = []
    for _, key in ORDERS:
        body = []
        for r in _sorted(rows, key)[:ROWS_MAX]:
            status = str(r.get("status", ""))
            cls = "bad" if status in gate.FAILING else ""
            golden = (f"{_text(r.get('golden_max_ulp'))} / {_text(r.get('golden_p99_ulp'))}"
                      if r.get("golden_max_ulp") is not None else "\u2014")
            if r.get("golden") and r.get("golden") != r.get("hardware"):
                golden += f" (another machine: {r['golden']})"
            body.append((code(r.get("api")), esc(r.get("dtype")), esc(r.get("device")), esc(r.get("samples")),
                         esc(_text(r.get("max_ulp"))), esc(_text(r.get("p99_ulp"))),
                         esc(gate.ratio_text(r.get("ratio")) if r.get("ratio") is not None else "\u2014"), esc(golden),
                         esc(r.get("verdict") or "\u2014"), f'<span class="{cls}">{esc(status)}</span>',
                         esc(str(r.get("message") or "")[:300])))
        views.append(f'<div class="by-{key}">{table(header, body, "wide", raw_header=True)}</div>')
    more = len(rows) - ROWS_MAX
    parts.append(f'<div class="sorts">{radios}<div class="views">{"".join(views)}</div></div>')
    if more > 0:
        parts.append(f'<p class="muted">\u2026 and {more} more rows in catalogue.csv.</p>')
    return '<section id="catalogue">' + "".join(parts) + "</section>"
