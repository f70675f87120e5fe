"""What a new free_benchmark probe costs each test, and a start/stop cycle of a running one,
for one or more source trees of this repo measured interleaved (each run its own process).

    python benchmarks/probe_start_cost.py                      # this checkout
    git worktree add /tmp/before <commit>
    python benchmarks/probe_start_cost.py /tmp/before .        # a commit pair, interleaved

A tree's code is imported without the venv's editable install (the interpreter runs with -S and
the venv's site-packages is appended by hand), so each tree measures its own probes.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import sysconfig
from pathlib import Path

_CHILD = r"""
import sys, time, tempfile, statistics
tree, site, repeats = sys.argv[1], sys.argv[2], int(sys.argv[3])
sys.path[:0] = [tree, site]
import torch
torch.set_num_threads(1)
import probes
from probes.pytorch import PrecisionDebugger
assert probes.__file__.startswith(tree), probes.__file__
per_test, cycle = [], []
x = torch.randn(16, 16)
for i in range(repeats + 2):
    t = time.perf_counter()
    dbg = PrecisionDebugger(config={"task": "free_benchmark", "dump_path": tempfile.mkdtemp(),
                                    "free_benchmark": {"pert_mode": "no_change"}})
    dbg.start(); torch.nn.functional.relu(x); dbg.stop(); dbg.step()
    t1 = time.perf_counter()
    dbg.start(); dbg.stop(); dbg.step()
    t2 = time.perf_counter()
    if i >= 2:  # the first probes import and warm up
        per_test.append(t1 - t); cycle.append(t2 - t1)
print(statistics.median(per_test), statistics.median(cycle))
"""


def measure(tree: Path, repeats: int) -> tuple[float, float]:
    site = sysconfig.get_paths()["purelib"]
    out = subprocess.run([sys.executable, "-S", "-c", _CHILD, str(tree.resolve()), site, str(repeats)],
                         capture_output=True, text=True, check=True, env={**os.environ, "OMP_NUM_THREADS": "1"})
    per_test, cycle = out.stdout.split()[-2:]
    return float(per_test), float(cycle)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("trees", nargs="*", default=[str(Path(__file__).resolve().parents[1])])
    parser.add_argument("--rounds", type=int, default=3, help="interleaved rounds (each tree once per round)")
    parser.add_argument("--repeats", type=int, default=10, help="probes per run (median)")
    args = parser.parse_args(argv)
    found: dict[str, list[tuple[float, float]]] = {t: [] for t in args.trees}
    for _ in range(args.rounds):
        for tree in args.trees:
            found[tree].append(measure(Path(tree), args.repeats))
    print(f"{'tree':40s} {'new probe per test':>20s} {'start+stop+step':>17s}")
    for tree, runs in found.items():
        per_test = statistics.median(r[0] for r in runs) * 1e3
        cycle = statistics.median(r[1] for r in runs) * 1e3
        print(f"{tree:40s} {per_test:17.1f} ms {cycle:14.2f} ms")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
