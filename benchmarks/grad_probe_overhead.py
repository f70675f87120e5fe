"""Overhead of the grad_probe gradient monitor on CPU training loops: time and peak memory.

Same method as free_benchmark_overhead.py, whose models, timing and memory helpers this script
imports: for each model and grad_level the same training loop runs with and without the monitor in
ONE process, plain and probed loops interleaved (the order alternates every repeat), after a warm-up;
the time ratio is median(probed loop) / median(plain loop). A third loop, the floor, trains a third
copy and writes each step's files with bare system calls (FloorFiles): what the dump alone costs on
the dump's disk, which on a virtual machine can exceed a small model's whole step. Each loop drives
its own copy of the model (same seed), because ``dbg.monitor(model)`` installs a global optimizer
step pre-hook that stays until ``dbg.stop()``. Peak memory is measured in fresh subprocesses (this
script re-invokes itself with ``--memory-child MODEL:LEVEL``) by free_benchmark_overhead's
``memory_child``: peak RSS growth of the loop (VmHWM reset after the model and data exist).

    python benchmarks/grad_probe_overhead.py            # full run: 3 models x L0/L1/L2, ~2-3 min on 2 cores
    python benchmarks/grad_probe_overhead.py --quick    # tiny + medium-fp32, fewer repeats, ~1 min

See benchmarks/README.md for how to read the table.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import platform
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
for _p in (ROOT, Path(__file__).resolve().parent):
    if str(_p) not in sys.path:
        sys.path.insert(0, str(_p))

import free_benchmark_overhead as fbo  # noqa: E402
import torch  # noqa: E402
from free_benchmark_overhead import (  # noqa: E402
    SPECS,
    Bench,
    ModelSpec,
    cpu_snapshot,
    fmt,
    print_columns,
    verdict,
)

RESULTS = ROOT / "benchmarks" / "results" / "grad_probe_overhead.json"

LEVELS = ("L0", "L1", "L2")
# issue 4's target for MindSpore's grad_probe L1, used as the bar for PyTorch too; L0/L2 have none
TIME_TARGET: dict[str, float] = {"L1": 1.5}
# the toy model (a test suite's model, ~0.5 ms a step): what a step's files cost on their own
MODEL_TIME_TARGET: dict[tuple[str, str], float] = {("toy", "L1"): 2.0}

# (steps per timed loop, warm-up steps each way). The monitor costs a fraction of a step, so the
# medium models get more than free_benchmark's one step per loop: a 1.5x bar needs less noise.
STEPS = {"toy": (50, 10), "tiny": (10, 3), "medium-fp32": (3, 1), "medium-bf16": (1, 1)}
QUICK_STEPS = {"toy": (20, 5), "tiny": (5, 1), "medium-fp32": (2, 1), "medium-bf16": (1, 1)}

_OPEN: list[tuple[Any, str]] = []  # debuggers created by make_debugger, closed by close_debuggers


def make_debugger(level: str, dump_path: str) -> Any:
    from probes.pytorch import PrecisionDebugger

    dbg = PrecisionDebugger(config={"task": "grad_probe", "dump_path": dump_path,
                                    "grad_probe": {"grad_level": level}})
    _OPEN.append((dbg, dump_path))
    return dbg


def probed_step(dbg: Any, bench: Bench) -> float:
    """One training step with the monitor on ``bench.model`` (monitor() on the first call)."""
    if dbg.probe is None:
        dbg.monitor(bench.model)
    return bench.step()


def close_debuggers() -> None:
    """stop() every debugger still open and delete its dump (stop() writes summary.json, which
    would otherwise be written at interpreter exit into a temporary directory already removed)."""
    while _OPEN:
        dbg, path = _OPEN.pop()
        dbg.stop()
        shutil.rmtree(path, ignore_errors=True)


def use_grad_probe_in_fbo() -> None:
    """Make free_benchmark_overhead's memory_child and profile_config drive grad_probe: they look
    these two functions up in their module's globals at call time."""
    fbo.make_debugger = make_debugger
    fbo.probed_step = probed_step


def file_creation_us(root: str | None, files: int = 200) -> float:
    """Microseconds of CPU (the kernel's, mostly) one new empty file costs under ``root``, from
    `files` made in a row in a fresh folder: a step at L1 makes a file per parameter, a folder and
    the CSV, and on some disks (a virtual machine's ext4 that other jobs also write to) a new inode
    costs ~20 us one minute and ~800 us the next, which then decides the toy model's ratio
    whatever the monitor does. In a row, because the first few dozen after a pause cost less."""
    folder = tempfile.mkdtemp(prefix="gp_inodes_", dir=root)
    try:
        start = time.thread_time()
        for i in range(files):
            os.close(os.open(os.path.join(folder, f"f{i}"), os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o640))
        return 1e6 * (time.thread_time() - start) / files
    finally:
        shutil.rmtree(folder, ignore_errors=True)


# the floor: what the dump alone costs, in plain code ------------------------------------------------
class FloorFiles:
    """A step's files written with bare system calls, with the monitor's names and sizes: the CSV
    through a temporary file and a rename and, from L1 on, the step's folder and a `.npy` per
    parameter (np.save's 128-byte header, then a byte per element). The bytes are made once: the
    figures are not in the floor. Beside the monitor in the same rounds it says what the dump alone
    costs on this disk: on a virtual machine's ext4 a new file can cost more than the toy model's
    whole step, whatever the monitor does."""

    def __init__(self, root: str, model: Any, level: str) -> None:
        self.root, self.step = root, 0
        params = [(n, p) for n, p in model.named_parameters() if p.requires_grad]
        header = bytes(127) + b"\n"
        self.npy = [(f"{n}.npy", header + bytes(p.numel())) for n, p in params] if level != "L0" else []
        rows = "".join(f"{n},{0.1:.20g},{-0.1:.20g},{1.0:.20g},{list(p.shape)}\n" for n, p in params)
        self.csv = f"name,max,min,norm,shape\n{rows}".encode()
        os.makedirs(root, exist_ok=True)

    def write(self) -> None:
        flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL
        if self.npy:
            folder = os.path.join(self.root, f"step{self.step}")
            os.mkdir(folder)
            for name, data in self.npy:
                fd = os.open(os.path.join(folder, name), flags, 0o640)
                os.write(fd, data)
                os.close(fd)
        path = os.path.join(self.root, f"grad_summary_{self.step}.csv")
        fd = os.open(path + ".tmp", flags, 0o640)
        os.write(fd, self.csv)
        os.close(fd)
        os.replace(path + ".tmp", path)
        self.step += 1


def dump_bytes(path: str) -> int:
    return sum(f.stat().st_size for f in Path(path).rglob("*") if f.is_file())


# timing ---------------------------------------------------------------------------------------------
def time_config(spec: ModelSpec, level: str, repeats: int, dump_root: str | None = None) -> dict[str, Any]:
    plain_bench, probed_bench, floor_bench = Bench(spec), Bench(spec), Bench(spec)  # same seed: identical
    with tempfile.TemporaryDirectory(prefix="gp_overhead_", dir=dump_root) as tmp:
        probed_dump = os.path.join(tmp, "probed")
        dbg = make_debugger(level, probed_dump)
        files = FloorFiles(os.path.join(tmp, "floor"), floor_bench.model, level)

        def plain() -> None:
            for _ in range(spec.steps):
                plain_bench.step()

        def probed() -> None:
            for _ in range(spec.steps):
                probed_step(dbg, probed_bench)
            dbg.probe.flush()  # the loop's files on disk: what the writer thread wrote counts here

        def floor() -> None:
            for _ in range(spec.steps):
                floor_bench.step()
                files.write()

        try:
            for _ in range(spec.warmup):
                plain_bench.step()
                probed_step(dbg, probed_bench)
            floor()
            arms = fbo.time_arms({"plain": plain, "probed": probed, "floor": floor}, repeats)
        finally:
            _OPEN.remove((dbg, probed_dump))
            dbg.stop()
        summary = dbg.summary()
        size = dump_bytes(probed_dump)
    probed_steps = spec.warmup + repeats * spec.steps
    written = len(summary["steps_written"])
    plain_s, floor_med = arms["plain"], statistics.median(arms["floor"])
    return {
        **fbo.loop_figures(plain_s, arms["probed"], spec.steps),
        "floor_ratio": floor_med / statistics.median(plain_s),
        "ratio_over_floor": statistics.median(arms["probed"]) / floor_med,
        "probed_steps": probed_steps,
        "steps_written": written,
        "params": len(summary["params"]),
        "dump_bytes": size,
        "dump_kib_per_step": size / 1024 / max(written, 1),
        "compute_dtype": summary["compute_dtype"],
        "errors": summary["errors"],
        "file_creation_us": file_creation_us(dump_root),  # the disk's state just after the timings
    }


def run_memory_child(model: str, level: str, steps: int) -> dict[str, Any]:
    cmd = [sys.executable, str(Path(__file__).resolve()), "--memory-child", f"{model}:{level}",
           "--memory-steps", str(steps), "--threads", str(torch.get_num_threads())]
    proc = subprocess.run(cmd, capture_output=True, text=True, cwd=str(ROOT))
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("{")]
    if proc.returncode != 0 or not lines:
        return {"error": f"child exited {proc.returncode}: {proc.stderr.strip()[-500:]}"}
    return json.loads(lines[-1])


# report ---------------------------------------------------------------------------------------------
def print_table(rows: list[dict[str, Any]]) -> None:
    head = ("model", "level", "plain ms", "probed ms", "time x", "target", "", "floor", "x floor", "min x", "noise",
            "drift", "mem x", "+MiB", "anon x", "params", "dump KiB/step", "dumped", "errors")
    widths = (11, 5, 8, 9, 6, 6, 5, 5, 7, 6, 5, 5, 5, 7, 6, 6, 13, 7, 6)
    cell_rows = []
    for r in rows:
        t = r.get("timing") or {}
        m = r.get("memory") or {}
        tt = r["time_target"]
        dumped = f"{t['steps_written']}/{t['probed_steps']}" if t else "-"
        cells = (
            r["model"], r["level"],
            fmt(t.get("plain_ms_per_step"), ".1f"), fmt(t.get("probed_ms_per_step"), ".1f"),
            fmt(t.get("time_ratio"), ".2f"), "-" if tt is None else f"<={tt:g}", r["time_verdict"],
            fmt(t.get("floor_ratio"), ".2f"), fmt(t.get("ratio_over_floor"), ".2f"), fmt(t.get("time_ratio_min"), ".2f"), fmt(t.get("plain_noise"), ".1f"), fmt(t.get("probed_drift"), ".2f"),
            fmt(m.get("ratio"), ".2f"), fmt(m.get("extra_mib"), "+.1f"), fmt(m.get("anon_ratio"), ".2f"),
            str(t.get("params", "-")), fmt(t.get("dump_kib_per_step"), ".1f"), dumped,
            str(len(t["errors"])) if "errors" in t else "-",
        )
        cell_rows.append(cells)
    print_columns(head, widths, cell_rows)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true", help="tiny + medium-fp32, 3 repeats, shorter loops (~1 min)")
    ap.add_argument("--models", help=f"comma list of {', '.join(SPECS)} ('medium' = both medium ones)")
    ap.add_argument("--levels", help=f"comma list of {', '.join(LEVELS)}")
    ap.add_argument("--repeats", type=int, help="timed repeats of each loop (default 5, --quick 3)")
    ap.add_argument("--no-memory", action="store_true", help="skip the peak-memory subprocesses")
    ap.add_argument("--memory-steps", type=int, default=2, help="training steps per memory child")
    ap.add_argument("--json", default=str(RESULTS), help="where to write the JSON results")
    ap.add_argument("--profile", metavar="MODEL:LEVEL", help="cProfile probed steps of one config and exit")
    ap.add_argument("--profile-steps", type=int, default=3)
    ap.add_argument("--threads", type=int, help="torch.set_num_threads (default: torch's default)")
    ap.add_argument("--verbose", action="store_true", help="keep the probe's log messages")
    ap.add_argument("--dump-root", help="where the probed loops' dumps go (default: the system's temporary folder); "
                    "/dev/shm times the monitor without the disk")
    ap.add_argument("--memory-child", metavar="MODEL:LEVEL", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)

    if not args.verbose:
        logging.getLogger("probes").setLevel(logging.ERROR)
    if args.threads:
        torch.set_num_threads(args.threads)
    use_grad_probe_in_fbo()
    if args.memory_child:
        # import the probe before the peak mark: its module objects are a one-time cost, not the loop's
        import probes.grad_probe.torch_monitor  # noqa: F401
        import probes.pytorch  # noqa: F401

        try:
            fbo.memory_child(args.memory_child, args.memory_steps)
        finally:
            close_debuggers()
        return 0
    if args.profile:
        model, level = args.profile.split(":")
        try:
            fbo.profile_config(model, level, args.profile_steps)
        finally:
            close_debuggers()
        return 0

    if args.models:
        models: list[str] = []
        for m in args.models.split(","):
            models += ["medium-fp32", "medium-bf16"] if m == "medium" else [m]
    else:
        models = ["toy", "tiny", "medium-fp32"] if args.quick else [m for m in SPECS if not m.startswith("llama")]
    levels = args.levels.split(",") if args.levels else list(LEVELS)
    for m in models:
        if m not in SPECS:
            ap.error(f"unknown model {m!r}; choose from {', '.join(SPECS)}")
    for lv in levels:
        if lv not in LEVELS:
            ap.error(f"unknown level {lv!r}; choose from {', '.join(LEVELS)}")
    repeats = args.repeats or (3 if args.quick else 5)

    load_start = os.getloadavg()[0]
    cpu_start = cpu_snapshot()
    t_start = time.perf_counter()
    rows: list[dict[str, Any]] = []
    for model in models:
        steps, warmup = (QUICK_STEPS if args.quick else STEPS)[model]
        spec = ModelSpec(model, SPECS[model].dtype, steps=steps, warmup=warmup)
        plain_mem = None
        if not args.no_memory:
            plain_mem = run_memory_child(model, "plain", args.memory_steps)
            print(f"[{time.perf_counter() - t_start:6.1f}s] {model} plain: peak RSS growth "
                  f"{plain_mem.get('growth_kib', 0) / 1024:.1f} MiB", file=sys.stderr, flush=True)
        for level in levels:
            row: dict[str, Any] = {"model": model, "dtype": str(spec.dtype).replace("torch.", ""), "level": level}
            try:
                row["timing"] = time_config(spec, level, repeats, args.dump_root)
            except Exception as exc:
                row["timing"] = None
                row["timing_error"] = f"{type(exc).__name__}: {exc}"
            t = row["timing"]
            row["time_target"] = MODEL_TIME_TARGET.get((model, level), TIME_TARGET.get(level))
            row["time_verdict"] = verdict(t and t["time_ratio"], row["time_target"], t and t["floor_ratio"])
            if t and (t["errors"] or t["steps_written"] != t["probed_steps"]):
                row["time_verdict"] = "ERR" if row["time_target"] else row["time_verdict"]
            if not args.no_memory:
                child = run_memory_child(model, level, args.memory_steps)
                mem: dict[str, Any] = {"probed": child, "plain": plain_mem}
                if "growth_kib" in child and plain_mem and plain_mem.get("growth_kib"):
                    mem["ratio"] = child["growth_kib"] / plain_mem["growth_kib"]
                    mem["extra_mib"] = (child["growth_kib"] - plain_mem["growth_kib"]) / 1024
                if child.get("anon_growth_kib") and plain_mem and plain_mem.get("anon_growth_kib"):
                    mem["anon_ratio"] = child["anon_growth_kib"] / plain_mem["anon_growth_kib"]
                row["memory"] = mem
            else:
                row["memory"] = None
            rows.append(row)
            msg = (f"time x{t['time_ratio']:.2f} ({t['probed_ms_per_step']:.1f} vs {t['plain_ms_per_step']:.1f} ms/step; "
                   f"a new file costs {t['file_creation_us']:.0f} us of CPU)" if t else f"ERROR {row['timing_error']}")
            if row.get("memory") and "ratio" in row["memory"]:
                msg += f", mem x{row['memory']['ratio']:.2f}"
            print(f"[{time.perf_counter() - t_start:6.1f}s] {model} {level}: {msg}", file=sys.stderr, flush=True)

    print(f"grad_probe overhead: torch {torch.__version__}, {torch.get_num_threads()} threads, "
          f"{os.cpu_count()} CPUs, {platform.processor() or platform.machine()}, repeats={repeats}, "
          f"median of interleaved repeats, dumps under {args.dump_root or tempfile.gettempdir()}")
    print_table(rows)
    fails = sum(r["time_verdict"] in ("FAIL", "ERR") for r in rows)
    floors = [r for r in rows if r["time_verdict"] == "FLOOR"]
    for r in rows:
        t = r["timing"]
        if r.get("timing_error"):
            print(f"ERROR {r['model']} {r['level']}: {r['timing_error']}")
        elif t:
            for e in t["errors"][:5]:
                print(f"probe error {r['model']} {r['level']}: step {e['step']} {e['param']}: {e['error']}")
            if t["steps_written"] != t["probed_steps"]:
                print(f"ERROR {r['model']} {r['level']}: the monitor dumped {t['steps_written']} steps "
                      f"of {t['probed_steps']} probed")
        if r.get("memory") and r["memory"]["probed"].get("error"):
            print(f"ERROR (memory child) {r['model']} {r['level']}: {r['memory']['probed']['error']}")
    elapsed = time.perf_counter() - t_start
    others = fbo.print_run_notes(rows, "level", cpu_start, load_start, elapsed)
    print("floor = (plain step + the step's files, the same names and sizes, written with bare system calls) / "
          "plain step, timed in the same rounds (the figures are not in it); x floor = probed / floor")
    for r in floors:
        t = r["timing"]
        print(f"FLOOR {r['model']} {r['level']}: over its target, but the floor alone is {t['floor_ratio']:.2f}x "
              f"(a new file cost {t['file_creation_us']:.0f} us of CPU here): this disk decides, not the monitor "
              f"({t['ratio_over_floor']:.2f}x its floor). --dump-root /dev/shm times the monitor without it.")
    verdicts = [f"{fails} FAIL/ERR"] if fails else ["ALL PASS" if not floors else "no FAIL"]
    verdicts += [f"{len(floors)} over target by the disk (FLOOR)"] if floors else []
    print(f"target: grad_probe L1 <=1.5x time (issue 4's MindSpore target, our bar for PyTorch), the toy model "
          f"<=2x -> {', '.join(verdicts)}  ({elapsed:.0f}s)")
    fbo.write_results(args.json, rows, repeats=repeats, memory_steps=None if args.no_memory else args.memory_steps,
                      targets={"time": TIME_TARGET}, elapsed_s=elapsed, load_average_start=load_start,
                      other_processes_cores=others)
    return 0


if __name__ == "__main__":
    sys.exit(main())
