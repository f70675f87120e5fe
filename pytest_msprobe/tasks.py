"""What the plugin does per task: start a probe around a test, judge its result, build the
session table. One small class per task, so plugin.py stays the same for all of them.

Results cross process boundaries (xdist workers send them back as JSON), so `finish` returns a
plain dictionary and everything after it works on dictionaries only.
"""

from __future__ import annotations

from typing import Any

from pytest_msprobe import grad_report
from pytest_msprobe.reporting import failure_message, merge_api_tables, risky_table_lines, sort_figure


class FreeBenchmarkTask:
    name = "free_benchmark"
    table_title = "risky APIs"

    def start(self, framework: str, config: Any) -> Any:
        if framework == "mindspore":
            from probes.mindspore import PrecisionDebugger
        else:
            from probes.pytorch import PrecisionDebugger
        debugger = PrecisionDebugger(config=config)
        debugger.start()
        return debugger

    def finish(self, debugger: Any) -> dict[str, Any]:
        debugger.stop()
        summary = debugger.summary()
        result = {k: summary[k] for k in ("apis", "flagged", "csv_files", "errors", "config")}
        result["flagged"] = result["flagged"][:50]
        result["framework"] = summary.get("framework", "")
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
        return {"flagged_apis": self.flagged(result), "csv_files": result["csv_files"], "errors": result["errors"]}

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
        return risky_table_lines(table)


class GradProbeTask:
    name = "grad_probe"
    table_title = "non-finite gradients"

    def start(self, framework: str, config: Any) -> Any:
        if framework == "mindspore":
            from probes.grad_probe.mindspore_watch import MindSporeOptimizerWatch as Watch
        else:
            from probes.grad_probe.torch_watch import TorchOptimizerWatch as Watch
        return Watch(config).start()

    def finish(self, watch: Any) -> dict[str, Any]:
        from probes.grad_probe.health import nonfinite_gradients

        watch.stop()
        summary = watch.summary()
        summary["nonfinite"] = [f.to_dict() for f in nonfinite_gradients(watch.config.dump_path)]
        return grad_report.compact(summary)

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


TASKS: dict[str, Any] = {"free_benchmark": FreeBenchmarkTask, "grad_probe": GradProbeTask}
