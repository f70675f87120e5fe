"""grad_probe as the plugin runs it: every optimizer step's gradient statistics, and their direction."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

from probes.core.session_tables import ParamRow, ProbeError, param_table
from probes.core.table_text import text_table
from pytest_msprobe.tools.base import Results, Tool, ToolRun, entered

NONFINITE_KEPT = 50


def compact(summary: dict[str, Any]) -> dict[str, Any]:
    """What the session keeps of one test's watch summary."""
    optimizers = []
    for opt in summary["optimizers"]:
        optimizers.append({"dump_path": opt["dump_path"], "params": len(opt["params"]),
                           "steps_written": len(opt["steps_written"]), "errors": opt["errors"]})
    return {
        "framework": summary["framework"],
        "optimizers": optimizers,
        "nonfinite": summary["nonfinite"][:NONFINITE_KEPT],
        "nonfinite_total": len(summary["nonfinite"]),
        "errors": summary["errors"] + [e for opt in summary["optimizers"] for e in opt["errors"]],
        "config": summary["config"],
    }


def nonfinite_message(nodeid: str, result: dict[str, Any], limit: int = 10) -> str | None:
    """What a test with non-finite gradients fails with: each parameter's first, and where to look next."""
    bad = result["nonfinite"]
    if not bad:
        return None
    first: dict[str, dict[str, Any]] = {}
    for f in bad:
        first.setdefault(f["param"], f)
    lines = [f"grad_probe found non-finite gradients in {nodeid} "
             f"({len(first)} parameter(s), {result['nonfinite_total']} parameter-step(s)):"]
    for f in list(first.values())[:limit]:
        shown = ", ".join(f"{k} {v}" for k, v in f["figures"].items())
        lines.append(f"  {f['param']}: first at step {f['step']} ({shown}; threshold: finite)")
    if len(first) > limit:
        lines.append(f"  ... and {len(first) - limit} more")
    lines.append(f"evidence: {bad[0]['csv']}")
    lines.append("next: rerun this test with --msprobe-task=free_benchmark to find the API that loses precision, "
                 "or look at the loss scale / learning rate of the step before; "
                 "use --msprobe-fail-on=never to report without failing.")
    return "\n".join(lines)


def nonfinite_table_lines(table: Mapping[str, ParamRow], results: Results) -> list[str]:
    """The session's non-finite parameters, worst first; with none, one line counting what was checked."""
    optimizers = sum(len(r["optimizers"]) for _, r in results)
    param_steps = sum(o["params"] * o["steps_written"] for _, r in results for o in r["optimizers"])
    if not table:
        return [f"all gradients finite: {optimizers} optimizer(s), {param_steps} parameter-steps checked "
                f"in {len(results)} test(s)"]
    header = ("parameter", "non-finite steps", "first", "tests affected")
    rows = [(p, str(t.nonfinite_steps), t.first, str(len(t.tests)))
            for p, t in sorted(table.items(), key=lambda kv: (-kv[1].nonfinite_steps, kv[0]))]
    return (text_table(header, rows)
            + [f"{optimizers} optimizer(s), {param_steps} parameter-steps checked in {len(results)} test(s)"])


class GradProbeRun(ToolRun):
    """`with grad_probe() as run: train(...)` monitors every optimizer stepped in the block; then
    `run.assert_finite()` and `run.assert_directions_close(other_run_or_dump_path)`."""

    tool = "grad_probe"

    def start(self) -> None:
        if self.framework == "mindspore":
            from probes.grad_probe.mindspore_watch import MindSporeOptimizerWatch as Watch
        else:
            from probes.grad_probe.torch_watch import TorchOptimizerWatch as Watch
        self.handle = Watch(self.config).start()

    def finish(self) -> None:
        self.handle.stop()
        self.summary = self.handle.summary()

    @property
    def nonfinite(self) -> list[Any]:
        from probes.grad_probe.health import nonfinite_gradients

        return nonfinite_gradients(self.dump_path)

    @property
    def steps(self) -> int:
        """Optimizer steps recorded by the first optimizer of the block."""
        first = self.summary.get("optimizers") or [{}]
        return len(first[0].get("steps_written", []))

    def assert_finite(self) -> None:
        bad = self.nonfinite
        if bad:
            shown = "\n".join(f"  {f.describe()}" for f in bad[:10])
            raise AssertionError(f"{self.label}: {len(bad)} non-finite gradient statistic(s):\n{shown}\n"
                                 f"evidence: {bad[0].csv}")

    def assert_directions_close(self, other: GradProbeRun | str | Path, first_step_min: float | None = None,
                                max_drop: float | None = None) -> None:
        """The direction rule between this run and `other` (a run or a grad_probe dump path):
        similarity ≥ first_step_min at the first step, no drop > max_drop after it (the rule's
        own limits unless given)."""
        from probes.grad_probe import assert_grad_directions_close
        from probes.grad_probe.direction_rule import FIRST_STEP_MIN, MAX_DROP

        if not self.summary.get("optimizers"):
            raise AssertionError(f"{self.label}: no optimizer stepped inside the grad_probe block; nothing to compare")
        other_path = other.dump_path if isinstance(other, GradProbeRun) else Path(other)
        assert_grad_directions_close(self.dump_path, other_path,
                                     FIRST_STEP_MIN if first_step_min is None else first_step_min,
                                     MAX_DROP if max_drop is None else max_drop,
                                     out=self.dump_path.parent / f"{self.dump_path.name}_vs_{other_path.name}")


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


class GradProbeTool(Tool):
    name = "grad_probe"
    table_title = "non-finite gradients"
    run_class = GradProbeRun
    report_sections = ("params", "similarities", "fp8_health")

    def start(self, framework: str, config: Any) -> Any:
        return entered(GradProbeRun(framework, config, ""))

    def read(self, run: Any) -> dict[str, Any]:
        return self.result_of(dict(run.summary, nonfinite=[f.to_dict() for f in run.nonfinite]))

    def result_of(self, summary: Mapping[str, Any]) -> dict[str, Any]:
        """What the session keeps of a watch summary with its non-finite findings."""
        result = compact(summary)
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
        return nonfinite_message(nodeid, result)

    def properties(self, result: dict[str, Any]) -> list[tuple[str, Any]]:
        props: list[tuple[str, Any]] = [("msprobe_param_steps_checked", result["checked"])]
        if result["nonfinite"]:
            props += [("msprobe_nonfinite_params", ",".join(self.flagged(result))),
                      ("msprobe_nonfinite_param_steps", result["nonfinite_total"])]
        return props

    def test_entry(self, result: dict[str, Any]) -> dict[str, Any]:
        return {self.findings_key: self.flagged(result), "dump_paths": [o["dump_path"] for o in result["optimizers"]]}

    def table(self, results: Results) -> dict[str, ParamRow]:
        return param_table((nodeid, r["nonfinite"]) for nodeid, r in results)

    def table_lines(self, table: dict[str, ParamRow], results: Results) -> list[str]:
        return nonfinite_table_lines(table, results)

    def golden_input(self, outcome: dict[str, Any], dump: Any) -> Any:
        return dump

    def run_golden_input(self, run: GradProbeRun) -> Any:
        return run.dump_path

    def read_rank(self, summaries: list[dict[str, Any]], paths: list[Path], rank: int
                  ) -> tuple[dict[str, Any], list[dict[str, Any]], list[dict[str, Any]]]:
        from probes.grad_probe.health import nonfinite_gradients  # reads CSVs only: no framework

        rank_dir = paths[0].parent
        bad = nonfinite_gradients(rank_dir)
        found = [{"rank": rank, "what": f.param, "name": f.param, "step": f.step, "order": i, "figure": f.figures,
                  "threshold": "finite",
                  "figure_text": ", ".join(f"{k} {v}" for k, v in f.figures.items()) + " (not finite)",
                  "evidence": f.csv} for i, f in enumerate(sorted(bad, key=lambda f: f.step))]
        s = summaries[0]  # the rank's monitor summary: one optimizer
        watch = {"framework": s.get("framework", ""), "errors": [], "config": s.get("config", {}),
                 "optimizers": [dict(s, dump_path=str(rank_dir))], "nonfinite": [f.to_dict() for f in bad]}
        result = self.result_of(watch)
        return result, found, result["errors"]

