"""What the plugin does per task: start a probe around a test, judge its result, build the
session table. One small class per task, so plugin.py stays the same for all of them.

Results cross process boundaries (xdist workers send them back as JSON), so `finish` returns a
plain dictionary and everything after it works on dictionaries only.
"""

from __future__ import annotations

from typing import Any

from pytest_msprobe.reports import grads as grad_report
from pytest_msprobe.reports.text import (
    failure_message,
    merge_api_tables,
    risky_table_lines,
    sort_figure,
    text_table,
)


class FreeBenchmarkTask:
    name = "free_benchmark"
    table_title = "risky APIs"

    def start(self, framework: str, config: Any) -> Any:
        from pytest_msprobe.tool_runs import FreeBenchmarkRun

        return FreeBenchmarkRun(framework, config, "").__enter__()

    def finish(self, run: Any) -> dict[str, Any]:
        run.close()
        summary = run.summary
        result = {k: summary[k] for k in ("apis", "flagged", "csv_files", "errors", "config")}
        result["flagged"] = result["flagged"][:50]
        result["framework"] = summary.get("framework", "")
        if summary.get("graphs"):
            result["graphs"] = summary["graphs"]
        from probes.free_benchmark.exclusions import COMPILED

        compiled = summary.get("not_checked", {}).get(COMPILED)
        if compiled:  # compiled MindSpore graphs: free_benchmark does not reach inside them
            result["compiled_not_checked"] = compiled
        return result

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
        return {"flagged_apis": self.flagged(result), "csv_files": result["csv_files"], "errors": result["errors"],
                **({"graphs": result["graphs"]} if result.get("graphs") else {})}

    def table(self, results: list[tuple[str, dict[str, Any]]]) -> dict[str, Any]:
        frameworks = {r.get("framework", "") for _, r in results}
        if len(frameworks) <= 1:
            return merge_api_tables((nodeid, r["apis"]) for nodeid, r in results)
        # a suite mixing PyTorch and MindSpore: Functional.gelu of one is not the other's
        return merge_api_tables(
            (nodeid, {f"{api} [{r.get('framework', '')}]": v for api, v in r["apis"].items()})
            for nodeid, r in results
        )

    def table_lines(self, table: dict[str, Any], results: list[tuple[str, dict[str, Any]]]) -> list[str]:
        lines = risky_table_lines(table)
        compiled = [(nodeid, r["compiled_not_checked"]) for nodeid, r in results if r.get("compiled_not_checked")]
        if compiled:
            calls = sum(sum(c.values()) for _, c in compiled)
            lines.append(f"{len(compiled)} test(s) ran compiled MindSpore code that free_benchmark does not check "
                         f"({calls} call(s) of mindspore.jit functions or GRAPH_MODE cells; free_benchmark checks "
                         "PyNative calls, as msprobe; grad_probe does check compiled steps): "
                         + ", ".join(nodeid for nodeid, _ in compiled[:5]) + (" ..." if len(compiled) > 5 else ""))
        return lines


class GradProbeTask:
    name = "grad_probe"
    table_title = "non-finite gradients"

    def start(self, framework: str, config: Any) -> Any:
        from pytest_msprobe.tool_runs import GradProbeRun

        return GradProbeRun(framework, config, "").__enter__()

    def finish(self, run: Any) -> dict[str, Any]:
        run.close()
        return grad_report.compact(dict(run.summary, nonfinite=[f.to_dict() for f in run.nonfinite]))

    def flagged(self, result: dict[str, Any]) -> list[str]:
        return sorted({f["param"] for f in result["nonfinite"]})

    def failure(self, nodeid: str, result: dict[str, Any]) -> str | None:
        return grad_report.failure_message(nodeid, result)

    def properties(self, result: dict[str, Any]) -> list[tuple[str, Any]]:
        steps = sum(o["params"] * o["steps_written"] for o in result["optimizers"])
        props: list[tuple[str, Any]] = [("msprobe_param_steps_checked", steps)]
        if result["nonfinite"]:
            props += [("msprobe_nonfinite_params", ",".join(self.flagged(result))),
                      ("msprobe_nonfinite_param_steps", result["nonfinite_total"])]
        return props

    def test_entry(self, result: dict[str, Any]) -> dict[str, Any]:
        return {"nonfinite_params": self.flagged(result),
                "dump_paths": [o["dump_path"] for o in result["optimizers"]], "errors": result["errors"]}

    def table(self, results: list[tuple[str, dict[str, Any]]]) -> dict[str, Any]:
        return grad_report.merge(results)

    def table_lines(self, table: dict[str, Any], results: list[tuple[str, dict[str, Any]]]) -> list[str]:
        return grad_report.table_lines(table, results)


class OnlineDispatchTask:
    name = "online_dispatch"
    table_title = "ops that disagree with the CPU reference"

    def start(self, framework: str, config: Any) -> Any:
        from pytest_msprobe.tool_runs import OnlineDispatchRun

        if framework != "pytorch":
            return None  # aten ops are PyTorch's: a MindSpore test runs unprobed
        return OnlineDispatchRun(framework, config, "").__enter__()

    def finish(self, run: Any) -> dict[str, Any]:
        from pytest_msprobe.tool_runs import failing_ops

        if run is None:
            return {"ops_compared": 0, "failing_ops": [], "failed_total": 0, "errors": [], "csv_path": None,
                    "summary": {}}
        run.close()
        ops = failing_ops(run.summary)
        return {"ops_compared": run.summary.get("ops_compared", 0), "failing_ops": ops[:50], "failed_total": len(ops),
                "errors": sorted(run.summary.get("probe_errors", {})), "csv_path": run.summary.get("csv_path"),
                "summary": {k: run.summary[k] for k in ("ops_compared", "failed_ops", "csv_path", "graphs")
                            if k in run.summary}}

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
                "errors": result["errors"], **({"graphs": graphs} if graphs else {})}

    def table(self, results: list[tuple[str, dict[str, Any]]]) -> dict[str, Any]:
        table: dict[str, dict[str, Any]] = {}
        for nodeid, r in results:
            for f in r["failing_ops"]:
                t = table.setdefault(f["op"], {"failed": 0, "worst_cosine": None, "worst_max_abs_err": 0.0,
                                               "tests": []})
                t["failed"] += 1
                if t["worst_cosine"] is None or f["cosine"] < t["worst_cosine"]:
                    t["worst_cosine"] = f["cosine"]
                t["worst_max_abs_err"] = max(t["worst_max_abs_err"], f["max_abs_err"])
                if nodeid not in t["tests"]:
                    t["tests"].append(nodeid)
        return table

    def table_lines(self, table: dict[str, Any], results: list[tuple[str, dict[str, Any]]]) -> list[str]:
        compared = sum(r["ops_compared"] for _, r in results)
        if not table:
            return [f"no failing op: {compared} op calls compared with the CPU reference in {len(results)} test(s)"]
        header = ("op", "failing calls", "worst Cosine", "worst MaxAbsErr", "tests affected")
        rows = [(op, str(t["failed"]), f"{t['worst_cosine']:.6g}", f"{t['worst_max_abs_err']:.6g}", str(len(t["tests"])))
                for op, t in sorted(table.items(), key=lambda kv: (kv[1]["worst_cosine"], kv[0]))]
        return (text_table(header, rows)
                + [f"{compared} op calls compared in {len(results)} test(s)"])


#: the runner of each task named in probes.core.config.TASKS (a test checks they agree)
TASK_RUNNERS: dict[str, Any] = {runner.name: runner for runner in (FreeBenchmarkTask, GradProbeTask, OnlineDispatchTask)}
