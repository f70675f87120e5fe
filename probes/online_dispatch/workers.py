"""process_num > 0: the figures of each op computed in worker processes.

The device op and the CPU re-run stay in the user's process (they must run where the tensors
are, in order); the workers compute exactly `verdict.figures` on the two results, with the
parent's torch thread count so every reduction sums in the same order and the CSV is identical
to process_num = 0. Results come back in submission order and are written by the parent only
(the reference let every worker append to the CSV and a JSON file without a working lock, B-O9).
At most `WINDOW_PER_WORKER * process_num` ops are in flight; beyond that the parent waits, which
bounds the memory held by pending ops (their tensors stay alive until judged, for the dumps).

Workers are started with "spawn" (fork after torch has started its thread pools can deadlock) at
the first __enter__, not in the constructor; each __exit__ waits for the pending ops, and the
workers stop when the PtdbgDispatch object is closed or garbage-collected (or at interpreter exit).
"""

from __future__ import annotations

import weakref
from collections import deque
from collections.abc import Callable
from concurrent.futures import Future, ProcessPoolExecutor
from typing import Any

import torch
import torch.multiprocessing as tmp

WINDOW_PER_WORKER = 4


def _init_worker(threads: int) -> None:
    torch.set_num_threads(threads)


def _figures(pairs: list) -> list:
    from probes.online_dispatch.verdict import figures

    return figures(pairs)


class ComparisonPool:
    """Submit an op's output pairs; `finish(job, figures)` runs in the parent, in submission order."""

    def __init__(self, workers: int, finish: Callable[[Any, list | BaseException], None]) -> None:
        ctx = tmp.get_context("spawn")
        self._pool = ProcessPoolExecutor(max_workers=workers, mp_context=ctx, initializer=_init_worker,
                                         initargs=(torch.get_num_threads(),))
        # a weak reference: the pool must not keep its PtdbgDispatch alive (the finalizer that
        # stops the workers runs when that object is collected)
        self._finish = weakref.WeakMethod(finish) if hasattr(finish, "__self__") else (lambda: finish)
        self._pending: deque[tuple[Future, Any]] = deque()
        self._window = WINDOW_PER_WORKER * workers

    def submit(self, job: Any, pairs: list) -> None:
        future = self._pool.submit(_figures, pairs)
        self._pending.append((future, job))
        self._drain(block=len(self._pending) > self._window)

    def _drain(self, block: bool) -> None:
        while self._pending and (block or self._pending[0][0].done()):
            future, job = self._pending.popleft()
            try:
                result: list | BaseException = future.result()
            except Exception as exc:  # a worker failure becomes the op's Err_message
                result = exc
            finish = self._finish()
            if finish is not None:
                finish(job, result)
            block = len(self._pending) > self._window

    def drain(self) -> None:
        """Judge every pending op (the workers keep running for the next context)."""
        while self._pending:
            self._drain(block=True)

    def close(self) -> None:
        """Judge every pending op, then stop the workers."""
        try:
            self.drain()
        finally:
            self._pool.shutdown(wait=True)
