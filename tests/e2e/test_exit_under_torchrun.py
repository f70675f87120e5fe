"""No abort at exit: two-rank torchrun jobs under each tool end with exit status 0, every time.

A probe thread still running when the interpreter shuts down (a writer, the reference thread)
made such jobs end in ``terminate called without an active exception`` (SIGABRT) one run in a
few. The probes now end their threads when a run stops, and again at exit, before the runtime
goes. Each case runs the job MSPROBE_EXIT_RUNS times (default 3 in CI; 20 for the full check)
and fails on any non-zero exit, with the job's output; it also checks the results are complete.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import pytest
from repo_paths import REPO, SUPPORT

pytestmark = pytest.mark.slow  # subprocess pytest sessions / multi-process jobs: minutes in all

pytest.importorskip("torch")

ROOT = REPO
RUNS = int(os.environ.get("MSPROBE_EXIT_RUNS", "3"))
TIMEOUT_S = 180


def _torchrun(args: list[str], cwd: Path) -> tuple[int, str]:
    if shutil.which("torchrun") is None and not Path(sys.executable).with_name("torchrun").exists():
        pytest.skip("torchrun is not installed")
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2", *args]
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(ROOT), str(SUPPORT)]), OMP_NUM_THREADS="1")
    proc = subprocess.Popen(cmd, cwd=cwd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            start_new_session=True)
    try:
        out, _ = proc.communicate(timeout=TIMEOUT_S)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        out, _ = proc.communicate()
        pytest.fail(f"torchrun did not finish in {TIMEOUT_S} s:\n{out[-3000:]}")
    return proc.returncode, out


def _failed_run(i: int, rc: int, out: str) -> str:
    """The run's head (where ``terminate called ...`` is printed) and its tail (torchrun's verdict)."""
    text = out if len(out) <= 3000 else f"{out[:1500]}\n...\n{out[-1500:]}"
    return f"run {i}: exit status {rc}\n{text}"


def _check_results(tool: str, dump: Path) -> None:
    for rank in (0, 1):
        assert (dump / f"done{rank}").exists()
        if tool == "grad_probe":
            written = sorted(p.name for p in (dump / f"rank{rank}").glob("grad_summary_*.csv"))
            assert written == [f"grad_summary_{i}.csv" for i in range(3)]
            assert (dump / f"rank{rank}" / "summary.json").exists()
        if tool == "online_dispatch":
            runs = sorted(dump.glob(f"msprobe_rank{rank}_*"))
            assert len(runs) == 3 and all((r / "summary.json").exists() for r in runs)


@pytest.mark.parametrize("tool", ["online_dispatch", "grad_probe", "free_benchmark"])
def test_a_two_rank_job_never_aborts_at_exit(tmp_path, tool):
    failures = []
    for i in range(RUNS if tool != "free_benchmark" else 1):
        dump = tmp_path / f"run{i}"
        dump.mkdir()
        job = [str(SUPPORT / "exit_job.py"), tool if tool != "free_benchmark" else "none", str(dump)]
        rc, out = _torchrun(job, tmp_path)
        if rc != 0:
            failures.append(_failed_run(i, rc, out))
            continue
        _check_results(tool, dump)
    assert not failures, f"{len(failures)} of {RUNS} runs failed:\n" + "\n".join(failures)


@pytest.mark.parametrize("task", ["online_dispatch", "grad_probe"])
def test_the_plugin_under_torchrun_never_aborts_at_exit(tmp_path, task):
    failures = []
    for i in range(max(1, RUNS // 2)):
        args = ["-m", "pytest", str(SUPPORT / "exit_suite" / "ddp_steps.py"), "-q", "-p", "no:cacheprovider",
                "-p", "no:randomly", f"--msprobe-task={task}", "--msprobe-fail-on=never",
                f"--basetemp={tmp_path / f'base{i}'}", f"--msprobe-dump-path={tmp_path / f'out{i}'}"]
        rc, out = _torchrun(args, tmp_path)
        if rc != 0:
            failures.append(_failed_run(i, rc, out))
            continue
        # one pytest per rank: each rank's session files in its own folder, never the same file
        for rank in (0, 1):
            summary = json.loads((tmp_path / f"out{i}" / f"rank{rank}" / "summary.json").read_text())
            assert list(summary["tests"]) and summary["tool"] == task
        assert not (tmp_path / f"out{i}" / "summary.json").exists()
    assert not failures, f"{len(failures)} runs failed:\n" + "\n".join(failures)


def test_a_tensor_parallel_job_under_each_tool_ends_well_under_torchrun(tmp_path):
    """torchrun, 2 ranks, tensor parallelism: grad_probe, free_benchmark and online_dispatch in
    turn, exit status 0, and each tool's losses those of the plain run."""
    rc, out = _torchrun([str(SUPPORT / "sharded_jobs.py"), "tp", str(tmp_path)], tmp_path)
    assert rc == 0, out[-3000:]
    for rank in (0, 1):
        losses = json.loads((tmp_path / f"done{rank}.json").read_text())
        assert losses["grad_probe"] == losses["plain"]
        for dtype in ("float32", "bfloat16"):  # the same model under both (without grad_probe's head)
            assert losses[f"free_benchmark_{dtype}"] == losses[f"online_dispatch_{dtype}"]
        rows = (tmp_path / "grad_probe" / f"rank{rank}" / "grad_summary_1.csv").read_text(encoding="utf-8-sig")
        assert '"[32, 16]"' in rows  # l1.weight's full shape, on both ranks
        summary = json.loads((tmp_path / "free_benchmark_bfloat16" / f"summary_rank{rank}.json").read_text())
        assert summary["apis"]["Functional.linear"]["checked"] >= 4 and not summary["flagged"]
