"""grad_probe's statistics inside a compiled MindSpore graph (GRAPH_MODE, ``mindspore.jit``).

A compiled training step calls the optimizer inside the graph: no Python hook runs there, and a
forward pre-hook is compiled into the graph (its ``try`` fails to compile). msprobe 8.3.3 used
``ops.TensorDump``, which MindSpore 2.10 has no CPU kernel for. Here the optimizer is given a
monitored class of its own (a subclass made once per optimizer class) whose ``construct``, when
compiled, first writes each selected gradient's statistics into the monitor's own ``Parameter``
buffers (``ops.assign``), then runs the optimizer's own ``construct`` as a method call (its
attribute updates, such as Adam's ``beta1_power``, then keep their meaning); the host reads the
buffers once per ``step()`` / ``stop()``. It works on every target and needs no file written from
inside the graph.

Called from Python (PyNative, or an optimizer called eagerly in GRAPH_MODE), the monitored class's
``__call__`` runs the monitor's host path first (NumPy statistics on the gradients' host view,
probes/grad_probe/mindspore_monitor.py) and then the optimizer's original ``construct``, exactly
as without the monitor: the in-graph code exists only in compiled graphs.

The buffers hold one step. The host reads them when a compiled call returns to Python
(probes/backends/mindspore_compiled.py: a ``mindspore.jit`` function, or a Cell called in
GRAPH_MODE; one small read of a ``count`` the graph increments at every optimizer call, and the
statistics when it moved), and at ``step()`` / ``stop()``; a count that moved by more than one (an optimizer called several times inside one
compiled call) gives the number of steps that could not be read, which ``summary.json`` reports. Statistics are computed in float64 where the target has it (float32 on
Ascend), directions as one byte per element of the gradient, and at L0 a float32 copy of the
gradient (its checksum is taken on the host). The FP8 health fractions (``grad_probe.fp8_health``,
float64 targets only) are the host path's formula, :func:`stats.fp8_columns`, compiled over
``mindspore_xp.compiled_namespace()``: about 0.15 s of compile time per parameter and format on a
CPU, paid once per graph.
"""

from __future__ import annotations

import inspect
import weakref
from typing import Any

import mindspore as ms
import numpy as np
from mindspore import nn, ops

from probes.backends import mindspore_xp
from probes.grad_probe import stats
from probes.grad_probe.mindspore_figures import synchronize

_CLASSES: dict[tuple[type, bool], type] = {}
_XP = mindspore_xp.compiled_namespace()  # the statistics' array namespace inside the graph
ORIGINAL = "_msprobe_original"  # the optimizer class's own construct, as a method of the monitored class


class GraphBuffers(nn.Cell):
    """The Parameters a compiled step writes one step's statistics into (see the module docstring)."""

    def __init__(self, params: list[tuple[int, str, Any]], level: str, bounds: tuple, histogram: bool,
                 compute: Any, fp8_formats: tuple[str, ...] = ()) -> None:
        super().__init__()
        self.index = tuple(i for i, _name, _p in params)  # gradient positions of the selected parameters
        self.names = [name for _i, name, _p in params]
        self.bounds = tuple(float(b) for b in bounds)
        self.histogram = histogram
        self.with_directions = level in ("L1", "L2")
        self.with_copies = level == "L0"
        self.compute = compute
        # the FP8 health counts need float64 (the monitor writes nan for them where it is missing)
        self.fp8_formats = tuple(fp8_formats) if compute == ms.float64 else ()
        width = stats.vector_length(bounds, histogram) + len(stats.FP8_HEALTH_FIGURES) * len(self.fp8_formats)
        host_dtype = np.float64 if compute == ms.float64 else np.float32  # made on the host: no operator runs
        self.stats = ms.ParameterTuple([
            ms.Parameter(ms.Tensor(np.zeros(width, dtype=host_dtype)), name=f"msprobe_grad_stats_{k}",
                         requires_grad=False) for k in range(len(params))])
        shapes = [tuple(int(s) for s in p.shape) for _i, _n, p in params]
        # uint8, not bool: a bool Parameter written by a graph read back with stale elements on
        # MindSpore 2.10's CPU target, in about one run of three
        self.directions = ms.ParameterTuple([
            ms.Parameter(ms.Tensor(np.zeros(s if self.with_directions else (1,), dtype=np.uint8)),
                         name=f"msprobe_grad_direction_{k}", requires_grad=False) for k, s in enumerate(shapes)])
        self.copies = ms.ParameterTuple([
            ms.Parameter(ms.Tensor(np.zeros(s if self.with_copies else (1,), dtype=np.float32)),
                         name=f"msprobe_grad_copy_{k}", requires_grad=False) for k, s in enumerate(shapes)])
        self.count = ms.Parameter(ms.Tensor(0, ms.int32), name="msprobe_grad_count", requires_grad=False)
        self.shapes = shapes

    def read_count(self) -> int:
        """The number of optimizer calls compiled steps made. The device is synchronised first:
        the graph's writes into the buffers run asynchronously, and a Parameter's host copy does
        not wait for all of them (a read could see the previous step's directions)."""
        synchronize()
        return int(self.count.asnumpy())

    def read(self) -> tuple[list[list[float]], list[np.ndarray | None], list[np.ndarray | None]]:
        """The latest step's statistics rows, direction arrays (L1/L2) and gradient copies (L0), on
        the host: the statistics in one transfer."""
        rows = np.asarray(ops.stack([s.astype(ms.float64) for s in self.stats]).asnumpy(), dtype=np.float64)
        directions = [d.asnumpy().astype(np.bool_) if self.with_directions else None for d in self.directions]
        copies = [c.asnumpy() if self.with_copies else None for c in self.copies]
        return rows.tolist(), directions, copies


def record(self: Any, gradients: Any) -> Any:
    """The in-graph statistics of the selected gradients (compiled with the optimizer's construct:
    MindSpore's graph syntax only; every loop runs over constants)."""
    buffers = self._msprobe_buffers
    written = ()
    for k in range(len(buffers.index)):
        g = gradients[buffers.index[k]]
        x = g.astype(ms.float32).astype(buffers.compute)
        figures = [x.max(), x.min(), ops.sqrt((x * x).sum())]
        if buffers.histogram:
            n = x.size
            below = [(x <= b).astype(buffers.compute).sum() for b in buffers.bounds]
            edges = [ops.zeros((), buffers.compute)] + below + [ops.ones((), buffers.compute) * n]
            for j in range(len(edges) - 1):
                figures.append((edges[j + 1] - edges[j]) / n)
            figures.append((x == 0).astype(buffers.compute).sum() / n)
        row = ops.stack(figures)
        if buffers.fp8_formats:  # the host path's formula; one pass over x, which the graph holds anyway
            health = stats.fp8_columns(_XP, [x], buffers.fp8_formats, buffers.compute, chunked=False)
            row = ops.concat((row, health.reshape((-1,))))
        written = written + (ops.assign(buffers.stats[k], row),)
        if buffers.with_directions:
            written = written + (ops.assign(buffers.directions[k], (g > 0).astype(ms.uint8)),)
        if buffers.with_copies:
            written = written + (ops.assign(buffers.copies[k], g.astype(ms.float32)),)
    written = written + (ops.assign_add(buffers.count, ops.ones((), ms.int32)),)
    # the optimizer's kernels may update the gradients' memory in place: they run after the writes
    return ops.depend(gradients, written)


def construct(self: Any, gradients: Any) -> Any:
    """The monitored class's construct: compiled in a graph, it records, then runs the original."""
    gradients = self._msprobe_record(gradients)
    return self._msprobe_original(gradients)


def _call(self: Any, *args: Any, **kwargs: Any) -> Any:
    """Called from Python: the monitor's host path, then the original construct, as without it."""
    monitor = self._msprobe_monitor()
    if monitor is not None:
        monitor.on_call(self, args)
    cls = type(self)
    object.__setattr__(self, "construct", getattr(cls, ORIGINAL).__get__(self))  # this call runs the optimizer's own
    try:
        return cls._msprobe_base.__call__(self, *args, **kwargs)
    finally:
        object.__delattr__(self, "construct")


def monitored_class(base: type, graph: bool = True) -> type:
    """The monitored subclass of an optimizer class (made once per class and kind): with `graph`,
    its construct records in compiled graphs; without, only ``__call__`` is the monitor's."""
    cls = _CLASSES.get((base, graph))
    if cls is None:
        original = base.construct
        raw = getattr(original, "__wrapped__", original)  # the function under @jit
        members = {ORIGINAL: raw, "__call__": _call, "__module__": base.__module__, "_msprobe_base": base}
        if graph:
            members.update(construct=construct, _msprobe_record=record)
        cls = type(f"GradProbe{base.__name__}", (base,), members)
        _CLASSES[(base, graph)] = cls
    return cls


def supports(base: type) -> str | None:
    """None when the monitored class can stand in for `base` in a graph, else why not: its
    ``construct`` must take the gradients alone (``construct(self, gradients)``), as every
    ``nn.Optimizer`` does."""
    original = base.construct
    raw = getattr(original, "__wrapped__", original)
    try:
        params = list(inspect.signature(raw).parameters.values())
    except (TypeError, ValueError):
        return f"{base.__name__}.construct has no inspectable signature"
    plain = [p for p in params[1:] if p.default is inspect.Parameter.empty and p.kind in (
        inspect.Parameter.POSITIONAL_ONLY, inspect.Parameter.POSITIONAL_OR_KEYWORD)]
    if len(plain) != 1 or any(p.kind in (p.VAR_POSITIONAL, p.VAR_KEYWORD) for p in params):
        return f"{base.__name__}.construct takes {len(params) - 1} arguments, not the gradients alone"
    return None


def install(optimizer: Any, monitor: Any, buffers: GraphBuffers | None) -> None:
    """Give `optimizer` the monitored class and the buffers (undone by `uninstall`); without
    buffers (an optimizer `supports` refuses) its construct stays its own: only calls from Python
    are recorded."""
    base = type(optimizer)
    if hasattr(base, "_msprobe_base"):
        from probes.core.errors import ProbeError

        raise ProbeError(f"this {base._msprobe_base.__name__} optimizer is already monitored by a grad_probe "
                         "monitor: stop that one first")
    object.__setattr__(optimizer, "_msprobe_monitor", weakref.ref(monitor))
    if buffers is not None:
        optimizer._msprobe_buffers = buffers  # a sub-cell: its Parameters are the graph's
    optimizer.__class__ = monitored_class(base, graph=buffers is not None)


def uninstall(optimizer: Any) -> None:
    cls = type(optimizer)
    base = getattr(cls, "_msprobe_base", None)
    if base is None:
        return
    optimizer.__class__ = base
    for name in ("_msprobe_buffers", "_msprobe_monitor"):
        try:
            delattr(optimizer, name)
        except AttributeError:
            pass
