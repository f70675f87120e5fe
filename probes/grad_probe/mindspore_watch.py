"""Every MindSpore optimizer created or called while the watch is on gets a MindSporeGradMonitor
(whole-suite mode; PyNative, GRAPH_MODE and ``mindspore.jit`` steps alike).

MindSpore has no global optimizer hook, so the watch wraps ``mindspore.nn.Optimizer.__init__``
(an optimizer made during the test is monitored as soon as its parameters are known, which a
compiled step needs: it never calls the optimizer from Python) and ``__call__`` (inherited by Adam,
SGD, ...; an optimizer class defining its own ``__call__`` is wrapped too: an optimizer made before
the test is monitored at its first call from Python, before the call runs, so that first step is
recorded). The original attributes are put back at stop().
"""

from __future__ import annotations

import functools
import weakref
from typing import Any

import mindspore as ms

from probes.core.config import ProbeConfig
from probes.grad_probe.mindspore_monitor import MindSporeGradMonitor
from probes.grad_probe.watch_common import OptimizerWatchBase

_MISSING = object()


class MindSporeOptimizerWatch(OptimizerWatchBase):
    framework = "mindspore"

    def __init__(self, config: ProbeConfig) -> None:
        super().__init__(config)
        self._seen: weakref.WeakKeyDictionary[Any, bool] = weakref.WeakKeyDictionary()
        self._saved: list[tuple[type, str, Any]] = []

    def _install(self) -> None:
        for cls in _optimizer_classes():
            original = cls.__dict__.get("__call__", _MISSING)
            self._saved.append((cls, "__call__", original))
            call = original if original is not _MISSING else cls.__call__
            cls.__call__ = self._wrap(call)
        init = ms.nn.Optimizer.__dict__["__init__"]
        self._saved.append((ms.nn.Optimizer, "__init__", init))
        ms.nn.Optimizer.__init__ = self._wrap_init(init)

    def _uninstall(self) -> None:
        for cls, name, original in reversed(self._saved):
            if original is _MISSING:
                delattr(cls, name)
            else:
                setattr(cls, name, original)
        self._saved.clear()

    def _watch(self, optimizer: Any) -> None:
        if self.running and optimizer not in self._seen:
            self._seen[optimizer] = True
            try:
                self.monitors.append(MindSporeGradMonitor(self.config_for(len(self.monitors)), optimizer))
            except Exception as exc:
                self._monitor_failed(exc)

    def _wrap(self, call: Any) -> Any:
        @functools.wraps(call)
        def wrapper(optimizer: Any, *args: Any, **kwargs: Any) -> Any:
            self._watch(optimizer)
            return call(optimizer, *args, **kwargs)

        return wrapper

    def _wrap_init(self, init: Any) -> Any:
        @functools.wraps(init)
        def wrapper(optimizer: Any, *args: Any, **kwargs: Any) -> None:
            init(optimizer, *args, **kwargs)
            self._watch(optimizer)  # the parameter list is known once the base class made it

        return wrapper


def _optimizer_classes() -> list[type]:
    """nn.Optimizer and every loaded subclass that defines its own ``__call__``."""
    base = ms.nn.Optimizer
    out, todo = [base], list(base.__subclasses__())
    while todo:
        cls = todo.pop()
        todo.extend(cls.__subclasses__())
        if "__call__" in cls.__dict__:
            out.append(cls)
    return out
