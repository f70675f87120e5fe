"""MindSpore's part of a grad_probe step taken from Python
(:class:`~probes.grad_probe.step_files.StepFigures`).

PyNative dispatches each operator on its own (~0.1-0.5 ms however small the tensor), so on the CPU
target a gradient's figures are taken with NumPy on a view of its memory (no copy, no operator;
at L1 a float32 / float64 gradient in one pass, host_figures.one_pass_figures, as PyTorch's
monitor takes a large CPU gradient);
the gradients NumPy should not take (bfloat16, very large ones, other targets) take the same
formulas as MindSpore operators, and their statistics vectors come to the host in one transfer.
A low-precision dtype whose kernel this MindSpore build lacks is computed on a float32 upcast.
"""

from __future__ import annotations

import contextlib
import logging
from contextlib import AbstractContextManager
from typing import Any

import array_api_compat.numpy as np_xp
import mindspore as ms
import numpy as np

from probes.backends import mindspore_xp as xp
from probes.backends.mindspore_backend import BACKEND
from probes.grad_probe import stats
from probes.grad_probe.host_figures import one_pass_figures
from probes.grad_probe.monitor_common import MonitorBase
from probes.grad_probe.step_files import StepFigure

__all__ = ["FLOATS", "LOW_PRECISION", "MindSporeStepFigures", "host_rows", "kernel_missing", "synchronize"]

log = logging.getLogger("probes.grad_probe")

#: the gradient dtypes grad_probe measures, by their neutral names
FLOATS = {
    xp.float16: "float16",
    xp.bfloat16: "bfloat16",
    xp.float32: "float32",
    xp.float64: "float64",
}
_ONE_PASS = (np.dtype(np.float32), np.dtype(np.float64))  # host views L1 takes in one pass
#: the dtypes whose kernels a MindSpore build may lack (see kernel_missing)
LOW_PRECISION = ("float16", "bfloat16")


class MindSporeStepFigures:
    """One optimizer call seen from Python: ``grads`` maps each parameter name to its gradient
    (the optimizer's input). ``upcasts`` is the monitor's record of the ops computed on a float32
    upcast, reported in summary.json."""

    def __init__(self, monitor: MonitorBase, grads: dict[str, Any], upcasts: dict[str, set[str]]) -> None:
        self.monitor = monitor
        self.grads = grads
        self.upcasts = upcasts
        self.l0 = monitor.level == "L0"

    def computing(self) -> AbstractContextManager[Any]:
        return contextlib.nullcontext()

    def partitioned(self, p: Any) -> bool:
        return False

    def gradient(self, name: str, p: Any) -> Any:
        return self.grads.get(name)

    def no_gradient(self, step: int, name: str) -> None:
        """Listed in summary.json only: an optimizer input without a gradient is rare, not logged."""

    def take(self, name: str, g: Any) -> tuple[str, tuple[int, ...], Any, Any]:
        """(name, shape, statistics vector, payload), the payload on the host: a direction or a
        checksum needs the gradient's values as they are now, before the optimizer runs."""
        dtype_name = FLOATS.get(g.dtype)
        if dtype_name is None:
            raise TypeError(f"gradient of dtype {g.dtype} is not a real floating-point tensor")
        host = BACKEND.host_view(g)  # None: the tensor path (see the module docstring)
        monitor = self.monitor
        if host is not None and not (self.l0 or monitor.histogram or monitor.fp8_formats) and host.dtype in _ONE_PASS:
            # L1 in one pass, as PyTorch's monitor takes a large CPU gradient: the same cells
            (row,), signs = one_pass_figures([host.reshape(-1)])
            if row[0] == 0.0 or row[1] == 0.0:  # which signed zero: NumPy's, as stat_vector's
                row[:2] = [float(host.max()), float(host.min())]
            monitor.compute_dtypes.add("float64")
            return name, tuple(int(s) for s in g.shape), row, signs.reshape(host.shape)
        if host is not None:
            vec = self.figures(np_xp, host)
        else:
            vec = self._op(dtype_name, "statistics", g, lambda t: self.figures(xp, t))
        self.monitor.compute_dtypes.add("float64")
        if self.l0:
            payload = host if host is not None else g.astype(xp.float32).asnumpy()
        else:
            payload = host > 0 if host is not None else self._op(dtype_name, "direction", g, lambda t: t > 0).asnumpy()
        return name, tuple(int(s) for s in g.shape), vec, payload

    def measure(self, step: int, taken: list[Any], sharded: list[tuple[str, Any]]) -> list[Any]:
        return taken

    def to_host(self, measured: list[Any]) -> list[list[StepFigure]]:
        rows = host_rows([v for _, _, v, _ in measured])
        return [[StepFigure(name, shape, row, payload) for (name, shape, _, payload), row in zip(measured, rows)]]

    def figures(self, ns: Any, g: Any) -> Any:
        """One gradient's statistics vector, then its FP8 health fractions when asked for: the
        formulas PyTorch's monitor runs, over NumPy (the host view) or MindSpore (``ns``), so the
        two frameworks write the same cells for the same gradient."""
        bounds, histogram, formats = self.monitor.bounds, self.monitor.histogram, self.monitor.fp8_formats
        vec = stats.stat_vector(ns, g, bounds, histogram, dtype=ns.float64)
        if not formats:
            return vec
        health = stats.fp8_columns(ns, [g], formats, ns.float64)
        return ns.concat([vec, ns.reshape(health, (-1,))])

    def _op(self, dtype_name: str, op: str, g: Any, fn: Any) -> Any:
        """``fn(g)``, or ``fn`` of a float32 upcast when this MindSpore build has no kernel for
        ``op`` on a low-precision ``dtype_name`` (checked once on a tiny tensor, see
        :func:`kernel_missing`; trying the real gradient instead is unreliable because PyNative
        reports a missing kernel asynchronously, at a later synchronisation)."""
        if dtype_name in LOW_PRECISION and kernel_missing(dtype_name, op, fn):
            if op not in self.upcasts.setdefault(dtype_name, set()):
                log.info("grad_probe: %s of %s gradients computed on a float32 upcast (no kernel)", op, dtype_name)
            self.upcasts[dtype_name].add(op)
            return fn(g.astype(xp.float32))
        return fn(g)


def host_rows(vectors: list[Any]) -> list[list[float]]:
    """Statistics vectors as float lists: NumPy ones as they are, MindSpore ones stacked and
    copied to the host in one transfer."""
    rows: list[Any] = list(vectors)
    on_device = [i for i, v in enumerate(vectors) if isinstance(v, ms.Tensor)]
    if on_device:
        copied = np.asarray(xp.stack([vectors[i] for i in on_device]).asnumpy(), dtype=np.float64)
        for i, row in zip(on_device, copied):
            rows[i] = row
    return [np.asarray(r, dtype=np.float64).tolist() for r in rows]


_MISSING: dict[tuple[str, str], bool] = {}


def kernel_missing(dtype_name: str, op: str, fn: Any) -> bool:
    """Whether ``fn`` fails on a tiny tensor of ``dtype_name`` (cached per dtype and op). The
    device is synchronised before and after, so an asynchronous failure is caught here and does
    not surface at a later, unrelated operation."""
    key = (dtype_name, op)
    if key not in _MISSING:
        dtype = {v: k for k, v in FLOATS.items()}[dtype_name]
        probe = ms.Tensor(np.array([[1.0, -1.0], [0.0, 0.5]], dtype=np.float32)).astype(dtype)
        synchronize()
        try:
            np.asarray(fn(probe).asnumpy())
            synchronize()
            _MISSING[key] = False
        except Exception:
            try:
                synchronize()
            except Exception:  # the failure reported once more by the synchronisation
                pass
            _MISSING[key] = True
    return _MISSING[key]


def synchronize() -> None:
    """Wait for the device's queued work: PyNative reports a kernel's failure asynchronously, and a
    graph's writes into Parameters may still be in flight."""
    sync = getattr(getattr(ms, "runtime", None), "synchronize", None)
    if sync is not None:
        sync()
