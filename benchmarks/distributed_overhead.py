"""Overhead of the grad_probe gradient monitor on a 2-rank CPU job, under DDP and FSDP2: time,
collectives added per step, peak memory.

Why a separate benchmark: grad_probe_overhead.py measures one process, where the monitor's cost is
its statistics of every gradient plus one host transfer per step. On a data-parallel job two more
things can cost: a collective the monitor issues (each one is a synchronisation of every rank, and
a rank that stalls there stalls them all), and the work of reading sharded gradients (under FSDP2
each rank holds a DTensor shard of every gradient). The floor the table should show is therefore:
under DDP the single-process cost (every rank takes statistics of its full, already averaged,
gradients, and no collective is needed); under FSDP2 the statistics of each rank's shard (half the
elements at 2 ranks) plus the exchange that combines the shards' figures into the full parameters'
(today two small all-reduces per step and mesh: sums, and maxima/minima). What crosses between ranks
is a few numbers per parameter (``+coll KiB/step``), never anything of a gradient's size.

Method, the same as grad_probe_overhead.py (whose timing helpers from free_benchmark_overhead.py
this script reuses): in each 2-rank job (``pytest_msprobe.distributed.run_ranks``, gloo on
loopback, ``--threads`` torch threads per rank) every rank builds two copies of the same MLP
(same seed) under the engine, one plain and one monitored by ``PrecisionDebugger(task=grad_probe)
.monitor(model)``; after warm-up steps of both it times ``--repeats`` rounds of one plain loop and
one probed loop, the order alternating from round to round. Only the training loops are timed, not
process start, the process group or the model build. A round's loop time is the slowest rank's
(a data-parallel step is as slow as its slowest rank); ``time x`` = median(probed) / median(plain).
The ``single`` rows are one process with the rank's share of the batch and threads and no wrapper:
the same per-rank work without communication, for context.

Collectives are counted by wrapping the Python collective APIs of ``torch.distributed`` and of
``torch.distributed._functional_collectives`` (what DTensor uses) in each rank before any model or
probe exists; a call made from inside another counted call is not counted again. ``+coll/step`` is
(calls during the probed loops - calls during the plain loops) / steps, per rank (the maximum over
ranks); ``+coll KiB/step`` the same difference of the bytes of the tensors passed to those calls.
DDP's own bucket all-reduces are issued from C++ and are not seen (``plain coll/step`` is 0 there);
FSDP2's all-gathers and reduce-scatters are, and cancel out in the difference.

Peak memory: in separate 2-rank jobs each rank builds ONE model (plain, or probed with the debugger
created after the mark), resets the kernel's peak-RSS mark (free_benchmark_overhead's helpers:
``/proc/self/clear_refs``), runs ``--memory-steps`` steps and reads VmHWM; ``+MiB`` = peak growth
(probed) - peak growth (plain), each the larger rank's. Coarse (RSS counts pages the allocator keeps), but
it is what the machine sees; ``+anon MiB`` leaves out file-backed pages (torch's library code a
kernel touches for the first time, a one-time cost) as free_benchmark_overhead.py does.

``errors`` is the number of errors the monitor recorded (summed over ranks): a non-zero count means
some statistics were not taken (as under FSDP2 before grad_probe read DTensor shards: "error at step
N: .numpy() is not supported for tensor subclasses"), and the time ratio is then that of a failing
monitor, not a real one. ``dumped`` = steps written / steps probed (the lowest rank's).

    python benchmarks/distributed_overhead.py            # ~1 min on 2 idle cores
    python benchmarks/distributed_overhead.py --quick    # fewer, shorter loops: ~30 s
    python benchmarks/distributed_overhead.py --engines fsdp --levels L1 --repeats 9 --no-memory
"""

from __future__ import annotations

import argparse
import contextlib
import gc
import logging
import os
import platform
import sys
import tempfile
import threading
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Callable

ROOT = Path(__file__).resolve().parents[1]
for _p in (ROOT, Path(__file__).resolve().parent):
    if str(_p) not in sys.path:
        sys.path.insert(0, str(_p))

import free_benchmark_overhead as fbo  # noqa: E402
import torch  # noqa: E402

from pytest_msprobe.distributed import run_ranks  # noqa: E402

RESULTS = ROOT / "benchmarks" / "results" / "distributed_overhead.json"
ENGINES = ("single", "ddp", "fsdp")
ENGINE_LABEL = {"single": "1 process", "ddp": "DDP x2", "fsdp": "FSDP2 x2"}
LEVELS = ("L1", "L2")
WORLD = 2
#: CPU seconds the ranks used: forks of run_ranks' forkserver, not children of this process, so
#: os.times() here does not see them and print_run_notes would count them as other processes' load
RANKS_CPU_S = 0.0

# the Python collective APIs a probe could call (what is absent from this torch is skipped)
C10D_COLLECTIVES = (
    "all_reduce", "all_reduce_coalesced", "all_gather", "all_gather_into_tensor", "all_gather_single",
    "all_gather_coalesced", "all_gather_object", "reduce_scatter", "reduce_scatter_tensor", "reduce",
    "broadcast", "broadcast_object_list", "all_to_all", "all_to_all_single", "gather", "gather_object",
    "scatter", "scatter_object_list", "barrier", "monitored_barrier", "send", "recv", "isend", "irecv",
    "batch_isend_irecv",
)
FUNCOL_COLLECTIVES = (
    "all_reduce", "all_reduce_coalesced", "all_gather_tensor", "all_gather_tensor_autograd",
    "all_gather_into_tensor_coalesced", "reduce_scatter_tensor", "reduce_scatter_tensor_autograd",
    "reduce_scatter_tensor_coalesced", "all_to_all_single", "all_to_all_single_autograd", "broadcast",
    "permute_tensor",
)


@dataclass(frozen=True)
class Shape:
    """The MLP and its per-rank batch: sized so that a plain step takes ~20-50 ms on one core, so
    the monitor's per-step cost is measured against a step of realistic weight, not a toy's."""

    width: int = 768
    depth: int = 6
    batch: int = 64  # per rank


# collective counting ----------------------------------------------------------------------------
class CollectiveCounter:
    """Counts calls of the collective APIs from now on, by name (outermost calls only: one API
    that calls another, as all_gather_into_tensor does, is one collective)."""

    def __init__(self) -> None:
        self.counts: dict[str, int] = {}
        self.bytes: dict[str, int] = {}
        self._depth = threading.local()
        import torch.distributed as dist
        import torch.distributed._functional_collectives as funcol
        import torch.distributed.distributed_c10d as c10d

        apis = (((dist, c10d), C10D_COLLECTIVES, ""), ((funcol,), FUNCOL_COLLECTIVES, "funcol."))
        for modules, names, prefix in apis:
            for name in names:
                original = getattr(modules[0], name, None)
                if original is None:
                    continue
                wrapped = self._wrap(prefix + name, original)
                for module in modules:
                    if getattr(module, name, None) is original:
                        setattr(module, name, wrapped)

    def _wrap(self, label: str, fn: Callable[..., Any]) -> Callable[..., Any]:
        def counted(*args: Any, **kwargs: Any) -> Any:
            depth = getattr(self._depth, "n", 0)
            if depth == 0:
                self.counts[label] = self.counts.get(label, 0) + 1
                self.bytes[label] = self.bytes.get(label, 0) + _tensor_bytes(args, kwargs)
            self._depth.n = depth + 1
            try:
                return fn(*args, **kwargs)
            finally:
                self._depth.n = depth

        counted.__wrapped__ = fn  # type: ignore[attr-defined]
        return counted

    def snapshot(self) -> dict[str, int]:
        """Calls by name, and bytes passed under ``bytes:`` + name."""
        return {**self.counts, **{"bytes:" + k: v for k, v in self.bytes.items()}}


def _tensor_bytes(args: tuple, kwargs: dict) -> int:
    """Bytes of the tensors handed to a collective (inputs and outputs, lists included)."""
    total = 0
    for a in (*args, *kwargs.values()):
        for t in (a if isinstance(a, (list, tuple)) else (a,)):
            if isinstance(t, torch.Tensor):
                with contextlib.suppress(Exception):
                    total += t.numel() * t.element_size()
    return total


def _diff(after: dict[str, int], before: dict[str, int]) -> dict[str, int]:
    return {k: v - before.get(k, 0) for k, v in after.items() if v - before.get(k, 0)}


def _cpu_s() -> float:
    """CPU seconds of this process so far (a rank is a fresh fork: its own work only)."""
    t = os.times()
    return t.user + t.system


# the model under each engine ------------------------------------------------------------------
def build(engine: str, shape: Shape, seed: int = 0) -> torch.nn.Module:
    """The MLP, wrapped as tests/support/engines.py wraps its small one (FSDP2: fully_shard per layer, then
    the root, on a 1-D mesh of every rank)."""
    torch.manual_seed(seed)
    layers: list[torch.nn.Module] = []
    for _ in range(shape.depth):
        layers += [torch.nn.Linear(shape.width, shape.width), torch.nn.GELU()]
    model = torch.nn.Sequential(*layers)
    if engine == "single":
        return model
    import torch.distributed as dist

    if engine == "ddp":
        return torch.nn.parallel.DistributedDataParallel(model)
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    mesh = init_device_mesh("cpu", (dist.get_world_size(),))
    for layer in model:
        if isinstance(layer, torch.nn.Linear):
            fully_shard(layer, mesh=mesh)
    fully_shard(model, mesh=mesh)
    return model


class Trainer:
    """One model, its AdamW and this rank's batch; ``step()`` is a full training step."""

    def __init__(self, engine: str, shape: Shape) -> None:
        import torch.distributed as dist

        rank = dist.get_rank() if dist.is_initialized() else 0
        self.model = build(engine, shape)
        self.opt = torch.optim.AdamW(self.model.parameters(), lr=1e-4)
        self.x = torch.randn(shape.batch, shape.width, generator=torch.Generator().manual_seed(100 + rank))

    def step(self) -> None:
        self.opt.zero_grad(set_to_none=True)
        self.model(self.x).square().mean().backward()
        self.opt.step()


def _debugger(level: str, dump: str, model: torch.nn.Module) -> Any:
    from probes.pytorch import PrecisionDebugger

    dbg = PrecisionDebugger(config={"task": "grad_probe", "dump_path": dump, "grad_probe": {"grad_level": level}},
                            model=model)
    dbg.monitor(model)
    return dbg


def _probe_figures(dbg: Any) -> dict[str, Any]:
    s = dbg.summary()
    return {"errors": len(s["errors"]) + s["errors_dropped"], "first_error": s["errors"][0] if s["errors"] else None,
            "steps_written": len(s["steps_written"]), "optimizer_steps": s["optimizer_steps"]}


# per-rank functions (module level: run_ranks' processes import them) ------------------------------
def rank_timing(engine: str, level: str, shape: Shape, steps: int, warmup: int, repeats: int, dump: str) -> dict[str, Any]:
    """Times plain and probed loops in turn on this rank; returns loop seconds and counts."""
    logging.getLogger("probes").setLevel(logging.CRITICAL)  # the table reports the errors
    counter = CollectiveCounter()  # before any model or probe exists
    plain, probed = Trainer(engine, shape), Trainer(engine, shape)
    dbg = _debugger(level, dump, probed.model)
    try:
        for _ in range(warmup):
            plain.step()
        for _ in range(warmup):
            probed.step()
        calls = {"plain": {}, "probed": {}}

        def loop(trainer: Trainer, key: str) -> Callable[[], None]:
            def run() -> None:
                before = counter.snapshot()
                for _ in range(steps):
                    trainer.step()
                for k, v in _diff(counter.snapshot(), before).items():
                    calls[key][k] = calls[key].get(k, 0) + v
            return run

        plain_s, probed_s = fbo.time_interleaved(loop(plain, "plain"), loop(probed, "probed"), repeats)
    finally:
        dbg.stop()
    return {"plain_s": plain_s, "probed_s": probed_s, "calls": calls, "cpu_s": _cpu_s(), **_probe_figures(dbg)}


def rank_memory(engine: str, level: str | None, shape: Shape, steps: int, dump: str) -> dict[str, Any]:
    """Peak RSS growth of ``steps`` steps of one model (probed when ``level``) on this rank."""
    logging.getLogger("probes").setLevel(logging.CRITICAL)
    import probes.grad_probe.torch_monitor  # noqa: F401 - a one-time import, not the loop's memory

    trainer = Trainer(engine, shape)
    gc.collect()
    rss0, anon0 = fbo._status_kib("VmRSS"), fbo._status_kib("RssAnon")
    reset = fbo._reset_peak()
    maxrss0 = _maxrss_kib()
    dbg = _debugger(level, dump, trainer.model) if level else None
    try:
        for _ in range(steps):
            trainer.step()
    finally:
        if dbg is not None:
            dbg.stop()
    anon = None
    if reset and rss0 is not None:
        peak = fbo._status_kib("VmHWM") or 0
        growth = peak - rss0
        file_kib, shmem_kib = fbo._status_kib("RssFile"), fbo._status_kib("RssShmem")
        if None not in (anon0, file_kib, shmem_kib):  # file pages only grow without memory pressure
            anon = peak - file_kib - shmem_kib - anon0
    else:  # a lower bound: an earlier peak of the process may hide the loop's
        growth = _maxrss_kib() - maxrss0
    return {"growth_kib": growth, "anon_growth_kib": anon, "method": "VmHWM" if reset else "ru_maxrss",
            "cpu_s": _cpu_s()}


def _maxrss_kib() -> int:
    import resource

    return int(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss)


# driver ------------------------------------------------------------------------------------------
def _job(fn: Callable[..., Any], engine: str, args: tuple, threads: int, timeout: float) -> list[Any]:
    """Every rank's return value of ``fn(*args, dump)``; ``single`` is a world of one rank, so the
    same per-rank code runs there (its process group is never used by the unwrapped model)."""
    with tempfile.TemporaryDirectory(prefix="dist_overhead_") as dump:
        job = run_ranks(fn, world_size=1 if engine == "single" else WORLD, args=(*args, dump),
                        threads_per_rank=threads, timeout=timeout)
    global RANKS_CPU_S
    RANKS_CPU_S += sum(v["cpu_s"] for v in job.values)
    return job.values


def time_config(engine: str, level: str, shape: Shape, steps: int, warmup: int, repeats: int,
                threads: int, timeout: float) -> dict[str, Any]:
    ranks = _job(rank_timing, engine, (engine, level, shape, steps, warmup, repeats), threads, timeout)
    plain_s = [max(r["plain_s"][i] for r in ranks) for i in range(repeats)]
    probed_s = [max(r["probed_s"][i] for r in ranks) for i in range(repeats)]
    loops = repeats * steps

    def per_step(r: dict[str, Any], key: str, nbytes: bool) -> float:
        return sum(v for k, v in r["calls"][key].items() if k.startswith("bytes:") == nbytes) / loops

    added_by_name: dict[str, float] = {}
    for r in ranks:
        for name in set(r["calls"]["probed"]) | set(r["calls"]["plain"]):
            d = (r["calls"]["probed"].get(name, 0) - r["calls"]["plain"].get(name, 0)) / loops
            if d and not name.startswith("bytes:"):
                added_by_name[name] = max(added_by_name.get(name, 0.0), d)
    return {
        **fbo.loop_figures(plain_s, probed_s, steps),
        "plain_collectives_per_step": max(per_step(r, "plain", False) for r in ranks),
        "added_collectives_per_step": max(per_step(r, "probed", False) - per_step(r, "plain", False) for r in ranks),
        "added_collective_kib_per_step": max(per_step(r, "probed", True) - per_step(r, "plain", True)
                                             for r in ranks) / 1024,
        "added_collectives_by_name": added_by_name,
        "errors": sum(r["errors"] for r in ranks),
        "first_error": next((r["first_error"] for r in ranks if r["first_error"]), None),
        "steps_written": min(r["steps_written"] for r in ranks),
        "probed_steps": warmup + loops,
    }


def memory_config(engine: str, level: str | None, shape: Shape, steps: int, threads: int, timeout: float) -> dict[str, Any]:
    ranks = _job(rank_memory, engine, (engine, level, shape, steps), threads, timeout)
    anon = [r["anon_growth_kib"] for r in ranks]
    return {"growth_kib": max(r["growth_kib"] for r in ranks),
            "anon_growth_kib": None if None in anon else max(anon), "method": ranks[0]["method"]}


def _forkserver_cpu_s() -> float:
    """CPU seconds of multiprocessing's forkserver (it imported torch for the ranks), which this
    process reaps only at exit; 0 where it cannot be read."""
    try:
        from multiprocessing import forkserver

        pid = forkserver._forkserver._forkserver_pid
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")  # utime, stime
    except Exception:
        return 0.0


def print_markdown(rows: list[dict[str, Any]]) -> None:
    head = ("engine", "level", "plain ms", "probed ms", "time x", "min x", "noise", "plain coll/step",
            "+coll/step", "+coll KiB/step", "+MiB", "+anon MiB", "dumped", "errors")
    print("| " + " | ".join(head) + " |")
    print("|" + "|".join("---" if i < 2 else "---:" for i in range(len(head))) + "|")
    for r in rows:
        t = r.get("timing") or {}
        m, a = r.get("extra_mib"), r.get("extra_anon_mib")
        cells = (
            ENGINE_LABEL[r["engine"]], r["level"],
            fbo.fmt(t.get("plain_ms_per_step"), ".1f"), fbo.fmt(t.get("probed_ms_per_step"), ".1f"),
            fbo.fmt(t.get("time_ratio"), ".2f"), fbo.fmt(t.get("time_ratio_min"), ".2f"),
            fbo.fmt(t.get("plain_noise"), ".2f"), fbo.fmt(t.get("plain_collectives_per_step"), ".1f"),
            fbo.fmt(t.get("added_collectives_per_step"), "+.1f"), fbo.fmt(t.get("added_collective_kib_per_step"), "+.2f"),
            fbo.fmt(m, "+.1f"), fbo.fmt(a, "+.1f"),
            f"{t['steps_written']}/{t['probed_steps']}" if t else "-",
            str(t["errors"]) if t else "ERR",
        )
        print("| " + " | ".join(cells) + " |")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true", help="3 repeats of 3-step loops, 2 memory steps (~30 s)")
    ap.add_argument("--engines", default=",".join(ENGINES), help=f"comma list of {', '.join(ENGINES)}")
    ap.add_argument("--levels", default=",".join(LEVELS), help="comma list of grad_probe levels (L0, L1, L2)")
    ap.add_argument("--repeats", type=int, help="timed rounds of each loop (default 7, --quick 3)")
    ap.add_argument("--steps", type=int, help="training steps per timed loop (default 5, --quick 3)")
    ap.add_argument("--warmup", type=int, help="untimed steps of each model first (default 2, --quick 1)")
    ap.add_argument("--width", type=int, default=Shape.width)
    ap.add_argument("--depth", type=int, default=Shape.depth)
    ap.add_argument("--batch", type=int, default=Shape.batch, help="rows per rank")
    ap.add_argument("--threads", type=int, default=max(1, (os.cpu_count() or 1) // WORLD),
                    help="torch threads of each rank (default: the CPUs shared out between 2 ranks)")
    ap.add_argument("--no-memory", action="store_true", help="skip the peak-memory jobs")
    ap.add_argument("--memory-steps", type=int, help="steps per memory job (default 3, --quick 2)")
    ap.add_argument("--timeout", type=float, default=300.0, help="seconds a job may take before it is killed")
    ap.add_argument("--json", default=str(RESULTS), help="where to write the JSON results")
    args = ap.parse_args(argv)

    engines = [e for e in args.engines.split(",") if e]
    levels = [lv for lv in args.levels.split(",") if lv]
    for e in engines:
        if e not in ENGINES:
            ap.error(f"unknown engine {e!r}; choose from {', '.join(ENGINES)}")
    for lv in levels:
        if lv not in ("L0", "L1", "L2"):
            ap.error(f"unknown level {lv!r}")
    repeats = args.repeats or (3 if args.quick else 7)
    steps = args.steps or (3 if args.quick else 5)
    warmup = args.warmup if args.warmup is not None else (1 if args.quick else 2)
    memory_steps = args.memory_steps or (2 if args.quick else 3)
    shape = Shape(args.width, args.depth, args.batch)

    load_start = os.getloadavg()[0]
    cpu_start = fbo.cpu_snapshot()
    t_start = time.perf_counter()
    rows: list[dict[str, Any]] = []
    for engine in engines:
        plain_mem = None
        if not args.no_memory:
            try:
                plain_mem = memory_config(engine, None, shape, memory_steps, args.threads, args.timeout)
            except Exception as exc:
                print(f"ERROR (memory job) {engine} plain: {type(exc).__name__}: {exc}", file=sys.stderr)
        for level in levels:
            row: dict[str, Any] = {"engine": engine, "level": level, "model": ENGINE_LABEL[engine]}
            try:
                row["timing"] = time_config(engine, level, shape, steps, warmup, repeats, args.threads, args.timeout)
            except Exception as exc:  # a failed job is a row that says so, not a lost run
                row["timing"] = None
                row["timing_error"] = f"{type(exc).__name__}: {exc}"
            if plain_mem is not None:
                try:
                    probed_mem = memory_config(engine, level, shape, memory_steps, args.threads, args.timeout)
                except Exception as exc:
                    row["memory_error"] = f"{type(exc).__name__}: {exc}"
                else:
                    row["memory"] = {"plain": plain_mem, "probed": probed_mem}
                    row["extra_mib"] = (probed_mem["growth_kib"] - plain_mem["growth_kib"]) / 1024
                    if None not in (probed_mem["anon_growth_kib"], plain_mem["anon_growth_kib"]):
                        row["extra_anon_mib"] = (probed_mem["anon_growth_kib"] - plain_mem["anon_growth_kib"]) / 1024
            rows.append(row)
            t = row["timing"]
            msg = (f"time x{t['time_ratio']:.2f} ({t['probed_ms_per_step']:.1f} vs {t['plain_ms_per_step']:.1f} ms/step), "
                   f"+{t['added_collectives_per_step']:.1f} collectives/step, {t['errors']} probe errors"
                   if t else f"ERROR {row['timing_error'].splitlines()[0]}")
            print(f"[{time.perf_counter() - t_start:6.1f}s] {engine} {level}: {msg}", file=sys.stderr, flush=True)

    print(f"grad_probe on a {WORLD}-rank job (gloo, CPU): torch {torch.__version__}, {args.threads} thread(s) per rank, "
          f"{os.cpu_count()} CPUs, {platform.processor() or platform.machine()}; MLP {shape.depth}x Linear({shape.width}) "
          f"+ GELU, AdamW, batch {shape.batch} per rank; {steps}-step loops, warm-up {warmup}, median of {repeats} "
          f"interleaved repeats; time = the slowest rank's")
    print()
    print_markdown(rows)
    print()
    for r in rows:
        t = r["timing"]
        if r.get("memory_error"):
            print(f"ERROR (memory job) {r['engine']} {r['level']}: {r['memory_error']}")
        if r.get("timing_error"):
            print(f"ERROR {r['engine']} {r['level']}: {r['timing_error']}")
        elif t:
            if t["first_error"]:
                e = t["first_error"]
                print(f"probe error {r['engine']} {r['level']} ({t['errors']} in all): step {e['step']} "
                      f"{e['param']}: {e['error']}")
            if t["added_collectives_by_name"]:
                print(f"collectives added {r['engine']} {r['level']} (per step, per rank): "
                      + ", ".join(f"{k} {v:g}" for k, v in sorted(t["added_collectives_by_name"].items())))
    elapsed = time.perf_counter() - t_start
    if cpu_start is not None:  # count the ranks' CPU time as this benchmark's own (see RANKS_CPU_S)
        cpu_start = (cpu_start[0], cpu_start[1] - RANKS_CPU_S - _forkserver_cpu_s())
    others = fbo.print_run_notes(rows, "level", cpu_start, load_start, elapsed)
    print(f"({elapsed:.0f}s)")
    fbo.write_results(args.json, rows, shape=asdict(shape), world_size=WORLD, repeats=repeats, steps=steps,
                      warmup=warmup, threads_per_rank=args.threads,
                      memory_steps=None if args.no_memory else memory_steps, elapsed_s=elapsed,
                      load_average_start=load_start, other_processes_cores=others)
    return 0


if __name__ == "__main__":
    sys.exit(main())
