"""A compiled graph's entry in the run's summary (``graphs``), and the localisation of a failing one.

A graph is compared as a whole (OnlineDispatchMode.graph_call); when it fails, the node that
loses the precision is looked for once per graph (probes.compiled.localize), so a failing graph
called every step costs one search, not one per call.
"""

from __future__ import annotations

import logging
from typing import Any

from probes.compiled import runs as graph_runs
from probes.compiled.localize import localise_and_reproduce
from probes.online_dispatch.graph_ops import GraphBackwardOp
from probes.online_dispatch.jobs import Job
from probes.online_dispatch.results import RunResults

logger = logging.getLogger("probes.online_dispatch")


def graph_entry(results: RunResults, graph: Any) -> graph_runs.GraphReport:
    """The graph's entry in the summary, made at its first sampled call or failure."""
    return results.graphs.setdefault(graph.name, graph_runs.GraphReport(
        graph.name, graph.where, graph.backend_name, len(graph.nodes)))


def localise(results: RunResults, job: Job, leaf: str) -> None:
    """The first node of a failing graph that loses the precision, and its reproduction
    (probes.compiled.localize), once per graph; in the summary's ``graphs``."""
    graph = job.func.graph
    entry = graph_entry(results, graph)
    entry.flagged += 1
    if entry.localisation is not None or entry.errors:
        return
    tail = leaf.rsplit("_output.", 1)
    index = int(tail[1].split(".")[0]) if len(tail) == 2 and tail[1].split(".")[0].isdigit() else None
    backward = isinstance(job.func, GraphBackwardOp)
    args = job.args[:len(job.args) - len(job.func.outputs)] if backward else job.args
    try:
        found = localise_and_reproduce(graph, args, results.run_dir / "graphs", None if backward else index,
                                       stage="backward" if backward else "forward")
    except Exception as exc:
        entry.errors.append(f"localising: {type(exc).__name__}: {exc}")
        return
    if found is not None:
        entry.localisation = found
        logger.warning("online_dispatch: %s (%s, %s) loses precision at %s; reproduction in %s", job.prefix,
                       graph.where, graph.backend_name, found.describe(), found.repro)
