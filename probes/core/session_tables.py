"""The tables of a session's summary.json, typed: a row per API (free_benchmark), per op
(online_dispatch) and per parameter (grad_probe), a test's probe errors, and the probe's account of
the session (what it checked, what it left unchecked and why, its errors, the tests that gave it
nothing to check).

The plugin builds them from the tools' summaries, summary.json holds their `to_dict`, and every
reader (the terminal summary, report.html, ``python -m probes summary``, ``probes.results.load``)
takes them back with `from_dict`, which wants exactly the fields of its class. A field that one
side writes and the other does not know, or expects and does not get, fails where it is read and
names the field, instead of a dash in a report where a figure should be (the failure that left
every clean API's margin off the report). Framework-free and JSON-able: xdist workers send their
results to the controller as JSON, and the command line reads them without the plugin.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any, ClassVar, TypeVar

__all__ = ["COMPARED_BY_OP", "ApiRow", "OpRow", "ParamRow", "ProbeAccount", "ProbeError", "Row", "SummaryFormatError",
           "api_table", "as_number", "failing_ops", "op_rows", "op_table", "param_table", "read_table",
           "sort_figure", "write_table"]

#: online_dispatch's summary key counting the compared calls of each op (op overload -> calls)
COMPARED_BY_OP = "ops_compared_by_op"
ERRORS_SHOWN = 5  # the first probe errors the session account repeats (every one is in its test's entry)

R = TypeVar("R", bound="Row")


class SummaryFormatError(ValueError):
    """A summary.json table whose rows do not have the fields this version writes and reads."""


class Row:
    """A row of one of summary.json's tables; TABLE is that table's key."""

    TABLE: ClassVar[str] = ""

    @classmethod
    def from_dict(cls: type[R], key: str, data: Any) -> R:
        """The row `key` of summary.json's table, with exactly this class's fields."""
        names = [f.name for f in dataclasses.fields(cls)]  # type: ignore[arg-type]
        where = f"summary.json's {cls.TABLE}[{key!r}]"
        if not isinstance(data, Mapping):
            raise SummaryFormatError(f"{where} is a {type(data).__name__}, not a row of {', '.join(names)}")
        missing = [n for n in names if n not in data]
        unknown = sorted(str(k) for k in data if k not in names)
        if missing or unknown:
            said = ([f"lacks {', '.join(missing)}"] if missing else []) + ([f"has unknown {', '.join(unknown)}"]
                                                                          if unknown else [])
            raise SummaryFormatError(f"{where} {' and '.join(said)}: it was written by another version of "
                                     "pytest-msprobe; rerun the session (or read the file with the version that "
                                     "wrote it)")
        return cls(**{n: data[n] for n in names})

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)  # type: ignore[call-overload]


def read_table(cls: type[R], rows: Any) -> dict[str, R]:
    """A table of summary.json (name -> row) as typed rows; an absent table is empty."""
    if rows is None:
        return {}
    if not isinstance(rows, Mapping):
        raise SummaryFormatError(f"summary.json's {cls.TABLE} is a {type(rows).__name__}, not a table")
    return {str(k): cls.from_dict(str(k), v) for k, v in rows.items()}


def write_table(rows: Mapping[str, Row]) -> dict[str, dict[str, Any]]:
    """A table as summary.json holds it (and xdist workers send it): plain dictionaries."""
    return {k: r.to_dict() for k, r in rows.items()}


def sort_figure(v: Any) -> float:
    """A max_rel as a number to sort by: verdict strings (nan_mismatch, ...) rank worst."""
    if isinstance(v, (int, float)) and not isinstance(v, bool) and not math.isnan(v):
        return float(v)
    return math.inf  # symbol_flipping, nan_mismatch, ...


# free_benchmark ---------------------------------------------------------------------------------
@dataclass
class ApiRow(Row):
    """One API over the session's tests."""

    TABLE: ClassVar[str] = "apis"
    calls: int  # calls the probe saw, checked or not
    checked: int
    flagged: int  # checked calls whose outputs moved past their threshold
    worst_max_rel: float | str | None  # of the worst flagged call (a word for flips and NaN mismatches)
    threshold: float | None  # that call's threshold
    first_flagged: str | None  # that call's name, Torch.exp.3.forward
    # the largest error / threshold of any checked call, flagged or not (1 is the threshold): how
    # close a clean API came
    worst_score: float | None
    dtypes: list[str]
    tests: list[str]  # the tests (ranks, in a merged multi-rank summary) in which it was flagged


def api_table(per_test: Iterable[tuple[str, Mapping[str, Mapping[str, Any]]]]) -> dict[str, ApiRow]:
    """The session's per-API table from each test's free_benchmark summary "apis"."""
    table: dict[str, ApiRow] = {}
    for nodeid, apis in per_test:
        for api, s in apis.items():
            row = table.get(api)
            if row is None:
                row = table[api] = ApiRow(0, 0, 0, None, None, None, None, [], [])
            row.calls += s["calls"]
            row.checked += s["checked"]
            row.flagged += s["flagged"]
            score = s["worst_score"]
            if score is not None and (row.worst_score is None or score > row.worst_score):
                row.worst_score = score
            if not set(s["dtypes"]) <= set(row.dtypes):
                row.dtypes = sorted(set(row.dtypes) | set(s["dtypes"]))
            if s["flagged"]:
                row.tests.append(nodeid)
                if row.worst_max_rel is None or sort_figure(s["worst_max_rel"]) > sort_figure(row.worst_max_rel):
                    row.worst_max_rel, row.threshold, row.first_flagged = (
                        s["worst_max_rel"], s["threshold"], s["first_flagged"])
    return table


# online_dispatch --------------------------------------------------------------------------------
@dataclass
class OpRow(Row):
    """One op (an aten overload, aten.addmm.default) over the session's tests."""

    TABLE: ClassVar[str] = "ops"
    compared: int | None  # calls compared with the reference; None where the tool did not count them per op
    failed: int  # calls failing the rule
    worst_cosine: float | str | None  # of the failing calls ("nan" where a cosine was not a number)
    worst_max_abs_err: float | None
    tests: list[str]  # the tests (ranks) with failing calls


def as_number(v: Any, default: float) -> float:
    """A figure of a summary as a float (figures may be words: "unsupported", "N/A")."""
    try:
        return float(v)
    except (TypeError, ValueError):
        return default


def failing_ops(summary: Mapping[str, Any]) -> list[dict[str, Any]]:
    """One entry per failing op call of an online_dispatch summary: {"op", "name", "cosine",
    "max_abs_err"}, the worst of its output leaves."""
    out = []
    for f in summary.get("failed_ops", []):
        leaves = f.get("leaves") or [{}]
        worst = min(leaves, key=lambda leaf: as_number(leaf.get("cosine"), 1.0))
        out.append({"op": f["op"], "name": f["name"], "cosine": as_number(worst.get("cosine"), math.nan),
                    "max_abs_err": max(as_number(leaf.get("max_abs_err"), 0.0) for leaf in leaves)})
    return out


def _cosine_rank(v: Any) -> float:
    """A cosine to take the worst of: one that is not a number is the worst."""
    f = as_number(v, math.nan)
    return -math.inf if math.isnan(f) else f


def op_rows(summary: Mapping[str, Any]) -> dict[str, OpRow]:
    """The per-op rows of one online_dispatch run (its summary): every op it compared, with its
    calls when the summary counts them per op, and the failing calls' worst figures."""
    counts = summary.get(COMPARED_BY_OP)
    rows = {str(op): OpRow(int(n), 0, None, None, []) for op, n in (counts or {}).items()}
    for f in failing_ops(summary):
        row = rows.get(f["op"])
        if row is None:
            row = rows[f["op"]] = OpRow(None, 0, None, None, [])
        row.failed += 1
        if row.worst_cosine is None or _cosine_rank(f["cosine"]) < _cosine_rank(row.worst_cosine):
            row.worst_cosine = f["cosine"]
        row.worst_max_abs_err = max(row.worst_max_abs_err or 0.0, f["max_abs_err"])
    return rows


def op_table(per_test: Iterable[tuple[str, Mapping[str, Mapping[str, Any]]]]) -> dict[str, OpRow]:
    """The session's per-op table from each test's per-op rows (`op_rows`, as dictionaries)."""
    table: dict[str, OpRow] = {}
    for nodeid, ops in per_test:
        for op, data in ops.items():
            r = OpRow.from_dict(op, data)
            row = table.get(op)
            if row is None:
                row = table[op] = OpRow(r.compared, 0, None, None, [])
            elif row.compared is not None:
                row.compared = None if r.compared is None else row.compared + r.compared
            row.failed += r.failed
            if r.worst_cosine is not None and (row.worst_cosine is None
                                               or _cosine_rank(r.worst_cosine) < _cosine_rank(row.worst_cosine)):
                row.worst_cosine = r.worst_cosine
            if r.worst_max_abs_err is not None:
                row.worst_max_abs_err = max(row.worst_max_abs_err or 0.0, r.worst_max_abs_err)
            if r.failed and nodeid not in row.tests:
                row.tests.append(nodeid)
    return table


# grad_probe -------------------------------------------------------------------------------------
@dataclass
class ParamRow(Row):
    """A parameter whose gradient went non-finite in the session."""

    TABLE: ClassVar[str] = "params"
    nonfinite_steps: int
    first: str  # "step 4: max nan, norm nan"
    tests: list[str]


def param_table(per_test: Iterable[tuple[str, Iterable[Mapping[str, Any]]]]) -> dict[str, ParamRow]:
    """The session's per-parameter table from each test's non-finite gradient findings (the
    monitors do not say which test monitored a parameter, so only the non-finite ones are rows)."""
    table: dict[str, ParamRow] = {}
    for nodeid, findings in per_test:
        for f in findings:
            row = table.get(f["param"])
            if row is None:
                first = f"step {f['step']}: " + ", ".join(f"{k} {v}" for k, v in f["figures"].items())
                row = table[f["param"]] = ParamRow(0, first, [])
            row.nonfinite_steps += 1
            if nodeid not in row.tests:
                row.tests.append(nodeid)
    return table


# the probe's own account ------------------------------------------------------------------------
@dataclass
class ProbeError(Row):
    """An error inside the probe: recorded, not raised into the test (unless "strict": true)."""

    TABLE: ClassVar[str] = "errors"
    call: str  # the API / op / parameter it happened on, or the probe's own step ("probe stop")
    error: str  # "RuntimeError: ..."
    count: int

    def describe(self) -> str:
        return f"{self.call}: {self.error}" + (f" (x{self.count})" if self.count != 1 else "")


@dataclass
class ProbeAccount(Row):
    """What the probe did over the session's tests, from their entries in summary.json."""

    TABLE: ClassVar[str] = "probe"
    tests: int  # tests run under the probe
    # free_benchmark: API calls checked; online_dispatch: op calls compared; grad_probe: parameter-steps
    checked: int
    errors: int  # probe errors, each occurrence counted
    tests_with_errors: int
    first_errors: list[dict[str, Any]]  # the first few: {"test", "call", "error", "count"}
    not_checked: dict[str, int]  # why calls were left unchecked -> how many
    nothing_checked: dict[str, str]  # a test that gave the probe nothing to check -> why

    @classmethod
    def of(cls, tests: Mapping[str, Mapping[str, Any]]) -> ProbeAccount:
        not_checked: dict[str, int] = {}
        first: list[dict[str, Any]] = []
        errors = with_errors = 0
        for nodeid, entry in tests.items():
            found = [ProbeError.from_dict(f"{nodeid} error", e) for e in entry["errors"]]
            errors += sum(e.count for e in found)
            with_errors += bool(found)
            first += [dict(e.to_dict(), test=nodeid) for e in found[:ERRORS_SHOWN - len(first)]]
            for reason, n in entry["not_checked"].items():
                not_checked[reason] = not_checked.get(reason, 0) + n
        # a test that skipped itself gave the probe nothing by its own choice, not the probe's
        nothing = {nodeid: e["nothing_checked"] for nodeid, e in tests.items()
                   if e["nothing_checked"] and e.get("outcome") != "skipped"}
        return cls(len(tests), sum(e["checked"] for e in tests.values()), errors, with_errors, first,
                   dict(sorted(not_checked.items(), key=lambda kv: (-kv[1], kv[0]))), nothing)

