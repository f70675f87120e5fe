"""One compiled function, judged on its own: `check_compiled(fn, *inputs)` (imported as
``probes.compiled.check_compiled``).

For a test that wants just that: ``fn`` is compiled with ``torch.compile`` and run once on the
inputs under free_benchmark (improve_precision, the scaled rule, compiled graphs only): every graph
Dynamo captures is judged against its eager program in float64, with the eager kernels' own error
next to it; with ``backward=True`` the gradients too (a second call, floating inputs made to require
gradients, with a cotangent of ones for every floating output that requires one). A failing graph
names its first failing node and leaves a standalone reproduction.

It is free_benchmark's own run (probes/free_benchmark/torch_probe.py), not the msprobe facade's: the
facade adds nothing a single function needs, and this way the check stands on the tool it runs.
"""

from __future__ import annotations

import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from probes.compiled.check import CompiledCheck
from probes.core.config import load_config
from probes.free_benchmark.torch_probe import TorchFreeBenchmark


def check_compiled(fn: Callable[..., Any], *inputs: Any, backend: Any = "inductor", backward: bool = False,
                   dump_path: str | Path | None = None, pert_mode: str = "improve_precision",
                   **compile_kwargs: Any) -> CompiledCheck:
    """Compile `fn` with torch.compile(backend=..., **compile_kwargs), run it on `inputs` under
    free_benchmark restricted to compiled graphs, and return the graphs' reports."""
    dump = Path(dump_path) if dump_path is not None else Path(tempfile.mkdtemp(prefix="msprobe-compiled-"))
    if backward:
        # a function of its inputs only gets gradients through them: inputs that need none are
        # passed as copies that do (both calls: one compiled graph serves the two stages)
        inputs = tuple(x.detach().requires_grad_() if isinstance(x, torch.Tensor) and x.is_floating_point()
                       and not x.requires_grad else x for x in inputs)
    compiled = torch.compile(fn, backend=backend, **compile_kwargs)
    section = {"pert_mode": pert_mode, "rule": "scaled", "list": ["Graph"], "compiled_first": 1}
    outputs, summary = _run(dump / "forward", section, lambda: compiled(*inputs))
    summaries = [summary]
    if backward:

        def forward_and_backward() -> None:
            again = compiled(*inputs)
            leaves = [t for t in _tensors(again) if t.is_floating_point() and t.requires_grad]
            if leaves:
                torch.autograd.backward(leaves, [torch.ones_like(t) for t in leaves])

        summaries.append(_run(dump / "backward", dict(section, fuzz_stage="backward"), forward_and_backward)[1])
    return CompiledCheck(outputs, _merged(summaries), dump, summaries)


def _run(dump: Path, section: dict[str, Any], work: Callable[[], Any]) -> tuple[Any, dict[str, Any]]:
    """`work()` under one free_benchmark run (its hooks removed whatever happens), and the run's summary."""
    run = TorchFreeBenchmark(load_config({"task": "free_benchmark", "dump_path": str(dump),
                                          "free_benchmark": section}))
    run.start()
    try:
        result = work()
    finally:
        run.stop()
    return result, run.probe.summary()


def _tensors(x: Any) -> list[Any]:
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
