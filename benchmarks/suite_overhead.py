"""What the plugin costs a user's own test suite: a small suite of tiny models in plain PyTorch
(benchmarks/suites/tiny_models: MLPs, a conv net, attention, layer norms, a transformer layer, an
LSTM, embeddings; a few training steps each, 51 tests) run plain and under each ``--msprobe-task``,
each run one pytest process, the runs interleaved (the order rotating every repeat), medians.

    python benchmarks/suite_overhead.py                        # 3 repeats, ~10-15 min on 2 shared cores
    python benchmarks/suite_overhead.py --repeats 1 --trivial 40 --profile-tasks free_benchmark  # a quick check
    python benchmarks/suite_overhead.py --suites trivial --tasks free_benchmark   # fixed costs only

The plugin's fixed per-test cost is measured on a trivial suite: N tests that each call one torch op,
and the same file with 1 test, under each task and plain. With D(n) = pytest.main time probed - plain
for n tests, per test = (D(N) - D(1)) / (N - 1) and per session = D(1) - per test. One run of the N-test
suite per task under cProfile then lists the top cumulative entries inside pytest_msprobe/ and probes/:
where that per-test cost goes.

Each run goes through benchmarks/third_party_suites.py's run_one (JUnit outcomes, the probe's errors,
``--msprobe-fail-on=never``, a fresh TORCHINDUCTOR_CACHE_DIR) with its TIMED_LAUNCHER: torch is
imported before pytest.main, whose duration is the ratio's measure (``pytest.main s``), so interpreter
start and torch's import, paid alike by plain and probed runs, do not dilute it; the wall time of the
process is shown beside it. ``broken`` = tests that passed plain and did not pass probed. The suites
are copied to a temp dir with their own pytest.ini (this repository's configuration stays out).
Targets (issue 36): free_benchmark <= 1.5x, online_dispatch <= 2.5x on the tiny-model suite.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import pstats
import shutil
import statistics
import sys
import tempfile
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
import third_party_suites as tps  # noqa: E402

SUITE_DIR = Path(__file__).resolve().parent / "suites" / "tiny_models"
TARGETS = {"free_benchmark": 1.5, "online_dispatch": 2.5}
TRIVIAL = '''import pytest
import torch

X = torch.ones(8)


@pytest.mark.parametrize("i", range({n}))
def test_one_op(i):
    assert torch.add(X, i)[0] == 1 + i
'''
#: cProfile around pytest.main (torch imported first), the stats dumped to $SUITE_OVERHEAD_PROFILE
PROFILED_LAUNCHER = [sys.executable, "-c", "import os, sys, time, cProfile, torch, pytest; p = cProfile.Profile(); "
                     "t = time.perf_counter(); p.enable(); rc = pytest.main(sys.argv[1:]); p.disable(); "
                     "print(f'pytest.main: {time.perf_counter() - t:.6f} s', flush=True); "
                     "p.dump_stats(os.environ['SUITE_OVERHEAD_PROFILE']); sys.exit(rc)"]


def make_suites(work: Path, trivial: int) -> dict[str, Path]:
    """The suites' directories under `work`, each with an empty pytest.ini (its own rootdir)."""
    dirs = {"tiny_models": work / "tiny_models", "trivial": work / f"trivial{trivial}", "trivial1": work / "trivial1"}
    shutil.copytree(SUITE_DIR, dirs["tiny_models"], ignore=shutil.ignore_patterns("__pycache__"))
    for key, n in (("trivial", trivial), ("trivial1", 1)):
        dirs[key].mkdir()
        (dirs[key] / "test_trivial.py").write_text(TRIVIAL.replace("{n}", str(n)))
    for d in dirs.values():
        (d / "pytest.ini").write_text("[pytest]\n")
    return dirs


def run_rounds(suite: str, cwd: Path, tasks: list[str], repeats: int, runs: Path, env: dict[str, str],
               timeout: float) -> dict[str, list[dict[str, Any]]]:
    """`repeats` rounds of one run per task, the order rotating every round."""
    out: dict[str, list[dict[str, Any]]] = {t: [] for t in tasks}
    for r in range(repeats):
        k = r % len(tasks)
        for task in tasks[k:] + tasks[:k]:
            res = tps.run_one(f"{suite}-r{r}", cwd, [], env, task, runs, str(runs / "basetemp"), timeout, [],
                              launcher=tps.TIMED_LAUNCHER)
            out[task].append(res)
    return out


def _median(results: list[dict[str, Any]], key: str) -> float | None:
    values = [r[key] for r in results if r.get(key) is not None]
    return statistics.median(values) if values else None


def summarize(suite: str, by_task: dict[str, list[dict[str, Any]]]) -> list[dict[str, Any]]:
    plain = by_task["plain"]
    base_main, base_wall = _median(plain, "pytest_main_s"), _median(plain, "wall_s")
    rows = []
    for task, results in by_task.items():
        main_s, wall = _median(results, "pytest_main_s"), _median(results, "wall_s")
        broken = sorted({b[0] for r, p in zip(results, plain) for b in tps.compare(p, r)[0]}) if task != "plain" else []
        rows.append({
            "suite": suite, "task": task, "tests": len(results[0]["tests"]), "counts": results[0]["counts"],
            "pytest_main_s": main_s, "wall_s": wall, "runs_pytest_main_s": [r.get("pytest_main_s") for r in results],
            "x_plain": main_s / base_main if main_s and base_main and task != "plain" else None,
            "x_plain_wall": wall / base_wall if wall and base_wall and task != "plain" else None,
            "target": TARGETS.get(task) if suite == "tiny_models" else None, "broken": broken,
            "probe_errors": sum(len(r.get("probe_errors", [])) for r in results) if task != "plain" else 0,
            "test_time_s": statistics.median(sum(t["time"] for t in r["tests"].values()) for r in results),
        })
    return rows


def print_suite_table(rows: list[dict[str, Any]]) -> None:
    head = ("suite", "task", "tests", "P F E S", "pytest.main s", "x plain", "target", "", "wall s", "x wall",
            "broken", "probe err")
    cells = []
    for r in rows:
        x, target = r["x_plain"], r["target"]
        verdict = "" if r["task"] == "plain" else ("n/a" if target is None or x is None else
                                                   ("PASS" if x <= target else "FAIL"))
        cells.append((r["suite"], r["task"], str(r["tests"]), tps.fmt_counts(r["counts"]),
                      _f(r["pytest_main_s"], ".2f"), _f(x, ".2f"), _f(target, ".1f"), verdict,
                      _f(r["wall_s"], ".1f"), _f(r["x_plain_wall"], ".2f"), str(len(r["broken"])),
                      str(r["probe_errors"])))
    widths = [max(len(c[i]) for c in [head, *cells]) for i in range(len(head))]
    for c in [head, *cells]:
        print("  ".join(v.ljust(w) if i < 2 else v.rjust(w) for i, (v, w) in enumerate(zip(c, widths))))
    for r in rows:
        for nodeid in r["broken"][:5]:
            print(f"  BROKEN under {r['task']}: {nodeid}")


def _f(v: float | None, spec: str) -> str:
    return "-" if v is None else format(v, spec)


def fixed_costs(rows: list[dict[str, Any]], n: int) -> list[dict[str, Any]]:
    """Per-test and per-session cost of each task from the trivial suites' pytest.main medians."""
    by = {(r["suite"], r["task"]): r for r in rows}
    out = []
    for (suite, task), r in by.items():
        if suite != "trivial" or task == "plain" or ("trivial1", task) not in by:
            continue
        d_n = r["pytest_main_s"] - by[("trivial", "plain")]["pytest_main_s"]
        d_1 = by[("trivial1", task)]["pytest_main_s"] - by[("trivial1", "plain")]["pytest_main_s"]
        per_test = (d_n - d_1) / (n - 1)
        in_tests = (r["test_time_s"] - by[("trivial", "plain")]["test_time_s"]) / n  # setup + call + teardown
        out.append({"task": task, "per_test_ms": per_test * 1e3, "per_session_ms": (d_1 - per_test) * 1e3,
                    "in_test_protocol_ms": in_tests * 1e3,
                    "plain_per_test_ms": by[("trivial", "plain")]["test_time_s"] / n * 1e3})
    return out


def plugin_dirs() -> tuple[str, ...]:
    dirs = []
    for name in ("pytest_msprobe", "probes"):
        spec = importlib.util.find_spec(name)
        dirs += [str(Path(p).resolve()) for p in (spec.submodule_search_locations or [])] if spec else []
    return tuple(dirs)


def profile_task(task: str, cwd: Path, runs: Path, env: dict[str, str], n: int, timeout: float, top: int) -> dict[str, Any]:
    """One cProfile'd run of the trivial suite under `task`; the top cumulative entries in the plugin."""
    prof = runs / f"trivial-profile-{task}.prof"
    res = tps.run_one("trivial-profile", cwd, [], {**env, "SUITE_OVERHEAD_PROFILE": str(prof)}, task, runs,
                      str(runs / "basetemp"), timeout, [], launcher=PROFILED_LAUNCHER)
    if not prof.exists():
        print(f"\n[profile {task}] no profile written (see {res['log']})")
        return {"task": task, "entries": []}
    stats = pstats.Stats(str(prof))
    roots = plugin_dirs()
    entries = []
    for (file, line, func), (_cc, ncalls, tottime, cumtime, _callers) in stats.stats.items():  # type: ignore[attr-defined]
        if file.startswith(roots):
            short = file.split("/pytest_msprobe/")[-1] if "/pytest_msprobe/" in file else file.split("/probes/")[-1]
            pkg = "pytest_msprobe" if "/pytest_msprobe/" in file else "probes"
            entries.append({"where": f"{pkg}/{short}:{line}({func})", "ncalls": ncalls, "tottime": tottime,
                            "cumtime": cumtime})
    entries.sort(key=lambda e: -e["cumtime"])
    own = sum(e["tottime"] for e in entries)
    print(f"\n[profile {task}] trivial suite, {n} tests, pytest.main {_f(res.get('pytest_main_s'), '.2f')} s under "
          f"cProfile; own time of all plugin/probe functions {own:.2f} s = {own / n * 1e3:.2f} ms/test")
    print(f"  {'cum s':>7} {'ms/test':>8} {'own s':>7} {'calls':>7} {'calls/test':>10}  function")
    for e in entries[:top]:
        print(f"  {e['cumtime']:7.3f} {e['cumtime'] / n * 1e3:8.2f} {e['tottime']:7.3f} {e['ncalls']:7d} "
              f"{e['ncalls'] / n:10.1f}  {e['where']}")
    print("  top own time:")
    for e in sorted(entries, key=lambda e: -e["tottime"])[:8]:
        print(f"  {e['tottime']:7.3f} s own, {e['ncalls']:7d} calls  {e['where']}")
    return {"task": task, "pytest_main_s": res.get("pytest_main_s"), "plugin_own_s": own, "entries": entries[:40]}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeats", type=int, default=3, help="rounds of runs (1 or 2: a check that it works)")
    parser.add_argument("--tasks", default=",".join(tps.TASKS))
    parser.add_argument("--suites", default="tiny_models,trivial", help="tiny_models and/or trivial")
    parser.add_argument("--trivial", type=int, default=100, help="tests in the trivial suite (N >= 2)")
    parser.add_argument("--threads", type=int, default=1, help="OMP_NUM_THREADS of the runs (1: steadier on a shared machine)")
    parser.add_argument("--profile-tasks", default=None, help="tasks to profile on the trivial suite (default: --tasks; 'none')")
    parser.add_argument("--top", type=int, default=15)
    parser.add_argument("--timeout", type=float, default=1800.0)
    parser.add_argument("--runs", type=Path, default=None, help="logs, JUnit files, dumps (default: a temp dir, kept)")
    parser.add_argument("--json", type=Path, default=None)
    args = parser.parse_args(argv)
    tasks = [t for t in args.tasks.split(",") if t]
    if unknown := [t for t in tasks if t not in tps.TASKS]:
        parser.error(f"unknown task(s): {unknown}")
    if args.trivial < 2:
        parser.error("--trivial must be >= 2")
    work = Path(tempfile.mkdtemp(prefix="suite_overhead_"))
    runs = (args.runs or work / "runs").resolve()
    runs.mkdir(parents=True, exist_ok=True)
    dirs = make_suites(work, args.trivial)
    env = {"OMP_NUM_THREADS": str(args.threads), "MKL_NUM_THREADS": str(args.threads)}
    suites = [s for s in args.suites.split(",") if s]
    names = [s for suite in suites for s in (["trivial", "trivial1"] if suite == "trivial" else [suite])]
    rows: list[dict[str, Any]] = []
    for name in names:
        rows += summarize(name, run_rounds(name, dirs[name], ["plain", *tasks], args.repeats, runs, env, args.timeout))
    print(f"\n=== suite overhead: pytest.main time, median of {args.repeats} interleaved run(s), "
          f"{args.threads} thread(s); plugin at {tps.plugin_state()} ===")
    print_suite_table(rows)
    costs = fixed_costs(rows, args.trivial) if "trivial" in suites else []
    if costs:
        print(f"\nplugin fixed costs (trivial suite, {args.trivial} tests vs 1; plain: "
              f"{costs[0]['plain_per_test_ms']:.2f} ms/test in the test protocol)")
        print(f"  {'task':16} {'ms/test':>8} {'ms/session':>10} {'ms/test in setup+call+teardown':>31}")
        for c in costs:
            print(f"  {c['task']:16} {c['per_test_ms']:8.2f} {c['per_session_ms']:10.1f} {c['in_test_protocol_ms']:31.2f}")
    profiles = []
    profile_tasks = tasks if args.profile_tasks is None else [t for t in args.profile_tasks.split(",") if t != "none"]
    if "trivial" in suites:
        profiles = [profile_task(t, dirs["trivial"], runs, env, args.trivial, args.timeout, args.top)
                    for t in profile_tasks]
    if os.environ.get("PYTHONDONTWRITEBYTECODE"):
        print("\nnote: PYTHONDONTWRITEBYTECODE is set, so every run compiles each module it imports (pytest also "
              "rewrites the asserts of every plugin module): the per-session figures include that")
    print(f"\nruns, logs and dumps: {runs}")
    if args.json is not None:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps({"repeats": args.repeats, "threads": args.threads, "rows": rows,
                                         "fixed_costs": costs, "profiles": profiles}, indent=1, default=str))
    return 0


if __name__ == "__main__":
    sys.exit(main())
