"""background="auto": which ops the reference thread takes, by what they cost when judged inline.

The thread pays for an op when the op's re-run and figures (torch kernels, which release the GIL)
overlap the user's program by more than the hand-off costs: a private copy of the result, a
future, and the GIL passed back and forth between two threads for the Python around the kernels.
Whether it does depends on the op's size far more than on the host. Measured with one torch
thread on 2 cores: on the Llama training step of benchmarks/llama_overhead.py (ops of 0.1-0.5 ms
to judge inline, the slowest 2.5 ms) the thread made the step 13x the plain one against 9x
inline, and handing it only the ops of at least 1 ms still cost 0.7x more than none; on the
medium transformer of benchmarks/online_dispatch_overhead.py, whose matmuls and attention take
6-28 ms to judge, it made the pass 4.4x against 5.5x inline.

So, once the host can overlap at all (workers.use_reference_thread) and the output is large
enough (workers.AUTO_THREAD_BYTES), each kind of op (the overload and its output's size) is
judged inline the first MEASUREMENTS times, timed, and handed to the thread on later calls only if
the quickest of those took at least THREAD_MIN_SECONDS. The CSV is the same whichever way an op goes.
"""

from __future__ import annotations

from typing import Any

#: the least inline cost (re-run and figures) of an op worth handing to the reference thread
THREAD_MIN_SECONDS = 4e-3
#: inline timings of a kind before it may go to the thread (the least of them counts)
MEASUREMENTS = 3
# kinds of op remembered; a program of ever new shapes starts measuring afresh past this
_MAX_KINDS = 4096


def worth_a_thread(inline_seconds: float | None) -> bool:
    """Whether an op kind that took `inline_seconds` inline goes to the thread (None: not yet
    measured, judged inline and timed)."""
    return inline_seconds is not None and inline_seconds >= THREAD_MIN_SECONDS


class InlineCosts:
    """The least seconds each kind of op took to judge inline, known once it was timed
    MEASUREMENTS times (a kind's first call also pays for warming up: allocations, first-use
    setup; timed once, the ops of a Llama step looked five times their cost)."""

    __slots__ = ("_seconds",)

    def __init__(self) -> None:
        self._seconds: dict[Any, tuple[int, float]] = {}

    def get(self, kind: Any) -> float | None:
        timed = self._seconds.get(kind)
        return timed[1] if timed is not None and timed[0] >= MEASUREMENTS else None

    def record(self, kind: Any, seconds: float) -> None:
        timed = self._seconds.get(kind)
        if timed is None:
            if len(self._seconds) >= _MAX_KINDS:
                self._seconds.clear()
            self._seconds[kind] = (1, seconds)
        else:
            self._seconds[kind] = (timed[0] + 1, min(timed[1], seconds))
