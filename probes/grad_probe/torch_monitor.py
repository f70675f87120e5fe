"""The PyTorch gradient monitor: per-parameter gradient statistics just before each optimizer step.

``GradMonitor(config, model_or_params, optimizers=None)`` writes, for every selected step,
``{dump_path}/rank{R}/grad_summary_{N}.csv`` (and at L1/L2 ``rank{R}/step{N}/{param}.npy``) in the
reference's format (see :mod:`probes.grad_probe.csv_format`), plus ``rank{R}/summary.json``.

Differences from msprobe 8.3.3:

* Only the model's own optimizers are hooked (the reference hooked every optimizer of the process,
  for good, so other optimizers and repeated ``monitor()`` calls advanced its step). With ``optimizers=`` given, each gets an
  ``optimizer.register_step_pre_hook``; otherwise one global step pre-hook is installed whose
  handler ignores every optimizer holding none of the monitored parameters. Steps are counted per
  optimizer. **Step number with several optimizers:** the monitor's step N is the number of
  ``step()`` calls already entered by the *lead* optimizer, the first of the model's optimizers
  that stepped; the statistics of all selected parameters are taken in the lead's pre-hook, and
  the other optimizers' steps only advance their own counters. So a model with one optimizer per
  layer gives steps 0, 1, 2 … once per iteration, not once per optimizer. Calling ``monitor()``
  again adds parameters/optimizers without adding hooks; :meth:`GradMonitor.stop` removes every
  hook handle.
* The rank is resolved at the first hook call, not at ``monitor()`` time (where, before
  ``init_process_group``, every rank wrote ``rank0``). The rank filter
  applies whether or not a process group exists (rank 0 without one), as for free_benchmark.
* Statistics in float64 on the gradient's device (not in the gradient's dtype rounded to float32),
  one host transfer per device per step; empty gradients give a row of NaN statistics instead of
  an exception.
* A parameter whose gradient is None is logged once (not every step); it has no CSV row
  and is listed per step in ``summary.json`` ``params_without_grad``.
* ``param_list`` names matching no parameter raise ConfigError with close matches (the reference
  ignores them silently).
* Errors inside the hook are recorded in ``summary.json`` ``errors`` and never reach the training
  loop unless ``config.strict``.
* ``param.main_grad`` (Megatron-style fp32 main gradient) is read when present and not None,
  else ``param.grad``. Sparse gradients are densified first.
"""

from __future__ import annotations

import sys
import weakref
from collections.abc import Iterable, Mapping
from typing import Any

import torch
from torch.optim.optimizer import register_optimizer_step_pre_hook

from probes.backends.torch_backend import BACKEND
from probes.core.config import ProbeConfig
from probes.core.errors import ProbeError
from probes.grad_probe.host_figures import Squares
from probes.grad_probe.monitor_common import MAX_ERRORS, SUMMARY_INTERVAL_S, MonitorBase, check_param_list  # noqa: F401 - MAX_ERRORS, SUMMARY_INTERVAL_S re-exported
from probes.grad_probe.step_files import dump_step
from probes.grad_probe.torch_figures import BATCH_ELEMENTS, TorchStepFigures, partitioning  # noqa: F401 - BATCH_ELEMENTS re-exported

__all__ = ["GradMonitor"]


class GradMonitor(MonitorBase):
    """Gradient statistics of a model's parameters, taken just before each optimizer step.

    ``model_or_params``: an ``nn.Module`` (its ``named_parameters()``), an ``Optimizer`` (its
    parameters, and that optimizer is the one hooked), a mapping name -> parameter, or an iterable
    of ``(name, parameter)`` pairs or of bare parameters (named by position). ``optimizers``: an
    optimizer or a list of them to hook; None = find the model's optimizers when they step.
    """

    framework = "pytorch"

    def __init__(
        self,
        config: ProbeConfig,
        model_or_params: Any = None,
        optimizers: Any = None,
        *,
        backend: Any = BACKEND,
    ) -> None:
        self._init_common(config)
        self.backend = backend

        self._names: dict[int, str] = {}  # id(param) -> name, every registered parameter
        self._params: list[tuple[str, torch.Tensor]] = []  # every registered parameter, in order
        self._explicit: weakref.WeakSet[torch.optim.Optimizer] = weakref.WeakSet()
        self._owner_cache: weakref.WeakKeyDictionary[torch.optim.Optimizer, bool] = weakref.WeakKeyDictionary()
        self._counts: weakref.WeakKeyDictionary[torch.optim.Optimizer, int] = weakref.WeakKeyDictionary()
        self._lead: weakref.ref[torch.optim.Optimizer] | None = None
        self._handles: list[Any] = []
        self._global_handle: Any = None
        self._logged_none: set[str] = set()
        self._squares = Squares()  # the host figures' buffer, kept from step to step

        if model_or_params is not None or optimizers is not None:
            self.monitor(model_or_params, optimizers)

    # ------------------------------------------------------------------ setup
    def monitor(
        self, model_or_params: Any = None, optimizers: Any = None, *, names_from: Any = None, hook: bool = True
    ) -> GradMonitor:
        """Add parameters and/or optimizers and make sure the hooks are installed (once).

        ``names_from``: an ``nn.Module`` whose ``named_parameters()`` name the parameters of an
        optimizer passed as ``model_or_params`` (otherwise they are called ``group{g}.param{i}``).
        ``hook=False``: register the parameters only; the caller already sees the optimizer's
        steps (a global hook of its own) and calls :meth:`on_step`.
        """
        if self._closed:
            raise ProbeError("this GradMonitor was stopped; create a new one")
        opts = _as_optimizers(optimizers)
        if isinstance(model_or_params, torch.optim.Optimizer):
            opts.insert(0, model_or_params)
            named = self._optimizer_params(model_or_params, names_from)
        else:
            named = _named_params(model_or_params)
        known = {id(p) for _, p in self._params}
        for name, p in named:
            if id(p) not in known:
                known.add(id(p))
                self._params.append((name, p))
                self._names[id(p)] = name
        self._check_param_list()
        self._owner_cache = weakref.WeakKeyDictionary()  # ownership may have changed
        if not hook:
            self._activate()
            return self
        for opt in opts:
            if opt not in self._explicit:
                self._explicit.add(opt)
                self._handles.append(opt.register_step_pre_hook(self._optimizer_hook))
        if not opts and not len(self._explicit) and self._global_handle is None:
            self._global_handle = register_optimizer_step_pre_hook(self._global_hook)
        self._activate()
        return self

    def _optimizer_params(self, opt: torch.optim.Optimizer, names_from: Any = None) -> list[tuple[str, torch.Tensor]]:
        """An optimizer's parameters, named from ``names_from`` (a module) or earlier registrations
        when possible, else ``group{g}.param{i}``; in ``names_from`` order when it is given."""
        names = dict(self._names)
        order: dict[int, int] = {}
        if isinstance(names_from, torch.nn.Module):
            for k, (n, p) in enumerate(names_from.named_parameters()):
                names.setdefault(id(p), n)
                order.setdefault(id(p), k)
        out = []
        for g, group in enumerate(opt.param_groups):
            for i, p in enumerate(group["params"]):
                out.append((names.get(id(p), f"group{g}.param{i}"), p))
        if order:
            out.sort(key=lambda item: order.get(id(item[1]), len(order)))
        return out

    def _check_param_list(self) -> None:
        check_param_list(self.gp.param_list, [n for n, _ in self._params])

    @property
    def selected(self) -> list[tuple[str, torch.Tensor]]:
        """The monitored (name, parameter) pairs, in registration order."""
        if not self.gp.param_list:
            return list(self._params)
        wanted = set(self.gp.param_list)
        return [(n, p) for n, p in self._params if n in wanted]

    # ------------------------------------------------------------------ hooks
    def _global_hook(self, optimizer: torch.optim.Optimizer, args: Any, kwargs: Any) -> None:
        if optimizer in self._explicit:  # it has its own hook
            return
        owns = self._owner_cache.get(optimizer)
        if owns is None:
            owns = any(id(p) in self._names for group in optimizer.param_groups for p in group["params"])
            if not owns and "deepspeed" in sys.modules:  # ZeRO steps flat partitions of the parameters
                from probes.backends import torch_zero

                owns = torch_zero.steps_for(optimizer, [p for _n, p in self._params])
            self._owner_cache[optimizer] = owns
        if owns and not ("deepspeed" in sys.modules and _zero_continues(optimizer)):
            self.on_step(optimizer)

    def _optimizer_hook(self, optimizer: torch.optim.Optimizer, args: Any, kwargs: Any) -> None:
        self.on_step(optimizer)

    def on_step(self, optimizer: torch.optim.Optimizer) -> None:
        """Take the statistics of a step ``optimizer`` is about to make (its step pre-hook)."""
        if self._closed:
            return
        count = self._counts.get(optimizer, -1) + 1
        self._counts[optimizer] = count
        lead = self._lead() if self._lead is not None else None
        if lead is None:
            self._lead = weakref.ref(optimizer)
        elif lead is not optimizer:
            return
        self.current_step = count
        try:
            if self.rank is None:
                self.rank = int(self.backend.rank())
            if not self.config.selects_step(count):
                return
            if self.config.selects_rank(self.rank):
                self._dump(count)
            elif any(partitioning(p) is not None for _n, p in self.selected):
                # a rank the filter leaves out still adds its slices to the figures the others write
                self._dump(count, write=False)
        except Exception as exc:  # never break the training loop unless strict
            self.record_error(count, None, exc)
            if self.config.strict:
                raise self._strict_failure(count, exc) from exc

    # ------------------------------------------------------------------ one step
    def _dump(self, step: int, write: bool = True) -> None:
        """Take and write one step's figures. ``write=False``: only this rank's share of the sharded
        parameters' collective (a rank the rank filter leaves out: the others wait for it)."""
        dump_step(self, step, TorchStepFigures(self, self.backend, self._logged_none, self._squares), write)

    def _resolve_rank(self) -> int:
        return int(self.backend.rank())

    # ------------------------------------------------------------------ teardown
    def remove(self) -> None:
        """Remove every hook this monitor installed. Idempotent."""
        for h in self._handles:
            h.remove()
        self._handles.clear()
        if self._global_handle is not None:
            self._global_handle.remove()
            self._global_handle = None

    @property
    def running(self) -> bool:
        return not self._closed and (bool(self._handles) or self._global_handle is not None)


# ---------------------------------------------------------------------- helpers
def _zero_continues(optimizer: torch.optim.Optimizer) -> bool:
    from probes.backends import torch_zero

    return torch_zero.continues_step(optimizer)


def _as_optimizers(optimizers: Any) -> list[torch.optim.Optimizer]:
    if optimizers is None:
        return []
    if isinstance(optimizers, torch.optim.Optimizer):
        return [optimizers]
    out = list(optimizers)
    for o in out:
        if not isinstance(o, torch.optim.Optimizer):
            raise TypeError(f"optimizers must be torch.optim.Optimizer instances, got {type(o).__name__}")
    return out


def _named_params(obj: Any) -> list[tuple[str, torch.Tensor]]:
    if obj is None:
        return []
    if isinstance(obj, torch.nn.Module):
        return list(obj.named_parameters())
    if isinstance(obj, torch.Tensor):
        return [("0", obj)]
    if isinstance(obj, Mapping):
        return [(str(k), v) for k, v in obj.items()]
    if isinstance(obj, Iterable):
        out = []
        for i, item in enumerate(obj):
            if isinstance(item, tuple) and len(item) == 2 and isinstance(item[0], str):
                out.append((item[0], item[1]))
            elif isinstance(item, torch.Tensor):
                out.append((str(i), item))
            else:
                raise TypeError(f"expected (name, parameter) pairs or parameters, got {type(item).__name__}")
        return out
    raise TypeError(
        f"GradMonitor needs an nn.Module, an Optimizer, a mapping or an iterable of parameters, got {type(obj).__name__}"
    )
