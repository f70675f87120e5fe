"""Compiled graphs in the place of aten overloads: what online_dispatch compares for torch.compile.

A sampled call of a compiled graph (probes.compiled.capture) is compared as one op: its compiled
outputs against the graph's eager program run in float64 on the CPU (`GraphOp`, `GraphInfo`).

Its backward is compared the same way, as one op named ``Graph.<name>.backward``: the compiled
backward's kernels (fused by the backend) run when the user's backward pass reaches the graph's
outputs, where a hook reads their real cotangents. There, the gradients with respect to the
call's inputs that require them are recomputed through the compiled function, and through the
eager program in float64 on the CPU for the same cotangents (`GraphBackwardOp`, its info), and
the two are compared by the op rule like any op's outputs. Recomputing from the call's own inputs
and cotangents means a gradient accumulated over several consumers is never compared, and the
user's gradients are not touched (``torch.autograd.grad`` on detached copies).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import torch

from probes.backends import torch_autodiff
from probes.compiled import runs as graph_runs
from probes.core.trees import iter_leaves

#: why a graph call's backward was not compared (the summary's skipped table)
BACKWARD_MODIFIED = "a compiled graph's input changed in place before its backward ran: its gradients cannot be recomputed"
BACKWARD_MUTATES = "a compiled graph that writes into its inputs: its backward is not recomputed"


class GraphOp:
    """A compiled graph in the place of an aten overload: called, it runs the compiled function;
    its name is the graph's."""

    _overloadname = ""
    namespace = "graph"

    def __init__(self, graph: Any) -> None:
        self.graph = graph
        self._opname = graph.key

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return self.graph.compiled(*args, **kwargs)

    def __str__(self) -> str:
        return self._opname


class GraphInfo:
    """The mode's per-op facts of a compiled graph: its reference is the graph's eager program,
    in float64 on the CPU."""

    __slots__ = ("api", "overload", "half_to_float", "written", "skip", "on_host", "per_call", "chained",
                 "rounded_once")
    native = -1  # a graph is not an op the reference runner re-runs (native_jobs)
    # a compiled program may write into its inputs: ops in flight are judged first, and the graph
    # itself now, on the user's thread (not queued)
    mutates = True

    def __init__(self, graph: Any, api: str | None = None, on_host: Callable[..., Any] | None = None) -> None:
        self.api, self.overload, self.half_to_float, self.written = api or graph.key, "", None, ((), ())
        self.skip = graph_runs.RANDOM.format(op=graph.random) if graph.random is not None else None
        self.on_host = on_host or graph_runs.quiet(graph.gm)
        self.per_call, self.chained = None, False  # a graph: no per-call rule, its own dtype's limit
        self.rounded_once = False


class GraphBackwardOp(GraphOp):
    """The backward of one call of a compiled graph: called with the call's inputs followed by the
    cotangents of its differentiable outputs, it returns the compiled code's gradients with respect
    to the inputs that required them."""

    def __init__(self, graph: Any, wrt: tuple[int, ...], outputs: tuple[int, ...]) -> None:
        super().__init__(graph)
        self._opname = f"{graph.key}.backward"
        self.wrt, self.outputs = wrt, outputs

    def __call__(self, *args: Any, **kwargs: Any) -> tuple[torch.Tensor, ...]:
        return vjp(self.graph.compiled, args, self.wrt, self.outputs)

    def info(self) -> GraphInfo:
        gm = graph_runs.quiet(self.graph.gm)
        return GraphInfo(self.graph, self._opname, lambda *args: vjp(gm, args, self.wrt, self.outputs))


def vjp(fn: Callable[..., Any], args: Sequence[Any], wrt: tuple[int, ...], outputs: tuple[int, ...],
        ) -> tuple[torch.Tensor, ...]:
    """Gradients of `fn`'s output leaves number `outputs` with respect to its arguments number
    `wrt`, for the cotangents that follow the arguments in `args` (None: that output received no
    gradient)."""
    n = len(args) - len(outputs)
    inputs = list(args[:n])
    cotangents = args[n:]
    with torch.enable_grad():
        for i in wrt:
            inputs[i] = inputs[i].detach().requires_grad_(True)
        leaves = tensor_leaves(fn(*inputs))
        ys, gs = [], []
        for position, cotangent in zip(outputs, cotangents):
            y = leaves[position]
            if cotangent is not None and y.requires_grad:
                ys.append(y)
                gs.append(cotangent.to(device=y.device, dtype=y.dtype))
        xs = [inputs[i] for i in wrt]
        grads = torch.autograd.grad(ys, xs, gs, allow_unused=True) if ys else [None] * len(xs)
    return tuple(torch.zeros_like(x) if g is None else g for g, x in zip(grads, xs))


def tensor_leaves(x: Any) -> list[Any]:
    return [leaf for _path, leaf in iter_leaves(x) if isinstance(leaf, torch.Tensor)]


def watch_backward(graph: Any, args: tuple, kwargs: dict, out: Any,
                   compare: Callable[[GraphBackwardOp, tuple], None], skip: Callable[[str, GraphOp], None]) -> None:
    """Compare the backward of this call of `graph` when the user's backward pass reaches its
    outputs: `compare(op, args + cotangents)` then, or `skip(reason, op)` when it cannot be."""
    if kwargs or not torch_autodiff.recording():
        return
    wrt = tuple(i for i, a in enumerate(args) if isinstance(a, torch.Tensor) and a.requires_grad
                and (a.is_floating_point() or a.is_complex()))
    leaves = tensor_leaves(out)
    outputs = tuple(i for i, leaf in enumerate(leaves) if leaf.requires_grad)
    if not wrt or not outputs:
        return
    op = GraphBackwardOp(graph, wrt, outputs)
    if graph.mutates:
        skip(BACKWARD_MUTATES, op)
        return
    saved = tuple(a.detach() if isinstance(a, torch.Tensor) else a for a in args)
    versions = [a._version if isinstance(a, torch.Tensor) else None for a in saved]

    def on_cotangents(cotangents: list[Any]) -> None:
        if any(isinstance(a, torch.Tensor) and a._version != v for a, v in zip(saved, versions)):
            skip(BACKWARD_MODIFIED, op)
            return
        compare(op, saved + tuple(None if c is None else c.detach() for c in cotangents))

    torch_autodiff.on_backward([leaves[i] for i in outputs], on_cotangents)
