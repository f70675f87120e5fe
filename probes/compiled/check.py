"""One compiled function, judged on its own: `check_compiled(fn, *inputs)`.

For a test that wants just that: ``fn`` is compiled with ``torch.compile`` and run once on the
inputs under free_benchmark (improve_precision, the scaled rule, compiled graphs only): every graph
Dynamo captures is judged against its eager program in float64, with the eager kernels' own error
next to it; with ``backward=True`` the gradients too (a second call, floating inputs made to require
gradients, with a cotangent of ones for every floating output that requires one). A failing graph names its first failing node and
leaves a standalone reproduction.
"""

from __future__ import annotations

import math
import tempfile
from collections.abc import Callable
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


def check_compiled(fn: Callable[..., Any], *inputs: Any, backend: Any = "inductor", backward: bool = False,
                   dump_path: str | Path | None = None, pert_mode: str = "improve_precision",
                   **compile_kwargs: Any) -> CompiledCheck:
    """Compile `fn` with torch.compile(backend=..., **compile_kwargs), run it on `inputs` under
    free_benchmark restricted to compiled graphs, and return the graphs' reports."""
    import torch

    from probes.pytorch import PrecisionDebugger

    dump = Path(dump_path) if dump_path is not None else Path(tempfile.mkdtemp(prefix="msprobe-compiled-"))
    if backward:
        # a function of its inputs only gets gradients through them: inputs that need none are
        # passed as copies that do (both calls: one compiled graph serves the two stages)
        inputs = tuple(x.detach().requires_grad_() if isinstance(x, torch.Tensor) and x.is_floating_point()
                       and not x.requires_grad else x for x in inputs)
    compiled = torch.compile(fn, backend=backend, **compile_kwargs)
    section = {"pert_mode": pert_mode, "rule": "scaled", "list": ["Graph"], "compiled_first": 1}
    forward = PrecisionDebugger(config={"task": "free_benchmark", "dump_path": str(dump / "forward"),
                                        "free_benchmark": section})
    with forward:
        outputs = compiled(*inputs)
    summaries = [forward.summary()]
    if backward:
        stage = PrecisionDebugger(config={"task": "free_benchmark", "dump_path": str(dump / "backward"),
                                          "free_benchmark": dict(section, fuzz_stage="backward")})
        with stage:
            again = compiled(*inputs)
            leaves = [t for t in _tensors(again) if t.is_floating_point() and t.requires_grad]
            if leaves:
                torch.autograd.backward(leaves, [torch.ones_like(t) for t in leaves])
        summaries.append(stage.summary())
    return CompiledCheck(outputs, _merged(summaries), dump, summaries)


def _tensors(x: Any) -> list[Any]:
    import torch

    if isinstance(x, torch.Tensor):
        return [x]
    if isinstance(x, (list, tuple)):
        return [t for item in x for t in _tensors(item)]
    if isinstance(x, dict):
        return [t for item in x.values() for t in _tensors(item)]
    return []


def _merged(summaries: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The forward run's graph reports with the backward run's figures folded in."""
    graphs: dict[str, dict[str, Any]] = {}
    for summary in summaries:
        for g in summary.get("graphs", []):
            seen = graphs.get(g["graph"])
            if seen is None:
                graphs[g["graph"]] = dict(g)
                continue
            seen["checked"] += g["checked"]
            seen["flagged"] += g["flagged"]
            seen["backward"] = seen.get("backward") or g.get("backward")
            seen["localisation"] = seen.get("localisation") or g.get("localisation")
            seen["errors"] = list(seen.get("errors", [])) + list(g.get("errors", []))
    return list(graphs.values())
