"""Monitoring every optimizer that steps while a watch is on (the plugin's whole-suite mode).

A test suite does not hand its optimizers to the probe, so the watch finds them when they step:
each new optimizer gets a monitor of its own (two models trained in one test never mix their
statistics). The first optimizer writes into the watch's dump path itself, so a test with one
optimizer leaves exactly the files of ``PrecisionDebugger(task="grad_probe").monitor(...)``; the
k-th further one writes under ``optimizer{k}/``.
"""

from __future__ import annotations

import logging
from dataclasses import replace
from pathlib import Path
from typing import Any

from probes.core.config import ProbeConfig

log = logging.getLogger("probes.grad_probe")


class OptimizerWatchBase:
    """Start/stop and results of a watch; a framework subclass finds the optimizers."""

    framework = "unknown"

    def __init__(self, config: ProbeConfig) -> None:
        self.config = config
        self.monitors: list[Any] = []  # one per optimizer, in the order they first stepped
        self.errors: list[str] = []
        self.running = False

    def dump_path_for(self, index: int) -> Path:
        root = Path(self.config.dump_path)
        return root if index == 0 else root / f"optimizer{index}"

    def config_for(self, index: int) -> ProbeConfig:
        return replace(self.config, dump_path=str(self.dump_path_for(index)))

    # subclass interface -------------------------------------------------------------------
    def _install(self) -> None:  # pragma: no cover - abstract
        raise NotImplementedError

    def _uninstall(self) -> None:  # pragma: no cover - abstract
        raise NotImplementedError

    # lifecycle ------------------------------------------------------------------------------
    def start(self) -> OptimizerWatchBase:
        if not self.running:
            self._install()
            self.running = True
        return self

    def stop(self) -> None:
        """Remove the hooks and stop every monitor (each writes its summary.json). Idempotent."""
        if self.running:
            self.running = False
            self._uninstall()
        for m in self.monitors:
            try:
                m.stop()
            except Exception as exc:  # a monitor's summary must not hide the others'
                self.errors.append(f"{type(exc).__name__}: {exc}")

    def __enter__(self) -> OptimizerWatchBase:
        return self.start()

    def __exit__(self, *exc: Any) -> None:
        self.stop()

    def _monitor_failed(self, exc: BaseException) -> None:
        if self.config.strict:
            raise exc
        self.errors.append(f"{type(exc).__name__}: {exc}")
        log.warning("grad_probe: could not monitor an optimizer: %r", exc)

    def summary(self) -> dict[str, Any]:
        return {
            "tool": "grad_probe",
            "framework": self.framework,
            "dump_path": str(self.config.dump_path),
            "optimizers": [dict(m.summary(), dump_path=str(m.dump_path)) for m in self.monitors],
            "errors": list(self.errors),
            "config": self.config.to_dict(),
        }
