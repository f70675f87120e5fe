"""msprobe-compatible PrecisionDebugger for MindSpore (PyNative).

MindSpore is imported only when a tool is built, so importing this module costs nothing.
"""

from __future__ import annotations

import os
from typing import Any

from probes.core.config import ProbeConfig, load_config
from probes.core.errors import ConfigError


class PrecisionDebugger:
    """Same call shape and config keys as probes.pytorch.PrecisionDebugger (and msprobe 8.3.3):
    `PrecisionDebugger(config_path=...)`, `start()`, `stop()`, `step()`, `monitor(optimizer)`,
    and `with debugger:`, which guarantees the hooks are removed.

    Tasks: free_benchmark (start/stop/step drive the probe; output files as on PyTorch) and
    grad_probe (`monitor(optimizer)` starts the MindSpore gradient monitor; start()/step() are
    no-ops; stop() ends it). Not a process-wide singleton: each instance is its own run.
    """

    def __init__(
        self,
        config_path: str | os.PathLike | None = None,
        task: str | None = None,
        dump_path: str | os.PathLike | None = None,
        level: str | None = None,
        model: Any = None,
        step: Any = None,
        *,
        config: ProbeConfig | dict | None = None,
        **overrides: Any,
    ) -> None:
        if config is not None and config_path is not None:
            raise ConfigError("config", config, "give either config_path or config, not both")
        if isinstance(config, ProbeConfig):
            self.config = config
        else:
            if level is not None:
                overrides["level"] = level
            self.config = load_config(
                config if config is not None else config_path,
                task=task, dump_path=None if dump_path is None else os.fspath(dump_path), step=step,
                overrides=overrides or None,
            )
        self.task = self.config.task
        self.model = model
        self._monitor: Any = None
        if self.task == "free_benchmark":
            from probes.free_benchmark.mindspore_probe import MindSporeFreeBenchmark

            self._tool = MindSporeFreeBenchmark(self.config)
        elif self.task == "grad_probe":
            self._tool = None  # the monitor is created by monitor()
        else:
            raise ConfigError(
                "task", self.task, "probes.mindspore.PrecisionDebugger runs free_benchmark and grad_probe",
                "online_dispatch is PyTorch only",
            )

    def start(self, model: Any = None) -> None:
        if self.task == "grad_probe":
            return
        self._tool.start()

    def stop(self) -> None:
        if self.task == "grad_probe":
            if self._monitor is not None:
                self._monitor.stop()
            return
        self._tool.stop()

    def step(self) -> None:
        if self.task == "grad_probe":
            return
        self._tool.step()

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

    def __enter__(self) -> PrecisionDebugger:
        self.start()
        return self

    def __exit__(self, *exc: Any) -> None:
        self.stop()

    # results ---------------------------------------------------------------------------------
    @property
    def probe(self) -> Any:
        return self._monitor if self.task == "grad_probe" else self._tool.probe

    @property
    def rows(self) -> list[Any]:
        """The inconsistent outputs found so far (records of free_benchmark.csv rows)."""
        if self.task == "grad_probe":
            return []
        return list(self._tool.probe.rows)

    def summary(self) -> dict[str, Any]:
        if self.task == "grad_probe":
            return self._monitor.summary() if self._monitor is not None else {}
        return self._tool.probe.summary()
