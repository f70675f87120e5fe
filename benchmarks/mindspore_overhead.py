"""Overhead of free_benchmark and grad_probe L1 on a MindSpore (2.x, CPU) training loop: PyNative,
and for grad_probe also a training step compiled with ``mindspore.jit`` (statistics in the graph).

Same method as free_benchmark_overhead.py, whose timing and report helpers this script imports:
plain and probed loops run in ONE process, interleaved (the order alternates every repeat), after a
warm-up; the time ratio is median(probed loop) / median(plain loop). The plain loop drives a second
model built from the same seed, so grad_probe's monitor (which hooks only the optimizer it is given)
never touches it; free_benchmark does the same for symmetry (its patches are active only between
``dbg.start()`` and ``dbg.stop()``).

    python benchmarks/mindspore_overhead.py            # 5 free_benchmark modes + grad_probe L1 (PyNative, jit)
    python benchmarks/mindspore_overhead.py --modes grad_probe_L1_jit
    python benchmarks/mindspore_overhead.py --quick    # fewer repeats

See benchmarks/README.md for how to read the table.
"""

from __future__ import annotations

import argparse
import cProfile
import io
import json
import logging
import os
import platform
import pstats
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Callable

ROOT = Path(__file__).resolve().parents[1]
for _p in (ROOT, Path(__file__).resolve().parent):
    if str(_p) not in sys.path:
        sys.path.insert(0, str(_p))

from free_benchmark_overhead import (  # noqa: E402
    cpu_snapshot,
    fmt,
    loop_figures,
    other_cpu_load,
    print_columns,
    probe_counts,
    time_interleaved,
    verdict,
)

RESULTS = ROOT / "benchmarks" / "results" / "mindspore_overhead.json"

FB_MODES = ("improve_precision", "add_noise", "bit_noise", "change_value", "no_change")
GRAD = "grad_probe_L1"
GRAD_JIT = "grad_probe_L1_jit"  # the training step compiled with mindspore.jit: statistics computed in the graph
TARGET = {"free_benchmark": 3.0, "grad_probe": 1.5, GRAD_JIT: 1.1}

ms: Any = None  # mindspore, imported in main() after --threads is applied
nn: Any = None


def import_mindspore(threads: int | None) -> None:
    global ms, nn
    if threads:
        for var in ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS"):
            os.environ[var] = str(threads)
    import mindspore
    import mindspore.nn

    ms, nn = mindspore, mindspore.nn
    from probes.backends import mindspore_xp

    mindspore_xp.warm_up()
    ms.set_context(mode=ms.PYNATIVE_MODE, device_target="CPU")


# model ------------------------------------------------------------------------------------------------
def build_model(d: int, heads: int, layers: int, classes: int) -> Any:
    ops = ms.ops

    class Block(nn.Cell):
        """Pre-norm block: LayerNorm + causal matmul attention, LayerNorm + GELU MLP (4x)."""

        def __init__(self) -> None:
            super().__init__()
            self.heads = heads
            self.ln1 = nn.LayerNorm((d,))
            self.qkv = nn.Dense(d, 3 * d)
            self.proj = nn.Dense(d, d)
            self.ln2 = nn.LayerNorm((d,))
            self.fc1 = nn.Dense(d, 4 * d)
            self.fc2 = nn.Dense(4 * d, d)
            self.gelu = nn.GELU(approximate=False)

        def construct(self, x: Any, mask: Any) -> Any:
            b, t, _ = x.shape
            h = self.heads
            qkv = self.qkv(self.ln1(x))
            q, k, v = ops.split(qkv, d, axis=-1)
            q, k, v = (z.reshape(b, t, h, d // h).transpose(0, 2, 1, 3) for z in (q, k, v))
            s = ops.matmul(q, k.transpose(0, 1, 3, 2)) * (1.0 / (d // h) ** 0.5) + mask
            a = ops.matmul(ops.softmax(s, axis=-1), v)
            x = x + self.proj(a.transpose(0, 2, 1, 3).reshape(b, t, d))
            return x + self.fc2(self.gelu(self.fc1(self.ln2(x))))

    class Medium(nn.Cell):
        def __init__(self) -> None:
            super().__init__()
            self.blocks = nn.CellList([Block() for _ in range(layers)])
            self.ln = nn.LayerNorm((d,))
            self.head = nn.Dense(d, classes)

        def construct(self, x: Any, mask: Any) -> Any:
            for blk in self.blocks:
                x = blk(x, mask)
            return self.head(self.ln(x))

    return Medium()


class Bench:
    """A model, its Adam optimizer and one fixed batch; step() is one training step."""

    def __init__(self, seed: int = 0, d: int = 128, heads: int = 4, layers: int = 2,
                 batch: int = 4, tokens: int = 64, classes: int = 128, jit: bool = False) -> None:
        import numpy as np

        ms.set_seed(seed)
        rng = np.random.default_rng(seed)
        self.model = build_model(d, heads, layers, classes)
        self.opt = nn.Adam(self.model.trainable_params(), learning_rate=1e-4)
        self.x = ms.Tensor(rng.standard_normal((batch, tokens, d)).astype(np.float32))
        self.y = ms.Tensor(rng.integers(0, classes, (batch * tokens,)).astype(np.int32))
        causal = np.triu(np.full((tokens, tokens), -1e9, dtype=np.float32), k=1)
        self.mask = ms.Tensor(causal)
        self.classes = classes
        loss_fn = nn.CrossEntropyLoss()

        def forward(x: Any, mask: Any, y: Any) -> Any:
            out = self.model(x, mask)
            return loss_fn(out.reshape(-1, classes), y)

        self.grad_fn = ms.value_and_grad(forward, None, self.opt.parameters)
        grad_fn, opt = self.grad_fn, self.opt

        def train(x: Any, mask: Any, y: Any) -> Any:
            loss, grads = grad_fn(x, mask, y)
            opt(grads)
            return loss

        self.train = ms.jit(train) if jit else train

    def step(self) -> float:
        return float(self.train(self.x, self.mask, self.y).asnumpy())


# probes -----------------------------------------------------------------------------------------------
def make_debugger(mode: str, dump_path: str) -> Any:
    from probes.mindspore import PrecisionDebugger

    if mode in (GRAD, GRAD_JIT):
        return PrecisionDebugger(config={"task": "grad_probe", "dump_path": dump_path,
                                         "grad_probe": {"grad_level": "L1"}})
    return PrecisionDebugger(config={"task": "free_benchmark", "dump_path": dump_path,
                                     "free_benchmark": {"pert_mode": mode, "handler_type": "check"}})


def probed_step_fn(mode: str, dbg: Any, bench: Bench) -> Callable[[], float]:
    if mode in (GRAD, GRAD_JIT):
        dbg.monitor(bench.opt)
        return bench.step

    def step() -> float:
        dbg.start()
        try:
            loss = bench.step()
        finally:
            dbg.stop()
        dbg.step()
        return loss

    return step


def time_config(mode: str, repeats: int, steps: int, warmup: int) -> dict[str, Any]:
    jit = mode == GRAD_JIT
    plain_bench, probed_bench = Bench(jit=jit), Bench(jit=jit)
    with tempfile.TemporaryDirectory(prefix="ms_overhead_") as tmp:
        dbg = make_debugger(mode, tmp)
        probed_step = probed_step_fn(mode, dbg, probed_bench)

        def plain() -> None:
            for _ in range(steps):
                plain_bench.step()

        def probed() -> None:
            for _ in range(steps):
                probed_step()

        try:
            for _ in range(warmup):
                plain_bench.step()
            for _ in range(warmup):
                probed_step()
            plain_s, probed_s = time_interleaved(plain, probed, repeats)
            extra: dict[str, Any] = {}
            if mode in (GRAD, GRAD_JIT):
                s = dbg.summary() or {}
                extra = {"monitor_summary_keys": sorted(s), "paths": s.get("paths"),
                         "steps_not_recorded": (s.get("steps_not_recorded") or {}).get("count")}
            else:
                probed_steps = warmup + repeats * steps
                counts = probe_counts(dbg)
                extra = {**counts, "checked_per_step": counts["checked"] / probed_steps,
                         "calls_per_step": counts["calls"] / probed_steps}
        finally:
            if mode in (GRAD, GRAD_JIT):
                dbg.stop()
    return {**loop_figures(plain_s, probed_s, steps), **extra}


def profile_config(mode: str, steps: int, limit: int = 12) -> str:
    bench = Bench(jit=mode == GRAD_JIT)
    with tempfile.TemporaryDirectory(prefix="ms_overhead_prof_") as tmp:
        dbg = make_debugger(mode, tmp)
        step = probed_step_fn(mode, dbg, bench)
        step()
        prof = cProfile.Profile()
        prof.enable()
        for _ in range(steps):
            step()
        prof.disable()
        if mode in (GRAD, GRAD_JIT):
            dbg.stop()
    buf = io.StringIO()
    pstats.Stats(prof, stream=buf).sort_stats("cumulative").print_stats("probes/", limit)
    body = buf.getvalue()
    start = body.find("   ncalls")
    return f"== cProfile of {steps} probed steps, {mode}: cumulative time, functions in probes/\n" + (
        body[start:] if start >= 0 else body)


# report -----------------------------------------------------------------------------------------------
def print_table(rows: list[dict[str, Any]]) -> None:
    head = ("task", "mode", "plain ms", "probed ms", "time x", "target", "", "min x", "noise", "drift",
            "chk/step", "flag rows", "errors")
    widths = (14, 17, 8, 9, 6, 6, 4, 6, 5, 5, 8, 9, 6)
    cell_rows = []
    for r in rows:
        t = r.get("timing") or {}
        cells = (
            r["task"], r["mode"], fmt(t.get("plain_ms_per_step"), ".1f"), fmt(t.get("probed_ms_per_step"), ".1f"),
            fmt(t.get("time_ratio"), ".2f"), f"<={r['target']:g}", r["verdict"], fmt(t.get("time_ratio_min"), ".2f"),
            fmt(t.get("plain_noise"), ".1f"), fmt(t.get("probed_drift"), ".2f"),
            fmt(t.get("checked_per_step"), ".1f"), str(t.get("flagged_rows", "-")),
            str(len(t["errors"])) if "errors" in t else "-",
        )
        cell_rows.append(cells)
    print_columns(head, widths, cell_rows)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true", help="3 repeats, 1 step per loop, 1 warm-up step")
    ap.add_argument("--modes", help=f"comma list of {', '.join(FB_MODES)}, {GRAD}, {GRAD_JIT} (default: all)")
    ap.add_argument("--repeats", type=int, help="timed repeats of each loop (default 5, --quick 3)")
    ap.add_argument("--steps", type=int, help="training steps per timed loop (default 2, --quick 1)")
    ap.add_argument("--threads", type=int, help="OMP/MKL/OpenBLAS threads, set before mindspore is imported")
    ap.add_argument("--profile", action="store_true", help="after the table, cProfile every failing config")
    ap.add_argument("--profile-steps", type=int, default=2)
    ap.add_argument("--json", default=str(RESULTS), help="where to write the JSON results")
    ap.add_argument("--verbose", action="store_true", help="keep the probe's log messages")
    args = ap.parse_args(argv)

    modes = args.modes.split(",") if args.modes else [*FB_MODES, GRAD, GRAD_JIT]
    for m in modes:
        if m not in (*FB_MODES, GRAD, GRAD_JIT):
            ap.error(f"unknown mode {m!r}; choose from {', '.join(FB_MODES)}, {GRAD}, {GRAD_JIT}")
    repeats = args.repeats or (3 if args.quick else 5)
    steps = args.steps or (1 if args.quick else 2)
    warmup = 1
    if not args.verbose:
        logging.getLogger("probes").setLevel(logging.ERROR)
    import_mindspore(args.threads)

    load_start = os.getloadavg()[0]
    cpu_start = cpu_snapshot()
    t_start = time.perf_counter()
    rows: list[dict[str, Any]] = []
    for mode in modes:
        task = "grad_probe" if mode in (GRAD, GRAD_JIT) else "free_benchmark"
        label = {GRAD: "L1", GRAD_JIT: "L1 jit step"}.get(mode, mode)
        row: dict[str, Any] = {"task": task, "mode": label, "target": TARGET[GRAD_JIT if mode == GRAD_JIT else task]}
        try:
            row["timing"] = time_config(mode, repeats, steps, warmup)
        except Exception as exc:
            row["timing"] = None
            row["timing_error"] = f"{type(exc).__name__}: {exc}"
        t = row["timing"]
        row["verdict"] = verdict(t and t["time_ratio"], row["target"])
        rows.append(row)
        msg = (f"x{t['time_ratio']:.2f} ({t['probed_ms_per_step']:.1f} vs {t['plain_ms_per_step']:.1f} ms/step)"
               if t else f"ERROR {row['timing_error']}")
        print(f"[{time.perf_counter() - t_start:6.1f}s] {task} {row['mode']}: {msg}", file=sys.stderr, flush=True)

    elapsed = time.perf_counter() - t_start
    others = other_cpu_load(cpu_start, cpu_snapshot(), elapsed)
    print(f"MindSpore overhead: mindspore {ms.__version__}, CPU PyNative, threads={args.threads or 'default'}, "
          f"{os.cpu_count()} CPUs, repeats={repeats}, {steps} step(s)/loop, median of interleaved repeats")
    print_table(rows)
    fails = [r for r in rows if r["verdict"] in ("FAIL", "ERR")]
    for r in rows:
        if r.get("timing_error"):
            print(f"ERROR {r['task']} {r['mode']}: {r['timing_error']}")
        elif r["timing"] and r["timing"].get("errors"):
            for e in r["timing"]["errors"]:
                print(f"probe error {r['mode']}: {e.get('api')} x{e.get('count')}: {e.get('error')}")
    if others is not None:
        print(f"CPU used by other processes during the run: {others:.2f} cores on average "
              f"(1-min load average {load_start:.2f} at start)")
    if (others or 0) > 0.25:
        print("WARNING: other processes used the CPUs during the run; compare 'min x', or rerun on a quiet machine")
    print(f"targets: free_benchmark <=3x, grad_probe L1 <=1.5x (a jit step: <=1.1x) -> "
          f"{'ALL PASS' if not fails else f'{len(fails)} FAIL/ERR'}  ({elapsed:.0f}s)")

    profiles: dict[str, str] = {}
    if args.profile:
        for r in fails:
            if r["timing"] is None:
                continue
            mode = {"L1": GRAD, "L1 jit step": GRAD_JIT}.get(r["mode"], r["mode"])
            profiles[mode] = profile_config(mode, args.profile_steps)
            print(profiles[mode])

    out = Path(args.json)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps({
        "mindspore": ms.__version__, "threads": args.threads, "cpus": os.cpu_count(),
        "python": platform.python_version(), "machine": platform.machine(), "repeats": repeats,
        "steps_per_loop": steps, "warmup": warmup, "targets": TARGET, "elapsed_s": elapsed,
        "load_average_start": load_start, "other_processes_cores": others, "results": rows,
        "profiles": profiles,
    }, indent=2, default=str))
    print(f"JSON: {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
