"""msprobe-compatible PrecisionDebugger for PyTorch."""

from __future__ import annotations

import os
from typing import Any

from probes.core.config import ProbeConfig, load_config
from probes.core.errors import ConfigError


class PrecisionDebugger:
    """Same call shape as msprobe 8.3.3 (`PrecisionDebugger(config_path=...)`, `start()`,
    `stop()`, `step()`), plus `with debugger:` which guarantees the hooks are removed.

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
        else:
            raise ConfigError(
                "task", self.task, "this version of probes.pytorch.PrecisionDebugger runs free_benchmark",
                "grad_probe and online_dispatch arrive in later releases",
            )

    def start(self, model: Any = None) -> None:
        self._tool.start()

    def stop(self) -> None:
        self._tool.stop()

    def step(self) -> None:
        self._tool.step()

    def __enter__(self) -> PrecisionDebugger:
        self.start()
        return self

    def __exit__(self, *exc: Any) -> None:
        self.stop()

    # results ---------------------------------------------------------------------------------
    @property
    def probe(self) -> Any:
        return self._tool.probe

    @property
    def rows(self) -> list[Any]:
        """The inconsistent outputs found so far (records of free_benchmark.csv rows)."""
        return list(self._tool.probe.rows)

    def summary(self) -> dict[str, Any]:
        return self._tool.probe.summary()
