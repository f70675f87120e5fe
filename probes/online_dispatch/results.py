"""Rows, the compare_result CSV, summary.json and the one log line per failing op.

The CSV keeps msprobe's 18 documented columns in their order and appends the single-benchmark
figures (what msprobe 8.3.3 actually computed), the noise floor, the rule that failed the leaf (``FailedRule``:
"reference", "scaled", "both" or empty) and the scaled figure in ulps of the device dtype
(``Scaled Error (ulp)``, on every float tensor output row) as extra columns, new ones always
last; it uses the project's CSV conventions (as grad_probe's: UTF-8 with BOM, CRLF, ``csv.writer``'s
minimal quoting, ``str()`` numbers), while Cosine / MaxAbsErr / MaxRelativeErr keep the
documented 12-decimal rendering.
"""

from __future__ import annotations

import logging
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from probes.core.dispatch_metrics import FAILING, YES, LeafVerdict, format_figure
from probes.core.writers import CsvAppender, csv_field, write_json_atomic

logger = logging.getLogger("probes.online_dispatch")

COLUMNS = (
    "NPU Name", "Bench Name", "NPU Tensor Dtype", "Bench Tensor Dtype", "NPU Tensor Shape", "Bench Tensor Shape",
    "NPU max", "NPU min", "NPU mean", "Bench max", "Bench min", "Bench mean",
    "Cosine", "MaxAbsErr", "MaxRelativeErr", "Accuracy Reached or Not", "NPU_Stack_Info", "Err_message",
)
EXTRA_COLUMNS = ("Error Balance", "Small Value Max Abs Err", "Large Value Max Rel Err", "Single Benchmark", "Noise Floor",
                 "FailedRule", "Scaled Error (ulp)")
ENCODING = "utf-8-sig"
LINE_END = "\r\n"
# Failing ops logged one line each up to this many per run; the rest are only in summary.json.
MAX_LOGGED_FAILURES = 50


@dataclass
class Row:
    """One CSV row: an input or output leaf of one compared op."""

    name: str
    npu_dtype: str
    bench_dtype: str
    npu_shape: str
    bench_shape: str
    npu_stats: tuple[Any, Any, Any] = ("", "", "")
    bench_stats: tuple[Any, Any, Any] = ("", "", "")
    cosine: Any = ""
    max_abs_err: Any = ""
    max_rel_err: Any = ""
    accuracy: str = ""
    stack: str = ""
    message: str = ""
    extra: tuple[Any, ...] = ("", "", "", "", "")
    failed_rule: str = ""
    scaled_ulps: Any = ""

    @property
    def failed(self) -> bool:
        return self.accuracy in FAILING

    def cells(self) -> list[Any]:
        # format_figure keeps words ("" too) as they are
        return [
            self.name, self.name, self.npu_dtype, self.bench_dtype, self.npu_shape, self.bench_shape,
            *self.npu_stats, *self.bench_stats, format_figure(self.cosine), format_figure(self.max_abs_err),
            format_figure(self.max_rel_err), self.accuracy, self.stack, self.message, *self.extra, self.failed_rule,
            _ulps(self.scaled_ulps),
        ]


def _ulps(v: Any) -> Any:
    """The scaled figure in ulps, 6 significant digits (str() of the rounded float)."""
    return float(f"{v:.6g}") if isinstance(v, float) else v


NO_STATS = ("", "", "")  # the statistics columns of a row that shows none
_NO_EXTRA = ("", "", "", "", "")

# an input row's cells from Cosine on: compared with itself (as documented: Cosine 1, errors 0, Yes),
# no stack, message, evidence, FailedRule or scaled figure
_INPUT_TAIL = (format_figure(1.0), format_figure(0.0), format_figure(0.0), YES, "", "", "", "", "", "", "", "", "")
_INPUT_TAIL_TEXT = ",".join(_INPUT_TAIL)
_NO_STATS_TEXT = ",,,,,,"  # the six statistics fields left blank, with the comma before each

# Most rows of every op are an input leaf's or a passing output leaf's, of a few fixed forms: they
# are rendered here, as csv.writer would write their cells, from fields known in advance (the dtype
# and shape texts remembered as CSV fields).
_FIELDS: dict[str, str] = {}
_FIELDS_KEPT = 4096


def _field(text: str) -> str:
    field = _FIELDS.get(text)
    if field is None:
        if len(_FIELDS) >= _FIELDS_KEPT:
            _FIELDS.clear()
        field = _FIELDS[text] = csv_field(text)
    return field


def input_row(name: str, npu_dtype: str, bench_dtype: str, shape: str, stats: tuple[Any, Any, Any]) -> list[Any]:
    """The CSV cells of an input leaf (what Row(..., 1.0, 0.0, 0.0, "Yes").cells() gives): a list,
    not a Row, since an input row is never judged and every op writes one per input."""
    return [name, name, npu_dtype, bench_dtype, shape, shape, *stats, *stats, *_INPUT_TAIL]


def _leaf_fields(name: str, npu_dtype: str, bench_dtype: str, shape: str) -> str:
    """A row's first six fields (name, dtypes, shapes), for a `name` csv.writer writes as it is
    (writers.needs_quotes: none)."""
    shape = _FIELDS.get(shape) or _field(shape)
    return (f"{name},{name},{_FIELDS.get(npu_dtype) or _field(npu_dtype)},{_FIELDS.get(bench_dtype) or _field(bench_dtype)},"
            f"{shape},{shape}")


def input_line(name: str, npu_dtype: str, bench_dtype: str, shape: str, value: float | None = None) -> str:
    """The CSV line of an input leaf (input_row's cells as csv.writer writes them, `name` as in
    _leaf_fields): a tensor's, without statistics, or a Python number's, whose statistics are its
    `value`."""
    stats = _NO_STATS_TEXT if value is None else f",{value!r}" * 6  # csv.writer writes a float as its repr
    return f"{_leaf_fields(name, npu_dtype, bench_dtype, shape)}{stats},{_INPUT_TAIL_TEXT}"


def with_input_stats(line: str, stats: tuple[float, float, float]) -> str:
    """An input_line with its statistics filled in (an op with a failing leaf shows them)."""
    head = line[: -len(_NO_STATS_TEXT) - 1 - len(_INPUT_TAIL_TEXT)]
    figures = ",".join([repr(v) for v in stats])  # csv.writer writes a float as its repr
    return f"{head},{figures},{figures},{_INPUT_TAIL_TEXT}"


def output_row(name: str, npu_dtype: str, bench_dtype: str, shape: str, v: LeafVerdict) -> Row:
    """An output leaf; the evidence columns (statistics, MaxRelativeErr, single benchmark, noise
    floor) stay blank unless the leaf failed a rule (verdict.rows fills them); FailedRule and the
    scaled figure are on every output row."""
    return Row(name, npu_dtype, bench_dtype, shape, shape, NO_STATS, NO_STATS, v.cosine, v.max_abs_err,
               v.max_rel_err, v.accuracy, "", v.message, _NO_EXTRA, v.failed_rule, v.scaled_ulps)


def passing_output_line(name: str, npu_dtype: str, bench_dtype: str, shape: str, v: LeafVerdict) -> str:
    """The CSV line of an output leaf that passed (accuracy Yes, no FailedRule) and shows no evidence:
    output_row(...).cells() as csv.writer writes them (`name` as in _leaf_fields)."""
    message = v.message
    ulps = _ulps(v.scaled_ulps)  # as Row.cells() rounds it
    ulps = repr(ulps) if ulps.__class__ is float else _field(str(ulps))
    return (f"{_leaf_fields(name, npu_dtype, bench_dtype, shape)}{_NO_STATS_TEXT},{_figure_field(v.cosine)},"
            f"{_figure_field(v.max_abs_err)},{_figure_field(v.max_rel_err)},{YES},,"
            f"{csv_field(message) if message else ''},,,,,,,{ulps}")


def _figure_field(value: float | str) -> str:
    # format_figure's numbers hold digits, signs, points and "inf" / "nan": never quoted
    return _field(value) if value.__class__ is str else format_figure(value)


def special_row(name: str, npu_dtype: str, bench_dtype: str, npu_shape: str, bench_shape: str,
                accuracy: str, message: str, figure: str = "N/A") -> Row:
    """A leaf that could not be measured (shape mismatch, empty, reference failure…)."""
    return Row(name, npu_dtype, bench_dtype, npu_shape, bench_shape, cosine=figure, max_abs_err=figure,
               max_rel_err=figure, accuracy=accuracy, message=message)


@dataclass
class FailedOp:
    """What summary.json and the log line say about one failing op call."""

    name: str
    op: str
    leaves: list[dict[str, Any]]
    dumped: bool = False


@dataclass
class RunResults:
    """Everything one PtdbgDispatch run writes besides the dumps."""

    run_dir: Path
    csv_path: Path
    rank: int
    config: dict[str, Any]
    csv: CsvAppender = field(init=False)
    ops_compared: int = 0
    compared_by_op: Counter = field(default_factory=Counter)  # op overload name -> calls compared
    rows_written: int = 0
    accuracy_counts: Counter = field(default_factory=Counter)
    failed_rules: Counter = field(default_factory=Counter)  # FailedRule -> output rows
    skipped: dict = field(default_factory=dict)  # (reason, op overload) -> calls
    graphs: dict = field(default_factory=dict)  # compiled graph name -> probes.compiled.runs.GraphReport
    failed_ops: list[FailedOp] = field(default_factory=list)
    errors: Counter = field(default_factory=Counter)  # "op: what: error" -> times
    devices: Counter = field(default_factory=Counter)

    def __post_init__(self) -> None:
        self.csv = CsvAppender(self.csv_path, COLUMNS + EXTRA_COLUMNS, encoding=ENCODING, newline=LINE_END)

    def add_rows(self, rows: list[Row | str], inputs: list[list[Any] | str] = ()) -> None:
        """An op's rows: its input rows (input_line, or input_row's cells), then its output rows (a
        Row, or the line of a leaf that passed: passing_output_line)."""
        accuracy, failed_rules = self.accuracy_counts, self.failed_rules
        if inputs:
            accuracy[YES] += len(inputs)
        cells = [*inputs]
        for r in rows:
            if r.__class__ is str:  # passed: Yes, no FailedRule
                acc, rule = YES, ""
            else:
                acc, rule = r.accuracy, r.failed_rule
                r = r.cells()
            if acc:
                accuracy[acc] += 1
            if rule:
                failed_rules[rule] += 1
            cells.append(r)
        self.csv.add_all(cells)
        self.rows_written += len(cells)

    def add_failure(self, failure: FailedOp, op_label: str, overload: str) -> None:
        self.failed_ops.append(failure)
        n = len(self.failed_ops)
        if n <= MAX_LOGGED_FAILURES:
            parts = ", ".join(
                f"{leaf['name']} shape={leaf['shape']} Cosine={leaf['cosine']},MaxAbsErr={leaf['max_abs_err']}"
                + (f",ScaledErr={leaf['scaled_ulps']}ulp" if leaf.get("scaled_ulps") != "" else "")
                + f",FailedRule={leaf.get('failed_rule', '')}"
                for leaf in failure.leaves
            )
            logger.warning("rank%d %s overload=%s Failed: %s", self.rank, op_label, overload, parts)
        elif n == MAX_LOGGED_FAILURES + 1:
            logger.warning("more failing ops: see %s", self.run_dir / "summary.json")

    def add_error(self, op: str, what: str, exc: BaseException) -> None:
        key = f"{op}: {what}: {type(exc).__name__}: {exc}"
        if key not in self.errors:
            logger.warning("online_dispatch: %s (the op ran unchanged)", key)
        self.errors[key] += 1

    def summary(self) -> dict[str, Any]:
        by_reason: dict[str, dict[str, int]] = {}
        for (reason, op), n in self.skipped.items():
            ops = by_reason.setdefault(reason, {})
            ops[str(op)] = ops.get(str(op), 0) + n
        return {
            "tool": "online_dispatch",
            "rank": self.rank,
            "config": self.config,
            "csv": self.csv_path.name,
            "devices": dict(self.devices),
            "ops_compared": self.ops_compared,
            "ops_compared_by_op": dict(self.compared_by_op),
            "rows": self.rows_written,
            "accuracy": dict(self.accuracy_counts),
            "failed_rules": dict(self.failed_rules),
            "failed_op_count": len(self.failed_ops),
            "failed_ops": [
                {"name": f.name, "op": f.op, "dumped": f.dumped, "leaves": f.leaves} for f in self.failed_ops
            ],
            "skipped_calls": {reason: sum(ops.values()) for reason, ops in by_reason.items()},
            "skipped": by_reason,
            "probe_errors": dict(self.errors),
            **({"graphs": [g.to_dict() for _n, g in sorted(self.graphs.items())]} if self.graphs else {}),
        }

    def flush(self) -> None:
        if not self.csv_path.exists() and not self.csv.pending:
            self.csv_path.write_text(",".join(COLUMNS + EXTRA_COLUMNS) + LINE_END, encoding=ENCODING, newline="")
        self.csv.flush()
        write_json_atomic(self.run_dir / "summary.json", self.summary())


def leaf_summary(row: Row) -> dict[str, Any]:
    def num(v: Any) -> Any:
        return format_figure(v) if isinstance(v, (float, str)) and v != "" else v

    return {
        "name": row.name, "dtype": row.npu_dtype, "shape": row.npu_shape, "accuracy": row.accuracy,
        "cosine": num(row.cosine), "max_abs_err": num(row.max_abs_err), "max_rel_err": num(row.max_rel_err),
        "message": row.message, "failed_rule": row.failed_rule, "scaled_ulps": _ulps(row.scaled_ulps),
    }

