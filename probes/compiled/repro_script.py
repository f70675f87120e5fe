"""The text of a written reproduction (probes/compiled/repro.py): the script's header, which the
writer fills in, and its runner, the same for every graph.

The runner mirrors the localisation's runs (probes/compiled/localize.py): the same float64
reference (on the CPU for devices without float64), the same seeded cotangents, fresh copies of
the inputs per run; its figures come from `probes.compiled.repro.measure`, the localisation's own
judge, imported, so that they are the report's.
"""

from __future__ import annotations

import ast

HEADER = '''"""Reproduction of {title}, written by pytest-msprobe.

    python repro.py [--backend NAME | --backend module:attribute] [--json]

The graph is the class Repro below: its forward is the graph's code as Dynamo captured it. Its
tensors are in state.pt and the failing call's inputs in inputs.pt, plain tensors loaded with
torch.load(..., weights_only=True). The script compiles it with torch.compile (--backend: {default}
by default; the graph was compiled with {graph_backend}, passed as module:attribute when it is a
callable), runs it eagerly in float64 (the reference) and in its own dtypes, and prints each one's
error in ulps of the output dtype, the figures of the report. {what}

The figures are measured by pytest-msprobe's scaled rule (probes/core/scaled.py), imported when it
is installed; without it the script says so and prints the largest absolute differences instead.
"""

import argparse
import importlib
import json
import math
import sys
from pathlib import Path

import torch

{paths}{imports}
HERE = Path(__file__).resolve().parent
STAGE = {stage!r}
DEFAULT_BACKEND = {default!r}
# each tensor of state.pt: (where it goes in Repro, what it is, whether it requires grad)
TENSORS = {tensors!r}
# the sub-graphs higher-order operators call, traced to GraphModules once their tensors are in
SUBGRAPHS = {subgraphs!r}
NO_FLOAT64 = {no_float64!r}  # devices without float64: the reference runs on the CPU

try:
    from probes.compiled.repro import measure  # the report's own judge
except ImportError:
    measure = None


'''

PATHS = "sys.path[:0] = [p for p in {paths!r} if p not in sys.path]  # where the graph's own imports live\n"

WHAT = {"forward": "It compares the outputs.",
        "backward": "It compares the gradients with respect to the floating inputs, for a cotangent of "
                    "seeded normal values (the localisation's)."}

UNRUNNABLE = '''"""Reproduction of {title}, written by pytest-msprobe: NOT RUNNABLE.

The graph cannot be written as a standalone script:
{reasons}

graph.py holds its readable code and inputs.pt the failing call's inputs (plain tensors, loaded
with torch.load(..., weights_only=True)) when they could be saved, to rebuild it by hand.
"""

import sys

sys.exit({message!r})
'''

RUNNER = '''

def put(root, dotted, value):
    """Set root.<dotted> to value, creating empty modules on the way; tensors by their kind."""
    owner, _, name = dotted.rpartition(".")
    for part in filter(None, owner.split(".")):
        if not hasattr(root, part):
            root.add_module(part, torch.nn.Module())
        root = getattr(root, part)
    if isinstance(value, tuple):
        tensor, kind, requires_grad = value
        if kind == "parameter":
            root.register_parameter(name, torch.nn.Parameter(tensor, requires_grad=requires_grad))
        elif kind == "buffer":
            root.register_buffer(name, tensor)
        else:
            setattr(root, name, tensor)
    else:
        setattr(root, name, value)


def get(root, dotted):
    for part in filter(None, dotted.split(".")):
        root = getattr(root, part)
    return root


def build(state):
    module = Repro()
    for name, kind, requires_grad in TENSORS:
        put(module, name, (state[name], kind, requires_grad))
    for name in SUBGRAPHS:  # innermost first
        put(module, name, torch.fx.symbolic_trace(get(module, name)))
    return module


def load_state():
    path = HERE / "state.pt"
    return torch.load(path, weights_only=True) if path.exists() else {}


def load_inputs():
    return torch.load(HERE / "inputs.pt", weights_only=True)


def leaves(x):
    if isinstance(x, torch.Tensor):
        return [x]
    if isinstance(x, (tuple, list)):
        return [leaf for item in x for leaf in leaves(item)]
    return []


def copies(args):
    """Fresh copies of the inputs for each run: a graph may write into its inputs."""
    return [x.detach().clone() if isinstance(x, torch.Tensor) else x for x in args]


def upcast(x):
    if isinstance(x, torch.Tensor) and (x.is_floating_point() or x.is_complex()):
        device = "cpu" if x.device.type in NO_FLOAT64 else x.device
        return x.detach().to(device=device, dtype=torch.float64 if x.is_floating_point() else torch.complex128)
    return x


def differentiable(x):
    return isinstance(x, torch.Tensor) and (x.is_floating_point() or x.is_complex())


def cotangent(output):
    g = torch.Generator().manual_seed(0)
    return torch.randn(tuple(output.shape), generator=g, dtype=torch.float64).to(output.dtype).to(output.device)


def gradients(fn, args, cotangents=None):
    """(gradients of fn's outputs with respect to its floating inputs, the cotangents used)."""
    inputs = [x.detach().clone().requires_grad_(True) if differentiable(x) else x for x in args]
    with torch.enable_grad():
        outputs = [o for o in leaves(fn(*inputs)) if o.requires_grad]
        wrt = [x for x in inputs if isinstance(x, torch.Tensor) and x.requires_grad]
        if not outputs or not wrt:
            return [], []
        if cotangents is None:
            cotangents = [cotangent(o) for o in outputs]
        else:
            cotangents = [c.to(dtype=o.dtype, device=o.device) for c, o in zip(cotangents, outputs)]
        grads = torch.autograd.grad(outputs, wrt, cotangents, allow_unused=True)
    return [g if g is not None else torch.zeros_like(w) for g, w in zip(grads, wrt)], cotangents


def backend_of(spec):
    if ":" in spec:
        module, _, name = spec.partition(":")
        return getattr(importlib.import_module(module), name)
    return spec


def run(compiled, module, reference_module, inputs):
    """(compiled, eager, float64 reference) results: outputs, or gradients for STAGE backward."""
    up = [upcast(x) for x in inputs]
    if STAGE == "backward":
        out, cotangents = gradients(compiled, inputs)
        eager, _ = gradients(module, inputs, cotangents)
        reference, _ = gradients(reference_module, up, [c.double() for c in cotangents])
        return out, eager, reference
    with torch.no_grad():
        return compiled(*copies(inputs)), module(*copies(inputs)), reference_module(*copies(up))


def ulps(out, reference):
    value, threshold = measure(out, reference, stage=STAGE)
    return (value if not math.isnan(value) else math.inf), threshold


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--backend", default=DEFAULT_BACKEND)
    parser.add_argument("--json", action="store_true", help="print the figures as one JSON object")
    options = parser.parse_args()
    state = load_state()
    module = build(state)
    # the reference holds the graph's tensors in float64 too: the same values (widening is exact),
    # and float64 operators need float64 operands
    reference_module = build({name: upcast(t) for name, t in state.items()})
    compiled = torch.compile(module, backend=backend_of(options.backend))
    out, eager, reference = run(compiled, module, reference_module, load_inputs())
    what = "gradient of input" if STAGE == "backward" else "output"
    rows = [(i, o, e, r) for i, (o, e, r) in enumerate(zip(leaves(out), leaves(eager), leaves(reference)))
            if r.is_floating_point() or r.is_complex()]
    if measure is None:
        print("pytest-msprobe is not installed: the figures in ulps need its scaled rule "
              "(pip install pytest-msprobe). The largest absolute differences against float64:")
        for i, o, e, r in rows:
            print(f"{what} {i} ({o.dtype}): eager {float((e.double() - r.double()).abs().max()):.4g}, "
                  f"compiled ({options.backend}) {float((o.double() - r.double()).abs().max()):.4g}")
        return
    figures = {"stage": STAGE, "backend": options.backend, "leaves": []}
    for i, o, e, r in rows:
        (compiled_ulps, threshold), (eager_ulps, _) = ulps(o, r), ulps(e, r)
        figures["leaves"].append({"index": i, "dtype": str(o.dtype), "compiled_ulps": compiled_ulps,
                                  "eager_ulps": eager_ulps, "threshold_ulps": threshold})
        if not options.json:
            print(f"{what} {i} ({o.dtype}): eager {eager_ulps:.4g} ulps, compiled ({options.backend}) "
                  f"{compiled_ulps:.4g} ulps against float64 (threshold {threshold:.4g})")
    (compiled_ulps, threshold), (eager_ulps, _) = ulps(out, reference), ulps(eager, reference)
    figures.update(compiled_ulps=compiled_ulps, eager_ulps=eager_ulps, threshold_ulps=threshold)
    if options.json:
        print(json.dumps(figures))
    else:
        print(f"worst: eager {eager_ulps:.4g} ulps, compiled ({options.backend}) {compiled_ulps:.4g} ulps "
              f"against float64 (threshold {threshold:.4g})")


if __name__ == "__main__":
    main()
'''

# names the script defines: a graph global of the same name would clash with them
RESERVED = {"argparse", "importlib", "json", "math", "sys", "Path", "torch", "HERE", "STAGE", "DEFAULT_BACKEND",
             "TENSORS", "SUBGRAPHS", "NO_FLOAT64", "measure", "Repro"} | {
    n.name for n in ast.parse(RUNNER).body if isinstance(n, ast.FunctionDef)}
