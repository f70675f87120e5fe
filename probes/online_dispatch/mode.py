"""The TorchDispatchMode that checks every aten op against a CPU re-run.

Per call: cached skip decision for the overload (for attention also the call's dropout_p;
skipped calls cost one dict lookup and a counter) -> CPU copies of the inputs -> the device op,
exactly as without the mode -> the reference re-run -> figures on the reference side, one host
transfer -> rows, and for failing ops (auto), every op (all) or listed ops (list) the .npy dumps.
Everything after the device op is inside a try: a probe error becomes a row's Err_message or a
summary entry, never an exception in the user's code, and the device result is returned untouched.

With `background` (default "auto": ops of at least workers.AUTO_THREAD_BYTES that took long enough
inline, when the thread can overlap, see thread_choice) the re-run and the figures run in one background thread on a private copy of the device result,
while the user's program goes on; numbering happens in that thread in op order, rows, dumps and
the failure record are made on the user's thread in op order, and everything is judged when the
context exits, so the CSV is the same as inline. Otherwise they run inline, right after the op.
"""

from __future__ import annotations

import logging
import weakref
from time import perf_counter
from typing import Any

import torch
from torch.utils._python_dispatch import TorchDispatchMode, _disable_current_modes

from probes.backends import torch_memory
from probes.backends.torch_backend import BACKEND, GradOff
from probes.compiled import capture
from probes.core.file_names import dispatch_csv_name
from probes.online_dispatch import leaf_pairs, reference, skip_list, verdict
from probes.online_dispatch.call_scan import ProbeSide, other_modes_on, scan
from probes.online_dispatch.call_stack import capture_stack
from probes.online_dispatch.graph_calls import GraphCalls
from probes.online_dispatch.jobs import (
    SKIPPED,
    Job,
    ReferenceFailed,
    Skipped,
    output_bytes,
    snapshot,
    written_devices,
    written_pairs,
)
from probes.online_dispatch.native_jobs import NativeJudging, NativeQueue, distributed_run
from probes.online_dispatch.op_info import OpInfo, dispatching_subclass, has_dtensor
from probes.online_dispatch.options import DispatchOptions
from probes.online_dispatch.outcomes import record_outcome
from probes.online_dispatch.results import RunResults
from probes.online_dispatch.run_dir import create_run_dir
from probes.online_dispatch.thread_choice import InlineCosts, worth_a_thread
from probes.online_dispatch.torchscript_aside import aside_for_torchscript, put_back
from probes.online_dispatch.workers import (
    AUTO_THREAD_BYTES,
    OrderedPool,
    figures_in_worker,
    process_pool,
    reference_thread,
    use_reference_thread,
)

logger = logging.getLogger("probes.online_dispatch")
_RUN = object()  # _prepare: run the reference here


class OnlineDispatchMode(GraphCalls, NativeJudging, TorchDispatchMode):
    """Compare every aten op run inside the context with a CPU reference (see module docstring).

    Under torch.compile the mode lets Dynamo compile (``ignore_compile_internals``): the compiled
    program runs unchanged, its graphs' calls come here (``graph_call``, probes.compiled.capture)
    and each sampled call is compared as a whole with the graph's eager program in float64 on the
    CPU, rows named ``Graph.<function>_<compile id>_<n>``."""

    # higher-order operators (torch.cond, while_loop, ...) come to __torch_dispatch__, which runs
    # them with no mode instead of failing on them
    supports_higher_order_operators = True

    @classmethod
    def ignore_compile_internals(cls) -> bool:
        return True

    def __init__(self, options: DispatchOptions) -> None:
        super().__init__()
        self.options = options
        # id(overload) -> its OpInfo: an overload's __hash__ is Python (a frame every call); the
        # overloads are kept alive in _overloads, so their ids are not reused
        self._infos: dict[int, OpInfo] = {}
        self._overloads: list[Any] = []
        self._counters: dict[str, int] = {}
        self._no_cpu_kernel: set[Any] = set()
        self.results: RunResults | None = None
        self._pool: OrderedPool | None = None
        self._listed = frozenset(options.api_list)
        # rule="reference" judges by msprobe's rule alone: the scaled figure is not measured
        self._scaled = options.rule != "reference"
        self._depth = 0
        self._graph_calls: dict[str, int] = {}  # calls of each compiled graph seen
        self._auto_thread: bool | None = None  # background="auto": whether the thread can overlap here
        self._inline_costs = InlineCosts()  # background="auto": what op kinds took inline
        # background="auto" on a host that can overlap: ops re-run on the reference runner's native
        # thread (native_jobs) once it is built; _in_flight is its queue's deque (or an empty one)
        self._native: NativeQueue | None = None
        self._native_wanted = False
        # whether the runner may read the user's tensors (cast the inputs, measure the outputs) or
        # only the probe's private copies (native_jobs: a distributed engine frees memory outside
        # the dispatcher, FSDP's storage resizes)
        self._runner_reads_user = True
        self._in_flight: Any = ()

    # context --------------------------------------------------------------------------------------
    def __enter__(self) -> OnlineDispatchMode:
        if self.results is None:
            rank = BACKEND.rank()  # global rank, looked up when the run starts (not msprobe's local device index)
            run_dir, ts = create_run_dir(self.options.dump_path, rank, self.options.tag)
            self.results = RunResults(run_dir, run_dir / dispatch_csv_name(rank, ts), rank,
                                      self.options.as_dict())
            if self.options.debug:
                logger.info("online_dispatch: %s, writing to %s", self.options.as_dict(), run_dir)
        if self._pool is None and self.options.process_num > 0:
            self._pool = process_pool(self.options.process_num, self._finish_job)
            self._pool_finalizer = weakref.finalize(self, self._pool.close)
        elif self._pool is None and self._depth == 0 and self.options.background is True:
            self._start_thread()
        elif self._depth == 0 and self.options.background == "auto" and self.options.process_num == 0:
            self._native_wanted = use_reference_thread("auto")
            self._runner_reads_user = not distributed_run()
        if self._depth == 0:
            capture.install(self)
            self._torchscript = aside_for_torchscript(self)
        self._depth += 1
        return super().__enter__()

    def __exit__(self, exc_type: Any, exc: Any, tb: Any) -> None:
        try:
            super().__exit__(exc_type, exc, tb)
        finally:
            self._depth -= 1
            if self._depth == 0:
                capture.uninstall(self)
                put_back(getattr(self, "_torchscript", ()))
                self._torchscript = ()
                if self._threaded or self._native is not None:
                    self.close()  # a Python thread is cheap to start again; none outlives the context
                else:
                    self.flush()

    def _start_thread(self) -> None:
        self._pool = reference_thread(self._finish_job)
        self._pool_finalizer = weakref.finalize(self, self._pool.close)

    def _hand_off(self, func: Any, out: Any) -> tuple[bool, Any]:
        """(whether this op goes to the reference thread, the kind to time it under when judged
        inline). background=True: every op. "auto": an op large enough and measured slow enough
        inline to be worth the hand-off (thread_choice; the thread starts at the first such op,
        where the host can overlap), or any op while earlier ones are still in flight there (ops
        are judged in order, and only one thread numbers them)."""
        background = self.options.background
        if self.options.process_num > 0 or background is False or self._native is not None:
            return False, None
        if background is True:
            return True, None
        if self._pool is not None and not self._pool.idle():
            return True, None
        size = output_bytes(out)
        if size < AUTO_THREAD_BYTES:
            return False, None
        if self._auto_thread is None:
            self._auto_thread = use_reference_thread("auto")
        if not self._auto_thread:
            return False, None
        kind = (func, size)
        if not worth_a_thread(self._inline_costs.get(kind)):
            return False, kind
        if self._pool is None:
            self._start_thread()
        return True, None

    def close(self) -> None:
        """Flush, and stop the reference thread or the worker processes."""
        try:
            self.flush()
        finally:
            if self._pool is not None:
                self._pool = None
                self._pool_finalizer()
            self._native, self._in_flight = None, ()  # (the runner's thread is the process's, idle now)

    def flush(self) -> None:
        """Judge pending ops, flush the CSV and write summary.json (also after an exception)."""
        try:
            self._drain_native()
            if self._pool is not None:
                self._pool.drain()
        finally:
            if self.results is not None:
                self.results.flush()
                if self.options.debug:
                    s = self.results.summary()
                    logger.info("online_dispatch: %d ops compared, %d failing, %d probe errors; %s",
                                s["ops_compared"], s["failed_op_count"], len(s["probe_errors"]), self.results.run_dir)

    @property
    def _threaded(self) -> bool:
        """The pool is the reference thread (re-run and figures there), not worker processes."""
        return self._pool is not None and self.options.process_num == 0

    @property
    def run_dir(self) -> Any:
        return self.results.run_dir if self.results is not None else None

    # per call ---------------------------------------------------------------------------------------
    def __torch_dispatch__(self, func: Any, types: Any, args: tuple = (), kwargs: dict | None = None) -> Any:
        if kwargs is None:
            kwargs = {}
        info = self._infos.get(id(func))
        if info is None:  # a new overload (higher-order operators are never cached: they come here each time)
            if isinstance(func, torch._ops.HigherOrderOperator):
                self._drain_native()  # it may write anything
                key = (skip_list.HIGHER_ORDER, func.name())
                self.results.skipped[key] = self.results.skipped.get(key, 0) + 1
                with _disable_current_modes():
                    return func(*args, **kwargs)
            info = self._infos[id(func)] = OpInfo(func)
            self._overloads.append(func)
        if self._in_flight and info.mutates:  # the ops in flight read their outputs: judged before any write
            self._drain_native()
        reason = info.skip
        if info.per_call is not None:  # attention's dropout, _to_copy's FP8 casts: the call decides
            reason = info.per_call(args, kwargs)
        if reason is None and self._no_cpu_kernel and func in self._no_cpu_kernel:
            reason = skip_list.NO_CPU_KERNEL
        if reason is None and types and not all(getattr(t, "__simulated_device__", None) for t in types):
            reason = skip_list.UNSUPPORTED_TENSOR  # a tracer's tensors: no values
        if types and dispatching_subclass(types):
            # a tensor subclass (nested, masked, DTensor, a user's): its own __torch_dispatch__ runs
            # the op as operators on plain tensors, which come back through this mode and are
            # compared; the subclass-level op is counted apart (a subclass that stands for a plain
            # device tensor, pytest_msprobe.testing.simulated_npu, is compared as one)
            key = (skip_list.THROUGH_DTENSOR if has_dtensor(types) else skip_list.THROUGH_SUBCLASS, func)
            self.results.skipped[key] = self.results.skipped.get(key, 0) + 1
            return NotImplemented
        device = None
        if reason is None:
            device, plain, nbytes = scan(args, kwargs)
            if device is None:
                reason = skip_list.NO_TENSOR
            elif not plain:
                reason = skip_list.UNSUPPORTED_TENSOR
        if reason is not None:
            key = (reason, func)
            skipped = self.results.skipped
            skipped[key] = skipped.get(key, 0) + 1
            return func(*args, **kwargs)
        return self._check(func, info, device, args, kwargs, nbytes=nbytes)

    def _check(self, func: Any, info: OpInfo, device: torch.device, args: tuple, kwargs: dict,
               float64: bool = False, nbytes: int | None = None) -> Any:
        results = self.results
        if nbytes is None:
            nbytes = reference.input_bytes(args, kwargs)
        too_large = torch_memory.too_large(2 * nbytes, reference.CPU)
        if too_large is not None:
            key = (skip_list.TOO_LARGE, func)
            results.skipped[key] = results.skipped.get(key, 0) + 1
            return func(*args, **kwargs)
        # the probe's own operators (copies, the reference, figures) run with every other mode
        # off: a user's mode outside this one (FlopCounterMode, a logger) and a tracer (make_fx)
        # see the user's op only, as without the probe
        # (grad mode off as well: the copies, the re-run and the figures record no autograd history)
        side = ProbeSide(other_modes_on())
        if (self._native is not None and self._runner_reads_user and not float64 and device is reference.CPU
                and info.native != -1):
            # the reference runner makes the host copies itself, after the op (which writes none
            # of its arguments), off this thread (_judge makes them here if the runner declines)
            out = func(*args, **kwargs)
            with side:
                self._judge(func, info, device, None, args, kwargs, out)
            return out
        try:
            with side:
                # pristine copies of written arguments: their input rows and dumps show what the op received
                ref = reference.build_reference(args, kwargs, float64 or device is reference.CPU or device.type == "cpu",
                                                info.half_to_float, info.written, keep_pristine=True)
        except Exception as exc:
            out = func(*args, **kwargs)
            results.add_error(str(func), "copying the inputs for the reference", exc)
            return out
        out = func(*args, **kwargs)  # the user's op, untouched
        with side:
            self._judge(func, info, device, ref, args, kwargs, out)
        return out

    def _judge(self, func: Any, info: OpInfo, device: torch.device, ref: Any, args: tuple, kwargs: dict,
               out: Any) -> None:
        """The reference run and the figures of one op (now, or handed to the reference thread)."""
        job = Job(func, info, device, ref, args, kwargs, None)
        try:
            void = out is None or (isinstance(out, tuple) and not out)
            native = self._native
            if native is None and self._native_wanted:
                native = self._start_native()
            if native is not None:
                if not void and native.take(job, out):
                    return
                if ref is None and not self._copy_here(job):
                    return
                if not void and not info.mutates:  # judged in its turn, the ops in flight not waited for
                    if info.on_host is not func:  # a reference written in Python (attention's): on the runner
                        native.call(job, out)
                    else:  # a custom op (its kernel may be Python): its reference now
                        native.hold(job, out, self._reference_now(job))
                    return
                native.drain()  # ops are judged in the order they ran
            written = written_devices(info, args, kwargs) if void else None
            threaded, kind = self._hand_off(func, out)
            pool = self._pool
            if threaded or (pool is not None and not self._threaded):  # judged later: the user's frames are those of now
                job.stack = capture_stack()
            if threaded:
                # the thread gets private copies of what it compares: the user's program goes on
                # and may change these tensors in place before the thread reads them
                pool.submit(job, self._measure, job, snapshot(out), snapshot(written),
                            torch.is_inference_mode_enabled())
                return
            start = perf_counter() if kind is not None else 0.0
            outcome = self._prepare(job, out, written)
            if outcome is None and pool is not None and not self._threaded:
                # the workers get private copies: the user's tensors may change before they are pickled
                job.cmp.pairs = [(d.clone(), leaf_pairs.overflowed_as(r, d)) for d, r in job.cmp.pairs]
                pool.submit(job, figures_in_worker, job.cmp.pairs, self._scaled, self.options.debug)
            else:
                figs = outcome if outcome is not None else verdict.figures(job.cmp.pairs, self._scaled, self.options.debug)
                if kind is not None:
                    self._inline_costs.record(kind, perf_counter() - start)
                record_outcome(self.results, self.options, self._listed, job, figs)  # (_finish_job's body)
        except Exception as exc:  # recorded in the op's row and the summary, never raised
            self._finish_job(job, exc)

    def _prepare(self, job: Job, out: Any, written: list[Any] | None,
                 ref_out: Any = _RUN) -> Skipped | ReferenceFailed | None:
        """Number the op, run the CPU reference and pair its results with the device's (into
        job.cmp). Inline, or in the reference thread, which then owns the numbering: ops are
        numbered in the order they ran either way, so the CSV does not depend on timing. Called
        with grad mode off (_judge's ProbeSide, _measure)."""
        if self._no_cpu_kernel and job.func in self._no_cpu_kernel:  # an earlier call, still in flight when this one ran, found out
            return SKIPPED
        info = job.info
        idx = self._counters.get(info.api, 0) + 1
        self._counters[info.api] = idx
        job.prefix = f"{info.api}_{idx}"
        job.cmp = cmp = leaf_pairs.OpComparison(
            job.prefix, info.chained, reference.rounded_once_terms(job.func, job.args) if info.rounded_once else 0)
        ref = job.ref
        leaf_pairs.collect_inputs(cmp, job.args, job.kwargs,
                                  ref.pristine_args if ref.pristine_args is not None else ref.args,
                                  ref.pristine_kwargs if ref.pristine_kwargs is not None else ref.kwargs)
        if ref_out is _RUN:  # (given: the reference runner's)
            try:
                ref_out = info.on_host(*ref.args, **ref.kwargs)
            except Exception as exc:
                self._no_cpu_kernel.add(job.func)
                return ReferenceFailed(exc)
        pairs = written_pairs(info, written, ref) if written is not None else None
        leaf_pairs.collect_outputs(cmp, out, ref_out, pairs)
        return None

    def _measure(self, job: Job, out: Any, written: list[Any] | None, inference: bool) -> Any:
        """The reference thread's work for one op (grad and inference mode are thread-local, so
        the user's are set again here)."""
        with torch.inference_mode(inference), GradOff():
            outcome = self._prepare(job, out, written)
            return outcome if outcome is not None else verdict.figures(job.cmp.pairs, self._scaled, self.options.debug)

    def _finish_job(self, job: Job, figures: Any) -> None:
        """Rows, failure record and dumps of one op (on the user's thread, in op order)."""
        record_outcome(self.results, self.options, self._listed, job, figures)
