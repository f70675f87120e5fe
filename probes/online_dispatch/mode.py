"""The TorchDispatchMode that checks every aten op against a CPU re-run.

Per call: cached skip decision for the overload (skipped calls cost one dict lookup and a
counter) -> CPU copies of the inputs -> the device op, exactly as without the mode -> the
reference re-run -> figures on the reference side, one host transfer -> rows, and for failing
ops (auto), every op (all) or listed ops (list) the .npy dumps. Everything after the device op is
inside a try: a probe error becomes a row's Err_message or a summary entry, never an exception
in the user's code, and the device result is returned untouched.
"""

from __future__ import annotations

import logging
import os
import sys
import traceback
import weakref
from typing import Any

import torch
from torch.utils._python_dispatch import TorchDispatchMode

from probes.backends.torch_backend import BACKEND
from probes.online_dispatch import dump, reference, skip_list, verdict
from probes.online_dispatch.options import DispatchOptions
from probes.online_dispatch.results import FailedOp, RunResults, leaf_summary, special_row
from probes.online_dispatch.run_dir import create_run_dir
from probes.online_dispatch.workers import ComparisonPool

logger = logging.getLogger("probes.online_dispatch")

_TORCH_DIR = os.path.dirname(torch.__file__)
_PROBES_DIR = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
_CHECK = object()  # cache value: compare this overload


class _OpInfo:
    """What the mode needs about one overload, computed once."""

    __slots__ = ("api", "overload", "half_to_float", "written", "skip")

    def __init__(self, func: Any) -> None:
        self.api = func._opname
        self.overload = func._overloadname
        self.skip = skip_list.skip_reason(func)
        self.half_to_float = reference.half_to_float_index(func) if self.skip is None else None
        self.written = reference.written_arguments(func) if self.skip is None else ((), ())


class _Job:
    """One compared op call while its figures are computed (kept for rows and dumps)."""

    __slots__ = ("func", "info", "prefix", "cmp", "ref", "args", "kwargs", "stack")

    def __init__(self, func: Any, info: _OpInfo, prefix: str, cmp: verdict.OpComparison, ref: reference.ReferenceCall,
                 args: tuple, kwargs: dict, stack: str) -> None:
        self.func, self.info, self.prefix, self.cmp, self.ref = func, info, prefix, cmp, ref
        self.args, self.kwargs, self.stack = args, kwargs, stack


def user_stack() -> str:
    """The call stack outside torch and this package, as the CSV's NPU_Stack_Info."""
    frames = [
        [f.filename, f.lineno, f.name, (f.line or "").strip()]
        for f in traceback.extract_stack(sys._getframe(1))
        if not f.filename.startswith((_TORCH_DIR, _PROBES_DIR))
    ]
    return str(frames)


class OnlineDispatchMode(TorchDispatchMode):
    """Compare every aten op run inside the context with a CPU reference (see module docstring)."""

    def __init__(self, options: DispatchOptions) -> None:
        super().__init__()
        self.options = options
        self._infos: dict[Any, _OpInfo] = {}
        self._counters: dict[str, int] = {}
        self._no_cpu_kernel: set[Any] = set()
        self.results: RunResults | None = None
        self._pool: ComparisonPool | None = None
        self._listed = frozenset(options.api_list)
        self._depth = 0

    # context --------------------------------------------------------------------------------------
    def __enter__(self) -> OnlineDispatchMode:
        if self.results is None:
            rank = BACKEND.rank()  # global rank, looked up when the run starts (B-O12)
            run_dir, ts = create_run_dir(self.options.dump_path, rank, self.options.tag)
            self.results = RunResults(run_dir, run_dir / f"compare_result_rank{rank}_{ts}.csv", rank,
                                      self.options.as_dict())
            if self.options.debug:
                logger.info("online_dispatch: %s, writing to %s", self.options.as_dict(), run_dir)
        if self.options.process_num > 0 and self._pool is None:
            self._pool = ComparisonPool(self.options.process_num, self._finish_job)
            self._pool_finalizer = weakref.finalize(self, self._pool.close)
        self._depth += 1
        return super().__enter__()

    def __exit__(self, exc_type: Any, exc: Any, tb: Any) -> None:
        try:
            super().__exit__(exc_type, exc, tb)
        finally:
            self._depth -= 1
            if self._depth == 0:
                self.flush()

    def close(self) -> None:
        """Flush, and stop the worker processes (process_num > 0)."""
        self.flush()
        if self._pool is not None:
            self._pool = None
            self._pool_finalizer()

    def flush(self) -> None:
        """Judge pending ops, flush the CSV and write summary.json (also after an exception)."""
        try:
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
    def run_dir(self) -> Any:
        return self.results.run_dir if self.results is not None else None

    # per call ---------------------------------------------------------------------------------------
    def __torch_dispatch__(self, func: Any, types: Any, args: tuple = (), kwargs: dict | None = None) -> Any:
        if kwargs is None:
            kwargs = {}
        info = self._infos.get(func)
        if info is None:
            info = self._infos[func] = _OpInfo(func)
        reason = info.skip
        if reason is None and func in self._no_cpu_kernel:
            reason = skip_list.NO_CPU_KERNEL
        if reason is None and types:
            reason = skip_list.UNSUPPORTED_TENSOR
        device = None
        if reason is None:
            device = reference.device_under_test(args, kwargs)
            if device is None:
                reason = skip_list.NO_TENSOR
            elif not reference.plain_strided(args, kwargs):
                reason = skip_list.UNSUPPORTED_TENSOR
        if reason is not None:
            key = (reason, func)
            skipped = self.results.skipped
            skipped[key] = skipped.get(key, 0) + 1
            return func(*args, **kwargs)
        return self._check(func, info, device, args, kwargs)

    def _check(self, func: Any, info: _OpInfo, device: torch.device, args: tuple, kwargs: dict) -> Any:
        results = self.results
        try:
            with torch.no_grad():
                # pristine copies of written arguments: their input rows and dumps show what the op received
                ref = reference.build_reference(args, kwargs, device.type == "cpu", info.half_to_float, info.written,
                                                keep_pristine=True)
        except Exception as exc:
            out = func(*args, **kwargs)
            results.add_error(str(func), "copying the inputs for the reference", exc)
            return out
        out = func(*args, **kwargs)  # the user's op, untouched
        try:
            self._compare(func, info, device, args, kwargs, ref, out)
        except Exception as exc:
            results.add_error(str(func), "comparing", exc)
        return out

    def _compare(self, func: Any, info: _OpInfo, device: torch.device, args: tuple, kwargs: dict,
                 ref: reference.ReferenceCall, out: Any) -> None:
        results = self.results
        idx = self._counters.get(info.api, 0) + 1
        self._counters[info.api] = idx
        prefix = f"{info.api}_{idx}"
        results.ops_compared += 1
        results.devices[device.type] = results.devices.get(device.type, 0) + 1
        try:
            self._compare_named(func, info, prefix, args, kwargs, ref, out)
        except Exception as exc:  # recorded in the op's row and the summary, never raised
            results.add_error(str(func), "comparing", exc)
            results.add_rows([special_row(f"{prefix}_output", "", "", "", "", "Nan",
                                          f"comparison failed: {type(exc).__name__}: {exc}")])

    def _compare_named(self, func: Any, info: _OpInfo, prefix: str, args: tuple, kwargs: dict,
                       ref: reference.ReferenceCall, out: Any) -> None:
        results = self.results
        cmp = verdict.OpComparison(prefix)
        verdict.collect_inputs(cmp, args, kwargs, ref.pristine_args if ref.pristine_args is not None else ref.args,
                               ref.pristine_kwargs if ref.pristine_kwargs is not None else ref.kwargs)
        try:
            with torch.no_grad():
                ref_out = func(*ref.args, **ref.kwargs)
        except Exception as exc:
            self._no_cpu_kernel.add(func)
            results.add_rows([special_row(f"{prefix}_output", "", "", "", "", "Nan",
                                          f"reference run failed on cpu: {type(exc).__name__}: {exc}")])
            return
        written = None
        if out is None or (isinstance(out, tuple) and not out):
            written = _written_pairs(info, args, kwargs, ref)
        verdict.collect_outputs(cmp, out, ref_out, written)
        stack = user_stack() if self._pool is not None else ""
        job = _Job(func, info, prefix, cmp, ref, args, kwargs, stack)
        if self._pool is not None:
            # the workers get private copies: the user's tensors may change before they are pickled
            cmp.pairs = [(d.clone(), r) for d, r in cmp.pairs]
            self._pool.submit(job, cmp.pairs)
            return
        self._finish_job(job, verdict.figures(cmp.pairs))

    def _finish_job(self, job: _Job, figures: Any) -> None:
        """Rows, failure record and dumps of one op (in the parent process, in op order)."""
        results = self.results
        if isinstance(figures, BaseException):
            results.add_error(str(job.func), "computing the figures", figures)
            results.add_rows([special_row(f"{job.prefix}_output", "", "", "", "", "Nan",
                                          f"comparison failed: {type(figures).__name__}: {figures}")])
            return
        in_rows, out_rows = verdict.rows(job.cmp, figures, all_details=self.options.debug)
        failing = [r for r in out_rows if r.failed]
        if failing:
            stack = job.stack or user_stack()
            for r in failing:
                r.stack = stack
        results.add_rows(in_rows + out_rows)
        mode = self.options.dump_mode
        dumped = False
        if mode == "all" or (mode == "list" and job.info.api in self._listed) or (mode == "auto" and failing):
            try:
                self._dump(job)
                dumped = True
            except Exception as exc:
                results.add_error(str(job.func), "dumping", exc)
        if failing:
            results.add_failure(FailedOp(job.prefix, str(job.func), [leaf_summary(r) for r in failing], dumped),
                                job.prefix, job.info.overload)
        if self.options.debug:
            logger.info("online_dispatch: %s (%s) %s", job.prefix, job.func, "Failed" if failing else "Pass")

    def _dump(self, job: _Job) -> None:
        run_dir = self.results.run_dir
        ref = job.ref
        dump.dump_inputs(run_dir, job.prefix, ref.pristine_args if ref.pristine_args is not None else ref.args,
                         ref.pristine_kwargs if ref.pristine_kwargs is not None else ref.kwargs, job.args, job.kwargs)
        leaves = [(leaf.name, *job.cmp.pairs[leaf.index]) for leaf in job.cmp.outputs if leaf.index >= 0]
        dump.dump_outputs(run_dir, leaves)


def _written_pairs(info: _OpInfo, args: tuple, kwargs: dict, ref: reference.ReferenceCall) -> list[tuple[Any, Any]]:
    """(device, reference) values of the arguments a void op wrote into."""
    positions, names = info.written
    pairs = [(args[i], ref.args[i]) for i in positions if i < len(args)]
    pairs += [(kwargs[n], ref.kwargs[n]) for n in names if n in kwargs]
    return pairs

