"""Overhead of free_benchmark's backward stage on a CPU training loop: time and peak memory.

The medium transformer of free_benchmark_overhead.py (4 pre-norm blocks, d=256, batch 8x128),
trained with AdamW, probed in the backward stage with a 5-API list:

    linear, layer_norm, gelu, scaled_dot_product_attention, cross_entropy

(per step: 17 linear, 9 layer_norm, 4 gelu, 4 attention and 1 loss call are checked, each with two
vector-Jacobian products recomputed against the real cotangent). Time: plain and probed loops
interleaved in ONE process after a warm-up, ratio of medians.

Peak memory, in fresh subprocesses (`--memory-child`), two measures:
  * `mem x` (the target's measure): the peak of the bytes held by tensors during one steady-state
    training step, above what lives between steps (parameters, gradients, optimizer state, batch),
    probed / plain. It is read from the CPU allocator's events (torch.profiler, profile_memory), the
    CPU twin of torch.cuda.max_memory_allocated, and does not depend on what glibc keeps.
  * `RSS grow x`: peak RSS growth over the first training steps after one plain warm-up step
    (VmHWM reset after the model exists), probed / plain. Shown because it is what a user sees in
    `top`, but it measures the heap's first touch, not the step's peak: a plain step allocates
    ~33 MiB of tensors at its peak while its RSS grows ~17 MiB (glibc reuses the warm-up step's
    heap), and after two warm-up steps both runs grow by < 3 MiB.
  * `RSS x`: whole-process peak RSS, probed / plain.
Targets (issue 7): time <= 5x, peak memory (`mem x`) <= 2x.

    python benchmarks/free_benchmark_backward_overhead.py           # ~3 min on 2 cores
    python benchmarks/free_benchmark_backward_overhead.py --repeats 3 --configs medium-bf16:improve_precision
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import platform
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
for p in (str(ROOT), str(HERE)):
    if p not in sys.path:
        sys.path.insert(0, p)

import free_benchmark_overhead as fbo  # noqa: E402
import torch  # noqa: E402

RESULTS = ROOT / "benchmarks" / "results" / "free_benchmark_backward_overhead.json"
APIS = ["linear", "layer_norm", "gelu", "scaled_dot_product_attention", "cross_entropy"]
CONFIGS = ["medium-fp32:no_change", "medium-fp32:add_noise", "medium-bf16:improve_precision",
           "medium-bf16:bit_noise"]
TIME_TARGET = 5.0
MEMORY_TARGET = 2.0


def make_debugger(mode: str, dump_path: str) -> Any:
    from probes.pytorch import PrecisionDebugger

    return PrecisionDebugger(config={"task": "free_benchmark", "dump_path": dump_path, "free_benchmark": {
        "pert_mode": mode, "handler_type": "check", "fuzz_stage": "backward", "list": APIS}})


def time_config(model: str, mode: str, repeats: int, steps: int) -> dict[str, Any]:
    bench = fbo.Bench(fbo.SPECS[model])
    with tempfile.TemporaryDirectory(prefix="fb_bwd_") as tmp:
        dbg = make_debugger(mode, tmp)

        def plain() -> None:
            for _ in range(steps):
                bench.step()

        def probed() -> None:
            for _ in range(steps):
                fbo.probed_step(dbg, bench)

        bench.step()
        fbo.probed_step(dbg, bench)
        plain_s, probed_s = fbo.time_interleaved(plain, probed, repeats)
        counts = fbo.probe_counts(dbg)
        waiting = len(dbg.probe.backward.waiting)
    probed_steps = 1 + repeats * steps
    return {
        **fbo.loop_figures(plain_s, probed_s, steps),
        "checked_per_step": counts["checked"] / probed_steps,
        "waiting_after_run": waiting,
        **counts,
    }


def tensor_peak_bytes(fn: Any) -> int | None:
    """Peak of the bytes held by CPU tensors allocated while fn() runs. The profiler cannot size
    a block allocated before it started, so frees of older tensors (last step's gradients) are
    not subtracted: an upper bound of the step's own growth, with the same bias for both runs."""
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        fn()
    results = getattr(prof.profiler, "kineto_results", None)
    if results is None:
        return None
    cpu = torch._C._autograd.DeviceType.CPU
    events = sorted(((e.start_ns(), e.nbytes()) for e in results.events()
                     if e.name() == "[memory]" and e.device_type() == cpu), key=lambda ev: ev[0])
    running = peak = 0
    for _t, nbytes in events:
        running += nbytes
        peak = max(peak, running)
    return peak


def persistent_bytes(bench: Any) -> int:
    """What lives between steps: parameters, gradients, optimizer state, the batch."""
    tensors = list(bench.model.parameters()) + [p.grad for p in bench.model.parameters() if p.grad is not None]
    tensors += [v for state in bench.opt.state.values() for v in state.values() if isinstance(v, torch.Tensor)]
    tensors += [bench.x, bench.y]
    return sum(t.numel() * t.element_size() for t in tensors)


def memory_child(arg: str, steps: int) -> None:
    """Fresh process: one JSON line with the RSS growth of `steps` training steps, then the
    tensor peak of one more (steady-state) step."""
    model, mode = arg.split(":")
    torch.manual_seed(0)
    bench = fbo.Bench(fbo.SPECS[model])
    tmp = tempfile.TemporaryDirectory(prefix="fb_bwd_mem_")
    dbg = None if mode == "plain" else make_debugger(mode, tmp.name)

    def step() -> None:
        if dbg is None:
            bench.step()
        else:
            fbo.probed_step(dbg, bench)

    bench.step()  # first-touch allocations of the model (optimizer state, autograd buffers) are not the probe's
    base = fbo._status_kib("VmRSS")
    ok = fbo._reset_peak()
    for _ in range(steps):
        step()
    peak = fbo._status_kib("VmHWM")
    tensor_peak = tensor_peak_bytes(step)
    persistent = persistent_bytes(bench)
    tmp.cleanup()
    print(json.dumps({"config": arg, "base_kib": base, "peak_kib": peak,
                      "growth_kib": None if not ok or peak is None else peak - base,
                      "tensor_peak_bytes": tensor_peak, "persistent_bytes": persistent}))


def run_memory_child(config: str, steps: int) -> dict[str, Any]:
    cmd = [sys.executable, str(Path(__file__).resolve()), "--memory-child", config, "--memory-steps", str(steps),
           "--threads", str(torch.get_num_threads())]
    proc = subprocess.run(cmd, capture_output=True, text=True, cwd=str(ROOT))
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("{")]
    if proc.returncode != 0 or not lines:
        return {"error": f"child exited {proc.returncode}: {proc.stderr.strip()[-500:]}"}
    return json.loads(lines[-1])


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--configs", default=",".join(CONFIGS), help="comma list of MODEL:MODE")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--steps", type=int, default=1, help="training steps per timed loop")
    ap.add_argument("--memory-steps", type=int, default=2)
    ap.add_argument("--no-memory", action="store_true")
    ap.add_argument("--threads", type=int)
    ap.add_argument("--json", default=str(RESULTS))
    ap.add_argument("--memory-child", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    logging.getLogger("probes").setLevel(logging.ERROR)
    if args.threads:
        torch.set_num_threads(args.threads)
    if args.memory_child:
        memory_child(args.memory_child, args.memory_steps)
        return 0

    t0 = time.perf_counter()
    cpu0 = fbo.cpu_snapshot()
    rows, cells, plain_mem = [], [], {}
    for config in args.configs.split(","):
        model, mode = config.split(":")
        if model not in fbo.SPECS:
            ap.error(f"unknown model {model!r}; choose from {', '.join(fbo.SPECS)}")
        timing = time_config(model, mode, args.repeats, args.steps)
        mem: dict[str, Any] = {}
        if not args.no_memory:
            if model not in plain_mem:
                plain_mem[model] = run_memory_child(f"{model}:plain", args.memory_steps)
            probed = run_memory_child(config, args.memory_steps)
            mem = {"plain": plain_mem[model], "probed": probed}
            plain = plain_mem[model]
            if probed.get("tensor_peak_bytes") and plain.get("tensor_peak_bytes"):
                mem["ratio"] = probed["tensor_peak_bytes"] / plain["tensor_peak_bytes"]
                mem["extra_mib"] = (probed["tensor_peak_bytes"] - plain["tensor_peak_bytes"]) / 2**20
                mem["with_persistent_ratio"] = ((probed["tensor_peak_bytes"] + probed["persistent_bytes"])
                                                / (plain["tensor_peak_bytes"] + plain["persistent_bytes"]))
            if probed.get("growth_kib") and plain.get("growth_kib"):
                mem["rss_growth_ratio"] = probed["growth_kib"] / plain["growth_kib"]
                mem["peak_ratio"] = probed["peak_kib"] / plain["peak_kib"]
        row = {"model": model, "mode": mode, "timing": timing, "memory": mem,
               "time_verdict": fbo.verdict(timing["time_ratio"], TIME_TARGET),
               "memory_verdict": fbo.verdict(mem.get("ratio"), MEMORY_TARGET) if mem else "-"}
        rows.append(row)
        print(f"[{time.perf_counter() - t0:6.1f}s] {config}: time x{timing['time_ratio']:.2f}"
              + (f", mem x{mem['ratio']:.2f}" if "ratio" in mem else ""), file=sys.stderr, flush=True)
        cells.append((model, mode, fbo.fmt(timing["plain_ms_per_step"], ".0f"),
                      fbo.fmt(timing["probed_ms_per_step"], ".0f"), fbo.fmt(timing["time_ratio"], ".2f"),
                      row["time_verdict"], fbo.fmt(timing["time_ratio_min"], ".2f"), fbo.fmt(mem.get("ratio"), ".2f"),
                      row["memory_verdict"], fbo.fmt(mem.get("extra_mib"), "+.1f"),
                      fbo.fmt(mem.get("with_persistent_ratio"), ".2f"), fbo.fmt(mem.get("rss_growth_ratio"), ".2f"),
                      fbo.fmt(mem.get("peak_ratio"), ".2f"),
                      fbo.fmt(timing["checked_per_step"], ".1f"), str(timing["flagged_rows"]),
                      str(len(timing["errors"]))))
    elapsed = time.perf_counter() - t0
    others = fbo.other_cpu_load(cpu0, fbo.cpu_snapshot(), elapsed)
    print(f"free_benchmark backward stage, list={APIS}: torch {torch.__version__}, {torch.get_num_threads()} "
          f"threads, {os.cpu_count()} CPUs, repeats={args.repeats}, median of interleaved repeats")
    fbo.print_columns(("model", "mode", "plain ms", "probed ms", "time x", "", "min x", "mem x", "", "+MiB",
                       "+state x", "RSS grow x", "RSS x", "chk/step", "flag rows", "errors"),
                      (11, 17, 8, 9, 6, 4, 6, 5, 4, 7, 8, 10, 5, 8, 9, 6), cells)
    print("mem x (the target's measure): peak tensor bytes of a steady-state step above what lives between "
          "steps, probed / plain; +state x: the same with parameters, gradients and optimizer state counted; "
          "RSS grow x: peak RSS growth of the first steps (allocator first touch); RSS x: whole-process peak RSS")
    if others is not None:
        print(f"CPU used by other processes during the run: {others:.2f} cores on average")
    fails = sum(v in ("FAIL", "ERR") for r in rows for v in (r["time_verdict"], r["memory_verdict"]))
    print(f"targets: time <={TIME_TARGET:g}x, peak memory <={MEMORY_TARGET:g}x -> "
          f"{'ALL PASS' if not fails else f'{fails} FAIL/ERR'}  ({elapsed:.0f}s)")
    out = Path(args.json)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps({"torch": torch.__version__, "threads": torch.get_num_threads(),
                               "cpus": os.cpu_count(), "python": platform.python_version(), "apis": APIS,
                               "targets": {"time": TIME_TARGET, "memory": MEMORY_TARGET},
                               "other_processes_cores": others, "elapsed_s": elapsed, "results": rows},
                              indent=2, default=str))
    print(f"JSON: {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
