"""Where an op's comparison runs when it does not run inline: one background thread (the default)
or worker processes (process_num > 0). Either way results are judged in op order, on the user's
thread, by the mode's `finish(job, result)`; only the mode writes files.

* **The reference thread** (`reference_thread`) runs the CPU re-run *and* the figures of each op
  while the user's program goes on to its next op. torch kernels release the GIL, so the re-run
  overlaps the user's own computation: on an accelerator the CPU checks while the device works,
  on a CPU-only host it uses a core the model leaves idle. The thread is not inside the dispatch
  mode (dispatch modes are thread-local), and it runs with the torch thread count of the process,
  so every reduction sums in the same order and the CSV is identical to the inline one.
* **Worker processes** (`process_pool`, process_num > 0, the reference's option): the re-run
  stays in the user's process and only `verdict.figures` is shipped, with the parent's torch
  thread count. Started with "spawn" (fork after torch has started its thread pools can
  deadlock) at the first __enter__; they stop when the PtdbgDispatch object is closed or
  garbage-collected (or at interpreter exit). Shipping tensors costs more than comparing them on
  a small host: the README gives the numbers.

At most `window` ops are in flight; beyond that the user's thread waits for the oldest, which
bounds the memory held by pending ops (their tensors stay alive until judged, for the dumps).
The reference let every worker append to the CSV and a JSON file without a working lock; here
only the parent writes.
"""

from __future__ import annotations

import os
import weakref
from collections import deque
from collections.abc import Callable
from concurrent.futures import Executor, Future, ProcessPoolExecutor, ThreadPoolExecutor
from typing import Any

import torch
import torch.multiprocessing as tmp

WINDOW_PER_WORKER = 4
THREAD_WINDOW = 4


def _init_worker(threads: int) -> None:
    torch.set_num_threads(threads)


def figures_in_worker(pairs: list, scaled: bool = True, exact: bool = False) -> list:
    """What a worker process runs: exactly verdict.figures."""
    from probes.online_dispatch.verdict import figures

    return figures(pairs, scaled, exact)


class OrderedPool:
    """Submit `fn(*args)` for a job; `finish(job, result or exception)` runs on the submitting
    thread, in submission order, when the job's turn comes (at a later submit, `drain` or `close`)."""

    def __init__(self, executor: Executor, finish: Callable[[Any, Any], None], window: int) -> None:
        self._executor = executor
        # a weak reference: the pool must not keep its PtdbgDispatch alive (the finalizer that
        # stops the workers runs when that object is collected)
        self._finish = weakref.WeakMethod(finish) if hasattr(finish, "__self__") else (lambda: finish)
        self._pending: deque[tuple[Future, Any]] = deque()
        self._window = window

    def submit(self, job: Any, fn: Callable[..., Any], *args: Any) -> None:
        self._pending.append((self._executor.submit(fn, *args), job))
        self._drain(block=len(self._pending) > self._window)

    def _drain(self, block: bool) -> None:
        while self._pending and (block or self._pending[0][0].done()):
            future, job = self._pending.popleft()
            try:
                result: Any = future.result()
            except Exception as exc:  # a worker failure becomes the op's Err_message
                result = exc
            finish = self._finish()
            if finish is not None:
                finish(job, result)
            block = len(self._pending) > self._window

    def idle(self) -> bool:
        """Nothing in flight: every op submitted so far is judged (those that finished are, now)."""
        self._drain(block=False)
        return not self._pending

    def drain(self) -> None:
        """Judge every pending op (the workers keep running for the next context)."""
        while self._pending:
            self._drain(block=True)

    def close(self) -> None:
        """Judge every pending op, then stop the workers."""
        try:
            self.drain()
        finally:
            self._executor.shutdown(wait=True)


def process_pool(workers: int, finish: Callable[[Any, Any], None]) -> OrderedPool:
    ctx = tmp.get_context("spawn")
    executor = ProcessPoolExecutor(max_workers=workers, mp_context=ctx, initializer=_init_worker,
                                   initargs=(torch.get_num_threads(),))
    return OrderedPool(executor, finish, WINDOW_PER_WORKER * workers)


def available_cores() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return os.cpu_count() or 1


def accelerator_in_use() -> bool:
    """A device runtime (CUDA, NPU, XPU) was initialised in this process: device ops are
    asynchronous, so the host has time to spare for the reference while the device works."""
    for name in ("cuda", "npu", "xpu"):
        module = getattr(torch, name, None)
        is_initialized = getattr(module, "is_initialized", None)
        if callable(is_initialized):
            try:
                if is_initialized():
                    return True
            except Exception:  # a half-installed device runtime is not in use
                continue
    return False


#: background="auto" hands an op to the reference thread only when its output holds at least this
#: many bytes: below it the re-run and the figures take less time than the hand-off (a 16 x 64
#: float32 activation: ~30 us to compare inline, a whole step's worth of thread switches on 2 cores)
AUTO_THREAD_BYTES = 64 << 10


def use_reference_thread(background: bool | str) -> bool:
    """background="auto": a thread only when it can overlap (and then only for ops of at least
    AUTO_THREAD_BYTES, see PtdbgDispatch._check). The reference thread runs torch
    kernels with the process's intra-op thread count, so on a CPU-only host it needs that many idle
    cores: with torch using every core, two teams of threads fight over them and the step gets
    slower than inline (medium transformer on 2 cores, 2 torch threads: 7.7x against 4.7x inline;
    1 torch thread: 4.0x against 4.6x inline)."""
    if background != "auto":
        return bool(background)
    return accelerator_in_use() or available_cores() >= 2 * torch.get_num_threads()


def reference_thread(finish: Callable[[Any, Any], None]) -> OrderedPool:
    executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="msprobe-online-dispatch")
    return OrderedPool(executor, finish, THREAD_WINDOW)
