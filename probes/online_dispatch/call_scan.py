"""The dispatch mode's per-call look at an op's arguments, in one walk instead of three.

Every compared op needs the device under test, whether all its tensors are ordinary dense ones,
and how many bytes the reference will copy; on a model of small tensors each walk over the
arguments in Python costs a noticeable share of the op, so `scan` answers the three at once
(reference.device_under_test and reference.input_bytes are its parts, for the callers that need
one).
`other_modes_off` is _disable_current_modes without its cost when no other mode is active, as in
the usual run; `ProbeSide` is that and grad mode off in one context, what the probe's own
operators of a compared op run under.
"""

from __future__ import annotations

import contextlib
from typing import Any

import torch
from torch._ops import _len_torch_dispatch_stack_pre_dispatch
from torch.utils._python_dispatch import _disable_current_modes

CPU = torch.device("cpu")  # the device scan answers for CPU tensors (callers may test it by identity)
_STRIDED = torch.strided
_NO_MODES = contextlib.nullcontext()


def scan(args: tuple, kwargs: dict) -> tuple[torch.device | None, bool, int]:
    """(device under test: the first non-CPU tensor's device in reference.device_under_test's
    order, else CPU, None without tensors; every tensor plain strided; bytes of the tensors).
    A CPU tensor is told by `is_cpu`, a flag, where `device.type` makes a string (most calls
    have only CPU tensors, or only the accelerator's)."""
    found: torch.device | None = None
    plain = True
    nbytes = 0
    # popped from the end: the keyword values last to first, then the positional arguments, each
    # container's items last to first (the order the device is found in)
    stack: list[Any] = [*args, *kwargs.values()] if kwargs else [*args]
    while stack:
        x = stack.pop()
        if isinstance(x, torch.Tensor):
            if x.is_cpu:
                if found is None:
                    found = CPU
            elif found is None or found is CPU:
                found = x.device
            if x.layout is not _STRIDED or x.is_meta or x.is_quantized or x.is_nested:
                plain = False
            else:  # every dense tensor counts, plain call or not (input_bytes)
                nbytes += x.nbytes
        elif isinstance(x, (list, tuple)):
            stack.extend(x)
        elif isinstance(x, dict):
            stack.extend(x.values())
    return found, plain, nbytes


def other_modes_off(on: bool | None = None) -> contextlib.AbstractContextManager:
    """A context with every other dispatch mode off (torch's _disable_current_modes), or nothing
    to do when none is on; `on`: other_modes_on(), when the caller has asked already."""
    if on is None:
        on = other_modes_on()
    return _disable_current_modes() if on else _NO_MODES


def other_modes_on() -> bool:
    return _len_torch_dispatch_stack() != 0 or _len_torch_dispatch_stack_pre_dispatch() != 0


class ProbeSide:
    """Every other dispatch mode off (when `modes`: other_modes_on()) and grad mode off, back as
    they were on exit: one frame each way where other_modes_off and GradOff took five (a
    nullcontext's two among them), twice for every compared op."""

    __slots__ = ("_modes", "_off", "_grad")

    def __init__(self, modes: bool) -> None:
        self._modes = modes

    def __enter__(self) -> None:
        if self._modes:
            self._off = _disable_current_modes()
            self._off.__enter__()
        self._grad = _grad_enabled()
        if self._grad:
            _set_grad_enabled(False)

    def __exit__(self, *exc: object) -> None:
        try:
            if self._grad:
                _set_grad_enabled(True)
        finally:
            if self._modes:
                self._off.__exit__(*exc)


_len_torch_dispatch_stack = torch._C._len_torch_dispatch_stack
_grad_enabled = torch.is_grad_enabled
_set_grad_enabled = torch._C._set_grad_enabled
