"""free_benchmark as the plugin runs it: perturb each API's inputs, re-run it, judge the change."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

from probes.core.records import rule_figures
from probes.core.session_tables import ApiRow, ProbeError, api_table, sort_figure
from probes.core.table_text import figure_text, risky_table_lines
from pytest_msprobe.tools.base import KEPT, Results, Tool, ToolRun, nothing_checked, shown


def failure_message(nodeid: str, summary: dict[str, Any], limit: int = 10) -> str:
    """What a failing test prints: each flagged API with its figure, threshold and evidence."""
    flagged = [(api, s) for api, s in summary["apis"].items() if s["flagged"]]
    flagged.sort(key=lambda kv: -sort_figure(kv[1]["worst_max_rel"]))
    section = summary["config"]["free_benchmark"]
    lines = [f"free_benchmark ({section['pert_mode']}, {section.get('rule', 'reference')} rule) flagged "
             f"{len(flagged)} API(s) in {nodeid}:"]
    rows_by_api: dict[str, dict[str, Any]] = {}
    for row in summary["flagged"]:
        rows_by_api.setdefault(row["api"], row)
    for api, s in flagged[:limit]:
        row = rows_by_api.get(api, {})
        where = f" output {row.get('output_index')}" if row.get("output_index") not in (None, "") else ""
        both = rule_figures(row.get("detail") or {})
        lines.append(
            f"  {s['first_flagged']}: max_rel {figure_text(s['worst_max_rel'])} > threshold "
            f"{figure_text(s['threshold'])} ({row.get('dtype', '?')}{where}; {s['flagged']} of {s['checked']} "
            "checked calls inconsistent)"
            + (f"\n      {both}" if both else "")
        )
    if len(flagged) > limit:
        lines.append(f"  ... and {len(flagged) - limit} more")
    graphs = [g for g in summary.get("graphs", []) if g.get("flagged")]
    if graphs:  # compiled graphs: where they lose it, and how to reproduce it (probes.compiled)
        from probes.compiled.check import graph_lines

        lines += graph_lines(graphs)
    csvs = summary.get("csv_files") or []
    if csvs:
        lines.append(f"evidence: {csvs[0]}" + (f" (+{len(csvs) - 1} more)" if len(csvs) > 1 else ""))
    lines.append("next: run this API alone with free_benchmark list=[...] in other modes, or compare it with "
                 "pert_mode=to_cpu (fuzz_device cpu); use --msprobe-fail-on=never to report without failing.")
    return "\n".join(lines)


class FreeBenchmarkRun(ToolRun):
    """`with free_benchmark(pert_mode="bit_noise", list=["softmax"]) as fb: ...`, then `fb.rows`,
    `fb.flagged_apis`, `fb.assert_clean()`. `fb.step()` marks a training step inside the block."""

    tool = "free_benchmark"

    def start(self) -> None:
        if self.framework == "mindspore":
            from probes.mindspore import PrecisionDebugger
        else:
            from probes.pytorch import PrecisionDebugger
        self.handle = PrecisionDebugger(config=self.config)
        self.handle.start()

    def step(self) -> None:
        self.handle.step()

    def finish(self) -> None:
        self.handle.stop()
        self.summary = self.handle.summary()

    @property
    def rows(self) -> list[Any]:
        """The inconsistent outputs (records of free_benchmark.csv rows)."""
        return self.handle.rows if self.handle is not None else []

    @property
    def flagged_apis(self) -> list[str]:
        return sorted(api for api, s in self.summary.get("apis", {}).items() if s["flagged"])

    def assert_clean(self) -> None:
        """Fail, with each flagged API's figure, threshold and evidence file, unless every
        checked output stayed within its dtype's threshold."""
        if self.handle is None or not self.summary:
            raise RuntimeError("assert_clean() reads the results of a finished run: call it after the `with` block")
        if self.flagged_apis:
            raise AssertionError(failure_message(self.label, self.summary))


class FreeBenchmarkTool(Tool):
    name = "free_benchmark"
    table_title = "risky APIs"
    run_class = FreeBenchmarkRun
    report_sections = ("apis",)

    def session_config_problem(self, config: Any) -> str | None:
        if config.free_benchmark.if_preheat:
            return ("free_benchmark.if_preheat=true does not fit --msprobe-task: each test is one probe run "
                    "without training steps, and preheat needs a census step and preheat_step sampling steps; "
                    "allowed: if_preheat false here (use preheat in a training script)")
        return None

    def result_of(self, summary: Mapping[str, Any]) -> dict[str, Any]:
        apis = summary["apis"]
        checked = sum(s["checked"] for s in apis.values())
        not_checked = {reason: sum(per_api.values()) for reason, per_api in summary["not_checked"].items()}
        result = {"apis": apis, "flagged": summary["flagged"][:KEPT], "csv_files": summary["csv_files"],
                  "config": summary["config"], "framework": summary.get("framework", ""),
                  "errors": [ProbeError(e["first_call"], e["error"], e["count"]).to_dict() for e in summary["errors"]],
                  "checked": checked, "not_checked": not_checked,
                  "nothing_checked": None if checked else nothing_checked(not_checked, "it called no API "
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
        return {self.findings_key: self.flagged(result), "csv_files": result["csv_files"],
                **({"graphs": result["graphs"]} if result.get("graphs") else {})}

    def table(self, results: Results) -> dict[str, ApiRow]:
        frameworks = {r["framework"] for _, r in results if r["apis"]}
        if len(frameworks) <= 1:
            return api_table((nodeid, r["apis"]) for nodeid, r in results)
        # a suite mixing PyTorch and MindSpore: Functional.gelu of one is not the other's
        return api_table(
            (nodeid, {f"{api} [{r['framework']}]": v for api, v in r["apis"].items()})
            for nodeid, r in results
        )

    def table_lines(self, table: dict[str, ApiRow], results: Results) -> list[str]:
        lines = risky_table_lines(table)
        compiled = [(nodeid, r["compiled_not_checked"]) for nodeid, r in results if r.get("compiled_not_checked")]
        if compiled:
            calls = sum(sum(c.values()) for _, c in compiled)
            lines.append(f"{len(compiled)} test(s) ran compiled MindSpore code that free_benchmark does not check "
                         f"({calls} call(s) of mindspore.jit functions or GRAPH_MODE cells; free_benchmark checks "
                         "PyNative calls, as msprobe; grad_probe does check compiled steps): "
                         + ", ".join(nodeid for nodeid, _ in compiled[:5]) + (" ..." if len(compiled) > 5 else ""))
        return lines

    def golden_input(self, outcome: dict[str, Any], dump: Any) -> Any:
        """What its golden kind reads of a test's result under the session's probe."""
        return outcome["apis"]

    def run_golden_input(self, run: FreeBenchmarkRun) -> Any:
        """What its golden kind reads of a fixture's run."""
        return run.summary.get("apis", {})

    def read_rank(self, summaries: list[dict[str, Any]], paths: list[Path], rank: int
                  ) -> tuple[dict[str, Any], list[dict[str, Any]], list[dict[str, Any]]]:
        s = summaries[0]
        found = [{"rank": rank, "what": row["api_name"], "name": row["api"], "step": row["step"], "order": i,
                  "figure": row["max_rel"], "threshold": row["threshold"],
                  "figure_text": f"max_rel {shown(row['max_rel'])} > threshold {shown(row['threshold'])}, "
                                 f"{row['dtype']}" + (f" output {row['output_index']}" if row["output_index"] != ""
                                                      else ""),
                  "evidence": row.get("detail", {}).get("csv") or str(paths[0])}
                 for i, row in enumerate(s.get("flagged", []))]
        result = self.result_of(s)
        return result, found, result["errors"]

