"""A standalone reproduction of a failing graph: its code, the call's inputs, and a script.

The folder holds ``graph.py`` (the sub-graph's readable code, for people), ``module.pt`` (the
sub-graph itself, loadable with ``torch.load``), ``inputs.pt`` (the inputs of the failing call,
detached) and ``repro.py``, which needs nothing but PyTorch: it runs the sub-graph eagerly in
float64, eagerly in its own dtypes and compiled (Inductor, or the backend given on its command
line), and prints each one's error in ulps of the output dtype at the output's row scale. A
backward reproduction compares the gradients with respect to the floating inputs instead, for the
same fixed cotangent the localisation used.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

SCRIPT = '''"""Reproduction of {title}, written by pytest-msprobe.

    python repro.py [--backend inductor]

Runs the graph in module.pt on the inputs in inputs.pt: eagerly in float64 (the reference), eagerly
in its own dtypes, and compiled with torch.compile, and prints each one's error in ulps of the
output dtype, at the scale of the output's rows (the largest over the output's elements). With
STAGE "backward" it compares the gradients with respect to the floating inputs instead, for a
cotangent of seeded normal values.
"""

import argparse
from pathlib import Path

import torch

HERE = Path(__file__).resolve().parent
STAGE = {stage!r}


def ulps(out, ref):
    eps = torch.finfo(out.dtype if out.is_floating_point() else torch.float64).eps
    out, ref = out.double(), ref.double()
    row = 1
    for size in reversed(ref.shape):
        if row >= 16:
            break
        row *= size
    rows = ref.reshape(-1, max(row, 1))
    scale = torch.maximum(rows.abs(), rows.pow(2).mean(1, keepdim=True).sqrt()).reshape(ref.shape)
    return float(((out - ref).abs() / (scale.clamp_min(torch.finfo(torch.float64).tiny) * eps)).max())


def leaves(x):
    if isinstance(x, torch.Tensor):
        return [x]
    if isinstance(x, (tuple, list)):
        return [leaf for item in x for leaf in leaves(item)]
    return []


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--backend", default={backend!r})
    args = parser.parse_args()
    module = torch.load(HERE / "module.pt", weights_only=False)
    inputs = torch.load(HERE / "inputs.pt", weights_only=False)
    up = [x.double() if isinstance(x, torch.Tensor) and x.is_floating_point() else x for x in inputs]
    compiled_module = torch.compile(module, backend=args.backend)
    if STAGE == "backward":
        low = [leaf.dtype for leaf in leaves(module(*inputs)) if leaf.is_floating_point()]
        reference = gradients(module, up, low)
        eager = gradients(module, inputs, low)
        compiled = gradients(compiled_module, inputs, low)
        what = "gradient of input"
    else:
        with torch.no_grad():
            reference = leaves(module(*up))
            eager = leaves(module(*inputs))
            compiled = leaves(compiled_module(*inputs))
        what = "output"
    for i, ref in enumerate(reference):
        if not eager[i].is_floating_point():
            continue
        print(f"{{what}} {{i}} ({{eager[i].dtype}}): eager {{ulps(eager[i], ref):.4g}} ulps, "
              f"compiled ({{args.backend}}) {{ulps(compiled[i], ref):.4g}} ulps against float64")


def gradients(fn, inputs, low_dtypes):
    """The gradients of fn's floating outputs with respect to its floating inputs, for cotangents
    of seeded normal values rounded to the outputs' low-precision dtypes."""
    inputs = [x.detach().clone().requires_grad_(True) if isinstance(x, torch.Tensor) and x.is_floating_point()
              else x for x in inputs]
    outputs = [o for o in leaves(fn(*inputs)) if o.requires_grad]
    wrt = [x for x in inputs if isinstance(x, torch.Tensor) and x.requires_grad]
    cotangents = []
    for o, dtype in zip(outputs, low_dtypes):
        g = torch.Generator().manual_seed(0)
        values = torch.randn(tuple(o.shape), generator=g, dtype=torch.float64).to(dtype)
        cotangents.append(values.to(dtype=o.dtype, device=o.device))
    grads = torch.autograd.grad(outputs, wrt, cotangents, allow_unused=True)
    return [g if g is not None else torch.zeros_like(w) for g, w in zip(grads, wrt)]


if __name__ == "__main__":
    main()
'''


def write_repro(folder: Path, gm: torch.fx.GraphModule, args: tuple, title: str, backend: str,
                stage: str = "forward") -> Path:
    """Write the reproduction of `gm` on `args` into `folder` (created); returns the folder."""
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "graph.py").write_text(gm.print_readable(print_output=False), encoding="utf-8")
    torch.save(gm, folder / "module.pt")
    torch.save([_portable(a) for a in args], folder / "inputs.pt")
    registered = backend if _registered(backend) else "inductor"
    (folder / "repro.py").write_text(SCRIPT.format(title=title, backend=registered, stage=stage), encoding="utf-8")
    return folder


def _portable(x: Any) -> Any:
    return x.detach().clone() if isinstance(x, torch.Tensor) else x


def _registered(backend: str) -> bool:
    try:
        from torch._dynamo import list_backends

        return backend in list_backends(exclude_tags=())
    except Exception:
        return False
