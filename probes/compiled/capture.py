"""Where torch.compile hands the user's backend its FX graph: the hook, and the graphs it wraps.

Dynamo calls ``OutputGraph.call_user_compiler(gm, example_inputs)`` once per graph it captured;
the user's backend (Inductor, a registered vendor backend, a callable) compiles it there. While a
checker is installed, that call is wrapped: the backend compiles the graph exactly as it would
have (same graph, same kernels), a pristine copy of the graph is kept as the graph's eager
program, and the compiled function Dynamo caches is a thin runner that hands each call to the
active checker, or straight to the compiled function when none is active. Graphs compiled before
a checker started are not seen (Dynamo caches them); graphs compiled while one was on keep their
runner, a pass-through once it stops.

Importing Dynamo costs about a second, so it is not imported for a program that never compiles:
when it is not loaded yet, ``torch.compile`` itself is wrapped to install the hook on first use.
"""

from __future__ import annotations

import functools
import itertools
import sys
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Protocol

import torch

from probes.core.random_ops import TORCH_RANDOM_FUNCTIONS, is_random

# graph checkers (free_benchmark's, online_dispatch's): the latest installed gets the calls
_ACTIVE: list[GraphChecker] = []
_LOCK = threading.Lock()
_ORIGINAL: dict[str, Any] = {}  # what the hook replaced: "call_user_compiler", "compile"
_IDS = itertools.count()

# attention draws a dropout mask only when dropout_p > 0 (`_no_op_dropout`); matched as a substring,
# as its fused kernels and the math fallback carry the name
ATTENTION = "scaled_dot_product_attention"


class GraphChecker(Protocol):
    def graph_call(self, graph: CompiledGraph, args: tuple, kwargs: dict) -> Any:
        """Run the compiled graph on `args` (its outputs are the user's, untouched) and judge it."""


@dataclass(eq=False)
class CompiledGraph:
    """One graph as Dynamo handed it to the backend, and what the backend made of it."""

    name: str  # the compiled function's name and Dynamo's compile id: "forward_0_0"
    gm: torch.fx.GraphModule  # a pristine copy: the graph's eager program
    compiled: Callable[..., Any]  # what the user's backend returned
    backend: Callable[..., Any]  # the user's backend, to compile sub-graphs with
    backend_name: str
    where: str  # the compiled function's file:line
    random: str | None = None  # a random operator of the graph (its re-runs draw other numbers)
    mutates: bool = False  # the graph writes into one of its inputs
    calls: int = 0
    meta: Any = field(default=None, repr=False)  # a tool's per-graph record (free_benchmark's ApiMeta)

    @property
    def key(self) -> str:
        return f"Graph.{self.name}"

    @property
    def nodes(self) -> list[torch.fx.Node]:
        return [n for n in self.gm.graph.nodes if n.op in ("call_function", "call_method", "call_module")]


def install(checker: GraphChecker) -> None:
    """Send the calls of graphs compiled from now on to `checker` (until `uninstall`)."""
    with _LOCK:
        _ACTIVE.append(checker)
        if len(_ACTIVE) == 1:
            _hook()


def uninstall(checker: GraphChecker) -> None:
    with _LOCK:
        if checker in _ACTIVE:
            _ACTIVE.remove(checker)
        if not _ACTIVE:
            _unhook()


def active() -> GraphChecker | None:
    return _ACTIVE[-1] if _ACTIVE else None


def _hook() -> None:
    if "torch._dynamo" in sys.modules:
        _hook_dynamo()
        return
    original = torch.compile
    _ORIGINAL["compile"] = original

    @functools.wraps(original)
    def compile_then_hook(*args: Any, **kwargs: Any) -> Any:
        with _LOCK:
            if _ACTIVE and "call_user_compiler" not in _ORIGINAL:
                _hook_dynamo()
        return original(*args, **kwargs)

    torch.compile = compile_then_hook


def _hook_dynamo() -> None:
    from torch._dynamo.output_graph import OutputGraph

    if "call_user_compiler" in _ORIGINAL:
        return
    original = OutputGraph.call_user_compiler
    _ORIGINAL["call_user_compiler"] = original

    @functools.wraps(original)
    def call_user_compiler(self: Any, gm: torch.fx.GraphModule, example_inputs: list[Any]) -> Any:
        pristine = _pristine(gm)
        compiled = original(self, gm, example_inputs)
        try:
            graph = _describe(self, pristine, compiled)
        except Exception:  # an unexpected Dynamo internals layout: the program runs unchecked
            return compiled
        return runner(graph)

    OutputGraph.call_user_compiler = call_user_compiler


def _unhook() -> None:
    compile_wrapper = _ORIGINAL.pop("compile", None)
    if compile_wrapper is not None:
        torch.compile = compile_wrapper
    original = _ORIGINAL.pop("call_user_compiler", None)
    if original is not None:
        from torch._dynamo.output_graph import OutputGraph

        OutputGraph.call_user_compiler = original


def _pristine(gm: torch.fx.GraphModule) -> torch.fx.GraphModule:
    """A copy of the graph the backend may rewrite in place (its nodes; attributes are shared)."""
    graph = torch.fx.Graph()
    out = graph.graph_copy(gm.graph, {})
    graph.output(out)
    return torch.fx.GraphModule(gm, graph)


def _describe(output_graph: Any, gm: torch.fx.GraphModule, compiled: Callable[..., Any]) -> CompiledGraph:
    code = output_graph.root_tx.f_code
    compile_id = getattr(output_graph, "dynamo_compile_id", None)
    suffix = (f"{compile_id.frame_id}_{compile_id.frame_compile_id}" if compile_id is not None
              and getattr(compile_id, "frame_id", None) is not None else str(next(_IDS)))
    backend = output_graph.compiler_fn
    name, where = code.co_name, f"{code.co_filename}:{code.co_firstlineno}"
    module = _module_of(gm)
    if module is not None:  # a compiled nn.Module: named after it, not the frame Dynamo entered by
        name, where = module
    graph = CompiledGraph(f"{name}_{suffix}", gm, compiled, backend, backend_name(backend), where)
    graph.random = random_operator(gm)
    graph.mutates = mutates_inputs(gm)
    return graph


def _module_of(gm: torch.fx.GraphModule) -> tuple[str, str] | None:
    """(class name, "the module's class") of the outermost nn.Module the graph's nodes ran in."""
    for node in gm.graph.nodes:
        stack = node.meta.get("nn_module_stack")
        if stack:
            _path, cls = next(iter(stack.values()))
            cls_name = getattr(cls, "__name__", None) or str(cls).rsplit(".", 1)[-1].strip("'>")
            module = getattr(cls, "__module__", "")
            return cls_name, f"{module}.{cls_name}" if module else cls_name
    return None


def backend_name(backend: Any) -> str:
    for attr in ("compiler_name", "__name__"):
        name = getattr(backend, attr, None)
        if isinstance(name, str):
            return name
    inner = getattr(backend, "compiler_fn", None) or getattr(backend, "_torchdynamo_orig_backend", None)
    return backend_name(inner) if inner is not None and inner is not backend else type(backend).__name__


def runner(graph: CompiledGraph) -> Callable[..., Any]:
    """What Dynamo caches for the graph: the active checker's call, or the compiled function."""
    compiled = graph.compiled

    def run(*args: Any, **kwargs: Any) -> Any:
        checker = _ACTIVE[-1] if _ACTIVE else None
        if checker is None:
            return compiled(*args, **kwargs)
        graph.calls += 1
        return checker.graph_call(graph, args, kwargs)

    run.__msprobe_graph__ = graph  # type: ignore[attr-defined]
    return run


def _target_name(node: torch.fx.Node) -> str:
    target = node.target
    return target if isinstance(target, str) else getattr(target, "__name__", str(target))


def random_operator(gm: torch.fx.GraphModule) -> str | None:
    """The first node that draws random numbers (dropout in training mode, rand...), or None."""
    for node in gm.graph.nodes:
        if node.op not in ("call_function", "call_method", "call_module"):
            continue
        name = _target_name(node)
        if node.op == "call_module":
            module = gm.get_submodule(name)
            if isinstance(module, torch.nn.modules.dropout._DropoutNd) and module.training and module.p > 0:
                return f"{node.name} ({type(module).__name__})"
            continue
        if (is_random(name, TORCH_RANDOM_FUNCTIONS) or ATTENTION in name) and not _no_op_dropout(node, name):
            return f"{node.name} ({name})"
    return None


def _argument(node: torch.fx.Node, index: int, name: str, default: Any) -> Any:
    return node.args[index] if len(node.args) > index else node.kwargs.get(name, default)


def _no_op_dropout(node: torch.fx.Node, name: str) -> bool:
    """A dropout that draws nothing: p = 0, or not training (F.dropout(x, p, training)),
    scaled_dot_product_attention with dropout_p = 0."""
    if ATTENTION in name:
        return _argument(node, 4, "dropout_p", 0.0) == 0
    if "dropout" in name:
        return _argument(node, 1, "p", 0.5) == 0 or _argument(node, 2, "training", True) is False
    return False


def mutates_inputs(gm: torch.fx.GraphModule) -> bool:
    """Whether an in-place operator writes into a placeholder (a BatchNorm's running statistics,
    an in-place update of a buffer): its re-runs get copies of the inputs."""
    placeholders = {n for n in gm.graph.nodes if n.op == "placeholder"}
    for node in gm.graph.nodes:
        if node.op not in ("call_function", "call_method"):
            continue
        name = _target_name(node)
        inplace = (name.endswith("_") and not name.endswith("__")) or node.kwargs.get("inplace") is True or (
            "batch_norm" in name)  # updates its running statistics when training
        if inplace and any(a in placeholders for a in node.all_input_nodes):
            return True
    return False
