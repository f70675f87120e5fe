"""The MindSpore gradient monitor: per-parameter gradient statistics at each optimizer call, in the
same files as the PyTorch monitor, in PyNative, in GRAPH_MODE and under ``mindspore.jit``.

``MindSporeGradMonitor(config, optimizer)`` gives the optimizer a monitored class of its own
(probes/grad_probe/mindspore_graph.py). Called from Python, the optimizer's input ``(gradients,)``
reaches :meth:`on_call` first (the host path below), then the optimizer's own ``construct`` runs as
without the monitor; called inside a compiled graph, the graph writes the statistics into the
monitor's buffers and :meth:`graph_step` reads them after the compiled call. Gradient *i* belongs to
parameter *i* of ``optimizer._parameters`` (or ``optimizer.parameters``), named by
``Parameter.name`` (``fc1.weight``). For every selected step it writes
``{dump_path}/rank{R}/grad_summary_{N}.csv`` (and at L1/L2 ``rank{R}/step{N}/{param}.npy``) with
exactly the bytes the PyTorch monitor writes (:mod:`probes.grad_probe.csv_format`: ``param_name``
header, BOM, CRLF), plus ``rank{R}/summary.json``, so
:class:`~probes.grad_probe.comparator.GradComparator` compares a MindSpore run with a PyTorch run
of the same model, and a PyNative run with a graph run. ``grad_probe.fp8_health``'s cells are
PyTorch's formula (:func:`stats.fp8_columns`) on NumPy, MindSpore tensors or inside the graph:
the same cells for the same gradient (nan in a graph without float64, as PyTorch's without it).

Differences from msprobe 8.3.3:

* Graph mode writes the PyNative files (the reference's graph-mode path writes a different header
  spelling and depends on ``TensorDump`` file naming of MindSpore <= 2.4), with the step and rank
  filters and the L0 checksum.
* Each step's CSV is written atomically and replaces an existing one (the reference appends a second
  header + rows block when a dump_path is reused). Parameter names with characters outside
  ``[A-Za-z0-9_.-]`` are percent-encoded in file names (the reference raises at L1/L2).
* Statistics in float64 (the reference used the gradient's dtype and rounded to float32); an empty
  gradient gives a NaN row (the reference raised inside the hook).
* On the CPU target the statistics, the direction (``g > 0``) and the L0 checksum of float16/32/64
  gradients are computed with NumPy on a view of the gradient (``asnumpy()``, no copy: the
  tensor's memory is host memory): the same :func:`stats.stat_vector` formula, no MindSpore
  operator at all. PyNative dispatches each operator on its own (~0.1-0.5 ms however small the
  tensor), so the ~10 operators per parameter of the tensor path cost more than the optimizer
  step. bfloat16 gradients (NumPy has no bfloat16), gradients over
  ``mindspore_backend.HOST_MAX_ELEMENTS`` elements (where MindSpore's multi-threaded kernels
  beat single-threaded NumPy) and other device targets take the tensor path, whose statistics
  vectors are stacked and copied to the host once per step. The norm's float64 sum may differ
  from the tensor path's in the last bits (summation order); max, min and fractions are exact.
* bfloat16 on CPU: MindSpore has no CPU ``Greater`` kernel for bfloat16, so ``g > 0`` (direction
  files) is computed on a float32 upcast (exact: the sign does not change); any other statistic
  whose kernel is missing for a low-precision dtype is upcast the same way. ``summary.json``
  ``upcasts`` lists ``{dtype: {"to": "float32", "ops": [...]}}``.
* The rank is resolved at the first optimizer call (``mindspore.communication.get_rank()`` when
  the communication layer is initialised, else 0); step and rank filters apply per step. The step
  counts every call of the optimizer from 0; only selected steps are written.
* ``param_list`` entries matching no parameter raise ConfigError with close matches (the reference
  drops the whole list). Errors inside the hook are recorded in ``summary.json`` ``errors`` and
  never reach the training loop unless ``config.strict``. :meth:`stop` reads the last compiled
  step and gives the optimizer its own class back.
* ``names=``: rename parameters (a mapping MindSpore name -> reported name, or a sequence of names
  by position), e.g. to line a MindSpore run up with a PyTorch run whose names differ.
"""

from __future__ import annotations

import logging
import math
import weakref
from collections.abc import Mapping, Sequence
from typing import Any

import mindspore as ms

from probes.backends import mindspore_compiled
from probes.backends import mindspore_xp as xp
from probes.core.config import ProbeConfig
from probes.core.errors import ProbeError
from probes.grad_probe import mindspore_graph, stats
from probes.grad_probe.mindspore_figures import MindSporeStepFigures
from probes.grad_probe.monitor_common import MonitorBase, check_param_list
from probes.grad_probe.step_files import StepFigure, dump_step, write_step_figures

__all__ = ["GradMonitor", "MindSporeGradMonitor"]

log = logging.getLogger("probes.grad_probe")


class MindSporeGradMonitor(MonitorBase):
    """Gradient statistics of a MindSpore optimizer's parameters, taken at each of its calls, from
    Python or inside a compiled graph (module docstring). ``optimizer``: an ``nn.Optimizer`` (or
    any Cell called with ``(gradients,)`` whose ``_parameters`` / ``parameters`` lists the
    parameters in gradient order)."""

    framework = "mindspore"

    def __init__(self, config: ProbeConfig, optimizer: Any = None, *, names: Any = None) -> None:
        xp.warm_up()
        self._init_common(config)
        self._fp8_width = len(stats.FP8_HEALTH_FIGURES) * len(self.fp8_formats)
        self._params: list[tuple[str, Any]] = []  # every registered (name, parameter), in order
        self._optimizer: weakref.ref[Any] | None = None
        self._names: list[str] = []  # gradient position i -> name
        self._count = -1  # optimizer calls seen - 1
        self._buffers: Any = None  # the in-graph statistics of compiled steps (mindspore_graph)
        self._graph_seen = 0  # the buffers' count when the host last read them
        self.steps_by_path = {"host": 0, "graph": 0}  # steps recorded by each path
        self.graph_steps_lost = 0  # optimizer calls inside one compiled call, beyond the last
        self.graph_unsupported: str | None = None  # why compiled steps cannot be recorded
        self.upcasts: dict[str, set[str]] = {}  # dtype -> ops computed on a float32 upcast
        if optimizer is not None:
            self.monitor(optimizer, names=names)

    # ------------------------------------------------------------------ setup
    def monitor(self, optimizer: Any, *, names: Any = None) -> MindSporeGradMonitor:
        """Hook ``optimizer`` (once; again with the same optimizer is a no-op). One optimizer per
        monitor: gradients only reach a MindSpore optimizer as its input. ``names``: see the module
        docstring."""
        if self._closed:
            raise ProbeError("this MindSporeGradMonitor was stopped; create a new one")
        if not isinstance(optimizer, ms.nn.Cell):
            raise TypeError(f"monitor() needs a MindSpore optimizer (nn.Cell), got {type(optimizer).__name__}")
        current = self._optimizer() if self._optimizer is not None else None
        if current is optimizer:
            return self
        if current is not None:
            raise ProbeError("a MindSporeGradMonitor watches one optimizer; create another monitor for a second one")
        params = list(_optimizer_parameters(optimizer))
        own = _rename([str(p.name) for p in params], names)
        check_param_list(self.gp.param_list, own, "the optimizer's Parameter.name")
        self._params = list(zip(own, params))
        self._names = own
        self._optimizer = weakref.ref(optimizer)
        why_not = mindspore_graph.supports(type(optimizer))
        if why_not is None:
            wanted = {n for n, _ in self.selected}
            self._buffers = mindspore_graph.GraphBuffers(
                [(i, n, p) for i, (n, p) in enumerate(self._params) if n in wanted], self.level, self.bounds,
                self.histogram, _graph_compute_dtype(), self.fp8_formats)
            mindspore_compiled.subscribe(self._compiled_call)
        else:  # the host path alone: calls from Python are recorded, compiled steps are not
            self.graph_unsupported = why_not
            log.warning("grad_probe: %s: steps compiled with mindspore.jit or GRAPH_MODE are not recorded", why_not)
        mindspore_graph.install(optimizer, self, self._buffers)
        self._activate()
        return self

    @property
    def selected(self) -> list[tuple[str, Any]]:
        """The monitored (name, parameter) pairs, in optimizer order."""
        if not self.gp.param_list:
            return list(self._params)
        wanted = set(self.gp.param_list)
        return [(n, p) for n, p in self._params if n in wanted]

    def _resolve_rank(self) -> int:
        try:
            from mindspore.communication.management import GlobalComm

            if not GlobalComm.INITED:
                return 0
            from mindspore.communication import get_rank

            return int(get_rank())
        except Exception:  # not initialised / no communication backend
            return 0

    # ------------------------------------------------------------------ the two paths
    def on_call(self, cell: Any, inputs: Any) -> None:
        """The optimizer called from Python: statistics of its input gradients, on the host."""
        if self._closed:
            return
        self._count += 1
        count = self.current_step = self._count
        try:
            if not self._selected_step(count):
                return
            self._dump(count, self._gradients(inputs))
            self.steps_by_path["host"] += 1
        except Exception as exc:  # never break the training loop unless strict
            self.record_error(count, None, exc)
            if self.config.strict:
                raise self._strict_failure(count, exc) from exc

    def graph_step(self) -> None:
        """Read what compiled steps wrote into the buffers since the last read (after every
        compiled call, and at step() / stop()): one small read of the count, the statistics of the
        latest step when it moved."""
        if self._closed or self._buffers is None:
            return
        try:
            count = self._buffers.read_count()
            moved = count - self._graph_seen
            if moved <= 0:
                return
            self._graph_seen = count
            self._count += moved
            step = self.current_step = self._count
            skipped = [s for s in range(step - moved + 1, step) if self._selected_step(s)]
            self.graph_steps_lost += len(skipped)
            if skipped:
                self._dirty = True
            if self._selected_step(step):
                self._dump_buffers(step)
                self.steps_by_path["graph"] += 1
        except Exception as exc:  # never break the training loop unless strict
            self.record_error(self.current_step, None, exc)
            if self.config.strict:
                raise self._strict_failure(self.current_step or 0, exc) from exc

    def step(self) -> None:
        """The end of a training step: read a compiled step's statistics (a no-op when they were
        read as the compiled call returned, or when the optimizer ran from Python)."""
        self.graph_step()

    def _compiled_call(self, name: str, owner: Any) -> None:
        self.graph_step()

    def _selected_step(self, step: int) -> bool:
        if self.rank is None:
            self.rank = self._resolve_rank()
        return self.config.selects_rank(self.rank) and self.config.selects_step(step)

    def _dump_buffers(self, step: int) -> None:
        rows, directions, copies = self._buffers.read()
        # FP8 health not counted in the graph (a target without float64): nan, as PyTorch's monitor
        unmeasured = [math.nan] * (self._fp8_width if not self._buffers.fp8_formats else 0)
        l0 = self.level == "L0"
        figures = [StepFigure(name, shape, row + unmeasured, copy if l0 else positive)
                   for name, shape, row, positive, copy in zip(self._buffers.names, self._buffers.shapes, rows,
                                                               directions, copies)]
        self.compute_dtypes.add(str(self._buffers.compute).lower().replace("mindspore.", ""))
        write_step_figures(self, step, [figures], [])

    def _gradients(self, inputs: Any) -> dict[str, Any]:
        """name -> gradient of this call: gradient i belongs to parameter i."""
        # the optimizer's first argument: the gradients (a tuple), whatever else it takes
        grads = inputs[0] if isinstance(inputs, (tuple, list)) and inputs and isinstance(inputs[0], (tuple, list)) \
            else inputs
        grads = list(grads)
        if len(grads) != len(self._names):
            raise ProbeError(f"the optimizer got {len(grads)} gradients for {len(self._names)} parameters")
        return dict(zip(self._names, grads))

    # ------------------------------------------------------------------ one step
    def _dump(self, step: int, grads: dict[str, Any]) -> None:
        dump_step(self, step, MindSporeStepFigures(self, grads, self.upcasts))

    # ------------------------------------------------------------------ results
    def summary(self) -> dict[str, Any]:
        out = super().summary()
        out["paths"] = dict(self.steps_by_path)  # steps recorded from Python (host) and from compiled graphs
        out["mode"] = "graph" if self.steps_by_path["graph"] and not self.steps_by_path["host"] else (
            "pynative" if not self.steps_by_path["graph"] else "mixed")
        out["steps_not_recorded"] = {"count": self.graph_steps_lost, "reason": (
            "the optimizer ran more than once inside one compiled call: its in-graph buffers hold the "
            "latest step only") if self.graph_steps_lost else ""}
        if self.graph_unsupported:
            out["compiled_steps"] = f"not recorded: {self.graph_unsupported}"
        out["upcasts"] = {d: {"to": "float32", "ops": sorted(ops)} for d, ops in sorted(self.upcasts.items())}
        return out

    # ------------------------------------------------------------------ teardown
    def stop(self) -> None:
        """Read the last compiled step, then remove the monitored class and write summary.json."""
        if not self._closed:
            self.graph_step()
        super().stop()

    def remove(self) -> None:
        """Give the optimizer its own class back and stop watching compiled calls. Idempotent."""
        optimizer = self._optimizer() if self._optimizer is not None else None
        if optimizer is not None:
            mindspore_graph.uninstall(optimizer)
        mindspore_compiled.unsubscribe(self._compiled_call)

    @property
    def running(self) -> bool:
        optimizer = self._optimizer() if self._optimizer is not None else None
        return not self._closed and optimizer is not None


GradMonitor = MindSporeGradMonitor


# ---------------------------------------------------------------------- helpers
def _graph_compute_dtype() -> Any:
    """float64 for the in-graph statistics, float32 where the target has no float64 (Ascend)."""
    return ms.float32 if ms.get_context("device_target") == "Ascend" else ms.float64


def _optimizer_parameters(opt: Any) -> Sequence[Any]:
    params = getattr(opt, "_parameters", None)
    if params is None or isinstance(params, Mapping):  # a plain Cell's _parameters is an OrderedDict
        params = getattr(opt, "parameters", None)
    if params is None or isinstance(params, Mapping) or callable(params):
        raise TypeError(f"{type(opt).__name__} has no optimizer parameter list (_parameters / parameters)")
    return params


def _rename(names: list[str], mapping: Any) -> list[str]:
    if mapping is None:
        return names
    if isinstance(mapping, Mapping):
        return [str(mapping.get(n, n)) for n in names]
    new = [str(n) for n in mapping]
    if len(new) != len(names):
        raise ValueError(f"names= has {len(new)} entries for {len(names)} optimizer parameters")
    return new
