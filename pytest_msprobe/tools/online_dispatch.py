"""online_dispatch as the plugin runs it: every aten op re-run on the CPU reference and compared."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any, Callable

from probes.core.session_tables import (
    COMPARED_BY_OP,
    OpRow,
    ProbeError,
    as_number,
    failing_ops,
    op_rows,
    op_table,
    write_table,
)
from probes.core.table_text import figure_text, text_table
from pytest_msprobe.tools.base import KEPT, Results, Tool, ToolRun, entered, nothing_checked, shown


def dispatch_arguments(config: Any, overrides: dict[str, Any] | None = None) -> dict[str, Any]:
    """PtdbgDispatch's arguments from the config's "online_dispatch" section and overrides (its
    keys: probes.online_dispatch.options.CONFIG_SECTION_KEYS); dump_mode defaults to "auto"
    (failing ops dumped)."""
    from probes.online_dispatch.options import check_config_section

    section = dict(config.extra_sections.get("online_dispatch", {}))
    section.update(overrides or {})
    check_config_section(section)
    section.setdefault("dump_mode", "auto")
    return dict(section, dump_path=str(config.dump_path))


class OnlineDispatchRun(ToolRun):
    """`with online_dispatch(dump_mode="auto") as od: model(x)`; then `od.failing_ops` and
    `od.assert_clean()`. Every aten op in the block is compared with the CPU (float64 on a CPU run)."""

    tool = "online_dispatch"

    def __init__(self, framework: str, config: Any, label: str, overrides: dict[str, Any] | None = None) -> None:
        super().__init__(framework, config, label)
        if framework != "pytorch":
            raise ValueError("online_dispatch checks PyTorch aten ops; this test uses MindSpore")
        from probes.pytorch.online_dispatch import PtdbgDispatch

        self.handle = PtdbgDispatch(**dispatch_arguments(config, overrides))
        self.entered = False

    def start(self) -> None:
        self.handle.__enter__()
        self.entered = True

    def __exit__(self, *exc: Any) -> None:
        self.leave(*exc)

    def close(self) -> None:
        """Leave the dispatch mode if the test left the block open, then read the results."""
        self.leave(None, None, None)

    def leave(self, *exc: Any) -> None:
        if not self.closed:
            self.closed = True
            if self.entered:
                self.entered = False
                self.handle.__exit__(*exc)
            self.finish()

    def finish(self) -> None:
        if self.handle.results is None:  # never entered
            return
        self.handle.close()
        self.summary = self.handle.results.summary()
        self.summary["csv_path"] = str(self.handle.results.csv_path)

    @property
    def failing_ops(self) -> list[dict[str, Any]]:
        """One entry per failing op call: {"op", "name", "cosine", "max_abs_err"} (worst leaf)."""
        return failing_ops(self.summary)

    def assert_clean(self) -> None:
        if not self.summary:
            raise RuntimeError("assert_clean() reads the results of a finished run: call it after the `with` block")
        if self.failing_ops:
            raise AssertionError(dispatch_failure_message(self.label, self.summary))


def dispatch_failure_message(label: str, summary: dict[str, Any], limit: int = 10) -> str:
    from probes.core.dispatch_metrics import (
        COS_MAX_THRESHOLD,
        COS_THRESHOLD,
        MAX_ABS_ERR_MAX_THRESHOLD,
        MAX_ABS_ERR_THRESHOLD,
    )

    ops = failing_ops(summary)
    lines = [f"online_dispatch found {len(ops)} failing op call(s) in {label} "
             f"(of {summary.get('ops_compared', '?')} compared against the CPU reference):"]
    leaves = {f["name"]: f.get("leaves") or [] for f in summary.get("failed_ops", [])}
    for f in ops[:limit]:
        rules = sorted({leaf.get("failed_rule") for leaf in leaves.get(f["name"], []) if leaf.get("failed_rule")})
        ulps = [as_number(leaf["scaled_ulps"], 0.0) for leaf in leaves.get(f["name"], [])
                if leaf.get("scaled_ulps") not in (None, "")]
        extra = (f", scaled error {max(ulps):.4g} ulp" if ulps else "") + (f" [{'/'.join(rules)}]" if rules else "")
        lines.append(f"  {f['name']} ({f['op']}): Cosine {f['cosine']:.6g}, MaxAbsErr {f['max_abs_err']:.6g}{extra}")
    if len(ops) > limit:
        lines.append(f"  ... and {len(ops) - limit} more")
    graphs = [g for g in summary.get("graphs", []) if g.get("flagged")]
    if graphs:  # compiled graphs: where they lose it, and how to reproduce it (probes.compiled)
        from probes.compiled.check import graph_lines

        lines += graph_lines(graphs)
    config = summary.get("config")
    rule = config.get("rule", "reference") if config else "both"  # runs before the rule option: msprobe's
    reference = (f"Cosine < {COS_THRESHOLD} and MaxAbsErr > {MAX_ABS_ERR_THRESHOLD}, or Cosine < "
                 f"{COS_MAX_THRESHOLD}, or MaxAbsErr > {MAX_ABS_ERR_MAX_THRESHOLD}")
    scaled = "the error at the output's scale is above the dtype's DISPATCH_SCALED_THRESHOLD"
    text = {"reference": reference, "scaled": scaled}.get(rule, f"{reference} (reference), or {scaled} (scaled)")
    lines.append(f"rule ({rule}): fail when {text} (noise-level differences pass)")
    if summary.get("csv_path"):
        lines.append(f"evidence: {summary['csv_path']} (inputs and outputs of failing ops dumped beside it)")
    lines.append("next: rerun the op alone with PtdbgDispatch(dump_mode='list', api_list=[...]) and compare the "
                 "dumped .npy files; use --msprobe-fail-on=never to report without failing.")
    return "\n".join(lines)


class OnlineDispatchTool(Tool):
    name = "online_dispatch"
    table_title = "ops that disagree with the CPU reference"
    run_class = OnlineDispatchRun
    report_sections = ("ops",)

    def start(self, framework: str, config: Any) -> Any:
        if framework != "pytorch":
            return None  # aten ops are PyTorch's: a MindSpore test runs unprobed
        return entered(OnlineDispatchRun(framework, config, ""))

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
                "nothing_checked": None if compared else nothing_checked(summary["skipped_calls"],
                                                                         "it ran no aten op that could be compared")}

    def blank(self, framework: str, config: Any) -> dict[str, Any]:
        return {"ops_compared": 0, "failing_ops": [], "failed_total": 0, "ops": {}, "csv_path": None, "errors": [],
                "summary": {}, "checked": 0, "not_checked": {}, "nothing_checked": None}

    def flagged(self, result: dict[str, Any]) -> list[str]:
        return sorted({f["op"] for f in result["failing_ops"]})

    def failure(self, nodeid: str, result: dict[str, Any]) -> str | None:
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
        return {self.findings_key: self.flagged(result),
                "csv_files": [result["csv_path"]] if result["csv_path"] else [],
                **({"graphs": graphs} if graphs else {})}

    def table(self, results: Results) -> dict[str, OpRow]:
        return op_table((nodeid, r["ops"]) for nodeid, r in results)

    def table_lines(self, table: dict[str, OpRow], results: Results) -> list[str]:
        failing = {op: t for op, t in table.items() if t.failed}
        if not failing:
            return [f"no failing op: every compared call of {len(table)} op(s) within the rule"]
        per_op = all(t.compared is not None for t in table.values())  # the tool counted each op's calls
        header = ("op",) + (("calls compared",) if per_op else ()) + (
            "failing calls", "worst Cosine", "worst MaxAbsErr", "tests affected")
        rows = [(op,) + ((str(t.compared),) if per_op else ()) + (
                 str(t.failed), figure_text(t.worst_cosine), figure_text(t.worst_max_abs_err), str(len(t.tests)))
                for op, t in sorted(failing.items(), key=lambda kv: (_cosine_key(kv[1].worst_cosine), kv[0]))]
        return text_table(header, rows)

    def make_run(self, framework: str, config_for: Callable[..., Any], dump: Path, label: str,
                 overrides: dict[str, Any]) -> ToolRun:
        """The fixture's keyword arguments are PtdbgDispatch's, not config keys."""
        return OnlineDispatchRun(framework, config_for(self.name, dump, None), label, overrides)

    def golden_input(self, outcome: dict[str, Any], dump: Any) -> Any:
        return outcome["failing_ops"]

    def run_golden_input(self, run: OnlineDispatchRun) -> Any:
        return run.failing_ops

    def read_rank(self, summaries: list[dict[str, Any]], paths: list[Path], rank: int
                  ) -> tuple[dict[str, Any], list[dict[str, Any]], list[dict[str, Any]]]:
        found, csvs = [], []
        merged: dict[str, Any] = {"failed_ops": [], "ops_compared": 0, "probe_errors": {}, "skipped_calls": {},
                                  COMPARED_BY_OP: {}}
        per_op = all(COMPARED_BY_OP in s for s in summaries)  # calls per op only where every run counted them
        for s, path in zip(summaries, paths):  # a rank's runs, as one
            csv = str(path.parent / s["csv"]) if s.get("csv") else str(path)
            csvs.append(csv)
            for f in failing_ops(s):
                found.append({"rank": rank, "what": f["name"], "name": f["op"], "step": None, "order": len(found),
                              "figure": f["cosine"], "threshold": None,
                              "figure_text": f"cosine {shown(f['cosine'])}, max abs err {shown(f['max_abs_err'])}",
                              "evidence": csv})
            merged["failed_ops"] += s.get("failed_ops", [])
            merged["ops_compared"] += s.get("ops_compared", 0)
            for key in ("probe_errors", "skipped_calls", COMPARED_BY_OP):
                for k, n in (s.get(key) or {}).items():
                    merged[key][k] = merged[key].get(k, 0) + n
        if not per_op:
            del merged[COMPARED_BY_OP]
        merged["csv_path"] = csvs[0] if csvs else None
        result = self.result_of(merged)
        return result, found, result["errors"]



def _split_error(key: str) -> tuple[str, str]:
    """online_dispatch's error keys are "op: what: error": the op, and the rest."""
    op, sep, rest = key.partition(": ")
    return (op, rest) if sep else ("", key)


def _cosine_key(v: Any) -> float:
    return v if isinstance(v, float) and v == v else -2.0
