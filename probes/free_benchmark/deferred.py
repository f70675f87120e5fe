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

from probes.core.leaf_verdicts import Comparison
from probes.core.trees import iter_leaves

#: settle when this many comparisons are pending
MAX_CALLS = 512
#: or when the outputs they hold on to exceed this many bytes (originals and perturbed results)
MAX_BYTES = 256 << 20


@dataclass
class _Pending:
    comparison: Comparison | None  # None: finished at the call, `result` waits for its turn
    request: list[Any]
    done: Callable[[list[Any]], None]
    failed: Callable[[BaseException], None]
    nbytes: int
    result: Any = None


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
        if not self._pending and _on_host(request):
            # figures on the host already (equal CPU outputs, backend.any_differ): finished now, so
            # its tensors are freed at once; only with nothing pending, which keeps the rows in
            # call order
            request = self._finish_on_host(comparison, request, done, failed)
            if request is None:
                return
        self._pending.append(_Pending(comparison, request, done, failed, nbytes))
        self._bytes += nbytes
        if len(self._pending) >= self.max_calls or self._bytes >= self.max_bytes:
            self.settle()

    def add_finished(self, verdicts: list[Any], done: Callable[[list[Any]], None],
                     failed: Callable[[BaseException], None]) -> None:
        """A call whose verdicts were made at the call (compare.equal_at_once, ratio_at_once):
        handed to `done` now, or, while comparisons are pending, after theirs (the rows in call
        order); it keeps no tensor alive."""
        if not self._pending:
            done(verdicts)
            return
        self._pending.append(_Pending(None, [], done, failed, 0, verdicts))
        if len(self._pending) >= self.max_calls:
            self.settle()

    def add_recorded(self, ledger: Any, key: str, name: str, stats: Any, verdicts: list[Any], step: int) -> None:
        """add_finished for verdicts that go to `ledger.record` (the checks made at the call):
        recorded now when nothing is pending, without making add_finished's two callbacks."""
        if not self._pending:
            ledger.record(key, name, stats, verdicts, step)
            return
        self.add_finished(verdicts, lambda v: ledger.record(key, name, stats, v, step),
                          lambda exc: ledger.check_failed(key, name, exc))

    def _finish_on_host(self, comparison: Comparison, request: list[Any], done: Callable[[list[Any]], None],
                        failed: Callable[[BaseException], None]) -> list[Any] | None:
        """Feed a comparison its figures while they are host values (as a settle pass would,
        its errors and callbacks handled the same way); the request that needs the device, or
        None when it finished."""
        raised: list[BaseException] = []
        while request is not None and _on_host(request):
            request = _send(comparison, [list(a) for a in request], done, failed, raised)
        if raised:
            raise raised[0]
        return request

    def settle(self) -> None:
        """Finish every pending comparison: one host transfer per pass for all of them.

        Nothing is lost or blamed on another call: when the batched read fails (a figure that
        cannot be read), each call's figures are read on their own and only the call whose read
        fails is given the error; a callback that raises (strict mode) is raised after every
        other pending comparison has been settled."""
        if self._settling or not self._pending:
            return
        self._settling = True
        raised: list[BaseException] = []
        try:
            active, self._pending, self._bytes = self._pending, [], 0
            while active:
                active = self._pass(active, raised)
        finally:
            self._settling = False
        if raised:
            raise raised[0]

    def _pass(self, active: list[_Pending], raised: list[BaseException]) -> list[_Pending]:
        """One pass: every active comparison gets its figures; the ones that ask again stay."""
        flat = [array for p in active for array in p.request]
        try:
            host = self.backend.host_floats(flat) if flat else []
        except Exception:  # some call's figures cannot be read: read each call's alone
            host = None
        pos, still = 0, []
        for p in active:
            n = len(p.request)
            if host is not None:
                mine, pos = host[pos : pos + n], pos + n
            else:
                try:
                    mine = self.backend.host_floats(p.request) if n else []
                except Exception as exc:
                    _call(p.failed, exc, raised)
                    continue
            if p.comparison is None:  # finished at the call: its turn to be recorded
                _call(p.done, p.result, raised, p.failed)
                continue
            request = _send(p.comparison, mine, p.done, p.failed, raised)
            if request is not None:
                p.request = request
                still.append(p)
        return still


def _send(comparison: Comparison, figures: list[Any], done: Callable[[list[Any]], None],
          failed: Callable[[BaseException], None], raised: list[BaseException]) -> list[Any] | None:
    """Give a comparison its figures: its next request, or None once it finished (its verdicts to
    `done`) or failed (this call's problem, to `failed`; the others go on)."""
    try:
        return comparison.send(figures)
    except StopIteration as finished:
        _call(done, finished.value, raised, failed)
    except Exception as exc:
        _call(failed, exc, raised)
    return None


def _on_host(request: list[Any]) -> bool:
    """Every figure of a request is a host value already (a list: no transfer to wait for)."""
    for array in request:
        if type(array) is not list:
            return False
    return True


def _call(callback: Callable[[Any], None], value: Any, raised: list[BaseException],
          failed: Callable[[BaseException], None] | None = None) -> None:
    """Run a settle callback; an exception it raises is kept for the end of the settle (or, from
    `done`, handed to `failed` first: a verdict that cannot be recorded is that call's error)."""
    try:
        callback(value)
    except Exception as exc:
        if failed is None:
            raised.append(exc)
        else:
            _call(failed, exc, raised)


_ITEM_BYTES = {"bfloat16": 2, "float16": 2, "float32": 4, "float64": 8}


def held_bytes(backend: Any, *trees: Any) -> int:
    """Bytes of the tensors in `trees` (what a pending comparison keeps alive)."""
    total = 0
    for tree in trees:
        for _path, leaf in iter_leaves(tree):
            if backend.is_tensor(leaf):
                total += backend.numel(leaf) * _ITEM_BYTES.get(backend.dtype_name(leaf), 8)
    return total
