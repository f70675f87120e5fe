"""msprobe-compatible PrecisionDebugger for PyTorch."""

from __future__ import annotations

import os
from typing import Any

from probes.core.config import ProbeConfig, load_config
from probes.core.errors import ConfigError


class PrecisionDebugger:
    """Same call shape as msprobe 8.3.3 (`PrecisionDebugger(config_path=...)`, `start()`,
    `stop()`, `step()`, `monitor(model)`), plus `with debugger:` which guarantees the hooks are
    removed.

    Tasks: free_benchmark (start/stop/step drive the probe) and grad_probe (`monitor(model or
    optimizer)` starts the gradient monitor; start()/step() are no-ops, stop() removes its hooks
    and writes summary.json).

    Unlike the reference it is not a process-wide singleton: each instance is its own run.
    `overrides` sets config keys from code (`pert_mode="bit_noise"`, `list=["softmax"]`).
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
        if self.task == "free_benchmark":
            from probes.free_benchmark.torch_probe import TorchFreeBenchmark

            self._tool = TorchFreeBenchmark(self.config)
        elif self.task == "grad_probe":
            self._tool = None  # the GradMonitor is created by monitor()
            self._monitor: Any = None
        else:
            raise ConfigError(
                "task", self.task, "this version of probes.pytorch.PrecisionDebugger runs free_benchmark and grad_probe",
                "online_dispatch arrives in a later release",
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
