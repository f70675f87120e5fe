"""Run a function under N ranks of torch.distributed on this machine, with a hard time limit.

What the `msprobe_distributed` fixture runs, and what a test can call directly. Each rank is a
fresh process (the ``spawn`` start method, as torchrun's workers: no state inherited from the
test process; forks of a forkserver that imported torch once) with the environment torchrun gives its workers (``MASTER_ADDR``/``MASTER_PORT``,
``RANK``, ``LOCAL_RANK``, ``WORLD_SIZE``, ``LOCAL_WORLD_SIZE``); the process group is
initialised before the function runs and destroyed after it, so the function is the same code a
torchrun script runs between ``init_process_group`` and ``destroy_process_group``.

Why a hard limit matters: when one rank fails or skips a collective, the others wait in it until
the process group's timeout, and a test harness that only ``join()``s hangs CI. Here the first
failing rank ends the job: the others get ``FAILED_RANK_GRACE_S`` to finish, then are killed, and
the job raises :class:`RankJobError` naming every rank's state and the failing rank's traceback.
The whole job is bounded by ``timeout`` the same way.

The rendezvous uses 127.0.0.1 and a free port only; gloo is told to use the loopback interface,
so nothing is reachable from (or tried on) the network. On NPU or CUDA nodes pass
``backend="hccl"`` / ``"nccl"``: nothing else changes.
"""

from __future__ import annotations

import contextlib
import multiprocessing
import os
import pickle
import socket
import sys
import tempfile
import time
import traceback
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from datetime import timedelta
from pathlib import Path
from typing import Any

from probes.core.errors import ConfigError
from probes.core.writers import write_bytes_atomic

LOOPBACK = "127.0.0.1"
BACKENDS = ("gloo", "nccl", "hccl")
DEFAULT_TIMEOUT_S = 120.0
#: how long the other ranks may still run after one failed (they may be waiting in a collective)
FAILED_RANK_GRACE_S = 5.0
_POLL_S = 0.05
#: imported once by the forkserver, so a rank starts in a fraction of a second (torch._dynamo is
#: what the first optimizer step or custom op imports: seconds per rank otherwise)
PRELOAD = ("torch", "torch.distributed", "torch._dynamo", "probes.pytorch")


class RankJobError(AssertionError):
    """A multi-rank job that failed, timed out or deadlocked (an AssertionError: a test fails)."""


def free_port() -> int:
    """A TCP port free on the loopback interface now (the OS picks it)."""
    with contextlib.closing(socket.socket(socket.AF_INET, socket.SOCK_STREAM)) as s:
        s.bind((LOOPBACK, 0))
        return int(s.getsockname()[1])


def rank_env(rank: int, world_size: int, port: int, backend: str) -> dict[str, str]:
    """The environment torchrun gives worker ``rank`` of a one-node job (plus gloo on loopback)."""
    env = {"MASTER_ADDR": LOOPBACK, "MASTER_PORT": str(port), "RANK": str(rank), "LOCAL_RANK": str(rank),
           "WORLD_SIZE": str(world_size), "LOCAL_WORLD_SIZE": str(world_size), "GROUP_RANK": "0"}
    if backend == "gloo":
        env.setdefault("GLOO_SOCKET_IFNAME", os.environ.get("GLOO_SOCKET_IFNAME", "lo"))
    return env


@dataclass
class RankOutcome:
    """How one rank ended: its return value, or why it has none."""

    rank: int
    state: str  # "ok", "error", "killed" (still running at the deadline), "exited" (no result, exit code)
    value: Any = None
    error: str = ""
    exitcode: int | None = None


@dataclass
class RankJob:
    """A finished multi-rank job: ``values[r]`` is what rank r's function returned."""

    world_size: int
    backend: str
    seconds: float
    outcomes: list[RankOutcome] = field(default_factory=list)
    failed_order: list[int] = field(default_factory=list)  # failing ranks, first failure first

    @property
    def values(self) -> list[Any]:
        return [o.value for o in self.outcomes]


@dataclass(frozen=True)
class _JobSpec:
    """What every rank of a job is given (pickled to each rank's process)."""

    fn: Callable[..., Any]
    args: tuple
    kwargs: dict
    world_size: int
    port: int
    backend: str
    pg_timeout_s: float
    threads: int | None  # torch.set_num_threads of each rank (None: torch's default)
    init: bool  # the rank initialises the process group before fn
    simulated: dict[str, str] | None  # the defects of the parent's simulated NPU, if one is active


def _rank_main(job: _JobSpec, rank: int, result_path: str) -> None:
    """Entry point of a spawned rank: torchrun's environment, the process group, fn, the result file."""
    os.environ.update(rank_env(rank, job.world_size, job.port, job.backend))
    import torch
    import torch.distributed as dist

    if job.threads:
        torch.set_num_threads(job.threads)
    failed_at = 0.0
    stack = contextlib.ExitStack()
    try:
        if job.simulated is not None:  # the parent's simulated NPU, again in this fresh process
            from pytest_msprobe.testing.simulated_npu import simulated_npu

            stack.enter_context(simulated_npu(defects=job.simulated))
        if job.init:
            dist.init_process_group(job.backend, rank=rank, world_size=job.world_size,
                                    timeout=timedelta(seconds=job.pg_timeout_s))
        try:
            result: tuple[str, Any] = ("ok", job.fn(*job.args, **job.kwargs))
        except BaseException:
            failed_at = time.time()  # before the group goes down and the peers fail in turn
            raise
        finally:
            if dist.is_initialized():
                with contextlib.suppress(Exception):
                    dist.destroy_process_group()
    except BaseException as exc:  # reported to the parent, which raises it in the test
        result = ("error", (failed_at or time.time(), f"{type(exc).__name__}: {exc}\n{traceback.format_exc()}"))
    finally:
        stack.close()
    try:
        payload = pickle.dumps(result)
    except Exception as exc:
        payload = pickle.dumps(("error", (time.time(), f"rank {rank}: the return value cannot be pickled: {exc!r}")))
    write_bytes_atomic(result_path, payload)


def _active_simulation() -> dict[str, str] | None:
    """The defects of the simulated NPU active in this process (None: none is), which every rank
    then simulates too: a job dry-run on the simulated NPU uses device "npu" on every rank. Not
    imported when nothing asked for it (torch stays lazy)."""
    module = sys.modules.get("pytest_msprobe.testing.simulated_npu")
    active = module.active() if module is not None else None
    return dict(active.defects) if active is not None else None


def _context() -> Any:
    """forkserver with torch preloaded: every rank is a fresh fork of one clean server process
    (not of the test process, which may hold threads, hooks or a CUDA context), and a job's start
    costs a fork instead of a torch import per rank. Platforms without fork use spawn."""
    if "forkserver" not in multiprocessing.get_all_start_methods():
        return multiprocessing.get_context("spawn")
    ctx = multiprocessing.get_context("forkserver")
    ctx.set_forkserver_preload(list(PRELOAD))
    return ctx


def run_ranks(fn: Callable[..., Any], world_size: int = 2, args: Sequence[Any] = (), kwargs: dict | None = None, *,
              backend: str = "gloo", timeout: float = DEFAULT_TIMEOUT_S, threads_per_rank: int | None = None,
              check: bool = True, init: bool = True) -> RankJob:
    """Run ``fn(*args, **kwargs)`` on ``world_size`` ranks inside an initialised process group.

    ``fn`` must be importable by a fresh process (a module-level function). Returns the job with
    every rank's return value; raises :class:`RankJobError` (with ``check``) when a rank raised,
    died, or the job ran past ``timeout`` seconds — never hangs. ``threads_per_rank`` defaults to
    the CPU count shared out between the ranks (gloo ranks on one CPU otherwise oversubscribe it).
    ``init`` False: the process group is left to ``fn`` (torchrun's environment is set, so
    ``init_process_group(backend)`` needs no argument), as a script that starts a probe first.
    """
    if not isinstance(world_size, int) or isinstance(world_size, bool) or world_size < 1:
        raise ConfigError("world_size", world_size, "an int >= 1")
    if backend not in BACKENDS:
        raise ConfigError("backend", backend, f"one of {', '.join(BACKENDS)}")
    if not (isinstance(timeout, (int, float)) and timeout > 0):
        raise ConfigError("timeout", timeout, "a number of seconds > 0")
    if threads_per_rank is None and backend == "gloo":
        threads_per_rank = max(1, (os.cpu_count() or 1) // world_size)
    ctx = _context()
    port = free_port()
    pg_timeout = max(1.0, float(timeout))
    start = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="msprobe_ranks_") as tmp:
        paths = [str(Path(tmp) / f"rank{r}.pkl") for r in range(world_size)]
        procs = []
        spec = _JobSpec(fn, tuple(args), dict(kwargs or {}), world_size, port, backend, pg_timeout, threads_per_rank,
                    init, _active_simulation())
        for r in range(world_size):
            p = ctx.Process(target=_rank_main, name=f"msprobe-rank{r}", args=(spec, r, paths[r]))
            p.start()
            procs.append(p)
        killed, failed = _wait(procs, paths, start + float(timeout))
        failed.sort(key=lambda r: _failure_time(paths[r]))  # the poll sees near-simultaneous exits in rank order
        outcomes = [_outcome(r, procs[r], paths[r], r in killed) for r in range(world_size)]
    job = RankJob(world_size, backend, time.monotonic() - start, outcomes, failed)
    if check and any(o.state != "ok" for o in outcomes):
        raise RankJobError(_failure_text(job, float(timeout)))
    return job


def _wait(procs: list[Any], paths: list[str], deadline: float) -> tuple[set[int], list[int]]:
    """Wait for every rank; after a failure or at the deadline, kill the rest. Returns the killed
    ranks and the failed ranks in the order they were seen failing (the first is the cause; the
    others usually failed because their peer went away)."""
    failed: list[int] = []
    failed_at: float | None = None
    while True:
        for r, p in enumerate(procs):
            if r not in failed and not p.is_alive() and _failed(p, paths[r]):
                failed.append(r)
        alive = [r for r, p in enumerate(procs) if p.is_alive()]
        if not alive:
            return set(), failed
        now = time.monotonic()
        if failed and failed_at is None:
            failed_at = now
        if now >= deadline or (failed_at is not None and now - failed_at >= FAILED_RANK_GRACE_S):
            for r in alive:
                procs[r].kill()
            for r in alive:
                procs[r].join(5.0)
            return set(alive), failed
        procs[alive[0]].join(_POLL_S)


def _failure_time(path: str) -> float:
    """When the rank's function raised (from its result), else when it ended; inf without a result."""
    try:
        with open(path, "rb") as fh:
            state, value = pickle.load(fh)
        return float(value[0]) if state == "error" else os.stat(path).st_mtime
    except (OSError, EOFError, pickle.UnpicklingError, TypeError, IndexError, ValueError):
        return float("inf")


def _failed(proc: Any, path: str) -> bool:
    if proc.exitcode not in (0, None):
        return True
    try:
        with open(path, "rb") as fh:
            return pickle.load(fh)[0] != "ok"
    except (OSError, EOFError, pickle.UnpicklingError):
        return True  # exited without a result


def _outcome(rank: int, proc: Any, path: str, killed: bool) -> RankOutcome:
    proc.join(1.0)
    if killed:
        return RankOutcome(rank, "killed", exitcode=proc.exitcode,
                           error="still running when the job was stopped (waiting in a collective?)")
    try:
        with open(path, "rb") as fh:
            state, value = pickle.load(fh)
    except (OSError, EOFError, pickle.UnpicklingError):
        return RankOutcome(rank, "exited", exitcode=proc.exitcode, error=f"exited with code {proc.exitcode} "
                           "and no result")
    if state == "ok":
        return RankOutcome(rank, "ok", value=value, exitcode=proc.exitcode)
    return RankOutcome(rank, "error", error=str(value[1]), exitcode=proc.exitcode)


def _failure_text(job: RankJob, timeout: float) -> str:
    bad = [o for o in job.outcomes if o.state != "ok"]
    order = job.failed_order + [o.rank for o in bad if o.rank not in job.failed_order]
    first = [r for r in order if job.outcomes[r].state != "killed"]
    if not first:
        head = (f"multi-rank job ({job.world_size} ranks, {job.backend}) did not finish within {timeout:g} s "
                "(deadlock: a rank waiting in a collective that another rank never reached?)")
    else:
        head = (f"multi-rank job ({job.world_size} ranks, {job.backend}) failed: rank {first[0]} first"
                + (f", then rank(s) {', '.join(map(str, first[1:]))}" if first[1:] else ""))
    lines = [head] + [f"  rank {o.rank}: {o.state}" + (f" - {o.error.splitlines()[0]}" if o.error else "")
                      for o in job.outcomes]
    for r in first:
        lines += [f"--- rank {r} traceback ---", job.outcomes[r].error.rstrip()]
    return "\n".join(lines)


@dataclass
class DistributedRun:
    """What ``msprobe_distributed(...)`` returns: every rank's return value and the merged report."""

    job: RankJob
    dump_path: Path
    merged: dict[str, Any] | None  # rank_report.merge_ranks of the dump; None when no probe wrote anything

    @property
    def values(self) -> list[Any]:
        return self.job.values

    @property
    def flagged_ranks(self) -> list[int]:
        return list(self.merged["flagged_ranks"]) if self.merged else []

    def assert_clean(self) -> None:
        """Fail with the merged report's first findings when any rank flagged something."""
        from pytest_msprobe.reports.ranks import describe

        if self.merged and self.merged["findings"]:
            raise AssertionError(describe(self.merged) + f"\nmerged report: {self.dump_path}")


class DistributedRunner:
    """The ``msprobe_distributed`` fixture: ``msprobe_distributed(fn, *args, world_size=2)`` runs
    ``fn(dump_path, *args, **kwargs)`` on every rank (process group initialised, gloo by default)
    and merges what the probes wrote under ``dump_path``. Each call gets its own dump folder."""

    def __init__(self, root: Path) -> None:
        self.root = Path(root)
        self.calls = 0

    def __call__(self, fn: Callable[..., Any], *args: Any, world_size: int = 2, backend: str = "gloo",
                 timeout: float = DEFAULT_TIMEOUT_S, tool: str | None = None, **kwargs: Any) -> DistributedRun:
        from pytest_msprobe.reports.ranks import merge_ranks, rank_summaries

        dump = self.root / f"run{self.calls}"
        self.calls += 1
        dump.mkdir(parents=True, exist_ok=True)
        job = run_ranks(fn, world_size, (str(dump), *args), kwargs, backend=backend, timeout=timeout)
        merged = None
        try:
            rank_summaries(dump, tool)
        except ConfigError:
            if tool is not None:
                raise
        else:
            merged = merge_ranks(dump, tool, world_size=world_size, html=True)
        return DistributedRun(job, dump, merged)


__all__ = ["DistributedRun", "DistributedRunner", "RankJob", "RankJobError", "RankOutcome", "free_port", "rank_env", "run_ranks"]
