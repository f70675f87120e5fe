"""Which node of a failing graph loses the precision.

A precision bug can live in compiled code only (a fusion, a lowering), so the graph is bisected the
way PyTorch's accuracy minifier and CompilerBisector do, but judged against float64 as the rest of
the project: the prefix of the graph that ends at a node is compiled with the user's own backend,
run on the call's inputs and compared with the same prefix run eagerly in float64. Prefixes are
taken among the ancestors of the failing output, in topological order; a binary search finds the
first one that fails (the error then propagates to what depends on it), in about log2(nodes)
compilations. That node's prefix also runs eagerly in its own dtypes: when the eager kernel loses
the precision too, the problem is the kernel's, otherwise the compiler's.
"""

from __future__ import annotations

import math
import os
import re
from collections.abc import Callable
from typing import Any

import torch

from probes.compiled.capture import CompiledGraph
from probes.compiled.runs import Localisation, graph_limit, quiet, upcast

_TORCH_DIR = os.path.dirname(torch.__file__)
_PROBES_DIR = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# the most prefixes compiled for one graph (each costs a backend compilation)
MAX_COMPILATIONS = 12


def prefix(gm: torch.fx.GraphModule, node_name: str) -> torch.fx.GraphModule:
    """The graph's placeholders and the nodes up to `node_name`, returning that node's value (in a
    tuple, as Dynamo's graphs return theirs: backends such as AOTAutograd require it)."""
    graph = torch.fx.Graph()
    env: dict[torch.fx.Node, torch.fx.Node] = {}
    for node in gm.graph.nodes:
        if node.op == "output":
            break
        env[node] = graph.node_copy(node, lambda n: env[n])
        if node.name == node_name:
            graph.output((env[node],))
            break
    graph.eliminate_dead_code()
    return torch.fx.GraphModule(gm, graph)


def ancestors(gm: torch.fx.GraphModule, output_index: int | None) -> list[torch.fx.Node]:
    """The compute nodes the graph's output number `output_index` depends on (all of them when
    None), in topological order."""
    output = next(n for n in gm.graph.nodes if n.op == "output")
    results = output.args[0] if isinstance(output.args[0], (tuple, list)) else (output.args[0],)
    roots = [r for r in (results if output_index is None else results[output_index:output_index + 1])
             if isinstance(r, torch.fx.Node)]
    seen: set[torch.fx.Node] = set()
    stack = list(roots)
    while stack:
        node = stack.pop()
        if node in seen:
            continue
        seen.add(node)
        stack.extend(node.all_input_nodes)
    return [n for n in gm.graph.nodes if n in seen and n.op in ("call_function", "call_method", "call_module")]


def source_line(node: torch.fx.Node) -> str:
    """The user's line that made the node: the innermost frame of Dynamo's stack trace outside
    this package (whose wrappers Dynamo traces through) and, when there is one, outside torch;
    else the module it ran in ("layers.0.mlp.up_proj (Linear)"), which Dynamo always records."""
    line = user_frame(node.meta.get("stack_trace") or "")
    module = module_path(node)
    return f"{line} in {module}" if line and module else line or module


_SOURCE_PREFIX = re.compile(r"^L\[['\"](?:fn|self|mod|model|module)['\"]\]\.?")


def module_path(node: torch.fx.Node) -> str:
    stack = node.meta.get("nn_module_stack") or {}
    if not stack:
        return ""
    path, cls = list(stack.values())[-1]
    path = _SOURCE_PREFIX.sub("", str(path)).replace("._modules['", ".").replace("']", "")
    name = getattr(cls, "__name__", None) or str(cls).rsplit(".", 1)[-1].strip("'>")
    return f"{path} ({name})" if path else f"({name})"


def user_frame(trace: str) -> str:
    frames = [line.strip().replace("File ", "", 1) for line in trace.strip().splitlines()
              if line.strip().startswith("File ")]
    frames = [f for f in frames if _PROBES_DIR not in f]
    outside_torch = [f for f in frames if _TORCH_DIR not in f]
    return (outside_torch or frames or [""])[-1]


def target_name(node: torch.fx.Node) -> str:
    target = node.target
    if isinstance(target, str):
        return target
    module = getattr(target, "__module__", None) or ""
    name = getattr(target, "__name__", str(target))
    return f"{module.replace('torch._C._nn', 'torch.nn.functional')}.{name}" if module.startswith("torch") else name


def localise(graph: CompiledGraph, args: tuple, judge: Callable[[Any, Any], tuple[float, float]],
             output_index: int | None = None) -> Localisation | None:
    """The first node whose compiled prefix fails `judge(out, float64 reference) -> (ulps,
    threshold in ulps)` beyond the eager prefix's own error (runs.graph_limit), or None when no
    prefix fails (the graph fails only as a whole)."""
    nodes = ancestors(graph.gm, output_index)
    if not nodes:
        return None
    reference_args = _reference_args(args)
    cache: dict[int, tuple[float, float, float]] = {}

    def figures(i: int) -> tuple[float, float, float]:
        if i not in cache:
            cache[i] = _judge_prefix(graph, nodes[i].name, args, reference_args, judge)
        return cache[i]

    def fails(i: int) -> bool:
        compiled, eager, threshold = figures(i)
        return not compiled <= graph_limit(threshold, eager)

    lo, hi = 0, len(nodes) - 1
    if not fails(hi):
        return None
    while lo < hi and len(cache) < MAX_COMPILATIONS:
        mid = (lo + hi) // 2
        if fails(mid):
            hi = mid
        else:
            lo = mid + 1
    node = nodes[hi]
    compiled, eager, threshold = figures(hi)
    return Localisation(node.name, target_name(node), source_line(node), compiled, eager, threshold, len(cache))


def _reference_args(args: tuple) -> tuple:
    from probes.backends.torch_backend import BACKEND

    def up(x: Any) -> Any:
        if isinstance(x, torch.Tensor) and BACKEND.lacks_float64(x):
            return upcast(x, device="cpu")
        return upcast(x)

    return tuple(up(a) for a in args)


def _judge_prefix(graph: CompiledGraph, node_name: str, args: tuple, reference_args: tuple,
                  judge: Callable[[Any, Any], tuple[float, float]]) -> tuple[float, float, float]:
    """(compiled ulps, eager ulps, threshold ulps) of the prefix ending at `node_name`: compiled
    with the graph's backend and run eagerly in its own dtypes, each against float64."""
    gm = prefix(graph.gm, node_name)

    def inputs() -> list[Any]:  # a graph that writes into its inputs gets copies: the model's stay as they are
        return [(a.detach().clone() if graph.mutates else a.detach()) if isinstance(a, torch.Tensor) else a
                for a in args]

    with torch.no_grad():
        # the backend gets a copy of its own: a backend may rewrite the graph it is given
        compiled = quiet(graph.backend)(prefix(graph.gm, node_name), inputs())
        out = quiet(compiled)(*inputs())
        eager = quiet(gm)(*inputs())
        ref = quiet(gm)(*[a.clone() if graph.mutates and isinstance(a, torch.Tensor) else a for a in reference_args])
    ulps, threshold = judge(out, ref)
    eager_ulps, _threshold = judge(eager, ref)
    return ulps, eager_ulps if not math.isnan(eager_ulps) else math.inf, threshold


def localise_and_reproduce(graph: CompiledGraph, args: tuple, folder: Any, output_index: int | None = None,
                           judge: Callable[[Any, Any], tuple[float, float]] | None = None) -> Localisation | None:
    """localise() with the scaled rule against float64, and a reproduction of the failing node's
    prefix written under `folder` (``<graph>.<node>/``)."""
    from pathlib import Path

    from probes.compiled.repro import write_repro

    found = localise(graph, args, judge or scaled_judge, output_index)
    if found is None:
        return None
    name = re.sub(r"[^A-Za-z0-9._-]+", "_", f"{graph.name}.{found.node}")[:120]
    found.repro = str(write_repro(Path(folder) / name, prefix(graph.gm, found.node), args,
                                  f"{graph.key} up to node {found.node}", graph.backend_name))
    return found


def scaled_judge(out: Any, reference: Any) -> tuple[float, float]:
    """(worst ulps, its threshold in ulps) of `out` against its float64 `reference`, by the scaled
    rule under improve_precision (exact figures)."""
    from probes.backends.torch_backend import BACKEND
    from probes.core import thresholds as th
    from probes.free_benchmark.compare import compare_outputs

    verdicts = [v for v in compare_outputs(BACKEND, out, reference, pert_mode="improve_precision", rule="scaled",
                                           exact=True) if "ulps" in v.detail]
    if not verdicts:
        return 0.0, math.inf

    def ulps(v: Any) -> float:
        return math.inf if v.detail.get("nan_mismatch") or v.detail.get("inf_mismatch") else float(v.detail["ulps"])

    def limit(v: Any) -> float:
        return v.threshold / th.machine_eps(BACKEND.dtype_name(v.leaf))

    worst = max(verdicts, key=lambda v: (not v.consistent, ulps(v) / max(limit(v), 1e-300)))
    return ulps(worst), limit(worst)
