"""msprobe-compatible PrecisionDebugger for PyTorch."""

from __future__ import annotations

from typing import Any

from probes.core.config import ProbeConfig
from probes.debugger import PrecisionDebuggerBase


class PrecisionDebugger(PrecisionDebuggerBase):
    __doc__ = PrecisionDebuggerBase.__doc__
    framework = "PyTorch"

    def _free_benchmark_run(self, config: ProbeConfig) -> Any:
        from probes.free_benchmark.torch_probe import TorchFreeBenchmark

        return TorchFreeBenchmark(config)

    def monitor(self, model: Any = None, optimizers: Any = None) -> Any:
        """grad_probe: start monitoring ``model`` (an nn.Module: all its parameters, whichever of
        its optimizers steps) or an Optimizer (its parameters; only that optimizer is hooked).
        Calling it again adds to the same monitor (no step is counted twice). Returns the
        GradMonitor, or None for other tasks (where it does nothing, as in the reference)."""
        if self.task != "grad_probe":
            return None
        import torch

        from probes.grad_probe.torch_monitor import GradMonitor

        target = model if model is not None else self.model
        if target is None:
            raise TypeError("monitor() needs a model (nn.Module) or an optimizer")
        if self._monitor is None or not self._monitor.running:
            self._monitor = GradMonitor(self.config)
        names_from = self.model if isinstance(self.model, torch.nn.Module) else None
        self._monitor.monitor(target, optimizers, names_from=names_from)
        return self._monitor
