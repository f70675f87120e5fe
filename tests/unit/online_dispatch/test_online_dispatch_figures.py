"""The per-op figures on their fast path (figure_parts, the overflow screen) against the core's
formulas applied op by op, and the choice of the reference thread by measured cost."""

from __future__ import annotations

import csv
import dataclasses
import io
import math
import threading

import array_api_compat.torch as xp
import pytest
import seeded_dispatch  # noqa: F401  (registers the seeded_dispatch:: custom ops)
import torch
import torch.nn as nn
import torch.nn.functional as F
from dispatch_files import read_rows, summary

from probes.backends import host_arrays
from probes.core import dispatch_figures as df
from probes.online_dispatch import (
    figure_parts,
    leaf_pairs,
    mode,
    native_jobs,
    results,
    thread_choice,
    verdict,
)
from probes.pytorch.online_dispatch import PtdbgDispatch


def _core_figures(pairs):
    """The core's figures of each pair, leaf by leaf (dispatch_figures' own formulas)."""
    out = []
    for d, r in pairs:
        d, r = d.reshape(-1), r.reshape(-1)
        parts = torch.stack(df.leaf_figure_parts(xp, d, r)).tolist()
        out.append(df.figures_from_parts(parts, d.numel()))
    return out


def _op_by_op_figures(pairs, known=None):
    """Each pair's figures as the fast path means to take them, leaf by leaf: the core's formulas,
    with the sums in the one pass's documented order (NumPy's, host_arrays.dispatch_parts) for the
    leaves the one pass reads (`known`, the reference runner's sums, is not used: measured here)."""
    out = []
    for d, r in pairs:
        d, r = d.reshape(-1), r.reshape(-1)
        if d.dtype in (torch.float32, torch.float64, torch.bfloat16) and r.dtype == torch.float64:
            parts = host_arrays.dispatch_parts(d.double().numpy(), r.numpy())
            figs = df.figures_of_sums([*parts[:3], parts[3] + 0.0, parts[4] + 0.0], d.numel())
            figs[df.MAX_ABS] += 0.0
            out.append(figs)
        else:
            out.extend(_core_figures([(d, r)]))
    return out


def _same(a: list[float], b: list[float]) -> bool:
    return all(x == y or (math.isnan(x) and math.isnan(y)) for x, y in zip(a, b, strict=True))


@pytest.mark.parametrize("numel", [1, 300, 4095, 4096, 40_000, df.CHUNK_ELEMENTS + 5])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float64, torch.int64, torch.bool])
def test_fast_figures_equal_the_core_formulas_and_leave_the_device_tensor_alone(numel, dtype, kernel_path):
    """Bit for bit the op-by-op figures (the one pass's order for the leaves it reads, with the
    kernels and without), and the core's formulas up to the sums' last digits."""
    g = torch.Generator().manual_seed(numel)
    if dtype == torch.bool:
        dev = torch.rand(numel, generator=g) < 0.5
        ref = dev.clone()
    elif dtype == torch.int64:
        dev = torch.randint(-5, 5, (numel,), generator=g)
        ref = dev.clone()
        ref[0] += 1
    else:
        dev = torch.randn(numel, generator=g).to(dtype)
        ref = dev.double() * (1 + 1e-6 * torch.randn(numel, generator=g, dtype=torch.float64))
    before = dev.clone()
    fast = figure_parts.leaf_figures([(dev, ref)])
    assert torch.equal(dev, before)
    assert _same(fast[0], _op_by_op_figures([(dev, ref)])[0])
    core = _core_figures([(dev, ref)])[0]
    assert all(math.isclose(x, y, rel_tol=1e-12) for x, y in zip(fast[0], core, strict=True)), (fast[0], core)


def _csv_line(cells: list) -> str:
    buf = io.StringIO()
    csv.writer(buf, lineterminator="\r\n").writerow(cells)
    return buf.getvalue()[:-2]


# texts csv.writer quotes (a comma, a quote, line ends) and ones it does not
_TEXTS = ("mm_1_input.0", "[4, 8]", "[8]", "[]", 'we"ird', "a\nb", "c\rd", "<class 'int'>", "")


def test_an_input_row_is_the_cells_of_a_row_compared_with_itself():
    stats = (2.5, -1.0, 0.25)
    for st in (stats, ("", "", "")):
        row = results.Row("mm_1_input.0", "torch.float32", "torch.float64", "[4, 8]", "[4, 8]", st, st,
                          1.0, 0.0, 0.0, "Yes")
        assert results.input_row("mm_1_input.0", "torch.float32", "torch.float64", "[4, 8]", st) == row.cells()


@pytest.mark.parametrize("text", _TEXTS)
def test_an_input_line_is_what_csv_writer_writes_of_its_cells(text):
    """A tensor input's row is rendered without csv.writer: the same bytes, statistics or not."""
    for name, dtype, shape in (("mm_1_input.0", text, text),):
        line = results.input_line(name, dtype, "torch.float64", shape)
        assert line == _csv_line(results.input_row(name, dtype, "torch.float64", shape, results.NO_STATS))
        for stats in ((2.5, -1.0, 0.25), (float("nan"), float("-inf"), -0.0), (1e-300, 3.0, 1 / 3)):
            assert results.with_input_stats(line, stats) == _csv_line(
                results.input_row(name, dtype, "torch.float64", shape, stats))
        for value in (2.0, -0.0, float("inf"), 1e-300, 1 / 3):  # a Python number's: its value as the statistics
            assert results.input_line(name, dtype, dtype, "[]", value) == _csv_line(
                results.input_row(name, dtype, dtype, "[]", (value, value, value)))


@pytest.mark.parametrize("figs, numel, dtype_name", [
    ([0.5, 0.25, 1.0, 1e-7, 0.0, 8.0, 1e-7], 8, "float32"),  # passes: cosine and errors printed
    ([1.0, 1.0, 1.0, 0.0, 0.0, 1.0, 0.0], 1, "float32"),  # one element: "unsupported", a message
    ([0.0, 0.0, 0.0, 0.0, 0.0, 4.0, 0.0], 4, "float32"),  # both sides zero: cosine 1.0
    ([3.0, 9.0, 1.0, 0.0, 0.0, 3.0, -1.0], 3, "int64"),  # exact dtype, no scaled figure
    ([0.5, 0.25, 1.0, 1e-3, 0.0, 8.0, 1e-9], 8, "bfloat16"),  # a scaled figure of several digits
])
@pytest.mark.parametrize("text", _TEXTS)
def test_a_passing_output_leafs_line_is_what_csv_writer_writes_of_its_row(figs, numel, dtype_name, text):
    v = verdict.dm.judge(figs, numel, dtype_name, 0.0)
    assert not v.failed and v.accuracy == "Yes" and not v.failed_rule
    for args in (("mm_3_output", text, text, text, v),
                 ("mm_3_output", "torch.float32", "torch.float64", "[4, 8]",
                  dataclasses.replace(v, message=f"note, {text}"))):
        assert results.passing_output_line(*args) == _csv_line(results.output_row(*args).cells())


@pytest.mark.parametrize("prefix, plain", [("mul_3", True), ('my,op"1', False), ("op\n2", False)])
def test_an_ops_rows_are_lines_only_where_its_leaves_names_need_no_quotes(prefix, plain):
    """A name csv.writer would quote (a custom op's, a graph's) keeps the cells path: the same bytes."""
    cmp = leaf_pairs.OpComparison(prefix)
    assert cmp.plain_names is plain
    x = torch.randn(4, 8)
    leaf_pairs.collect_inputs(cmp, (x, 2.0), {}, (x.double(), 2.0), {})
    leaf_pairs.collect_outputs(cmp, x * 2, x.double() * 2, None)
    ins, outs = verdict.rows(cmp, figure_parts.leaf_figures(cmp.pairs))
    assert [r.__class__ is str for r in ins] == [plain, plain]
    assert [r.__class__ is str for r in outs] == [plain]
    expected = [results.input_row(f"{prefix}_input.0", "torch.float32", "torch.float64", "[4, 8]", results.NO_STATS),
                results.input_row(f"{prefix}_input.1", "<class 'float'>", "<class 'float'>", "[]", (2.0, 2.0, 2.0))]
    cells = [r if r.__class__ is list else next(csv.reader([r])) for r in ins]
    assert [_csv_line(c) for c in cells] == [_csv_line(c) for c in expected]
    assert [r if plain else _csv_line(r) for r in ins] == [_csv_line(c) for c in expected]


def test_shape_texts_are_the_csv_rendering_and_their_cache_stays_bounded(monkeypatch):
    monkeypatch.setattr(leaf_pairs, "_SHAPE_TEXTS", {})
    monkeypatch.setattr(leaf_pairs, "_SHAPE_TEXTS_KEPT", 3)
    for n in range(1, 8):
        shape = torch.Size([n, 2 * n])
        assert leaf_pairs.shape_text(shape) == str(list(shape)) == leaf_pairs.shape_text(shape)
        assert len(leaf_pairs._SHAPE_TEXTS) <= 3
    assert leaf_pairs.shape_text(torch.Size([])) == "[]"


def test_rows_of_a_passing_and_a_failing_op(tmp_path):
    """A passing op's input rows show no statistics, a failing op's show them (and a scalar input
    its value either way); a passing output row is counted as passing."""
    x = torch.randn(4, 8)
    negative = -x.abs() - 0.5  # the seeded defect loses the sign of negative inputs
    d = PtdbgDispatch(dump_path=str(tmp_path))
    with d:
        torch.add(x, 2.5)
        torch.ops.seeded_dispatch.scaled_tanh(negative)
    rows = {r["NPU Name"]: r for r in read_rows(d.run_dir)}
    assert rows["add_1_input.0"]["NPU max"] == "" and rows["add_1_input.1"]["NPU max"] == "2.5"
    assert rows["add_1_output"]["Accuracy Reached or Not"] == "Yes"
    assert float(rows["scaled_tanh_1_input.0"]["NPU max"]) == float(negative.max())
    assert rows["scaled_tanh_1_output"]["Accuracy Reached or Not"] == "No"
    s = summary(d.run_dir)
    assert s["accuracy"] == {"Yes": 4, "No": 1} and s["rows"] == 5


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16, torch.float64])
@pytest.mark.parametrize("numel", [1, 7, 300])
def test_the_scaled_bound_written_out_is_scaled_error_bound(dtype, numel):
    """verdict.figures' scaled bound for the usual leaf is the core's df.reference_rms,
    df.max_abs_err and scaled.error_bound, bit for bit (a zero leaf too)."""
    from probes.core.scaled import error_bound

    torch.manual_seed(numel)
    for ref in (torch.randn(numel, dtype=torch.float64) * 3, torch.zeros(numel, dtype=torch.float64)):
        dev = ref.to(dtype)  # rounding alone: the bound is within the limit and stands as the figure
        (f,) = verdict.figures([(dev, ref)])
        eps, limit, floor = verdict._bound_terms(dev)
        bound = error_bound(df.max_abs_err(f), df.reference_rms(f), eps, floor)
        assert bound <= limit and f[df.SCALED] == bound


def test_nonfinite_values_take_the_masked_pass_as_before():
    dev = torch.tensor([1.0, float("inf"), float("nan"), 2.0])
    ref = torch.tensor([1.0, float("inf"), 3.0, 2.0], dtype=torch.float64)
    (figs,) = verdict.figures([(dev, ref)])
    assert figs[df.NONFINITE_MISMATCH] == 1.0 and figs[df.FINITE_COUNT] == 2.0 and figs[df.MAX_ABS] == 0.0


def test_overflow_screen_maps_only_what_the_exact_test_maps():
    # float16 rounds 70000 to inf, correctly; the float64 reference holds 70000
    dev = torch.tensor([70000.0, 1.0], dtype=torch.float16)
    ref = torch.tensor([70000.0, 1.0], dtype=torch.float64)
    pairs = [(dev, ref)]
    (figs,) = verdict.figures(pairs)
    assert pairs[0][1][0].item() == math.inf  # the reference as measured, for the rows and dumps
    assert figs[df.NONFINITE_MISMATCH] == 0.0
    small = torch.randn(1000, dtype=torch.float64) * 100
    assert not leaf_pairs.may_overflow(small.to(torch.float16), small, float(small @ small))
    assert leaf_pairs.may_overflow(dev, ref, float(ref @ ref))
    assert leaf_pairs.may_overflow(dev, ref, math.nan)
    assert not leaf_pairs.may_overflow(ref, ref, math.inf)  # same dtype: nothing to map


class _Block(nn.Module):
    def __init__(self, d: int = 32) -> None:
        super().__init__()
        self.ln, self.fc1, self.fc2 = nn.LayerNorm(d), nn.Linear(d, 4 * d), nn.Linear(4 * d, 7)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.ln(x)
        h = h + torch.softmax(h @ h.transpose(-1, -2), dim=-1) @ h
        return self.fc2(F.gelu(self.fc1(h)))


def _run(path, dtype=torch.float32):
    torch.manual_seed(0)
    model = _Block().to(dtype)
    x = torch.randn(2, 16, 32, dtype=dtype) * 3
    y = torch.randint(0, 7, (32,))
    with PtdbgDispatch(dump_path=str(path), background=False) as d:
        out = model(x)
        y_hat = torch.ops.seeded_dispatch.scaled_tanh(out.float())  # the seeded defect
        loss = F.cross_entropy(y_hat.reshape(-1, 7), y)
    with d:
        loss.backward()
    (csv_path,) = d.run_dir.glob("compare_result_rank*.csv")
    return d.run_dir, csv_path.read_bytes()


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
def test_small_model_rows_equal_the_op_by_op_figures_and_the_defect_is_caught(tmp_path, monkeypatch, dtype):
    """The fast path's CSV against one where every leaf is measured by the core's formulas and
    every reference is mapped by the exact overflow test, as before the fast path: byte for byte."""
    csvs = {}
    for way in ("fast", "op_by_op"):  # one call site: the failing row's stack is the same
        if way == "op_by_op":
            monkeypatch.setattr(verdict.figure_parts, "leaf_figures", _op_by_op_figures)
            monkeypatch.setattr(verdict, "may_overflow", lambda dev, ref, ref_sq: True)
        csvs[way] = _run(tmp_path / way, dtype)
    (run, fast), (_, op_by_op) = csvs["fast"], csvs["op_by_op"]
    assert fast == op_by_op
    s = summary(run)
    assert [f["name"] for f in s["failed_ops"]] == ["scaled_tanh_1"] and s["probe_errors"] == {}
    rows = read_rows(run)
    assert len(rows) > 40
    bad = [r["NPU Name"] for r in rows if r["Accuracy Reached or Not"] not in ("Yes", "")]
    assert bad == ["scaled_tanh_1_output"]


def _threads() -> int:
    return sum(t.name.startswith("msprobe-online-dispatch") for t in threading.enumerate())


def test_auto_keeps_cheap_ops_inline_and_hands_costly_kinds_to_the_thread(tmp_path, monkeypatch):
    """Without the native reference runner (tests/unit/online_dispatch/test_native_jobs.py), "auto"
    hands costly kinds of op to the Python reference thread."""
    monkeypatch.setattr(native_jobs.torch_reference_runner, "runner_module", lambda wait=False: None)
    monkeypatch.setattr(native_jobs.torch_reference_runner, "why_not", lambda: "switched off here")
    monkeypatch.setattr(mode, "use_reference_thread", lambda background: True)  # a host that can overlap
    x = torch.randn(256, 256)  # 256 KiB outputs: above workers.AUTO_THREAD_BYTES
    # the limit set far above this add's inline cost even on a loaded machine (at the default 4 ms
    # a busy CI host could time it above): what is tested is that a kind under the limit stays inline
    monkeypatch.setattr(thread_choice, "THREAD_MIN_SECONDS", 0.5)
    d = PtdbgDispatch(dump_path=str(tmp_path / "cheap"))
    with d:
        for _ in range(8):
            torch.add(x, x)  # well under THREAD_MIN_SECONDS to judge inline
        assert d._pool is None and _threads() == 0
    monkeypatch.setattr(thread_choice, "THREAD_MIN_SECONDS", 0.0)
    d = PtdbgDispatch(dump_path=str(tmp_path / "costly"))
    with d:
        for i in range(thread_choice.MEASUREMENTS + 1):
            torch.mm(x, x)
            assert (d._pool is not None) == (i == thread_choice.MEASUREMENTS)  # timed inline first
    rows = [r["NPU Name"] for r in read_rows(d.run_dir) if "_output" in r["NPU Name"]]
    assert rows == [f"mm_{i}_output" for i in range(1, thread_choice.MEASUREMENTS + 2)]


def test_inline_costs_keep_the_least_and_forget_past_the_limit(monkeypatch):
    costs = thread_choice.InlineCosts()
    for seconds in (0.5, 0.01, 0.2):
        assert costs.get("mm") is None
        costs.record("mm", seconds)
    assert costs.get("mm") == 0.01
    monkeypatch.setattr(thread_choice, "_MAX_KINDS", 1)
    costs.record("add", 1.0)
    assert costs.get("mm") is None
    assert not thread_choice.worth_a_thread(None)


def test_one_walk_of_the_arguments_answers_device_plainness_and_bytes():
    """call_scan.scan: the device under test (the first non-CPU tensor's), whether every tensor
    is dense, and the bytes of every dense tensor, a sparse or meta one beside them or not."""
    from probes.online_dispatch.call_scan import CPU, scan

    dense = torch.ones(4, 8)  # 128 bytes
    assert scan((dense, 2.0), {"w": torch.ones(3, dtype=torch.float64)}) == (CPU, True, 128 + 24)
    assert scan((1, "a"), {}) == (None, True, 0)
    device, plain, nbytes = scan(([dense, dense.t()], torch.ones(2, 2).to_sparse()), {})  # the sparse one walked first
    assert device is CPU and not plain and nbytes == 256  # the sparse one left out of the bytes only
    device, plain, nbytes = scan((dense, torch.empty(5, device="meta")), {})
    assert device.type == "meta" and not plain and nbytes == 128
