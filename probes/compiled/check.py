"""What a check of compiled graphs reports: `CompiledCheck`, the outcome of
`probes.compiled.check_compiled(fn, *inputs)`, and the lines a failure says about each flagged graph
(the plugin's reports use them for free_benchmark's and online_dispatch's graphs alike).

The check itself is free_benchmark run on the function's graphs (probes/free_benchmark/compiled_check.py):
it is built on this package, so the graph machinery here never loads a tool.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any


@dataclass
class CompiledCheck:
    """The outcome of check_compiled: the function's outputs and every graph's report."""

    outputs: Any
    graphs: list[dict[str, Any]]
    dump_path: Path
    summaries: list[dict[str, Any]] = field(default_factory=list)

    @property
    def flagged(self) -> list[dict[str, Any]]:
        return [g for g in self.graphs if g.get("flagged")]

    def assert_clean(self) -> None:
        """Fail, naming each graph whose compiled outputs (or gradients) are further from float64
        than their dtype allows, with the failing node and the reproduction."""
        __tracebackhide__ = True  # pytest shows the message, not this frame
        if not self.graphs:
            raise AssertionError(f"no compiled graph was checked (dump: {self.dump_path}); the function ran "
                                 "without Dynamo capturing a graph")
        if self.flagged:
            raise AssertionError("\n".join(graph_lines(self.flagged)))


def graph_lines(graphs: list[dict[str, Any]]) -> list[str]:
    """What a failure says about each flagged graph (its worst figures, the node, the repro)."""
    lines = [f"{len(graphs)} compiled graph(s) lose precision against float64:"]
    for g in graphs:
        lines.append(f"  Graph.{g['graph']} ({g['where']}, backend {g['backend']}): flagged on {g['flagged']} of "
                     f"{g['checked']} checked calls")
        for stage in ("forward", "backward"):
            f = g.get(stage)
            if f:
                eager = f" (eager kernels: {_text(f.get('eager_ulps'))})" if f.get("eager_ulps") is not None else ""
                lines.append(f"    {stage}: output {f['output']} ({f['dtype']}) {_text(f['compiled_ulps'])} ulps > "
                             f"{_text(f['threshold_ulps'])} allowed{eager}")
        found = g.get("localisation")
        if found:
            where = ("only the compiled code loses it: a compiler problem" if found["where"] == "compiler"
                     else "the eager kernel loses it too: a kernel problem")
            lines.append(f"    first failing node: {found['node']} ({found['target']}) at {found['source'] or '?'}: "
                         f"compiled {_text(found['compiled_ulps'])}, eager {_text(found['eager_ulps'])} ulps; {where}")
            lines.append(f"    reproduce: python {Path(found['repro']) / 'repro.py'}")
    return lines


def _text(v: Any) -> str:
    if isinstance(v, (int, float)):
        return f"{v:.4g}" if math.isfinite(v) else str(v)
    return str(v)
