"""Every PyTorch optimizer that steps while the watch is on gets a GradMonitor (whole-suite mode).

One global optimizer step pre-hook finds the optimizers; parameter names come from the
``nn.Module`` that holds the optimizer's parameters, found once per optimizer among the live
modules (a test never hands its model to the plugin), else ``group{g}.param{i}``.
"""

from __future__ import annotations

import gc
import weakref
from typing import Any

import torch
from torch.optim.optimizer import register_optimizer_step_pre_hook

from probes.core.config import ProbeConfig
from probes.grad_probe.torch_monitor import GradMonitor
from probes.grad_probe.watch_common import OptimizerWatchBase


class TorchOptimizerWatch(OptimizerWatchBase):
    framework = "pytorch"

    def __init__(self, config: ProbeConfig) -> None:
        super().__init__(config)
        self._by_optimizer: weakref.WeakKeyDictionary[torch.optim.Optimizer, GradMonitor] = weakref.WeakKeyDictionary()
        self._handle: Any = None

    def _install(self) -> None:
        self._handle = register_optimizer_step_pre_hook(self._on_step)

    def _uninstall(self) -> None:
        if self._handle is not None:
            self._handle.remove()
            self._handle = None

    def _on_step(self, optimizer: torch.optim.Optimizer, args: Any, kwargs: Any) -> None:
        monitor = self._by_optimizer.get(optimizer)
        if monitor is None:
            try:
                monitor = GradMonitor(self.config_for(len(self.monitors)))
                monitor.monitor(optimizer, names_from=owning_module(optimizer), hook=False)
            except Exception as exc:
                self._monitor_failed(exc)
                return
            self.monitors.append(monitor)
            self._by_optimizer[optimizer] = monitor
        monitor.on_step(optimizer)  # records its own errors; raises only in strict mode


def owning_module(optimizer: torch.optim.Optimizer) -> torch.nn.Module | None:
    """The live module whose parameters cover most of the optimizer's, the smallest such module
    on a tie (the model rather than a wrapper around it)."""
    wanted = {id(p) for group in optimizer.param_groups for p in group["params"]}
    best: tuple[int, int] | None = None
    found = None
    module_type = torch.nn.Module
    for obj in gc.get_objects():
        if not issubclass(type(obj), module_type):  # type(): no __class__ lookup on lazy proxies
            continue
        try:
            ids = [id(p) for p in obj.parameters()]
        except Exception:  # a half-built or exotic module
            continue
        covered = len(wanted.intersection(ids))
        if covered == 0:
            continue
        key = (covered, -len(ids))
        if best is None or key > best:
            best, found = key, obj
    return found
