"""Compared ops whose float64 re-run and figures run on the reference runner's native thread
(probes.backends.torch_reference_runner), judged later on the user's thread in op order.

Which ops: those whose reference is the op itself re-run on the host copies, that write into none
of their arguments, whose output is a tensor or a flat tuple or list. The device op has run when an
op is submitted, and its reference arguments are private copies, so the only tensors the runner
shares with the user are the device outputs, which it reads for the figures while the user's
program goes on. Nothing else may change them first: every op that writes into an argument (the
mode asks OpInfo.mutates, compared or not) drains the queue before it runs, as does every op
judged inline (ops are numbered and their rows written in the order they ran). A write that does
not go through the dispatcher (a NumPy view, `data_ptr` in a C extension) is not seen: the same
hole every version counter has.

Judging an op here is the inline path from the reference's output on: the same pairing of
leaves, the same figures (the runner's sums come from the host kernels' own function, and a leaf it
did not measure is measured here), the same rows. A reference that raised on the runner is re-run
here, so its error is recorded as inline (its message, and the op's CPU kernel marked missing).
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable
from typing import Any

import torch

from probes.backends import torch_reference_runner
from probes.online_dispatch import reference, verdict
from probes.online_dispatch.call_scan import ProbeSide, other_modes_on
from probes.online_dispatch.call_stack import capture_stack
from probes.online_dispatch.jobs import Job
from probes.online_dispatch.outcomes import record_outcome

#: ops submitted and not yet judged before the user's thread waits for the oldest: enough to ride
#: out an op whose re-run is slow (an attention block's matmuls) without holding many references
WINDOW = 16
_TENSOR = torch.Tensor
FAILED = (True, None, None, None)  # a result that has the op judged inline (its reference re-run there)


def distributed_run() -> bool:
    """A process group is up: its engines (FSDP) free and refill parameter memory by resizing
    storages, which the dispatcher does not see, so the runner is given only private copies."""
    dist = getattr(torch, "distributed", None)
    return dist is not None and dist.is_available() and dist.is_initialized()


def device_leaves(out: Any) -> list[Any] | None:
    """The device output's leaves in the runner's order (a tensor the kernel may read, or None
    for any other leaf), or None for an output the runner does not pair (nested sequences)."""
    if type(out) is _TENSOR:
        return [out if out.is_cpu else None]
    if isinstance(out, (tuple, list)):
        leaves = []
        for x in out:
            if isinstance(x, (tuple, list, dict)):
                return None
            leaves.append(x if type(x) is _TENSOR and x.is_cpu else None)
        return leaves
    if isinstance(out, _TENSOR):  # a subclass the mode compares as one (a simulated device): no leaf read
        return [None]
    return None


def known_parts(leaves: list[Any], ref_out: Any, parts: list[Any]) -> dict[int, tuple[Any, Any]]:
    """id(reference leaf) -> (its device leaf, the runner's [r.r, r.d, d.d, max d, min d] of the
    pair), which figure_parts.leaf_figures looks its pairs up in before measuring them (by the
    reference, which is this op's own: the device leaf may come back detached, as autograd has
    given it a history since the op ran)."""
    if not parts:
        return {}
    refs = [ref_out] if isinstance(ref_out, _TENSOR) else list(ref_out) if isinstance(ref_out, (tuple, list)) else []
    if len(refs) != len(leaves):
        return {}
    return {id(r): (d, p) for d, r, p in zip(leaves, refs, parts) if p is not None}


class NativeQueue:
    """The ops in flight on one runner, oldest first; `finish(job, out, leaves, result)` judges one
    (result: the runner's (failed, reference output, parts))."""

    __slots__ = ("_runner", "_finish", "jobs", "_window", "reads_user")

    def __init__(self, runner: Any, finish: Callable[[Job, Any, list[Any], tuple], None], window: int = WINDOW,
                 reads_user: bool = True) -> None:
        self._runner = runner
        self.reads_user = reads_user  # False: the runner reads only the probe's copies (distributed_run)
        self._finish = finish
        self.jobs: deque[tuple[Job, Any, list[Any], tuple | None]] = deque()
        self._window = window

    def __bool__(self) -> bool:
        return bool(self.jobs)

    def take(self, job: Job, out: Any) -> bool:
        """Submit a compared op (its device op has run): False when it is not one the runner takes."""
        info = job.info
        index = info.native
        if index is None:
            index = info.native = self._runner.index(job.func)
        if index < 0:
            return False
        leaves = device_leaves(out)
        if leaves is None:
            return False
        if not self.reads_user:  # the output's figures are taken here, when it is judged
            leaves = [None] * len(leaves)
        ref = job.ref
        try:
            if ref is None:  # the runner copies the host arguments itself (the mode's _check)
                half = info.half_to_float
                submitted = self._runner.submit(index, job.args, job.kwargs, leaves, torch.is_inference_mode_enabled(),
                                                True, -1 if half is None else half)
            else:
                submitted = self._runner.submit(index, ref.args, ref.kwargs, leaves, torch.is_inference_mode_enabled(),
                                                False, -1)
            if not submitted:
                return False
        except Exception:  # arguments the runner cannot take: judged inline
            return False
        self._append(job, out, leaves, None)
        return True

    def call(self, job: Job, out: Any) -> None:
        """Queue an op whose reference is Python (attention's), called on the runner's thread with
        the GIL in its turn: the user's thread is spared the reference's kernels."""
        ref = job.ref
        self._runner.submit_python(job.info.on_host, ref.args, ref.kwargs, torch.is_inference_mode_enabled())
        self._append(job, out, [], None)

    def hold(self, job: Job, out: Any, result: tuple) -> None:
        """Queue an op whose reference ran on the user's thread (`result` as the runner's): it is
        judged in its turn, so the ops in flight need not be judged first."""
        self._append(job, out, [], result)

    def _append(self, job: Job, out: Any, leaves: list[Any], result: tuple | None) -> None:
        job.stack = capture_stack()  # judged later: the user's frames are those of now
        jobs = self.jobs
        jobs.append((job, out, leaves, result))
        ready = self._runner.ready
        while jobs and (len(jobs) > self._window or jobs[0][3] is not None or ready()):
            self._judge_oldest()

    def drain(self) -> None:
        """Judge every op in flight (waiting for the runner)."""
        while self.jobs:
            self._judge_oldest()

    def _judge_oldest(self) -> None:
        job, out, leaves, result = self.jobs.popleft()
        if result is None:
            try:
                result = self._runner.next()
            except Exception:  # never expected; the op is then judged inline as if its re-run had failed
                result = FAILED
        self._finish(job, out, leaves, result)


class NativeJudging:
    """The dispatch mode's side of the runner (a mixin of OnlineDispatchMode): starting its queue,
    draining it, and judging what comes back. The mode provides results, options, _listed,
    _scaled, _native, _native_wanted, _in_flight, _prepare and _finish_job."""

    def _drain_native(self) -> None:
        """Judge the ops in flight on the reference runner (before anything may write their outputs)."""
        if self._in_flight:
            with ProbeSide(other_modes_on()):
                self._native.drain()

    def _start_native(self) -> NativeQueue | None:
        module = torch_reference_runner.runner_module()
        if module is None:
            self._native_wanted = torch_reference_runner.why_not() == "building"  # asked again later
            return None
        self._native = NativeQueue(torch_reference_runner.ReferenceRunner(module), self._finish_native,
                                   reads_user=self._runner_reads_user)
        self._in_flight = self._native.jobs
        return self._native

    @staticmethod
    def _reference_now(job: Job) -> tuple:
        """The reference output of an op the runner does not re-run, as the runner gives it (a
        reference that raises is re-run when the op is judged, which records its error as inline)."""
        ref = job.ref
        try:
            return False, job.info.on_host(*ref.args, **ref.kwargs), None, None
        except Exception:
            return FAILED

    def _copy_here(self, job: Job) -> bool:
        """The host copies of an op the runner was to copy (the op wrote none of its arguments, so
        they hold what it received); False when copying fails, recorded as inline."""
        info = job.info
        try:
            job.ref = reference.build_reference(job.args, job.kwargs, True, info.half_to_float, info.written,
                                                keep_pristine=True)
        except Exception as exc:
            self.results.add_error(str(job.func), "copying the inputs for the reference", exc)
            return False
        return True

    def _finish_native(self, job: Job, out: Any, leaves: list[Any], result: tuple) -> None:
        """An op back from the reference runner, judged as inline from its reference output on
        (one whose reference raised there is re-run here: its error recorded as inline)."""
        failed, ref_out, parts, copies = result
        if job.ref is None:  # the runner made the copies
            if failed:
                if not self._copy_here(job):
                    return
            else:
                job.ref = reference.copied_call(job.args, job.kwargs, copies, job.info.positions, job.info.half_to_float)
        try:
            outcome = self._prepare(job, out, None) if failed else self._prepare(job, out, None, ref_out)
            if outcome is None:
                known = None if failed else known_parts(leaves, ref_out, parts)
                outcome = verdict.figures(job.cmp.pairs, self._scaled, self.options.debug, known)
            record_outcome(self.results, self.options, self._listed, job, outcome)
        except Exception as exc:  # recorded in the op's row and the summary, never raised
            self._finish_job(job, exc)
