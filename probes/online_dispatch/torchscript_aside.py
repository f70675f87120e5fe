"""torch.jit with the dispatch modes off while OnlineDispatchMode is entered.

TorchScript and dispatch modes do not mix: torch.jit.trace records another graph when a mode is
active (shapes become constants, then its own check fails), and a traced or scripted module's
interpreter hands a mode ops whose Tensor arguments are Python ints (aten.equal(84, 2)), which
cannot run from Python. So those calls run unprobed, each counted under its skip reason.
"""

from __future__ import annotations

import functools
from typing import Any

import torch
from torch.utils._python_dispatch import _disable_current_modes

from probes.online_dispatch import skip_list


def aside_for_torchscript(mode: Any) -> tuple[tuple[Any, str, Any], ...]:
    """Replace torch.jit.trace / trace_module and the calls of script modules by versions that run
    with the dispatch modes off and count themselves in `mode.results.skipped`. Returns the
    replaced attributes, for `put_back` when the mode exits."""
    saved = []
    targets = [(torch.jit, name, skip_list.JIT_TRACE) for name in ("trace", "trace_module")]
    targets.append((torch.jit.ScriptModule, "__call__", skip_list.TORCHSCRIPT))
    for owner, name, reason in targets:
        original = getattr(owner, name, None)
        if original is None:
            continue
        had_own = name in vars(owner)  # ScriptModule inherits __call__: deleted again, not set back

        def aside(*args: Any, __original: Any = original, __reason: str = reason, **kwargs: Any) -> Any:
            key = (__reason, "torch.jit")
            mode.results.skipped[key] = mode.results.skipped.get(key, 0) + 1
            with _disable_current_modes():
                return __original(*args, **kwargs)

        functools.update_wrapper(aside, original)
        saved.append((owner, name, original if had_own else None))
        setattr(owner, name, aside)
    return tuple(saved)


def put_back(saved: tuple[tuple[Any, str, Any], ...]) -> None:
    for owner, name, value in saved:
        if value is None:
            delattr(owner, name)
        else:
            setattr(owner, name, value)
