"""When a compiled MindSpore graph returns to Python: ``mindspore.jit`` functions (PyNative) and
Cells called in GRAPH_MODE.

Nothing of the probes runs inside a compiled graph, so a tool that needs to know a compiled call
happened subscribes here: grad_probe reads its in-graph buffers after each compiled step
(probes/grad_probe/mindspore_graph.py), free_benchmark lists the compiled calls it could not check.
The two entries of compiled execution are wrapped while anything is subscribed, and put back when
the last subscriber leaves; a callback runs after the outermost compiled call only (a jit function
called inside another's graph is part of it), with the compiled function's or Cell's name and the
object it belongs to (a Cell whose ``construct`` is jit-compiled, as MindSpore's optimizers are;
None for a plain function).
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

_SUBSCRIBERS: list[Callable[[str, Any], None]] = []
_PATCHED: dict[tuple[type, str], Any] = {}
_DEPTH = [0]


def subscribe(callback: Callable[[str, Any], None]) -> None:
    if callback not in _SUBSCRIBERS:
        _SUBSCRIBERS.append(callback)
    if not _PATCHED:
        _patch()


def unsubscribe(callback: Callable[[str, Any], None]) -> None:
    if callback in _SUBSCRIBERS:
        _SUBSCRIBERS.remove(callback)
    if not _SUBSCRIBERS:
        for (owner, name), original in _PATCHED.items():
            setattr(owner, name, original)
        _PATCHED.clear()


def _patch() -> None:
    """Wrap mindspore.jit's executor and a Cell's GRAPH_MODE call (``compile_and_run``); an entry a
    MindSpore version lacks is left out (its compiled calls then go unnoticed)."""
    from mindspore import nn

    targets: list[tuple[type, str, Callable[[Any], tuple[str, Any]]]] = [
        (nn.Cell, "compile_and_run", lambda cell: (type(cell).__name__, cell))]
    try:
        from mindspore.common.api import _JitExecutor

        targets.append((_JitExecutor, "__call__", _jit_label))
    except ImportError:
        pass
    for owner, name, label in targets:
        original = owner.__dict__.get(name)
        if original is not None:
            _PATCHED[(owner, name)] = original
            setattr(owner, name, _after(original, label))


def _jit_label(executor: Any) -> tuple[str, Any]:
    name = getattr(getattr(executor, "fn", None), "__name__", "jit function")
    owner = getattr(executor, "obj", None)
    return (f"{type(owner).__name__}.{name}" if owner is not None else name), owner


def _after(call: Any, label: Callable[[Any], tuple[str, Any]]) -> Any:
    @functools.wraps(call)
    def compiled_call(owner: Any, *args: Any, **kwargs: Any) -> Any:
        _DEPTH[0] += 1
        try:
            return call(owner, *args, **kwargs)
        finally:
            _DEPTH[0] -= 1
            if _DEPTH[0] == 0:
                name, of = label(owner)
                for callback in list(_SUBSCRIBERS):
                    callback(name, of)

    return compiled_call
