"""Overhead of online_dispatch (PtdbgDispatch) on a forward and a backward pass, CPU.

For each model the same pass runs plain and inside ``PtdbgDispatch(dump_mode=...)`` in ONE
process, plain and probed repeats interleaved (the order alternates every repeat), after a
warm-up; ``time x`` = median(probed pass) / median(plain pass), separately for the forward pass
(model + cross-entropy) and the backward pass (``loss.backward()``), each in its own context as
msprobe requires. ``f64 x`` times the same pass of a float64 copy of the model: the reference
re-run alone costs about that much, a floor under ``time x`` on a CPU-only machine.

    python benchmarks/online_dispatch_overhead.py                 # toy + tiny + medium, auto, 5 repeats
    python benchmarks/online_dispatch_overhead.py --quick         # 3 repeats
    python benchmarks/online_dispatch_overhead.py --process-num 0,1 --models medium --reuse   # the worker pool
    python benchmarks/online_dispatch_overhead.py --background off,on --threads 1              # inline vs thread

See benchmarks/README.md for how to read the table.
"""

from __future__ import annotations

import argparse
import copy
import gc
import json
import logging
import os
import platform
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
for _p in (ROOT, ROOT / "benchmarks"):
    if str(_p) not in sys.path:
        sys.path.insert(0, str(_p))

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402
from free_benchmark_overhead import (  # noqa: E402
    MediumTransformer,
    TinyMLP,
    cpu_snapshot,
    fmt,
    other_cpu_load,
    print_columns,
    verdict,
)

RESULTS = ROOT / "benchmarks" / "results" / "online_dispatch_overhead.json"
TIME_TARGET = {"toy": 12.0, "tiny": 30.0, "medium": 5.0}
# a toy pass takes well under a millisecond: more repeats for a stable median
REPEATS_FACTOR = {"toy": 10}


class Pass:
    """A model, one fixed batch, and its forward / backward passes."""

    def __init__(self, name: str, dtype: torch.dtype = torch.float32, seed: int = 0) -> None:
        torch.manual_seed(seed)
        if name == "toy":  # the size of model test suites train (benchmarks/free_benchmark_overhead.py)
            self.model: torch.nn.Module = TinyMLP(32, 64, 10).to(dtype)
            self.x = torch.randn(16, 32, dtype=dtype)
            self.y = torch.randint(0, 10, (16,))
            self.classes = 10
        elif name == "tiny":
            self.model = TinyMLP().to(dtype)
            self.x = torch.randn(256, 512, dtype=dtype)
            self.y = torch.randint(0, 10, (256,))
            self.classes = 10
        else:
            self.model = MediumTransformer().to(dtype)
            self.x = torch.randn(8, 128, 256, dtype=dtype)
            self.y = torch.randint(0, 256, (8 * 128,))
            self.classes = 256

    def forward(self) -> torch.Tensor:
        self.model.zero_grad(set_to_none=True)
        out = self.model(self.x)
        return F.cross_entropy(out.reshape(-1, self.classes), self.y)


def _timed(fn: Any) -> float:
    gc.collect()
    t0 = time.perf_counter()
    fn()
    return time.perf_counter() - t0


def time_model(name: str, dump_mode: str, process_num: int, repeats: int, warmup: int, dump_root: str,
               reuse: bool = False, background: bool | str = "auto") -> list[dict[str, Any]]:
    from probes.online_dispatch.workers import use_reference_thread
    from probes.pytorch.online_dispatch import PtdbgDispatch

    bench = Pass(name)
    f64 = Pass(name)
    f64.model = copy.deepcopy(bench.model).double()
    f64.x = bench.x.double()
    times: dict[str, dict[str, list[float]]] = {p: {"plain": [], "probed": [], "f64": []} for p in ("forward", "backward")}
    stats = {"ops": [], "failed": 0, "errors": 0}

    def plain(store: bool, which: Pass = bench, key: str = "plain") -> None:
        holder: dict[str, Any] = {}
        tf = _timed(lambda: holder.setdefault("loss", which.forward()))
        tb = _timed(lambda: holder["loss"].backward())
        if store:
            times["forward"][key].append(tf)
            times["backward"][key].append(tb)

    shared = [PtdbgDispatch(dump_mode=dump_mode, dump_path=dump_root, process_num=process_num, background=background)
              for _ in range(2)]

    def probed(store: bool) -> None:
        holder: dict[str, Any] = {}
        if reuse:  # one object per phase for the whole run (worker processes started once)
            fwd, bwd = shared
        else:  # a new context per pass, as `with PtdbgDispatch(...)` is usually written
            fwd, bwd = (PtdbgDispatch(dump_mode=dump_mode, dump_path=dump_root, process_num=process_num,
                                      background=background) for _ in range(2))
        before = [d.results.summary() if d.results is not None else None for d in (fwd, bwd)]

        def run_fwd() -> None:
            with fwd:
                holder["loss"] = bench.forward()

        def run_bwd() -> None:
            with bwd:
                holder["loss"].backward()

        tf = _timed(run_fwd)
        tb = _timed(run_bwd)
        if store:
            times["forward"]["probed"].append(tf)
            times["backward"]["probed"].append(tb)
            for d, b in zip((fwd, bwd), before):
                s = d.results.summary()
                stats["ops"].append(s["ops_compared"] - (b["ops_compared"] if b else 0))
                stats["failed"] += s["failed_op_count"] - (b["failed_op_count"] if b else 0)
                stats["errors"] += len(s["probe_errors"]) - (len(b["probe_errors"]) if b else 0)

    for _ in range(warmup):
        plain(False)
        probed(False)
        plain(False, f64)
    for _ in range(warmup * (REPEATS_FACTOR.get(name, 1) - 1)):
        plain(False)
        probed(False)
    for r in range(repeats * REPEATS_FACTOR.get(name, 1)):
        order = (plain, probed) if r % 2 == 0 else (probed, plain)
        for fn in order:
            fn(True)
        plain(True, f64, "f64")
    rows = []
    for phase, t in times.items():
        p, q, f = statistics.median(t["plain"]), statistics.median(t["probed"]), statistics.median(t["f64"])
        rows.append({
            "model": name, "phase": phase, "dump_mode": dump_mode, "process_num": process_num, "reuse": reuse,
            # "auto": the thread for ops of at least AUTO_THREAD_BYTES that took at least
            # thread_choice.THREAD_MIN_SECONDS inline, where it can overlap
            "thread": "auto" if background == "auto" and use_reference_thread("auto") else
                      "no" if background == "auto" else process_num == 0 and bool(background),
            "plain_ms": p * 1e3, "probed_ms": q * 1e3, "time_ratio": q / p,
            "time_ratio_min": min(t["probed"]) / min(t["plain"]), "f64_ratio": f / p,
            "plain_noise": max(t["plain"]) / min(t["plain"]),
            "ops_per_pass": statistics.median(stats["ops"][0 if phase == "forward" else 1 :: 2]),
            "failed_ops": stats["failed"], "probe_errors": stats["errors"],
            "raw": {k: [round(v * 1e3, 3) for v in vals] for k, vals in t.items()},
            "target": TIME_TARGET.get(name),
        })
    return rows


def print_table(rows: list[dict[str, Any]]) -> None:
    head = ("model", "phase", "mode", "proc", "thread", "plain ms", "probed ms", "time x", "target", "", "min x", "f64 x",
            "noise", "ops/pass", "failed", "errors")
    widths = (7, 9, 5, 4, 6, 8, 9, 6, 6, 4, 6, 5, 5, 8, 6, 6)
    cells = []
    for r in rows:
        t = r["target"]
        cells.append((
            r["model"], r["phase"], r["dump_mode"], str(r["process_num"]),
            r["thread"] if isinstance(r["thread"], str) else "yes" if r["thread"] else "no",
            fmt(r["plain_ms"], ".1f"),
            fmt(r["probed_ms"], ".1f"), fmt(r["time_ratio"], ".2f"), "-" if t is None else f"<={t:g}",
            verdict(r["time_ratio"], t), fmt(r["time_ratio_min"], ".2f"), fmt(r["f64_ratio"], ".2f"),
            fmt(r["plain_noise"], ".1f"), fmt(r["ops_per_pass"], ".0f"), str(r["failed_ops"]), str(r["probe_errors"]),
        ))
    print_columns(head, widths, cells)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--models", default="toy,tiny,medium")
    ap.add_argument("--dump-mode", default="auto", choices=("OFF", "auto", "all"))
    ap.add_argument("--process-num", default="0", help="comma-separated, e.g. 0,1")
    ap.add_argument("--background", default="auto",
                    help="comma-separated PtdbgDispatch(background=...) values: auto, on, off (e.g. off,on)")
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--warmup", type=int, default=1)
    ap.add_argument("--quick", action="store_true", help="3 repeats")
    ap.add_argument("--reuse", action="store_true",
                    help="one PtdbgDispatch per phase for the whole run (worker start-up paid once)")
    ap.add_argument("--threads", type=int, default=None)
    ap.add_argument("--json", default=str(RESULTS))
    ap.add_argument("--verbose", action="store_true")
    args = ap.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    if not args.verbose:
        logging.getLogger("probes").setLevel(logging.ERROR)
    repeats = 3 if args.quick else args.repeats
    rows: list[dict[str, Any]] = []
    t0 = time.perf_counter()
    snap = cpu_snapshot()
    with tempfile.TemporaryDirectory() as tmp:
        for model in args.models.split(","):
            for pn in (int(v) for v in args.process_num.split(",")):
                for bg in args.background.split(","):
                    background = {"auto": "auto", "on": True, "off": False}[bg]
                    rows += time_model(model, args.dump_mode, pn, repeats, args.warmup, tmp, args.reuse, background)
    elapsed = time.perf_counter() - t0
    load = other_cpu_load(snap, cpu_snapshot(), elapsed)
    print_table(rows)
    fails = sum(1 for r in rows if verdict(r["time_ratio"], r["target"]) == "FAIL")
    print(f"\n{fails} FAIL; {elapsed:.0f} s; torch {torch.__version__}, {torch.get_num_threads()} threads, "
          f"other processes used {fmt(load, '.2f')} cores on average")
    if load is not None and load > 0.3:
        print("WARNING: other processes competed for the CPU; rerun on a quiet machine or with --threads 1")
    out = Path(args.json)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps({"rows": rows, "machine": {"torch": torch.__version__, "threads": torch.get_num_threads(),
                                                         "cpus": os.cpu_count(), "python": platform.python_version(),
                                                         "other_load": load}}, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
