"""Run third-party projects' own pytest suites plain and under each msprobe task, and compare.

What a new user does: take a project's test suite, run it as it is, then run it again with
``--msprobe-task=free_benchmark|grad_probe|online_dispatch --msprobe-fail-on=never``. With
``fail-on=never`` the probe only reports, so every test that passes plain and fails probed is a
breakage of the probe (it changed what the code computes, or raised inside a probe hook). For
each run the script records the per-test outcomes (JUnit XML), the wall time, the probe's own
errors and "not checked" counts (the per-test ``summary.json`` files under the dump folder),
what the session flagged (``DIR/summary.json``), and the plugin's terminal section.

    python benchmarks/third_party_suites.py                          # every suite in SUITES, plain + 3 tasks
    python benchmarks/third_party_suites.py --suites einops --tasks plain,free_benchmark
    python benchmarks/third_party_suites.py --custom mysuite /path/to/checkout "tests -k small"
    python benchmarks/third_party_suites.py --report-only            # re-read the last runs' files

Options: ``--root`` (where the suites are unpacked, default /tmp/tp), ``--runs`` (where logs, JUnit
files and dump folders go, default ROOT/runs: never inside this repository), ``--basetemp`` (default
/tmp/pt-tp), ``--timeout`` per run (s), ``--json PATH`` (all results), ``--pytest-args "..."`` (added
to every run). Each run is ``python -m pytest ARGS -q -p no:cacheprovider --basetemp=BASETEMP
-o junit_family=xunit1 --junitxml=RUNS/<suite>-<task>.xml`` in the suite's directory (``-p
no:cacheprovider`` and ``--basetemp`` are mandatory on a shared machine: pytest otherwise deletes
other sessions' tmp folders), plus ``--msprobe-task=<task> --msprobe-fail-on=never
--msprobe-dump-path=RUNS/<suite>-<task>`` for the probed runs. Each run gets its own
``TORCHINDUCTOR_CACHE_DIR`` (a fresh temp dir, removed after it), so no run reuses the kernels
another compiled. Runs are sequential (2 shared cores). stdlib only; not a dependency of the package.

Suites (CPU, pure PyTorch), how to obtain them and their dependencies. Do NOT let pip touch torch
or numpy: every install is ``--no-deps`` with the missing packages named.

    mkdir -p /tmp/tp/sdists && cd /tmp/tp
    pip download --no-deps --no-binary :all: einops==0.8.2 -d sdists && tar -xzf sdists/einops-0.8.2.tar.gz
    pip install --no-deps einops==0.8.2 einx==0.4.3 frozendict loguru==0.7.3 torch-einops-utils==0.2.0
    pip download --no-deps --no-binary :all: x-transformers==2.31.10 -d sdists
    pip install --no-deps sdists/x_transformers-2.31.10.tar.gz     # vector-quantize-pytorch's test_fvq uses it

* ``einops`` 0.8.2, PyPI sdist (its tests ship inside the package: einops/tests). Torch backend
  only: ``EINOPS_TEST_BACKENDS=torch``. Command (in /tmp/tp/einops-0.8.2): ``pytest einops/tests``.
  66 tests. Uses torch.jit.trace / torch.jit.script / torch.compile on einops layers.
* ``vq`` / ``vq-lite`` vector-quantize-pytorch, GitHub lucidrains/vector-quantize-pytorch at commit
  0d7d1aa83334b6f2f8a40306bece75cdaa13d065 (pyproject says 1.31.0; the PyPI sdist 1.32.0 has no
  tests). Obtain: the search tool's ``fetch github:lucidrains/vector-quantize-pytorch``, then
  ``git --git-dir=<mirror> archive HEAD | tar -x -C /tmp/tp/vector-quantize-pytorch``. Deps: torch,
  einops, einx (+ x-transformers for test_fvq). Its pyproject puts "." on the path, so the
  checkout's own package is tested. Command: ``pytest tests``. 107 tests. test_lfq_video alone peaks
  at 13.5 GB RSS plain: probed, the session can be OOM-killed on a small machine; ``vq-lite``
  deselects it. test_lfq_bruteforce_frac_per_sample_entropy[*] is a flaky statistical test upstream
  (unseeded, 95% interval): it fails now and then plain, probed or not.
* ``xt`` x-transformers, GitHub lucidrains/x-transformers at commit
  9252ed7838021ee61e6c5be0930b3a9a88efdf06 (pyproject says 2.26.4; the PyPI sdist has no tests).
  Obtain: ``fetch github:lucidrains/x-transformers``, then ``git --git-dir=<mirror> archive HEAD
  x_transformers tests pyproject.toml | tar -x -C /tmp/tp/x-transformers`` (the full archive fails
  on data/enwik8.gz, absent from the mirror). ``python -m pytest`` puts the checkout first on
  sys.path, so its x_transformers is tested, not the installed one. Deps: einops, einx, loguru,
  packaging, torch-einops-utils. Command: ``pytest tests`` with a ``-k`` subset (see SUITES) to
  stay within a few minutes plain.
* ``rope`` rotary-embedding-torch: the repository has no tests on main; its only tests are
  tests/test_rope.py of unmerged commit 741d150d6fe8a787e844d062c2f7a9776478ee95 (an open pull
  request, 128 tests; the checkout's own package, pyproject 0.8.8, is tested). Obtain: ``fetch
  github:lucidrains/rotary-embedding-torch``, ``git --git-dir=<mirror> archive
  741d150d6fe8a787e844d062c2f7a9776478ee95 | tar -x -C /tmp/tp/rotary-embedding-torch-pr``.

Reading the output: ``breakages`` are tests that passed plain and did not pass probed (failed,
error, or skipped/missing); ``fixed`` the reverse (flaky or order-dependent tests show up there).
``probe errors`` counts the entries of the per-test ``errors`` / ``probe_errors`` lists;
``not checked`` sums the per-test ``not_checked`` counts by reason (free_benchmark).
"""

from __future__ import annotations

import argparse
import glob
import json
import os
import re
import shlex
import shutil
import subprocess
import sys
import tempfile
import time
import xml.etree.ElementTree as ET
from collections import Counter
from pathlib import Path
from typing import Any

TASKS = ("free_benchmark", "grad_probe", "online_dispatch")

#: name -> directory under --root, pytest arguments, extra environment
SUITES: dict[str, dict[str, Any]] = {
    "einops": {"dir": "einops-0.8.2", "args": ["einops/tests"], "env": {"EINOPS_TEST_BACKENDS": "torch"}},
    "vq": {"dir": "vector-quantize-pytorch", "args": ["tests"], "env": {}},
    # test_lfq_video peaks at 13.5 GB RSS plain (a 10240 x 65536 distance matrix); probed it needs
    # more than a 23 GB machine has and the OOM killer takes the whole session: vq-lite leaves it out
    "vq-lite": {"dir": "vector-quantize-pytorch", "args": ["tests", "--deselect", "tests/test_readme.py::test_lfq_video"],
                "env": {}},
    "xt": {"dir": "x-transformers", "args": ["tests/test_x_transformers.py", "-k", "XT_SUBSET"], "env": {}},
    "rope": {"dir": "rotary-embedding-torch-pr", "args": ["tests"], "env": {}},
}
# x-transformers: its whole file (201 tests) takes ~26 min plain on 2 shared cores (test_prepend_embed
# 316 s, test_prompts_given_as_list_tensor 213 s). This subset, 100 tests, ~1.5-2 min plain: every test
# function whose slowest case took <= 3 s, plus test_ttt_low_rank; it keeps the torch.func users
# (test_simple_mdlm[True]: vmap(grad_and_value(schedule)); test_ttt_*: vmap(functional_call)).
# Set it to "not flash" to run the whole file.
XT_SUBSET = " or ".join((
    "test_accept_layer_intermediates", "test_attn_gating", "test_attn_negative_weights",
    "test_belief_attn", "test_caching_when_inputs_not_include_past", "test_causal_override",
    "test_continuous_transformer_external_projects", "test_cope", "test_cross_attn_rotary",
    "test_custom_alibi", "test_custom_rotary_pos_emb", "test_derf", "test_embedder",
    "test_entropy_based_tokenizer_max_token_len", "test_external_key_values",
    "test_forgetting_transformer", "test_hybrid_cache", "test_hyper_connections",
    "test_inverted_cross_attn", "test_kv_cache", "test_kv_input_residual", "test_l2_distance",
    "test_laser", "test_lime", "test_multi_latent_attention", "test_multiple_input_embeds",
    "test_muon_params", "test_mv_split_residual", "test_neo_mlp", "test_next_latent",
    "test_orthog_residual", "test_pope", "test_pos_emb_parity", "test_qk_clip_attn", "test_reinject_input",
    "test_relative_proj_positional_bias", "test_repeat_blocks_multiple", "test_seq_start_pos_parity",
    "test_simple_mdlm", "test_softclamp_ff", "test_stochastic_attn", "test_to_logits",
    "test_ttt_custom_loss_optimization", "test_ttt_low_rank", "test_ttt_sleep_phase",
    "test_ttt_source_target_mapping", "test_value_residual",
))
SUITES["xt"]["args"] = [a.replace("XT_SUBSET", XT_SUBSET) for a in SUITES["xt"]["args"]]

FAILED = ("failed", "error")


#: a launcher for run_one: torch imported first, then pytest.main, whose duration it prints (interpreter
#: start and torch's import left out, so a plain run and a probed one pay them alike); collect() reads it
TIMED_LAUNCHER = [sys.executable, "-c", "import sys, time, torch, pytest; t = time.perf_counter(); "
                  "rc = pytest.main(sys.argv[1:]); print(f'pytest.main: {time.perf_counter() - t:.6f} s', "
                  "flush=True); sys.exit(rc)"]
PYTEST_MAIN_S = re.compile(r"^pytest\.main: ([0-9.]+) s$", re.M)


def run_one(name: str, cwd: Path, args: list[str], env: dict[str, str], task: str, runs: Path,
            basetemp: str, timeout: float, extra: list[str], launcher: list[str] | None = None) -> dict[str, Any]:
    """One pytest run in its own process (`launcher`, default ``python -m pytest``), with a fresh
    TORCHINDUCTOR_CACHE_DIR (a temp dir per run, removed after it: no run reuses another's
    compiled kernels)."""
    tag = f"{name}-{task}"
    junit, log, dump = runs / f"{tag}.xml", runs / f"{tag}.log", runs / tag
    for stale in (junit, log):
        if stale.exists():
            stale.unlink()
    cmd = [*(launcher or [sys.executable, "-m", "pytest"]), *args, "-q", "-p", "no:cacheprovider",
           f"--basetemp={basetemp}", "-o", "junit_family=xunit1", f"--junitxml={junit}", *extra]
    if task != "plain":
        cmd += [f"--msprobe-task={task}", "--msprobe-fail-on=never", f"--msprobe-dump-path={dump}"]
    print(f"[{tag}] {shlex.join(cmd)}  (cwd {cwd})", flush=True)
    inductor_cache = tempfile.mkdtemp(prefix=f"inductor-{tag}-")
    start = time.perf_counter()
    with open(log, "w") as out:
        out.write(f"# cwd: {cwd}\n# cmd: {shlex.join(cmd)}\n")
        out.flush()
        try:
            rc = subprocess.run(cmd, cwd=cwd, env={**os.environ, **env, "TORCHINDUCTOR_CACHE_DIR": inductor_cache},
                                stdout=out, stderr=subprocess.STDOUT, timeout=timeout).returncode
        except subprocess.TimeoutExpired:
            rc = "timeout"
        finally:
            shutil.rmtree(inductor_cache, ignore_errors=True)
    wall = time.perf_counter() - start
    (runs / f"{tag}.meta.json").write_text(json.dumps({"rc": rc, "wall_s": wall, "cmd": cmd, "cwd": str(cwd),
                                                       "plugin": plugin_state()}))
    return collect(name, task, runs)


def plugin_state() -> str:
    """The commit of this checkout and whether its work tree differs from it (results belong to it)."""
    repo = Path(__file__).resolve().parents[1]
    try:
        head = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=repo, capture_output=True, text=True,
                              check=True).stdout.strip()
        dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=repo,
                               capture_output=True, text=True, check=True).stdout.splitlines()
    except (OSError, subprocess.CalledProcessError):
        return "unknown"
    return f"{head}" + (f" + {len(dirty)} modified file(s)" if dirty else "")


def collect(name: str, task: str, runs: Path) -> dict[str, Any]:
    tag = f"{name}-{task}"
    meta_path = runs / f"{tag}.meta.json"
    meta = json.loads(meta_path.read_text()) if meta_path.exists() else {"rc": None, "wall_s": None}
    res: dict[str, Any] = {"suite": name, "task": task, "rc": meta["rc"], "wall_s": meta["wall_s"],
                           "plugin": meta.get("plugin", "unknown"),
                           "tests": parse_junit(runs / f"{tag}.xml"), "log": str(runs / f"{tag}.log")}
    res["counts"] = dict(Counter(t["outcome"] for t in res["tests"].values()))
    res["results_in_log"] = progress_count(runs / f"{tag}.log")
    main_s = PYTEST_MAIN_S.findall((runs / f"{tag}.log").read_text(errors="replace")) if (runs / f"{tag}.log").exists() else []
    res["pytest_main_s"] = float(main_s[-1]) if main_s else None  # TIMED_LAUNCHER's figure
    res["crashed"] = not (runs / f"{tag}.xml").exists()
    if task != "plain":
        res.update(parse_dump(runs / tag, task))
        res["terminal"] = msprobe_section(runs / f"{tag}.log")
    return res


def progress_count(log: Path) -> int:
    """Results pytest -q printed on its progress lines ("....F.s  [ 67%]"): where a run that died
    (no JUnit file) had got to."""
    if not log.exists():
        return 0
    n = 0
    for line in log.read_text(errors="replace").splitlines():
        m = re.match(r"^([.FEsxX]+)(\s+\[\s*\d+%\])?\s*$", line)
        if m:
            n += len(m.group(1))
    return n


def parse_junit(path: Path) -> dict[str, dict[str, Any]]:
    tests: dict[str, dict[str, Any]] = {}
    if not path.exists():
        return tests
    for case in ET.parse(path).getroot().iter("testcase"):
        file, cls, test = case.get("file", ""), case.get("classname", ""), case.get("name", "")
        module = file[:-3].replace("/", ".") if file.endswith(".py") else ""
        parts = [file or cls]
        if module and cls.startswith(module) and cls != module:
            parts.append(cls[len(module) + 1:].replace(".", "::"))
        nodeid = "::".join([*parts, test])
        outcome, message = "passed", ""
        for child in case:
            if child.tag in ("failure", "error", "skipped"):
                outcome = {"failure": "failed", "error": "error", "skipped": "skipped"}[child.tag]
                message = (child.get("message") or child.text or "").strip().splitlines()[0:1]
                message = message[0][:300] if message else ""
                break
        if nodeid in tests and outcome == "error":  # an error at teardown of a test that passed
            outcome = "error"
        tests[nodeid] = {"outcome": outcome, "message": message, "time": float(case.get("time") or 0.0)}
    return tests


def parse_dump(dump: Path, task: str) -> dict[str, Any]:
    """The probe's side of a run: DIR/summary.json (session counts, per-test errors and findings,
    the "probe" block: errors, not_checked by reason, nothing_checked) and the per-test summaries
    under DIR/tests (not_checked / skipped per reason and API or op, errors / probe_errors)."""
    out: dict[str, Any] = {"probe_errors": [], "not_checked": {}, "not_checked_apis": Counter(),
                           "nothing_checked": Counter(), "findings": [], "session": None, "probe": None}
    per_test_errors = []
    for path in sorted(glob.glob(str(dump / "tests" / "**" / "summary*.json"), recursive=True)):
        try:
            data = json.loads(Path(path).read_text())
        except (OSError, ValueError):
            continue
        if not isinstance(data, dict):
            continue
        rel = str(Path(path).relative_to(dump / "tests"))
        for key in ("errors", "probe_errors"):
            errs = data.get(key)
            if isinstance(errs, dict):
                errs = [f"{k}: {v}" for k, v in errs.items()]
            for e in errs or []:
                per_test_errors.append(f"{rel}: {json.dumps(e, default=str)[:400]}")
        for key in ("not_checked", "skipped"):
            for reason, per_api in (data.get(key) or {}).items():
                if isinstance(per_api, dict):
                    for api, n in per_api.items():
                        out["not_checked_apis"][f"{reason[:60]} | {api}"] += n if isinstance(n, int) else 1
    summary_path = dump / "summary.json"
    if summary_path.exists():
        s = json.loads(summary_path.read_text())
        out["session"] = s.get("session")
        out["unprobed"] = s.get("unprobed") or {}
        probe = s.get("probe") or {}
        out["probe"] = {k: v for k, v in probe.items() if k not in ("not_checked", "nothing_checked")}
        out["not_checked"] = dict(probe.get("not_checked") or {})
        for reason in (probe.get("nothing_checked") or {}).values():
            out["nothing_checked"][re.sub(r"\d+", "N", str(reason))] += 1
        for nodeid, t in (s.get("tests") or {}).items():
            for e in t.get("errors") or []:
                out["probe_errors"].append(f"{nodeid}: {json.dumps(e, default=str)[:400]}")
            for key in ("flagged_apis", "nonfinite_params", "failing_ops"):
                for item in t.get(key) or []:
                    out["findings"].append({"test": nodeid, "kind": key, "what": item})
        for api, a in (s.get("apis") or {}).items():
            if isinstance(a, dict) and a.get("flagged"):
                out["findings"].append({"api": api, "kind": "api", "checked": a.get("checked"),
                                        "flagged": a.get("flagged"), "worst_max_rel": a.get("worst_max_rel"),
                                        "threshold": a.get("threshold"), "tests": a.get("tests", [])[:5]})
    if not out["probe_errors"]:
        out["probe_errors"] = per_test_errors
    if not out["not_checked"]:  # an older plugin: no "probe" block in summary.json
        for key, n in out["not_checked_apis"].items():
            reason = key.split(" | ")[0]
            out["not_checked"][reason] = out["not_checked"].get(reason, 0) + n
    out["not_checked_apis"] = dict(out["not_checked_apis"].most_common(25))
    out["nothing_checked"] = dict(out["nothing_checked"])
    return out


def msprobe_section(log: Path) -> list[str]:
    if not log.exists():
        return []
    lines = log.read_text(errors="replace").splitlines()
    keep, on = [], False
    for line in lines:
        if re.match(r"^=+ msprobe ", line):
            on = True
        elif on and re.match(r"^=+ ", line):
            on = False
        if on:
            keep.append(line)
    return keep[:60]


def compare(plain: dict[str, Any], probed: dict[str, Any]) -> tuple[list[tuple[str, str, str]], list[str]]:
    broken, fixed = [], []
    for nodeid, t in plain["tests"].items():
        p = probed["tests"].get(nodeid)
        if t["outcome"] == "passed" and (p is None or p["outcome"] != "passed"):
            broken.append((nodeid, p["outcome"] if p else "missing", p["message"] if p else ""))
        elif t["outcome"] in FAILED and p is not None and p["outcome"] == "passed":
            fixed.append(nodeid)
    return broken, fixed


def fmt_counts(c: dict[str, int]) -> str:
    return " ".join(f"{c.get(k, 0)}{k[0].upper()}" for k in ("passed", "failed", "error", "skipped"))


def report(results: dict[str, dict[str, dict[str, Any]]]) -> None:
    print("\n=== third-party suites: plain vs probed ===")
    header = ("suite", "task", "tests", "P F E S", "wall s", "x plain", "broken", "probe err", "not chk", "findings")
    rows = []
    for name, by_task in results.items():
        plain = by_task.get("plain")
        for task, r in by_task.items():
            n = len(r["tests"])
            ratio = (f"{r['wall_s'] / plain['wall_s']:.2f}" if plain and plain.get("wall_s") and r.get("wall_s")
                     and task != "plain" else "")
            broken = str(len(compare(plain, r)[0])) if plain and task != "plain" else ""
            rows.append((name, task, str(n), fmt_counts(r["counts"]),
                         f"{r['wall_s']:.1f}" if r.get("wall_s") is not None else "?", ratio, broken,
                         str(len(r.get("probe_errors", []))) if task != "plain" else "",
                         str(sum(r.get("not_checked", {}).values())) if task != "plain" else "",
                         str(len(r.get("findings", []))) if task != "plain" else ""))
    widths = [max(len(x[i]) for x in [header, *rows]) for i in range(len(header))]
    for row in [header, *rows]:
        print("  ".join(v.ljust(w) for v, w in zip(row, widths)))
    for name, by_task in results.items():
        plain = by_task.get("plain")
        for task, r in by_task.items():
            if task == "plain":
                continue
            print(f"\n--- {name} / {task} (rc {r['rc']}, plugin at {r['plugin']}, log {r['log']})")
            if r.get("crashed"):
                order = list(plain["tests"]) if plain else []
                k = r.get("results_in_log", 0)
                where = f"during {order[k]} (test {k + 1} of {len(order)} in the plain run's order)" if k < len(
                    order) else f"after {k} results"
                rc = r["rc"]
                why = " (SIGKILL: the OOM killer? see dmesg)" if rc == -9 else ""
                print(f"  RUN DIED: rc {rc}{why}, no JUnit file, {where}; every test is reported missing")
            if plain:
                broken, fixed = compare(plain, r)
                if r.get("crashed"):
                    broken = broken[:3]
                for nodeid, outcome, msg in broken:
                    print(f"  BROKEN {outcome}: {nodeid}\n      {msg}")
                for nodeid in fixed:
                    print(f"  fixed (failed plain, passed probed): {nodeid}")
                slow = sorted(((r["tests"][k]["time"] / max(t["time"], 1e-3), k, t["time"], r["tests"][k]["time"])
                               for k, t in plain["tests"].items() if k in r["tests"] and t["time"] >= 0.2),
                              reverse=True)[:3]
                for ratio, k, tp, tq in slow:
                    print(f"  slowest: {k}: {tp:.2f} s plain, {tq:.2f} s probed ({ratio:.1f}x)")
            for e in r.get("probe_errors", [])[:15]:
                print(f"  probe error: {e}")
            if len(r.get("probe_errors", [])) > 15:
                print(f"  ... {len(r['probe_errors']) - 15} more probe errors")
            if r.get("probe"):
                print(f"  probe block: {json.dumps(r['probe'], default=str)[:600]}")
            for reason, n in sorted(r.get("not_checked", {}).items(), key=lambda kv: -kv[1]):
                print(f"  not checked: {n} x {reason}")
            for what, n in list(r.get("not_checked_apis", {}).items())[:10]:
                print(f"    by API/op: {n} x {what}")
            for reason, n in (r.get("unprobed") or {}).items():
                print(f"  unprobed: {n} test(s): {reason}")
            for reason, n in r.get("nothing_checked", {}).items():
                print(f"  nothing checked: {n} test(s): {reason}")
            for f in r.get("findings", [])[:20]:
                print(f"  finding: {json.dumps(f, default=str)}")
            for line in r.get("terminal", []):
                print(f"  | {line}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--root", type=Path, default=Path("/tmp/tp"))
    parser.add_argument("--runs", type=Path, default=None)
    parser.add_argument("--suites", default=",".join(SUITES))
    parser.add_argument("--tasks", default="plain," + ",".join(TASKS))
    parser.add_argument("--custom", nargs=3, action="append", default=[], metavar=("NAME", "DIR", "ARGS"),
                        help="an extra suite: name, directory, pytest arguments (one shell-quoted string)")
    parser.add_argument("--basetemp", default="/tmp/pt-tp")
    parser.add_argument("--timeout", type=float, default=1800.0)
    parser.add_argument("--pytest-args", default="", help="added to every run, e.g. '-W ignore::DeprecationWarning'")
    parser.add_argument("--json", type=Path, default=None)
    parser.add_argument("--report-only", action="store_true", help="re-read the files of earlier runs")
    args = parser.parse_args()
    runs = (args.runs or args.root / "runs").resolve()
    repo = Path(__file__).resolve().parents[1]
    if runs == repo or repo in runs.parents:
        parser.error(f"--runs must be outside the repository ({repo})")
    runs.mkdir(parents=True, exist_ok=True)
    suites = {k: dict(SUITES[k], dir=args.root / SUITES[k]["dir"]) for k in args.suites.split(",") if k}
    for name, directory, cmdline in args.custom:
        suites[name] = {"dir": Path(directory), "args": shlex.split(cmdline), "env": {}}
    tasks = [t for t in args.tasks.split(",") if t]
    unknown = [t for t in tasks if t != "plain" and t not in TASKS]
    if unknown:
        parser.error(f"unknown task(s): {unknown}")
    results: dict[str, dict[str, dict[str, Any]]] = {}
    for name, suite in suites.items():
        if not Path(suite["dir"]).is_dir():
            print(f"[{name}] {suite['dir']} not found: see this script's docstring for how to obtain it")
            continue
        for task in tasks:
            if args.report_only:
                results.setdefault(name, {})[task] = collect(name, task, runs)
            else:
                results.setdefault(name, {})[task] = run_one(
                    name, Path(suite["dir"]), suite["args"], suite.get("env", {}), task, runs, args.basetemp,
                    args.timeout, shlex.split(args.pytest_args))
    report(results)
    if args.json:
        args.json.write_text(json.dumps(results, indent=1, default=str))


if __name__ == "__main__":
    main()
