"""Cost of free_benchmark preheat on the medium transformer: each preheat step against a plain step.

Preheat (``if_preheat``) spends one census step per API (calls counted, nothing re-run) and then
``preheat_step`` sampling steps in which every call is checked and k = min(ceil(B / P), max_sample)
calls per API are also run on the CPU and judged by the single-benchmark rule. Target (issue 7):
every preheat step <= 20x the plain step.

The medium transformer of free_benchmark_overhead.py (imported), one process: plain and probed steps
alternate (plain, probed, plain, ...), each timed alone; the ratio of a probed step is its time over
the median plain step. The default P = 5 is harsher per step than msprobe's 15 (more samples per
step: k grows as P shrinks).

    python benchmarks/free_benchmark_preheat_overhead.py                 # ~3 min on 2 cores
    python benchmarks/free_benchmark_preheat_overhead.py --configs medium-bf16:bit_noise --preheat-step 15
"""

from __future__ import annotations

import argparse
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

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
for p in (str(ROOT), str(HERE)):
    if p not in sys.path:
        sys.path.insert(0, p)

import free_benchmark_overhead as fbo  # noqa: E402
import torch  # noqa: E402

RESULTS = ROOT / "benchmarks" / "results" / "free_benchmark_preheat_overhead.json"
CONFIGS = ["medium-fp32:add_noise", "medium-bf16:bit_noise"]
TIME_TARGET = 20.0


def make_debugger(mode: str, dump_path: str, preheat_step: int, max_sample: int) -> Any:
    from probes.pytorch import PrecisionDebugger

    return PrecisionDebugger(config={"task": "free_benchmark", "dump_path": dump_path, "free_benchmark": {
        "pert_mode": mode, "handler_type": "check", "if_preheat": True, "preheat_step": preheat_step,
        "max_sample": max_sample}})


def _step_time(fn: Any) -> float:
    t0 = time.perf_counter()
    fn()
    return time.perf_counter() - t0


def run_config(model: str, mode: str, preheat_step: int, max_sample: int, after: int) -> dict[str, Any]:
    bench = fbo.Bench(fbo.SPECS[model])
    bench.step()  # warm-up: kernels loaded, allocator primed
    with tempfile.TemporaryDirectory(prefix="fb_preheat_") as tmp:
        dbg = make_debugger(mode, tmp, preheat_step, max_sample)
        plain_s: list[float] = []
        probed_s: list[float] = []
        for _ in range(1 + preheat_step + after):
            plain_s.append(_step_time(bench.step))
            probed_s.append(_step_time(lambda: fbo.probed_step(dbg, bench)))
        summary = dbg.summary()
    plain = statistics.median(plain_s)
    ratios = [t / plain for t in probed_s]
    apis = summary["apis"].values()
    samples = sum(d["samples"] for a in apis for d in ((a.get("preheat") or {}).get("dtypes") or {}).values())
    return {
        "model": model, "mode": mode, "preheat_step": preheat_step, "max_sample": max_sample,
        "plain_ms": 1000 * plain, "plain_noise": max(plain_s) / min(plain_s),
        "census_x": ratios[0], "sampling_x": ratios[1 : 1 + preheat_step],
        "sampling_max_x": max(ratios[1 : 1 + preheat_step]),
        "sampling_median_x": statistics.median(ratios[1 : 1 + preheat_step]),
        "after_x": ratios[1 + preheat_step :],
        "cpu_samples_per_sampling_step": samples / preheat_step,
        "checked": sum(a["checked"] for a in apis), "rows_after_preheat": summary["rows_total"],
        "preheat_rows": summary["preheat"]["rows_total"], "errors": summary["errors"],
    }


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--configs", nargs="+", default=CONFIGS, help="model:mode pairs (models of free_benchmark_overhead.py)")
    ap.add_argument("--preheat-step", type=int, default=5)
    ap.add_argument("--max-sample", type=int, default=20)
    ap.add_argument("--after", type=int, default=2, help="steps timed after preheat")
    ap.add_argument("--threads", type=int, default=1, help="torch intra-op threads (1: less noise on a shared machine)")
    args = ap.parse_args(argv)
    torch.set_num_threads(args.threads)
    logging.getLogger("probes").setLevel(logging.ERROR)
    results = []
    for entry in args.configs:
        model, mode = entry.split(":")
        results.append(run_config(model, mode, args.preheat_step, args.max_sample, args.after))
    head = ("model / mode", "plain step", "census x", "sampling x (median / max)", "after x", "CPU samples/step",
            "rows after", "verdict")
    rows = []
    for r in results:
        worst = max([r["census_x"], r["sampling_max_x"]])
        rows.append((
            f"{r['model']} {r['mode']}", f"{r['plain_ms']:.0f} ms", f"{r['census_x']:.2f}",
            f"{r['sampling_median_x']:.2f} / {r['sampling_max_x']:.2f}",
            " ".join(f"{x:.2f}" for x in r["after_x"]), f"{r['cpu_samples_per_sampling_step']:.1f}",
            str(r["rows_after_preheat"]), fbo.verdict(worst, TIME_TARGET),
        ))
    fbo.print_columns(head, tuple(max(len(h), *(len(row[i]) for row in rows)) for i, h in enumerate(head)), rows)
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    RESULTS.write_text(json.dumps({
        "machine": {"platform": platform.platform(), "cpus": os.cpu_count(), "torch": torch.__version__,
                    "threads": args.threads},
        "target_x": TIME_TARGET, "results": results}, indent=1))
    print(f"\nresults: {RESULTS.relative_to(ROOT)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
