"""A standalone reproduction of a failing graph, written as Python code.

A pickled GraphModule would be the shortest reproduction, but it loads only with
``weights_only=False`` (running whatever the file says) and only under the PyTorch that wrote it.
So, as PyTorch's own minifier does, the graph is written as code: ``repro.py`` holds a module class
whose ``forward`` is the graph's code (sub-graphs of higher-order operators as classes of their
own), ``state.pt`` the graph's tensors and ``inputs.pt`` the failing call's inputs, both plain
tensors loaded with ``weights_only=True``. The script compiles the module with ``torch.compile``,
runs it eagerly in float64 (the reference) and in its own dtypes, and prints the figures the
report shows: it measures them through this module (`measure`, the localisation's own judge over
probes/core/scaled.py), never through a copy of the formula, which would drift.

What the code references must exist in a fresh interpreter: functions by an import path, operators
of PyTorch's own namespaces or of a ``custom_op`` whose module can be imported, ``torch.nn``
modules rebuilt from their repr. The written module is then run here on the saved files and must
compute what the graph computes. A graph that fails any of this gets a ``repro.py`` that says why
and stops (beside ``graph.py``, its readable code, and the inputs), never one that fails obscurely.
"""

from __future__ import annotations

import ast
import builtins
import importlib
import os
import sys
import types
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from probes.compiled.repro_script import HEADER, PATHS, RESERVED, RUNNER, UNRUNNABLE, WHAT

# the operator namespaces a fresh `import torch` registers (with Dynamo and Inductor loaded, as the
# script's torch.compile loads them): their operators need no import of their own
TORCH_NAMESPACES = frozenset({
    "_c10d_functional", "_c10d_functional_autograd", "_dtensor", "_inductor_test", "_native", "_quantized",
    "_test", "aten", "c10d", "c10d_functional", "debug_mode_ops", "debugprims", "export", "flex_lib", "fsdp",
    "inductor", "inductor_prims", "mkl", "mkldnn", "mkldnn_prepacked", "onednn", "onnx", "onnx_symbolic",
    "prims", "profiler", "quantization", "quantized", "quantized_decomposed", "rngprims", "sparse",
    "static_runtime", "streams", "symm_mem"})


def measure(out: Any, reference: Any, stage: str = "forward") -> tuple[float, float]:
    """(worst ulps, its threshold in ulps) of `out` against its float64 `reference`: the
    localisation's own judge, so that a written script prints the report's figures."""
    from probes.compiled.runs import scaled_judge

    return scaled_judge(out, reference, stage=stage)


def write_repro(folder: Path, gm: torch.fx.GraphModule, args: tuple, title: str, backend: str,
                stage: str = "forward") -> Path:
    """Write the reproduction of `gm` on `args` into `folder` (created); returns the folder."""
    from probes.backends.torch_backend import NO_FLOAT64_DEVICES

    folder.mkdir(parents=True, exist_ok=True)
    for stale in ("graph.py", "state.pt", "inputs.pt"):
        (folder / stale).unlink(missing_ok=True)
    code = _Code()
    code.add_class(gm, "Repro", "")
    inputs = [code.portable(a, f"input {i}") for i, a in enumerate(args)]
    if not code.problems:
        torch.save(inputs, folder / "inputs.pt")
        if code.state:
            torch.save(code.state, folder / "state.pt")
        default = backend if _registered(backend) else "inductor"
        paths = PATHS.format(paths=sorted(code.paths)) if code.paths else ""
        script = HEADER.format(title=title, default=default, graph_backend=backend, what=WHAT[stage], paths=paths,
                               imports="".join(f"{line}\n" for line in code.imports), stage=stage,
                               tensors=code.tensors, subgraphs=code.subgraphs,
                               no_float64=tuple(sorted(NO_FLOAT64_DEVICES)))
        script += "\n\n".join(code.classes) + RUNNER
        (folder / "repro.py").write_text(script, encoding="utf-8")
        problem = _verify(folder, script, code, gm, args)
        if problem is None:
            return folder
        code.problems.append(problem)
        (folder / "state.pt").unlink(missing_ok=True)
    (folder / "graph.py").write_text(gm.print_readable(print_output=False), encoding="utf-8")
    try:  # kept only when weights_only loading takes them back
        torch.save([_plain(a) for a in args], folder / "inputs.pt")
        torch.load(folder / "inputs.pt", weights_only=True)
    except Exception:
        (folder / "inputs.pt").unlink(missing_ok=True)
    reasons = "\n".join(f"  - {p}" for p in code.problems)
    message = f"no runnable reproduction of {title}:\n{reasons}\n(see graph.py and inputs.pt beside this script)"
    (folder / "repro.py").write_text(UNRUNNABLE.format(title=title, reasons=reasons, message=message),
                                     encoding="utf-8")
    return folder


@dataclass
class _Code:
    """The graph as code: class sources (sub-graphs first), what they import, the tensors they
    load, and what could not be written."""

    classes: list[str] = field(default_factory=list)
    imports: list[str] = field(default_factory=list)
    paths: set[str] = field(default_factory=set)
    tensors: list[tuple[str, str, bool]] = field(default_factory=list)
    subgraphs: list[str] = field(default_factory=list)  # their paths, innermost first
    originals: dict[str, torch.fx.GraphModule] = field(default_factory=dict)
    state: dict[str, torch.Tensor] = field(default_factory=dict)
    problems: list[str] = field(default_factory=list)

    def add_class(self, gm: torch.fx.GraphModule, name: str, prefix: str) -> None:
        python = gm.graph.python_code(root_module="self", verbose=True)
        for global_name, obj in python.globals.items():
            self._global(global_name, obj)
        init = []
        for target in dict.fromkeys(n.target for n in gm.graph.nodes if n.op in ("get_attr", "call_module")):
            init.extend(self._attribute(gm, target, prefix, name))
        for node in gm.graph.nodes:
            if node.op == "call_function":
                self._operator(node.target)
        body = "\n".join(f"        {line}" for line in ["super().__init__()", *init])
        forward = "\n".join(f"    {line}" if line.strip() else "" for line in python.src.strip("\n").splitlines())
        self.classes.append(f"class {name}(torch.nn.Module):\n    def __init__(self):\n{body}\n\n{forward}\n")

    def _attribute(self, gm: torch.fx.GraphModule, target: str, prefix: str, owner: str) -> list[str]:
        try:
            obj = _get(gm, target)
        except AttributeError:
            self.problems.append(f"the graph reads {target}, which it does not hold")
            return []
        if isinstance(obj, torch.fx.GraphModule):
            child = f"{owner}_{''.join(c if c.isalnum() else '_' for c in target)}"
            self.add_class(obj, child, f"{prefix}{target}.")
            self.subgraphs.append(prefix + target)
            self.originals[prefix + target] = obj
            if obj.meta:
                self.problems.append(f"sub-graph {target} carries {sorted(obj.meta)} in its meta, which code "
                                     "does not hold")
            return [f"put(self, {target!r}, {child}())"]
        if isinstance(obj, torch.Tensor):
            parent, _, leaf = target.rpartition(".")
            buffers = getattr(_get(gm, parent) if parent else gm, "_buffers", {})
            self._tensor(prefix + target, obj, "buffer" if leaf in buffers else "attribute")
            return []
        if isinstance(obj, torch.nn.Module):
            made = _constructor(obj)
            if made is None:
                self.problems.append(f"submodule {target} ({type(obj).__qualname__}) cannot be rebuilt from code")
                return []
            for name, t in [*obj.named_parameters(), *obj.named_buffers()]:
                self._tensor(f"{prefix}{target}.{name}", t, "buffer")
            return [f"put(self, {target!r}, {made}.train({obj.training}))"]
        if obj is None or isinstance(obj, (bool, int, float, str)):
            return [f"put(self, {target!r}, {obj!r})"]
        self.problems.append(f"the graph reads {target}, a {type(obj).__qualname__}, which has no code")
        return []

    def _tensor(self, name: str, t: torch.Tensor, kind: str) -> None:
        if isinstance(t, torch.nn.Parameter):
            kind = "parameter"
        self.tensors.append((name, kind, bool(t.requires_grad)))
        self.state[name] = self.portable(t, name)

    def portable(self, x: Any, what: str) -> Any:
        """`x` as weights_only loading takes it back: a detached copy of a plain tensor, a scalar."""
        if isinstance(x, torch.Tensor):
            if type(x) not in (torch.Tensor, torch.nn.Parameter):
                self.problems.append(f"{what} is a {type(x).__qualname__}, not a plain tensor")
            return _plain(x)
        if x is not None and not isinstance(x, (bool, int, float, complex, str)):
            self.problems.append(f"{what} is a {type(x).__qualname__}, which torch.load(weights_only=True) refuses")
        return x

    def _global(self, name: str, obj: Any) -> None:
        from torch.fx.graph import _custom_builtins

        if name in RESERVED and not (isinstance(obj, types.ModuleType) and obj.__name__ == name):
            self.problems.append(f"the graph's name {name} is also one of the script's")
        elif name in _custom_builtins and _custom_builtins[name].obj is obj:
            if _custom_builtins[name].import_str != "import torch":
                self._import(_custom_builtins[name].import_str)
        elif getattr(builtins, name, None) is obj:
            pass
        elif _literal(obj):  # a string annotation, a number
            self._import(f"{name} = {obj!r}")
        elif isinstance(obj, types.ModuleType):
            self._module(obj.__name__)
            self._import(f"import {obj.__name__}" if name == obj.__name__ else f"import {obj.__name__} as {name}")
        elif (path := _import_path(obj)) is not None:
            self._module(path[0])
            self._import(f"import {path[0]}")
            self._import(f"{name} = {path[0]}.{path[1]}")
        else:
            self.problems.append(f"the graph calls {name} ({obj!r}), which has no import path (defined in "
                                 f"__main__ or inside a function)")

    def _operator(self, target: Any) -> None:
        """An operator must be registered in the fresh interpreter: PyTorch's own, or a custom_op
        whose module the script imports."""
        if isinstance(target, torch._ops.HigherOrderOperator):
            self._module(type(target).__module__)
            self._import(f"import {type(target).__module__}")
            return
        if not isinstance(target, (torch._ops.OpOverload, torch._ops.OpOverloadPacket)):
            return
        qualname = target._schema.name if isinstance(target, torch._ops.OpOverload) else target._qualified_op_name
        opdef = getattr(torch._library.custom_ops, "OPDEFS", {}).get(qualname)
        module = getattr(getattr(opdef, "_init_fn", None), "__module__", None)
        if module and module != "__main__" and module in sys.modules:
            self._module(module)
            self._import(f"import {module}  # registers torch.ops.{qualname.replace('::', '.')}")
        elif qualname.split("::")[0] not in TORCH_NAMESPACES:
            self.problems.append(f"operator torch.ops.{qualname.replace('::', '.')} is registered outside PyTorch "
                                 "with no importable Python definition (a C++ extension, a torch.library "
                                 "registration or a custom_op in __main__)")

    def _import(self, line: str) -> None:
        if line not in self.imports:
            self.imports.append(line)

    def _module(self, name: str) -> None:
        """Note where a module outside torch is found, for the script's sys.path."""
        top = sys.modules.get(name.split(".")[0])
        if top is None or top is torch:
            return
        file = getattr(top, "__file__", None)
        if file:
            root = os.path.dirname(file)
            self.paths.add(os.path.dirname(root) if os.path.basename(file) == "__init__.py" else root)
        elif getattr(top, "__path__", None):
            self.paths.add(os.path.dirname(list(top.__path__)[0]))


def _verify(folder: Path, script: str, code: _Code, gm: torch.fx.GraphModule, args: tuple) -> str | None:
    """None when the written module, loaded from the written files, computes what `gm` computes on
    the call's inputs (and its sub-graphs, traced, call what the graph's call); else why not."""
    from probes.compiled.runs import quiet

    namespace: dict[str, Any] = {"__name__": "msprobe_repro", "__file__": str(folder / "repro.py")}
    saved_path = list(sys.path)
    try:
        exec(compile(script, str(folder / "repro.py"), "exec"), namespace)  # noqa: S102 - the code just written
        module = quiet(namespace["build"])(namespace["load_state"]())  # traces sub-graphs: no probe hook
        inputs = namespace["load_inputs"]()
        with torch.no_grad():
            written = namespace["leaves"](quiet(module)(*namespace["copies"](inputs)))
            expected = namespace["leaves"](quiet(gm)(*namespace["copies"](args)))
    except Exception as exc:
        return f"the written module does not run: {type(exc).__name__}: {exc}"
    finally:
        sys.path[:] = saved_path
    for name, original in code.originals.items():
        if _calls(namespace["get"](module, name)) != _calls(original):
            return f"the sub-graph {name}, traced from the written code, calls other operators than the graph's"
    if len(written) != len(expected):
        return f"the written module returns {len(written)} tensors, the graph {len(expected)}"
    for i, (w, e) in enumerate(zip(written, expected)):
        try:
            torch.testing.assert_close(w, e, equal_nan=True)
        except AssertionError as exc:
            return f"the written module's output {i} is not the graph's: {str(exc).splitlines()[0]}"
    return None


def _calls(gm: torch.fx.GraphModule) -> list[tuple[str, Any]]:
    return [(n.op, n.target) for n in gm.graph.nodes if n.op not in ("placeholder", "output")]


def _get(root: Any, dotted: str) -> Any:
    for part in dotted.split("."):
        root = getattr(root, part)
    return root


def _import_path(obj: Any) -> tuple[str, str] | None:
    """(module, qualified name) under which a fresh interpreter finds `obj`, or None."""
    module = getattr(obj, "__module__", None)
    qualname = getattr(obj, "__qualname__", None) or getattr(obj, "__name__", None)
    if not isinstance(module, str) or module == "__main__" or not isinstance(qualname, str) or "<" in qualname:
        return None
    try:
        return (module, qualname) if _get(importlib.import_module(module), qualname) is obj else None
    except (ImportError, AttributeError):
        return None


def _constructor(module: torch.nn.Module) -> str | None:
    """Code that builds a module like `module` (its tensors are loaded after): a torch.nn module
    whose repr is its constructor call, as the minifier writes them; else None."""
    cls = type(module)
    if getattr(torch.nn, cls.__name__, None) is not cls:
        return None
    made = f"torch.nn.{module!r}"
    try:
        built = eval(made, {"torch": torch})  # noqa: S307 - a torch.nn repr
    except Exception:
        return None
    shapes = {k: tuple(v.shape) for k, v in module.state_dict().items()}
    same = type(built) is cls and {k: tuple(v.shape) for k, v in built.state_dict().items()} == shapes
    return made if same else None


def _literal(x: Any) -> bool:
    try:
        return isinstance(x, (str, int, float, bool, type(None))) and ast.literal_eval(repr(x)) == x
    except (ValueError, SyntaxError):
        return False


def _plain(x: Any) -> Any:
    return x.detach().clone() if isinstance(x, torch.Tensor) else x


def _registered(backend: str) -> bool:
    try:
        from torch._dynamo import list_backends

        return backend in list_backends(exclude_tags=())
    except Exception:
        return False
