"""Which node of a failing graph loses the precision.

A precision bug can live in compiled code only (a fusion, a lowering), so the graph is bisected the
way PyTorch's accuracy minifier and CompilerBisector do, but judged against float64 as the rest of
the project: the prefix of the graph that ends at a node is compiled with the user's own backend,
run on the call's inputs and compared with the same prefix run eagerly in float64. Prefixes are
taken among the ancestors of the failing output, in topological order; a binary search finds the
first one that fails (the error then propagates to what depends on it), in about log2(nodes)
compilations. That node's prefix also runs eagerly in its own dtypes: when the eager kernel loses
the precision too, the problem is the kernel's, otherwise the compiler's.

A failing backward is bisected the same way, on gradients: each prefix is compiled with the
backend on inputs that require gradients (so AOTAutograd-based backends compile its backward too),
and the gradients of its output with respect to the graph's floating inputs, for one fixed random
cotangent, are judged against the prefix's float64 gradients for the same cotangent. The first
prefix whose compiled gradients fail holds the node whose backward loses the precision (what
depends on it differentiates through it).
"""

from __future__ import annotations

import functools
import math
import os
import re
from collections.abc import Callable
from typing import Any

import torch

from probes.compiled.capture import CompiledGraph
from probes.compiled.runs import Localisation, graph_limit, quiet, scaled_judge, upcast
from probes.core.trees import iter_leaves

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
             output_index: int | None = None, stage: str = "forward") -> Localisation | None:
    """The first node whose compiled prefix fails `judge(out, float64 reference) -> (ulps,
    threshold in ulps)` beyond the eager prefix's own error (runs.graph_limit), or None when no
    prefix fails (the graph fails only as a whole). `stage` "backward": judged on the prefixes'
    gradients (module docstring); a graph that writes into its inputs is not bisected there."""
    if stage == "backward" and graph.mutates:
        return None
    nodes = ancestors(graph.gm, output_index if stage == "forward" else None)
    if not nodes:
        return None
    reference_args = _reference_args(args)
    cache: dict[int, tuple[float, float, float]] = {}
    judge_prefix = _judge_prefix if stage == "forward" else _judge_prefix_backward

    def figures(i: int) -> tuple[float, float, float]:
        if i not in cache:
            cache[i] = judge_prefix(graph, nodes[i].name, args, reference_args, judge)
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
    return Localisation(node.name, target_name(node), source_line(node), compiled, eager, threshold, len(cache),
                        stage=stage)


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
                           judge: Callable[[Any, Any], tuple[float, float]] | None = None,
                           stage: str = "forward") -> Localisation | None:
    """localise() with the scaled rule against float64, and a reproduction of the failing node's
    prefix written under `folder` (``<graph>.<node>/``)."""
    from pathlib import Path

    from probes.compiled.repro import write_repro

    found = localise(graph, args, judge or functools.partial(scaled_judge, stage=stage), output_index, stage)
    if found is None:
        return None
    name = re.sub(r"[^A-Za-z0-9._-]+", "_", f"{graph.name}.{found.node}{'.backward' if stage == 'backward' else ''}")
    title = f"{graph.key} up to node {found.node}" + (" (its gradients)" if stage == "backward" else "")
    found.repro = str(write_repro(Path(folder) / name[:120], prefix(graph.gm, found.node), args, title,
                                  graph.backend_name, stage=stage))
    return found


def cotangent(output: torch.Tensor, seed: int = 0) -> torch.Tensor:
    """A fixed random cotangent for `output`: normal values drawn in float64 on the CPU (the same
    numbers on every device), rounded to the output's dtype; the float64 reference takes the
    rounded values, so both sides differentiate the same function of the same cotangent."""
    g = torch.Generator().manual_seed(seed)
    return torch.randn(tuple(output.shape), generator=g, dtype=torch.float64).to(output.dtype).to(output.device)


def _gradients(fn: Callable[..., Any], args: tuple, cotangents: list[torch.Tensor] | None = None,
               ) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
    """(gradients of fn's floating outputs with respect to its floating inputs, the cotangents
    used: `cotangents` cast to the outputs' dtypes, or new ones)."""
    inputs = [a.detach().clone().requires_grad_(True) if _differentiable(a) else a for a in args]
    with torch.enable_grad():
        outputs = [o for o in _tensors(fn(*inputs)) if o.requires_grad]
        wrt = [x for x in inputs if isinstance(x, torch.Tensor) and x.requires_grad]
        if not outputs or not wrt:
            return [], []
        if cotangents is None:
            cotangents = [cotangent(o) for o in outputs]
        else:
            cotangents = [c.to(dtype=o.dtype, device=o.device) for c, o in zip(cotangents, outputs)]
        grads = torch.autograd.grad(outputs, wrt, cotangents, allow_unused=True)
    return [g if g is not None else torch.zeros_like(w) for g, w in zip(grads, wrt)], cotangents


def _differentiable(x: Any) -> bool:
    return isinstance(x, torch.Tensor) and (x.is_floating_point() or x.is_complex())


def _tensors(x: Any) -> list[torch.Tensor]:
    return [leaf for _path, leaf in iter_leaves(x) if isinstance(leaf, torch.Tensor)]


def _judge_prefix_backward(graph: CompiledGraph, node_name: str, args: tuple, reference_args: tuple,
                           judge: Callable[[Any, Any], tuple[float, float]]) -> tuple[float, float, float]:
    """(compiled ulps, eager ulps, threshold ulps) of the gradients of the prefix ending at
    `node_name`: compiled with the graph's backend and run eagerly in its own dtypes, each against
    the float64 gradients for the same cotangent."""
    gm = prefix(graph.gm, node_name)
    example = [a.detach().clone().requires_grad_(True) if _differentiable(a) else a for a in args]
    with torch.enable_grad():
        compiled = quiet(graph.backend)(prefix(graph.gm, node_name), example)
    out, cotangents = quiet(_gradients)(compiled, args)
    if not out:  # the node does not depend on a floating input: nothing to differentiate
        return 0.0, 0.0, math.inf
    eager, _ = quiet(_gradients)(gm, args, cotangents)
    ref, _ = quiet(_gradients)(gm, reference_args, [c.double() for c in cotangents])
    ulps, threshold = judge(out, ref)
    eager_ulps, _threshold = judge(eager, ref)
    return ulps, eager_ulps if not math.isnan(eager_ulps) else math.inf, threshold
