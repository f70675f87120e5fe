"""Verdicts settled in batches: a checked call's figures stay on the device until step()/stop().

On an accelerator every device-to-host copy waits for the device to finish its queue, so a copy
per checked call makes the host and the device take turns. Each call instead starts its
comparison (probes/free_benchmark/compare.py `comparison`: the device figures are computed at
once, from the outputs as they are then) and leaves it here; `settle` gathers the figures of every
pending comparison into one host transfer per device, feeds each its numbers, and repeats for the
rare later passes (a leaf the bound does not settle, a leaf with inf/NaN, the reference figure
of a flagged leaf), all pending comparisons together. A step therefore costs one transfer, two
when something needed a closer look, whatever the number of checked calls.

The queue is bounded: it settles by itself when it holds `max_calls` comparisons or when the
output tensors they keep alive (a later pass reads them again) exceed `max_bytes`, so memory
cannot grow with the length of a step.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from probes.core.trees import iter_leaves
from probes.free_benchmark.compare import Comparison

#: settle when this many comparisons are pending
MAX_CALLS = 512
#: or when the outputs they hold on to exceed this many bytes (originals and perturbed results)
MAX_BYTES = 256 << 20


@dataclass
class _Pending:
    comparison: Comparison
    request: list[Any]
    done: Callable[[list[Any]], None]
    failed: Callable[[BaseException], None]
    nbytes: int


class VerdictQueue:
    """Pending comparisons of one probe. Not thread-safe by itself: the service calls it from the
    training thread (forward) or from the autograd engine's callbacks (backward), never both at
    once for one probe."""

    def __init__(self, backend: Any, max_calls: int = MAX_CALLS, max_bytes: int = MAX_BYTES) -> None:
        self.backend = backend
        self.max_calls = max_calls
        self.max_bytes = max_bytes
        self._pending: list[_Pending] = []
        self._bytes = 0
        self._settling = False

    def __len__(self) -> int:
        return len(self._pending)

    def add(self, comparison: Comparison, done: Callable[[list[Any]], None],
            failed: Callable[[BaseException], None], nbytes: int = 0) -> None:
        """Start `comparison` now (its first device figures) and settle it later. Errors of the
        start (a StructureMismatch) propagate to the caller; later ones go to `failed`."""
        try:
            request = next(comparison)
        except StopIteration as finished:  # nothing to measure on the device
            done(finished.value)
            return
        self._pending.append(_Pending(comparison, request, done, failed, nbytes))
        self._bytes += nbytes
        if len(self._pending) >= self.max_calls or self._bytes >= self.max_bytes:
            self.settle()

    def settle(self) -> None:
        """Finish every pending comparison: one host transfer per pass for all of them."""
        if self._settling or not self._pending:
            return
        self._settling = True
        try:
            active, self._pending, self._bytes = self._pending, [], 0
            while active:
                flat = [array for p in active for array in p.request]
                host = self.backend.host_floats(flat) if flat else []
                pos, still = 0, []
                for p in active:
                    n = len(p.request)
                    mine, pos = host[pos : pos + n], pos + n
                    try:
                        p.request = p.comparison.send(mine)
                    except StopIteration as finished:
                        p.done(finished.value)
                    except Exception as exc:  # this call's problem, reported as such; the others go on
                        p.failed(exc)
                    else:
                        still.append(p)
                active = still
        finally:
            self._settling = False


_ITEM_BYTES = {"bfloat16": 2, "float16": 2, "float32": 4, "float64": 8}


def held_bytes(backend: Any, *trees: Any) -> int:
    """Bytes of the tensors in `trees` (what a pending comparison keeps alive)."""
    total = 0
    for tree in trees:
        for _path, leaf in iter_leaves(tree):
            if backend.is_tensor(leaf):
                total += backend.numel(leaf) * _ITEM_BYTES.get(backend.dtype_name(leaf), 8)
    return total
