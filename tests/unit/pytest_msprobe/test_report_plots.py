"""The report's plots, drawn as inline SVG text: each parses as XML (hostile names escaped), says
what it shows (alt text, a title), and puts its bars, lines and markers where the data says:
a bar ends on the reference line of its own value, an off-scale value is a hatched bar across the
axis, a non-finite similarity breaks its line, a name has one colour in every panel."""

from __future__ import annotations

import math
import re
import xml.etree.ElementTree as ET

import pytest
from svg_plots import NS, having, parsed, texts

from probes.grad_probe.direction_rule import SUMMARY_ROW
from pytest_msprobe.reports.plots import fraction_plot, hbar_plot, similarity_plot
from pytest_msprobe.reports.svg import TAB10, linear_ticks, log_ticks, xml_text

HOSTILE = 'Torch.<script>&"$x$\'_</svg>'


def centre(marker: ET.Element) -> tuple[float, float]:
    xy = [float(v) for v in re.findall(r"-?[0-9.]+", marker.get("d"))]
    return sum(xy[0::2]) / len(xy[0::2]), sum(xy[1::2]) / len(xy[1::2])


def right_end(bar: ET.Element) -> float:
    return float(bar.get("x")) + float(bar.get("width"))


def test_hbar_draws_one_bar_per_entry_on_its_scale():
    entries = [(HOSTILE, 0.01, "0.01\u00d7  (a & b)", "#c0392b"), ("Torch.inf", None, "inf", "#c0392b"),
               ("Torch.one", 1.0, "1\u00d7", "#3b6ea8"), ("Torch.half", 0.5, "0.5\u00d7", "#3b6ea8")]
    root = parsed(hbar_plot(entries, xlabel="worst error / threshold", log=True,
                            lines=[(1.0, "--", "threshold <1>"), (0.5, ":", "half")], alt='worst "error" <per API>'))
    assert root.get("aria-label") == 'worst "error" <per API>'
    bars = having(root, "p-bar")
    assert len(bars) == 4 and texts(root, "p-label") == [e[0] for e in entries]  # first entry on top
    assert [float(b.get("y")) for b in bars] == sorted(float(b.get("y")) for b in bars)
    assert texts(root, "p-value") == ["0.01\u00d7  (a & b)", "inf", "1\u00d7", "0.5\u00d7"]  # spaces kept
    (off,) = having(root, "p-off")
    assert off is bars[1]
    pattern = re.fullmatch(r"url\(#(.+)\)", off.get("fill")).group(1)
    assert [p.get("id") for p in root.iter(f"{NS}pattern")] == [pattern]
    # the off-scale bar spans the axis: it ends where the longest bar could
    refs = having(root, "p-ref")
    assert texts(root, "p-legend") == ["threshold <1>", "half"]
    one, half = (float(r.get("x1")) for r in refs)
    assert right_end(bars[2]) == pytest.approx(one, abs=0.2) and right_end(bars[3]) == pytest.approx(half, abs=0.2)
    assert right_end(bars[0]) < half < one < right_end(off)
    assert refs[0].get("stroke-dasharray") and refs[1].get("stroke-dasharray") != refs[0].get("stroke-dasharray")
    # the decades between a third of the least value and thrice the largest, 10 and a raised exponent
    ticks = [(t.text, t.find(f"{NS}tspan").text) for t in root.iter(f"{NS}text") if t.find(f"{NS}tspan") is not None]
    assert ticks == [("10", "\u22122"), ("10", "\u22121"), ("10", "0")]


def test_hbar_linear_axis_and_its_reference_lines():
    entries = [(f"aten.op{i}.default", 0.5 + i / 10, f"cos {0.5 + i / 10:g}", "#c0392b") for i in range(5)]
    root = parsed(hbar_plot(entries, xlabel="worst cosine", log=False,
                            lines=[(0.99, "--", "cosine 0.99"), (0.9, ":", "cosine 0.9")], alt="cosines"))
    assert not having(root, "p-off") and not list(root.iter(f"{NS}pattern"))
    tight, loose = (float(r.get("x1")) for r in having(root, "p-ref"))
    assert loose < tight and right_end(having(root, "p-bar")[4]) == pytest.approx(loose, abs=0.2)  # 0.9
    labels = ["".join(t.itertext()) for t in root.iter(f"{NS}text")]
    assert ["0.0", "0.2", "0.4", "0.6", "0.8", "1.0"] == [s for s in labels if re.fullmatch(r"[0-9.]+", s)]


def test_hbar_height_follows_the_entries():
    heights = [int(parsed(hbar_plot([(f"a{i}", 1.0 + i, "x", "#000") for i in range(n)], xlabel="x", log=True,
                                    lines=[], alt="a")).get("height")) for n in (1, 5, 40)]
    assert heights[0] < heights[1] < heights[2] and heights[2] - heights[1] == 35 * 27


def test_similarity_lines_flags_and_legend():
    steps = [0, 1, 2, 3]
    rows = [("0.weight", [0.999, 0.998, math.nan, 0.90], [3]), (HOSTILE, [1.0, 1.0, 1.0, 1.0], []),
            (SUMMARY_ROW, [0.999, 0.998, 0.95, 0.94], [2, 3])]
    root = parsed(similarity_plot(steps, rows, 0.97, alt="similarity"))
    series = having(root, "p-series")
    assert len(series) == 3 and having(root, "p-summary") == [series[-1]]  # the summary last, on top
    lines = [s.findall(f"{NS}polyline") for s in series]
    assert [len(ls) for ls in lines] == [2, 1, 1]  # the NaN breaks the first line
    summary = lines[2][0]
    assert summary.get("stroke") == "#000"
    assert float(summary.get("stroke-width")) > float(lines[1][0].get("stroke-width"))
    assert [ls[0].get("stroke") for ls in lines[:2]] == list(TAB10[:2])
    drawn = {i: [tuple(map(float, p.split(","))) for line in ls for p in line.get("points").split()]
             for i, ls in enumerate(lines)}
    flags = sorted(centre(f) for f in having(root, "p-flag"))  # on the points they flag (row 0's third: step 3)
    expected = sorted([drawn[0][2], drawn[2][2], drawn[2][3]])
    assert [v for xy in flags for v in xy] == pytest.approx([v for xy in expected for v in xy], abs=0.2)
    (ref,) = having(root, "p-ref")
    assert drawn[2][1][1] < float(ref.get("y1")) < drawn[2][2][1]  # 0.998 above the 0.97 line, 0.95 below
    assert texts(root, "p-legend") == ["first-step min 0.97", "0.weight", HOSTILE, SUMMARY_ROW, "flagged step"]


def test_fraction_panels_share_colours_and_one_legend():
    steps = [0, 1, 2]
    panels = [("underflow fraction", [("a", [0.1, 0.2, 0.75]), ("b", [0.0, 0.0, 0.0])]),
              ("saturated fraction", [("b", [0.001, 0.0, 0.0]), ("a", [0.0, 0.0, 0.0])])]
    root = parsed(fraction_plot(steps, panels, alt="fp8"))
    axes = having(root, "p-axes")
    assert len(axes) == 2 and texts(root, "p-legend") == ["a", "b"]
    colours = [[g.find(f"{NS}polyline").get("stroke") for g in having(ax, "p-series")] for ax in axes]
    assert colours == [[TAB10[0], TAB10[1]], [TAB10[1], TAB10[0]]]
    assert len({c.get("id") for c in root.iter(f"{NS}clipPath")}) == 2  # each panel its own clip


def test_ids_are_the_plots_own_and_the_same_for_the_same_data():
    def plot(v: float | None) -> str:
        return hbar_plot([("a", v, "x", "#000"), ("b", None, "y", "#000")], xlabel="x", log=True, lines=[], alt="a")

    ids = [re.findall(r' id="([^"]+)"', plot(v)) for v in (1.0, 2.0)]
    assert ids[0] and ids[0] != ids[1] and plot(1.0) == plot(1.0)
    assert "\x00" not in plot(1.0)


def test_text_is_escaped_and_xml_safe():
    assert xml_text('<a href="x">&\'') == "&lt;a href=&quot;x&quot;&gt;&amp;&#x27;"
    assert xml_text("a\x00b\x1bc\ud800") == "a\ufffdb\ufffdc\ufffd"  # never valid XML, even escaped
    root = parsed(hbar_plot([("nul\x00name", 1.0, "\x07", "#000")], xlabel="x\x01", log=False, lines=[], alt="a\x02"))
    assert texts(root, "p-label") == ["nul\ufffdname"] and root.get("aria-label") == "a\ufffd"


def test_ticks():
    assert linear_ticks(-0.02, 1.01, 9) == [(v / 5, f"{v / 5:.1f}") for v in range(6)]
    assert [t for _, t in linear_ticks(0.89, 1.0122, 9)] == ["0.90", "0.92", "0.94", "0.96", "0.98", "1.00"]
    minus = "\u2212"  # matplotlib's minus sign, and never a "-0"
    assert [t for _, t in linear_ticks(-0.15, 0.1, 5)] == [f"{minus}0.15", f"{minus}0.10", f"{minus}0.05", "0.00", "0.05", "0.10"]
    assert [t for _, t in linear_ticks(-0.3, 40.3, 9, integer=True)] == [str(5 * k) for k in range(9)]
    major, minor = log_ticks(3e-4, 40.0)
    assert [v for v, _ in major] == pytest.approx([1e-3, 1e-2, 1e-1, 1.0, 10.0]) and len(minor) == 7 + 4 * 8 + 3
    major, _ = log_ticks(1e-30, 1e30)  # many decades: every few labelled
    assert 5 <= len(major) <= 10
    major, _ = log_ticks(0.67, 7.5)  # under two decades: the 2s and 5s labelled too
    assert [v for v, _ in major] == pytest.approx([1.0, 2.0, 5.0])

