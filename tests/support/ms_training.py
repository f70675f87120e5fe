"""The MindSpore training steps the bit-identity tests run plain and probed: start/stop/step of
the debugger (if any) around each `value_and_grad` step and optimizer update."""

from __future__ import annotations

from typing import Any


def run_steps(grad_fn: Any, opt: Any, x: Any, y: Any, dbg: Any, steps: int) -> list[Any]:
    """The losses of `steps` training steps, as numpy copies."""
    losses = []
    for _ in range(steps):
        if dbg:
            dbg.start()
        loss, grads = grad_fn(x, y)
        opt(grads)
        losses.append(loss.asnumpy().copy())
        if dbg:
            dbg.stop()
            dbg.step()
    return losses
