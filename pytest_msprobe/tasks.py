"""What the plugin does per task: start a probe around a test, judge its result, build the
session table. One small class per task, so plugin.py stays the same for all of them.

Results cross process boundaries (xdist workers send them back as JSON), so `finish` returns a
plain dictionary and everything after it works on dictionaries only. Every task's result has the
keys the session's account reads (pytest_msprobe.reports.tables.ProbeAccount): "checked",
"not_checked" (reason -> calls), "nothing_checked" (why the test gave the probe nothing, or None)
and "errors" (ProbeError dictionaries), whatever the tool calls them in its own summary.
"""

from __future__ import annotations

import contextlib
from collections.abc import Mapping
from typing import Any

from pytest_msprobe.reports import grads as grad_report
from pytest_msprobe.reports.tables import (
    CHECKED_LABELS,
    ApiRow,
    OpRow,
    ParamRow,
    ProbeError,
    api_table,
    failing_ops,
    op_rows,
    op_table,
    param_table,
    short_reason,
    sort_figure,
    write_table,
)
from pytest_msprobe.reports.text import failure_message, risky_table_lines, text_table

KEPT = 50  # findings a test's result keeps (summary.json and the report count every one)


def _entered(run: Any) -> Any:
    """A tool run started; one that fails to start is closed again, so no hook stays behind."""
    try:
        return run.__enter__()
    except Exception:
        with contextlib.suppress(Exception):
            run.close()
        raise


class Task:
    """What every task shares: a test's entry in summary.json and its account keys."""

    name = ""
    table_title = ""
    table_key = ""  # the session table's key in summary.json
    checked_label = ""  # what the account's "checked" counts, for a terminal line

    def stop(self, run: Any) -> None:
        """Stop the test's probe (hooks removed, pending checks settled, files written)."""
        if run is not None:
            run.close()

    def read(self, run: Any) -> dict[str, Any]:  # pragma: no cover - abstract
        """The result of a stopped run, as the session keeps it."""
        raise NotImplementedError

    def blank(self, framework: str, config: Any) -> dict[str, Any]:  # pragma: no cover - abstract
        """The result of a test that gave the probe nothing (its probe failed, or never ran)."""
        raise NotImplementedError

    def test_entry(self, result: dict[str, Any]) -> dict[str, Any]:  # pragma: no cover - abstract
        raise NotImplementedError

    def entry(self, result: dict[str, Any]) -> dict[str, Any]:
        """A test's entry in summary.json: its findings and evidence, and its account."""
        return {**self.test_entry(result), "errors": result["errors"], "checked": result["checked"],
                "not_checked": result["not_checked"], "nothing_checked": result["nothing_checked"]}

    def failed(self, framework: str, config: Any, stage: str, exc: BaseException) -> dict[str, Any]:
        """The result of a test whose probe raised at `stage` (start, stop, results): a probe error."""
        result = self.blank(framework, config)
        add_failure(result, stage, exc)
        result["nothing_checked"] = f"the probe failed at its {stage} ({result['probe_failure'].splitlines()[0][:200]})"
        return result


def add_failure(result: dict[str, Any], stage: str, exc: BaseException) -> None:
    """Record that the probe itself raised at `stage` as a probe error of the test's result."""
    text = f"{type(exc).__name__}: {exc}"
    result["errors"] = result["errors"] + [ProbeError(f"probe {stage}", text, 1).to_dict()]
    result["probe_failure"] = text


class FreeBenchmarkTask(Task):
    name = "free_benchmark"
    table_title = "risky APIs"
    table_key = ApiRow.TABLE
    checked_label = CHECKED_LABELS[name]

    def start(self, framework: str, config: Any) -> Any:
        from pytest_msprobe.tool_runs import FreeBenchmarkRun

        return _entered(FreeBenchmarkRun(framework, config, ""))

    def read(self, run: Any) -> dict[str, Any]:
        return self.result_of(run.summary)

    def result_of(self, summary: Mapping[str, Any]) -> dict[str, Any]:
        """What the session keeps of a free_benchmark summary (a test's, or a rank's)."""
        apis = summary["apis"]
        checked = sum(s["checked"] for s in apis.values())
        not_checked = {reason: sum(per_api.values()) for reason, per_api in summary["not_checked"].items()}
        result = {"apis": apis, "flagged": summary["flagged"][:KEPT], "csv_files": summary["csv_files"],
                  "config": summary["config"], "framework": summary.get("framework", ""),
                  "errors": [ProbeError(e["first_call"], e["error"], e["count"]).to_dict() for e in summary["errors"]],
                  "checked": checked, "not_checked": not_checked,
                  "nothing_checked": None if checked else _nothing_checked(not_checked, "it called no API "
                                                                           "free_benchmark checks")}
        if summary.get("graphs"):
            result["graphs"] = summary["graphs"]
        from probes.free_benchmark.exclusions import COMPILED

        compiled = summary["not_checked"].get(COMPILED)
        if compiled:  # compiled MindSpore graphs: free_benchmark does not reach inside them
            result["compiled_not_checked"] = compiled
        return result

    def blank(self, framework: str, config: Any) -> dict[str, Any]:
        return {"apis": {}, "flagged": [], "csv_files": [], "config": config.to_dict() if config is not None else {},
                "framework": framework, "errors": [], "checked": 0, "not_checked": {}, "nothing_checked": None}

    def flagged(self, result: dict[str, Any]) -> list[str]:
        return sorted(api for api, s in result["apis"].items() if s["flagged"])

    def failure(self, nodeid: str, result: dict[str, Any]) -> str | None:
        return failure_message(nodeid, result) if self.flagged(result) else None

    def properties(self, result: dict[str, Any]) -> list[tuple[str, Any]]:
        """JUnit XML properties of a test (what a CI dashboard shows without opening files)."""
        checked = [(api, s) for api, s in result["apis"].items() if s["checked"]]
        props: list[tuple[str, Any]] = [("msprobe_apis_checked", len(checked))]
        flagged = [(api, s) for api, s in checked if s["flagged"]]
        if flagged:
            api, s = max(flagged, key=lambda kv: sort_figure(kv[1]["worst_max_rel"]))
            props += [("msprobe_flagged_apis", ",".join(self.flagged(result))),
                      ("msprobe_worst_api", api), ("msprobe_worst_max_rel", s["worst_max_rel"]),
                      ("msprobe_threshold", s["threshold"])]
        return props

    def test_entry(self, result: dict[str, Any]) -> dict[str, Any]:
        return {"flagged_apis": self.flagged(result), "csv_files": result["csv_files"],
                **({"graphs": result["graphs"]} if result.get("graphs") else {})}

    def table(self, results: list[tuple[str, dict[str, Any]]]) -> dict[str, ApiRow]:
        frameworks = {r["framework"] for _, r in results if r["apis"]}
        if len(frameworks) <= 1:
            return api_table((nodeid, r["apis"]) for nodeid, r in results)
        # a suite mixing PyTorch and MindSpore: Functional.gelu of one is not the other's
        return api_table(
            (nodeid, {f"{api} [{r['framework']}]": v for api, v in r["apis"].items()})
            for nodeid, r in results
        )

    def table_lines(self, table: dict[str, ApiRow], results: list[tuple[str, dict[str, Any]]]) -> list[str]:
        lines = risky_table_lines(table)
        compiled = [(nodeid, r["compiled_not_checked"]) for nodeid, r in results if r.get("compiled_not_checked")]
        if compiled:
            calls = sum(sum(c.values()) for _, c in compiled)
            lines.append(f"{len(compiled)} test(s) ran compiled MindSpore code that free_benchmark does not check "
                         f"({calls} call(s) of mindspore.jit functions or GRAPH_MODE cells; free_benchmark checks "
                         "PyNative calls, as msprobe; grad_probe does check compiled steps): "
                         + ", ".join(nodeid for nodeid, _ in compiled[:5]) + (" ..." if len(compiled) > 5 else ""))
        return lines


def grad_errors(errors: list[Any]) -> list[dict[str, Any]]:
    """grad_probe's errors as ProbeErrors: the watch's are strings, a monitor's name the parameter
    and step."""
    out = []
    for e in errors:
        if isinstance(e, Mapping):
            out.append(ProbeError(f"{e.get('param')} at step {e.get('step')}", str(e.get("error")), 1).to_dict())
        else:
            out.append(ProbeError("optimizer watch", str(e), 1).to_dict())
    return out


class GradProbeTask(Task):
    name = "grad_probe"
    table_title = "non-finite gradients"
    table_key = ParamRow.TABLE
    checked_label = CHECKED_LABELS[name]

    def start(self, framework: str, config: Any) -> Any:
        from pytest_msprobe.tool_runs import GradProbeRun

        return _entered(GradProbeRun(framework, config, ""))

    def read(self, run: Any) -> dict[str, Any]:
        return self.result_of(dict(run.summary, nonfinite=[f.to_dict() for f in run.nonfinite]))

    def result_of(self, summary: Mapping[str, Any]) -> dict[str, Any]:
        """What the session keeps of a watch summary with its non-finite findings."""
        result = grad_report.compact(summary)
        result["errors"] = grad_errors(result["errors"])
        result["checked"] = sum(o["params"] * o["steps_written"] for o in result["optimizers"])
        result["not_checked"] = {}
        result["nothing_checked"] = None if result["optimizers"] else "it stepped no optimizer"
        return result

    def blank(self, framework: str, config: Any) -> dict[str, Any]:
        return {"framework": framework, "optimizers": [], "nonfinite": [], "nonfinite_total": 0, "errors": [],
                "config": config.to_dict() if config is not None else {}, "checked": 0, "not_checked": {},
                "nothing_checked": None}

    def flagged(self, result: dict[str, Any]) -> list[str]:
        return sorted({f["param"] for f in result["nonfinite"]})

    def failure(self, nodeid: str, result: dict[str, Any]) -> str | None:
        return grad_report.failure_message(nodeid, result)

    def properties(self, result: dict[str, Any]) -> list[tuple[str, Any]]:
        props: list[tuple[str, Any]] = [("msprobe_param_steps_checked", result["checked"])]
        if result["nonfinite"]:
            props += [("msprobe_nonfinite_params", ",".join(self.flagged(result))),
                      ("msprobe_nonfinite_param_steps", result["nonfinite_total"])]
        return props

    def test_entry(self, result: dict[str, Any]) -> dict[str, Any]:
        return {"nonfinite_params": self.flagged(result), "dump_paths": [o["dump_path"] for o in result["optimizers"]]}

    def table(self, results: list[tuple[str, dict[str, Any]]]) -> dict[str, ParamRow]:
        return param_table((nodeid, r["nonfinite"]) for nodeid, r in results)

    def table_lines(self, table: dict[str, ParamRow], results: list[tuple[str, dict[str, Any]]]) -> list[str]:
        return grad_report.table_lines(table, results)


class OnlineDispatchTask(Task):
    name = "online_dispatch"
    table_title = "ops that disagree with the CPU reference"
    table_key = OpRow.TABLE
    checked_label = CHECKED_LABELS[name]

    def start(self, framework: str, config: Any) -> Any:
        from pytest_msprobe.tool_runs import OnlineDispatchRun

        if framework != "pytorch":
            return None  # aten ops are PyTorch's: a MindSpore test runs unprobed
        return _entered(OnlineDispatchRun(framework, config, ""))

    def read(self, run: Any) -> dict[str, Any]:
        if run is None:
            return dict(self.blank("mindspore", None),
                        nothing_checked="a MindSpore test: online_dispatch compares PyTorch's aten ops only")
        return self.result_of(run.summary)

    def result_of(self, summary: Mapping[str, Any]) -> dict[str, Any]:
        """What the session keeps of an online_dispatch summary (a run's, or a rank's runs merged)."""
        ops = failing_ops(summary)
        compared = summary["ops_compared"]
        return {"ops_compared": compared, "failing_ops": ops[:KEPT], "failed_total": len(ops),
                "ops": write_table(op_rows(summary)), "csv_path": summary.get("csv_path"),
                "errors": [ProbeError(*_split_error(key), n).to_dict() for key, n in summary["probe_errors"].items()],
                "summary": {k: summary[k] for k in ("ops_compared", "failed_ops", "csv_path", "graphs", "config")
                            if k in summary},
                "checked": compared, "not_checked": dict(summary["skipped_calls"]),
                "nothing_checked": None if compared else _nothing_checked(summary["skipped_calls"],
                                                                          "it ran no aten op that could be compared")}

    def blank(self, framework: str, config: Any) -> dict[str, Any]:
        return {"ops_compared": 0, "failing_ops": [], "failed_total": 0, "ops": {}, "csv_path": None, "errors": [],
                "summary": {}, "checked": 0, "not_checked": {}, "nothing_checked": None}

    def flagged(self, result: dict[str, Any]) -> list[str]:
        return sorted({f["op"] for f in result["failing_ops"]})

    def failure(self, nodeid: str, result: dict[str, Any]) -> str | None:
        from pytest_msprobe.tool_runs import dispatch_failure_message

        return dispatch_failure_message(nodeid, result["summary"]) if result["failing_ops"] else None

    def properties(self, result: dict[str, Any]) -> list[tuple[str, Any]]:
        props: list[tuple[str, Any]] = [("msprobe_ops_compared", result["ops_compared"])]
        if result["failing_ops"]:
            worst = min(result["failing_ops"], key=lambda f: f["cosine"] if f["cosine"] == f["cosine"] else -2.0)
            props += [("msprobe_failing_ops", ",".join(self.flagged(result))), ("msprobe_worst_op", worst["op"]),
                      ("msprobe_worst_cosine", worst["cosine"]), ("msprobe_worst_max_abs_err", worst["max_abs_err"])]
        return props

    def test_entry(self, result: dict[str, Any]) -> dict[str, Any]:
        graphs = result.get("summary", {}).get("graphs")
        return {"failing_ops": self.flagged(result), "csv_files": [result["csv_path"]] if result["csv_path"] else [],
                **({"graphs": graphs} if graphs else {})}

    def table(self, results: list[tuple[str, dict[str, Any]]]) -> dict[str, OpRow]:
        return op_table((nodeid, r["ops"]) for nodeid, r in results)

    def table_lines(self, table: dict[str, OpRow], results: list[tuple[str, dict[str, Any]]]) -> list[str]:
        failing = {op: t for op, t in table.items() if t.failed}
        if not failing:
            return [f"no failing op: every compared call of {len(table)} op(s) within the rule"]
        per_op = all(t.compared is not None for t in table.values())  # the tool counted each op's calls
        header = ("op",) + (("calls compared",) if per_op else ()) + (
            "failing calls", "worst Cosine", "worst MaxAbsErr", "tests affected")
        rows = [(op,) + ((str(t.compared),) if per_op else ()) + (
                 str(t.failed), _figure(t.worst_cosine), _figure(t.worst_max_abs_err), str(len(t.tests)))
                for op, t in sorted(failing.items(), key=lambda kv: (_cosine_key(kv[1].worst_cosine), kv[0]))]
        return text_table(header, rows)


def _nothing_checked(not_checked: Mapping[str, int], none: str) -> str:
    """Why a test gave the probe nothing: `none` when it made no call the probe saw, else the
    commonest reason its calls were left unchecked."""
    if not not_checked:
        return none
    reason = max(not_checked, key=lambda r: not_checked[r])
    more = ", ..." if len(not_checked) > 1 else ""
    return f"none of its {sum(not_checked.values())} call(s) could be checked ({short_reason(reason)}{more})"


def _split_error(key: str) -> tuple[str, str]:
    """online_dispatch's error keys are "op: what: error": the op, and the rest."""
    op, sep, rest = key.partition(": ")
    return (op, rest) if sep else ("", key)


def _figure(v: Any) -> str:
    return f"{v:.6g}" if isinstance(v, float) else str(v)


def _cosine_key(v: Any) -> float:
    return v if isinstance(v, float) and v == v else -2.0


#: the runner of each task named in probes.core.config.TASKS (a test checks they agree)
TASK_RUNNERS: dict[str, Any] = {runner.name: runner for runner in (FreeBenchmarkTask, GradProbeTask, OnlineDispatchTask)}
