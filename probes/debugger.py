"""What the msprobe-compatible PrecisionDebugger does, whatever the framework.

The framework facades (`probes.pytorch`, `probes.mindspore`) subclass this with the two things
that differ: how free_benchmark's run is built and how `monitor()` finds the gradients.
"""

from __future__ import annotations

import os
from typing import Any

from probes.core.config import ProbeConfig, load_config
from probes.core.errors import ConfigError


class PrecisionDebuggerBase:
    """Same call shape as msprobe 8.3.3 (`PrecisionDebugger(config_path=...)`, `start()`,
    `stop()`, `step()`, `monitor(...)`), plus `with debugger:` which guarantees the hooks are
    removed.

    Tasks: free_benchmark (start/stop/step drive the probe) and grad_probe (`monitor(...)` starts
    the gradient monitor; start()/step() are no-ops, stop() removes its hooks and writes
    summary.json). Unlike the reference it is not a process-wide singleton: each instance is its
    own run. `overrides` sets config keys from code (`pert_mode="bit_noise"`, `list=["softmax"]`).
    """

    framework = ""
    tasks = ("free_benchmark", "grad_probe")

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
        self._tool: Any = None
        self._monitor: Any = None
        if self.task not in self.tasks:
            raise ConfigError("task", self.task, f"the {self.framework} PrecisionDebugger runs {', '.join(self.tasks)}",
                              "online_dispatch is used through probes.pytorch.online_dispatch.PtdbgDispatch")
        if self.task == "free_benchmark":
            self._tool = self._free_benchmark_run(self.config)

    def _free_benchmark_run(self, config: ProbeConfig) -> Any:
        raise NotImplementedError

    def monitor(self, *args: Any, **kwargs: Any) -> Any:
        raise NotImplementedError

    def start(self, model: Any = None) -> None:
        if self._tool is not None:
            self._tool.start()

    def stop(self) -> None:
        if self._tool is not None:
            self._tool.stop()
        elif self._monitor is not None:
            self._monitor.stop()

    def step(self) -> None:
        if self._tool is not None:
            self._tool.step()
        elif self._monitor is not None and hasattr(self._monitor, "step"):
            self._monitor.step()  # grad_probe on a compiled MindSpore step: read its statistics

    def __enter__(self) -> PrecisionDebuggerBase:
        self.start()
        return self

    def __exit__(self, *exc: Any) -> None:
        self.stop()

    # results ---------------------------------------------------------------------------------
    @property
    def probe(self) -> Any:
        return self._tool.probe if self._tool is not None else self._monitor

    @property
    def rows(self) -> list[Any]:
        """The inconsistent outputs found so far (records of free_benchmark.csv rows)."""
        if self._tool is None:
            return []
        self._tool.probe.settle()  # the checks still pending on the device first
        return list(self._tool.probe.rows)

    def summary(self) -> dict[str, Any]:
        if self._tool is not None:
            return self._tool.probe.summary()
        return self._monitor.summary() if self._monitor is not None else {}
