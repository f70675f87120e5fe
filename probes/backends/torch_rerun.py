"""A probe's re-run of a torch call, as if it had not happened: grad mode off (GradOff) and the
random generators at the state the call drew from, put back afterwards (`replayed`).

Every checked call of free_benchmark makes one. replay.replay writes it over the backend's
methods (rng_snapshot, rng_restore, no_grad and its context), eight Python frames around the
re-run; `replayed` takes the same steps in the same order in three. The generator state is read
and set here only (`rng_state`, `set_rng_state`): the backend's rng_snapshot and rng_restore are
these.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch


class GradOff:
    """torch.no_grad as a plain context: grad mode off, and back as it was on exit. torch's is
    several Python layers (a decorator class, its __new__ and __init__), a few microseconds that
    every probed re-run (free_benchmark's checked calls, online_dispatch's compared ops) paid."""

    __slots__ = ("_prev",)

    def __enter__(self) -> None:
        self._prev = _grad_enabled()
        if self._prev:
            _set_grad_enabled(False)

    def __exit__(self, *exc: object) -> None:
        if self._prev:
            _set_grad_enabled(True)


def rng_state() -> tuple[Any, Any]:
    """The generators' states (the CPU one and CUDA's, None where CUDA was never initialised): what
    a re-run starts from to draw the numbers its call drew, and what the user's stream is put
    back to afterwards."""
    cuda = torch.cuda.get_rng_state() if _cuda_initialized() else None
    return _CPU_GENERATOR.get_state(), cuda


def set_rng_state(state: tuple[Any, Any]) -> None:
    cpu, cuda = state
    _CPU_GENERATOR.set_state(cpu)
    if cuda is not None:
        torch.cuda.set_rng_state(cuda)


def replayed(snapshot: Any, fn: Callable[..., Any], args: tuple, kwargs: dict) -> Any:
    """replay.replay(TorchBackend, snapshot, fn, args, kwargs): `fn(*args, **kwargs)` with grad
    mode off and the generators at `snapshot` (rng_state before the call), the generators put
    back afterwards whatever happens."""
    after = rng_state()
    set_rng_state(snapshot)
    try:
        grad = _grad_enabled()
        if grad:
            _set_grad_enabled(False)
        try:
            return fn(*args, **kwargs)
        finally:
            if grad:
                _set_grad_enabled(True)
    finally:
        set_rng_state(after)


_grad_enabled = torch.is_grad_enabled
_set_grad_enabled = torch._C._set_grad_enabled
# torch.get_rng_state() / set_rng_state() are these two calls behind a Python function each
_CPU_GENERATOR = torch.default_generator
_cuda_initialized = torch.cuda.is_initialized
