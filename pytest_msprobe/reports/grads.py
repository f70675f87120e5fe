"""grad_probe's verdicts and session table in whole-suite mode (framework-free; works on the
JSON-able dictionaries that xdist workers send back)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from pytest_msprobe.reports.tables import ParamRow
from pytest_msprobe.reports.text import text_table

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


def failure_message(nodeid: str, result: dict[str, Any], limit: int = 10) -> str | None:
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


def table_lines(table: Mapping[str, ParamRow], results: list[tuple[str, dict[str, Any]]]) -> list[str]:
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
