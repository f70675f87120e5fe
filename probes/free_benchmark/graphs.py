"""free_benchmark on torch.compile graphs: each compiled graph checked as one API call.

A graph Dynamo captured (probes.compiled.capture) is handed to the probe's per-call path like an
API named ``Graph.<function>_<compile id>``: the mode perturbs the graph's inputs, and

* improve_precision / to_cpu re-run the graph's *eager* program in float64 / on the CPU and judge
  the compiled outputs against it: the fused kernels the user runs are what is judged;
* add_noise, bit_noise, change_value and no_change re-run the *compiled* function on the perturbed
  inputs and judge the output's move, as for an API.

The backward stage recomputes the compiled function's gradients and the eager program's float64
gradients with the real cotangents (probes/free_benchmark/backward.py). Each judged call is also
reviewed here: under improve_precision / to_cpu the graph's eager program runs in its own dtypes
too, and its error is recorded next to the compiled one (``eager_ulps``), so "the compiled result
differs from eager but is closer to float64" reads as what it is; a graph that fails is
localised to its first failing node (probes.compiled.localize) and a reproduction is written.

Which calls are checked: the first ``compiled_first`` of each graph, then every
``compiled_every``-th; summary.json's ``graphs`` says how many ran, were sampled and checked.
Graphs that draw random numbers (dropout in training) are not checked, with the reason.
"""

from __future__ import annotations

import logging
import math
from typing import Any

from probes.backends.patching import ApiMeta, suspended
from probes.compiled import capture
from probes.compiled.localize import localise_and_reproduce
from probes.compiled.runs import EAGER_MARGIN, RANDOM, Figure, GraphReport, graph_limit, quiet, sampled
from probes.core import thresholds as th
from probes.core.trees import format_path
from probes.free_benchmark.call_path import REFERENCE_MODES
from probes.free_benchmark.compare import compare_outputs

log = logging.getLogger("probes.free_benchmark")
GRAPHS_DIR = "graphs"
GRAPH_PREFIX = "Graph"  # a `list` / `scope` entry starting with it selects compiled graphs


class FreeBenchmarkGraphs:
    """The probe's checker of compiled graphs (capture.GraphChecker)."""

    def __init__(self, probe: Any) -> None:
        self.probe = probe
        self.reports: dict[str, GraphReport] = {}
        self._metas: dict[int, ApiMeta] = {}
        probe.graph_reports = self.reports

    def install(self) -> None:
        capture.install(self)

    def uninstall(self) -> None:
        capture.uninstall(self)

    def graph_call(self, graph: capture.CompiledGraph, args: tuple, kwargs: dict) -> Any:
        """The compiled function's result, untouched; API hooks pass through meanwhile (a
        backend's runtime may call torch functions: they are the graph's, judged with it)."""
        probe = self.probe
        with suspended():
            if not probe.active:
                return graph.compiled(*args, **kwargs)
            report = self._report(graph)
            report.calls += 1
            if graph.random is not None:
                report.not_checked = RANDOM.format(op=graph.random)
                probe.ledger.skip(graph.key, report.not_checked)
                return graph.compiled(*args, **kwargs)
            fb = probe.fb
            if not sampled(report.calls - 1, fb.compiled_first, fb.compiled_every):
                return graph.compiled(*args, **kwargs)
            report.sampled += 1
            return probe.on_call(self._meta(graph), graph.compiled, args, kwargs)

    def _report(self, graph: capture.CompiledGraph) -> GraphReport:
        report = self.reports.get(graph.name)
        if report is None:
            report = self.reports[graph.name] = GraphReport(graph.name, graph.where, graph.backend_name,
                                                            len(graph.nodes))
        return report

    def _meta(self, graph: capture.CompiledGraph) -> ApiMeta:
        meta = self._metas.get(id(graph))
        if meta is None:
            meta = ApiMeta("Graph", graph.name, None, "", graph.compiled, mutates_inputs=graph.mutates,
                           reference=quiet(graph.gm))
            meta.review = lambda *a: self._review(graph, *a)
            self._metas[id(graph)] = meta
        return meta

    # a judged call --------------------------------------------------------------------------
    def _review(self, graph: capture.CompiledGraph, stage: str, name: str, call: tuple, eager: Any, out: Any,
                reference: Any, verdicts: list[Any]) -> list[Any]:
        probe = self.probe
        report = self.reports[graph.name]
        mode, rule = probe.fb.pert_mode, probe.fb.rule
        figures = report.forward if stage == "forward" else report.backward
        # the eager kernels' error: on a graph's first check (the report shows it next to the
        # compiled one), and whenever the compiled result is past its dtype's threshold (its
        # verdict then depends on it); other checks cost the float64 re-run alone
        if mode in REFERENCE_MODES and (figures is None or not all(v.consistent for v in verdicts)):
            tolerance = th.BACKWARD_TOLERANCE if stage == "backward" else None
            eager_verdicts = {v.path: v for v in compare_outputs(probe.backend, eager(), reference, pert_mode=mode,
                                                                 rule=rule, stage=stage, tolerance=tolerance,
                                                                 exact=True)}
            for v in verdicts:
                e = eager_verdicts.get(v.path)
                if e is None:
                    continue
                eps = th.machine_eps(probe.backend.dtype_name(e.leaf))
                v.detail["eager_ulps"] = _ulps(e, eps)
                v.detail["eager_max_rel"] = e.max_rel
                if not v.consistent and "ulps" in v.detail and _ulps(v, eps) <= graph_limit(
                        v.threshold / eps, v.detail["eager_ulps"]):
                    v.consistent = True  # as far from float64 as the eager program: its dtype's, not the compiler's
                    v.detail["within_eager_margin"] = EAGER_MARGIN
        report.checked += 1
        backend = probe.backend
        for v in verdicts:
            if "ulps" in v.detail or "ratio" in v.detail:
                eps = th.machine_eps(backend.dtype_name(v.leaf))
                eager_ulps = v.detail.get("eager_ulps")
                report.worse(stage, Figure(str(format_path(v.path)), v.dtype_repr, _ulps(v, eps), eager_ulps,
                                           graph_limit(v.threshold / eps, eager_ulps)))
        bad = [v for v in verdicts if not v.consistent]
        if bad:
            report.flagged += 1
            if mode in REFERENCE_MODES and report.localisation is None:
                self._localise(graph, report, name, call, bad, stage)
            if report.localisation is not None:
                for v in bad:
                    v.detail["node"] = report.localisation.describe()
                    v.detail["repro"] = report.localisation.repro
        return verdicts

    def _localise(self, graph: capture.CompiledGraph, report: GraphReport, name: str, call: tuple,
                  bad: list[Any], stage: str) -> None:
        args, _kwargs = call
        first = bad[0].path[0] if bad[0].path and isinstance(bad[0].path[0], int) else None
        try:
            found = localise_and_reproduce(graph, args, self.probe.dump_path / GRAPHS_DIR, first, stage=stage)
        except Exception as exc:  # the check's verdict stands; only the localisation is missing
            report.errors.append(f"localising: {type(exc).__name__}: {exc}")
            return
        if found is not None:
            report.localisation = found
            log.warning("free_benchmark: %s (%s, %s) loses precision at %s; reproduction in %s", name, graph.where,
                        graph.backend_name, found.describe(), found.repro)


def _ulps(v: Any, eps: float) -> float:
    """A float leaf's error in ulps of its dtype: the scaled rule's figure, or msprobe's ratio
    figure (1 + relative error) over eps."""
    if v.detail.get("nan_mismatch") or v.detail.get("inf_mismatch") or not math.isfinite(v.figure):
        return math.inf
    if "ulps" in v.detail:
        return float(v.detail["ulps"])
    return max(float(v.figure) - 1.0, 0.0) / eps


