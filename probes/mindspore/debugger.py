"""msprobe-compatible PrecisionDebugger for MindSpore (PyNative).

MindSpore is imported only when a tool is built, so importing this module costs nothing.
"""

from __future__ import annotations

from typing import Any

from probes.core.config import ProbeConfig
from probes.debugger import PrecisionDebuggerBase


class PrecisionDebugger(PrecisionDebuggerBase):
    __doc__ = PrecisionDebuggerBase.__doc__
    framework = "MindSpore"

    def _free_benchmark_run(self, config: ProbeConfig) -> Any:
        from probes.free_benchmark.mindspore_probe import MindSporeFreeBenchmark

        return MindSporeFreeBenchmark(config)

    def monitor(self, optimizer: Any = None) -> Any:
        """grad_probe: monitor the parameters of a MindSpore optimizer (mindspore.nn.Optimizer).
        Returns the monitor, or None for other tasks (where it does nothing, as in msprobe)."""
        if self.task != "grad_probe":
            return None
        if optimizer is None:
            raise TypeError("monitor() needs a MindSpore optimizer (mindspore.nn.Optimizer)")
        from probes.grad_probe.mindspore_monitor import MindSporeGradMonitor

        self._monitor = MindSporeGradMonitor(self.config, optimizer)
        return self._monitor
