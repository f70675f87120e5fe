"""What one judged op call leaves behind: its rows, its failure record and its dumps.

Apart from the dispatch mode because it runs for a call whenever its judging ends (inline right
after the op, or later in op order for the reference thread and the worker processes), and only
reads what the call's `Job` carries.
"""

from __future__ import annotations

import logging
from typing import Any

from probes.online_dispatch import skip_list, verdict
from probes.online_dispatch.call_scan import CPU
from probes.online_dispatch.call_stack import format_stack, user_stack
from probes.online_dispatch.graph_ops import GraphOp
from probes.online_dispatch.graph_reports import localise
from probes.online_dispatch.jobs import SKIPPED, Job, ReferenceFailed, dump_job
from probes.online_dispatch.options import DispatchOptions
from probes.online_dispatch.results import FailedOp, Row, RunResults, leaf_summary, special_row

logger = logging.getLogger("probes.online_dispatch")


def record_outcome(results: RunResults, options: DispatchOptions, listed: frozenset, job: Job, figures: Any) -> None:
    """Rows, failure record and dumps of one op from its figures (or what stopped them: SKIPPED,
    ReferenceFailed, an exception)."""
    if figures is SKIPPED:
        key = (skip_list.NO_CPU_KERNEL, job.func)
        results.skipped[key] = results.skipped.get(key, 0) + 1
        return
    op_name = getattr(job.info, "name", None) or str(job.func)  # OpInfo keeps it; a graph's is per call
    results.ops_compared += 1
    results.compared_by_op[op_name] += 1
    device = "cpu" if job.device is CPU else job.device.type  # (device.type makes a new string each time)
    results.devices[device] = results.devices.get(device, 0) + 1
    if figures.__class__ is not list:  # what stopped the figures: the op's one row says it
        name = f"{job.prefix}_output" if job.prefix is not None else f"{job.info.api}_output"
        if isinstance(figures, ReferenceFailed):
            exc = figures.exc
            results.add_rows([special_row(name, "", "", "", "", "Nan",
                                          f"reference run failed on cpu: {type(exc).__name__}: {exc}")])
            return
        if isinstance(figures, BaseException):
            results.add_error(op_name, "comparing", figures)
            results.add_rows([special_row(name, "", "", "", "", "Nan",
                                          f"comparison failed: {type(figures).__name__}: {figures}")])
            return
    in_rows, out_rows = verdict.rows(job.cmp, figures, all_details=options.debug, rule=options.rule)
    failing = [r for r in out_rows if r.__class__ is Row and r.failed]
    if failing:
        stack = format_stack(job.stack) if job.stack is not None else user_stack()
        for r in failing:
            r.stack = stack
    results.add_rows(out_rows, in_rows)
    mode = options.dump_mode
    dumped = False
    if mode == "all" or (mode == "list" and job.info.api in listed) or (mode == "auto" and failing):
        try:
            dump_job(results.run_dir, job)
            dumped = True
        except Exception as exc:
            results.add_error(op_name, "dumping", exc)
    if failing:
        results.add_failure(FailedOp(job.prefix, op_name, [leaf_summary(r) for r in failing], dumped),
                            job.prefix, job.info.overload)
        if isinstance(job.func, GraphOp):
            localise(results, job, failing[0].name)
    if options.debug:
        logger.info("online_dispatch: %s (%s) %s", job.prefix, job.func, "Failed" if failing else "Pass")
