"""Multi-rank runs: real torch.distributed jobs (gloo on the CPU, 127.0.0.1 only) under each tool.

Every job runs in processes with a hard time limit (pytest_msprobe.distributed): a deadlock fails
the test instead of hanging CI. The jobs are in multirank_jobs.py; each seeds a defect on one rank
only and checks that it is reported on that rank only, under that rank's global number, that the
`rank` filter selects ranks, and that the collectives ran exactly as often as the user called
them, with exact results (never perturbed, compared or re-run).
"""

from __future__ import annotations

import csv
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import multirank_jobs as jobs
import pytest

from probes import GradComparator
from probes.core.errors import ConfigError
from probes.free_benchmark.service import ApiStats
from probes.grad_probe.comparator import MISSING_A, MISSING_B, RANK_OK
from pytest_msprobe.distributed import RankJobError, free_port, run_ranks
from pytest_msprobe.reports.ranks import MERGED_NAME, REPORT_NAME, describe, merge_ranks

TIMEOUT_S = 60.0  # per job; a job that deadlocks fails after this, it never hangs


def _exact_collectives(results: dict, world: int) -> None:
    assert results["all_reduce"] == [float(sum(range(1, world + 1)))] * 4
    assert results["broadcast"] == [float(world - 1)] * 3
    assert results["all_gather"] == [[float(r)] * 2 for r in range(world)]


# ------------------------------------------------------------------------------------ free_benchmark
@pytest.fixture(scope="module")
def fb_two_ranks(tmp_path_factory):
    dump = tmp_path_factory.mktemp("fb2") / "dump"
    job = run_ranks(jobs.free_benchmark_job, 2, (str(dump), 1), timeout=TIMEOUT_S)
    return dump, job.values


def test_free_benchmark_defect_on_rank1_is_reported_on_rank1_only(fb_two_ranks):
    dump, values = fb_two_ranks
    r0, r1 = values
    assert (r0["rank"], r1["rank"]) == (0, 1)
    assert r0["rows"] == 0 and r0["checked"] > 0, "rank 0 must be probed and clean"
    assert r1["rows"] > 0
    # per-rank files under the global rank; rank 0 flagged nothing, so it has no CSV
    assert sorted(p.name for p in dump.glob("summary_rank*.json")) == ["summary_rank0.json", "summary_rank1.json"]
    csvs = sorted(p.relative_to(dump).as_posix() for p in dump.rglob("free_benchmark.csv"))
    assert csvs == ["step0/rank1/free_benchmark.csv", "step1/rank1/free_benchmark.csv"]
    with open(dump / csvs[0], newline="") as fh:
        rows = list(csv.DictReader(fh))
    assert {r["rank"] for r in rows} == {"1"} and {r["api_name"] for r in rows} == {"Torch.expm1.0.forward"}
    s0 = json.loads((dump / "summary_rank0.json").read_text())
    assert s0["rank"] == 0 and s0["apis"]["Torch.expm1"]["checked"] == 2 and s0["apis"]["Torch.expm1"]["flagged"] == 0


def test_free_benchmark_never_perturbs_or_reruns_collectives(fb_two_ranks):
    _, values = fb_two_ranks
    for v in values:
        assert v["calls"] == {"all_reduce": 2, "broadcast": 2, "all_gather": 2}  # as called: once per step
        for step in v["results"]:
            _exact_collectives(step, 2)
        assert not [a for a in v["apis"] if any(c in a for c in jobs.COLLECTIVES)]


def test_merged_report_names_the_rank_that_flagged_first(fb_two_ranks):
    dump, _ = fb_two_ranks
    merged = merge_ranks(dump, world_size=2, html=True)
    assert merged["tool"] == "free_benchmark" and merged["flagged_ranks"] == [1]
    first = merged["first"]
    assert (first["rank"], first["what"], first["step"]) == (1, "Torch.expm1.0.forward", 0)
    assert first["figure"] > first["threshold"] and first["evidence"].endswith("step0/rank1/free_benchmark.csv")
    assert merged["ranks"]["rank0"]["status"] == "clean" and merged["ranks"]["rank1"]["status"] == "flagged"
    assert merged["tests"]["rank1"]["outcome"] == "failed" and merged["tests"]["rank0"]["outcome"] == "passed"
    assert merged["apis"]["Torch.expm1"]["tests"] == ["rank1"] and merged["apis"]["Torch.expm1"]["checked"] == 4
    assert json.loads((dump / MERGED_NAME).read_text())["first"] == first
    html = (dump / REPORT_NAME).read_text()
    assert "Torch.<wbr>expm1" in html and "<code>rank1</code>" in html
    # the entries are called ranks, not tests
    assert "<th>ranks affected</th>" in html and "<h2>ranks</h2>" in html and "tests affected" not in html
    assert "first flagged on rank 1: Torch.expm1.0.forward at step 0" in describe(merged)


def test_free_benchmark_rank_filter_selects_ranks(tmp_path):
    dump = tmp_path / "dump"
    r0, r1 = run_ranks(jobs.free_benchmark_job, 2, (str(dump), 1, [0]), timeout=TIMEOUT_S).values
    assert r0["checked"] > 0 and r1["checked"] == 0  # the defect on rank 1 is not looked at
    assert r1["calls"] == r0["calls"] == {"all_reduce": 2, "broadcast": 2, "all_gather": 2}
    assert not list(dump.rglob("free_benchmark.csv"))
    merged = merge_ranks(dump, world_size=2)
    assert merged["ranks"]["rank1"]["status"] == "not selected" and merged["flagged_ranks"] == []


def test_four_ranks_global_rank_names_and_filter(tmp_path):
    dump = tmp_path / "dump"
    values = run_ranks(jobs.free_benchmark_job, 4, (str(dump), 3, [2, 3], 1), timeout=TIMEOUT_S).values
    assert [v["rank"] for v in values] == [0, 1, 2, 3]
    assert [v["checked"] > 0 for v in values] == [False, False, True, True]
    assert [v["rows"] > 0 for v in values] == [False, False, False, True]
    for v in values:
        _exact_collectives(v["results"][0], 4)
        assert v["calls"] == {"all_reduce": 1, "broadcast": 1, "all_gather": 1}
    assert [p.relative_to(dump).as_posix() for p in dump.rglob("free_benchmark.csv")] == ["step0/rank3/free_benchmark.csv"]
    merged = merge_ranks(dump, world_size=4)
    assert [merged["ranks"][f"rank{r}"]["status"] for r in range(4)] == ["not selected", "not selected", "clean",
                                                                        "flagged"]
    assert merged["first"]["rank"] == 3


# ------------------------------------------------------------------------------------ grad_probe
@pytest.fixture(scope="module")
def gp_two_ranks(tmp_path_factory):
    root = tmp_path_factory.mktemp("gp2")
    job = run_ranks(jobs.grad_probe_job, 2, (str(root / "a"), str(root / "b"), 1), timeout=TIMEOUT_S)
    return root, job.values


def test_grad_probe_writes_per_rank_folders_and_keeps_collectives(gp_two_ranks):
    root, values = gp_two_ranks
    for run in ("a", "b"):
        assert sorted(p.name for p in (root / run).iterdir()) == ["rank0", "rank1"]
        for r in (0, 1):
            assert sorted(p.name for p in (root / run / f"rank{r}").glob("grad_summary_*.csv")) == [
                "grad_summary_0.csv", "grad_summary_1.csv", "grad_summary_2.csv"]
            assert json.loads((root / run / f"rank{r}" / "summary.json").read_text())["rank"] == r
    assert [v["calls"] for v in values] == [[{"all_reduce": 3}, {"all_reduce": 3}]] * 2


def test_grad_compare_distributed_flags_rank1_only(gp_two_ranks, tmp_path):
    root, _ = gp_two_ranks
    res = GradComparator.compare_distributed(root / "a", root / "b", tmp_path / "cmp")
    assert res.rank_status == {0: RANK_OK, 1: RANK_OK}
    assert res[0].flags == [] and res[1].first_flagged_step() == 1  # the sign flip starts at step 1
    assert res.first_flagged_step() == 1 and {r for r, _ in res.flags} == {1}
    assert (tmp_path / "cmp" / "rank0" / "similarities.csv").exists()
    assert (tmp_path / "cmp" / "rank1" / "similarities.csv").exists()


def test_grad_compare_distributed_rank_missing_on_one_side_is_a_status(gp_two_ranks, tmp_path):
    root, _ = gp_two_ranks
    only0 = tmp_path / "only0"
    shutil.copytree(root / "a" / "rank0", only0 / "rank0")
    res = GradComparator.compare_distributed(root / "a", only0, tmp_path / "c1")
    assert res.rank_status == {0: RANK_OK, 1: MISSING_B} and not res.ok and set(res) == {0}
    res = GradComparator.compare_distributed(only0, root / "b", tmp_path / "c2")
    assert res.rank_status == {0: RANK_OK, 1: MISSING_A} and res.to_dict()["rank_status"]["rank1"] == MISSING_A


def test_grad_probe_merged_report_nonfinite_on_rank1_only(gp_two_ranks):
    root, _ = gp_two_ranks
    clean = merge_ranks(root / "a", world_size=2)
    assert clean["tool"] == "grad_probe" and clean["findings"] == [] and clean["flagged_ranks"] == []
    merged = merge_ranks(root / "b", world_size=2, html=True)
    assert merged["flagged_ranks"] == [1] and merged["first"]["rank"] == 1 and merged["first"]["step"] == 2
    assert {f["rank"] for f in merged["findings"]} == {1}
    assert merged["params"] and all(t["tests"] == ["rank1"] for t in merged["params"].values())
    assert (root / "b" / REPORT_NAME).exists()


def test_grad_probe_rank_filter_selects_ranks(tmp_path):
    run_ranks(jobs.grad_probe_job, 2, (str(tmp_path / "a"), str(tmp_path / "b"), 1, [1]), timeout=TIMEOUT_S)
    assert sorted(p.name for p in (tmp_path / "a").iterdir()) == ["rank1"]
    assert merge_ranks(tmp_path / "b", world_size=2)["ranks"]["rank0"]["status"] == "missing"


# ------------------------------------------------------------------------------------ online_dispatch
def test_online_dispatch_defect_on_rank1_only_and_collectives_skipped(tmp_path):
    dump = tmp_path / "dump"
    values = run_ranks(jobs.online_dispatch_job, 2, (str(dump), 1), timeout=TIMEOUT_S).values
    for r, v in enumerate(values):
        run_dir = Path(v["run_dir"])
        assert run_dir.name.startswith(f"msprobe_rank{r}_") and run_dir.parent == dump
        assert list(run_dir.glob(f"compare_result_rank{r}_*.csv"))
        assert v["calls"] == {"all_reduce": 1, "broadcast": 1, "all_gather": 1}
        _exact_collectives(v["results"], 2)
        skipped = next(ops for reason, ops in v["skipped"].items() if reason.startswith("collective"))
        assert skipped == {"c10d.allreduce_.default": 1, "c10d.broadcast_.default": 1, "c10d.allgather_.default": 1}
    assert values[0]["failed"] == [] and values[1]["failed"] == ["rank_tanh_1"]
    merged = merge_ranks(dump, world_size=2, html=True)
    assert merged["tool"] == "online_dispatch" and merged["flagged_ranks"] == [1]
    assert (merged["first"]["rank"], merged["first"]["what"]) == (1, "rank_tanh_1")
    assert merged["ops"]["multirank_jobs.rank_tanh.default"]["tests"] == ["rank1"]


# ------------------------------------------------------------------------------------ rank lookup
def test_probes_started_before_init_process_group_use_the_global_rank(tmp_path):
    """Before the fix, free_benchmark wrote rank 1's rows under rank0 and both ranks one summary.json,
    and online_dispatch named both ranks' run folders rank0."""
    run_ranks(jobs.probes_started_before_init, 2, (str(tmp_path), 1), init=False, timeout=TIMEOUT_S)
    fb = tmp_path / "fb"
    assert sorted(p.name for p in fb.glob("summary*.json")) == ["summary_rank0.json", "summary_rank1.json"]
    assert [p.relative_to(fb).as_posix() for p in fb.rglob("*.csv")] == ["step0/rank1/free_benchmark.csv"]
    assert merge_ranks(fb, world_size=2)["flagged_ranks"] == [1]
    assert sorted(p.name.split("_")[1] for p in (tmp_path / "od").iterdir()) == ["rank0", "rank1"]
    assert sorted(p.name for p in (tmp_path / "gp").iterdir()) == ["rank0", "rank1"]


@pytest.mark.parametrize("env, rank, distributed", [
    ({}, 0, False),
    ({"RANK": "3", "WORLD_SIZE": "4"}, 3, True),
    ({"RANK": "0", "WORLD_SIZE": "1"}, 0, False),
    ({"RANK": "x", "WORLD_SIZE": ""}, 0, False),
])
def test_rank_before_init_comes_from_the_launcher_environment(monkeypatch, env, rank, distributed):
    from probes.backends.torch_backend import BACKEND

    for name in ("RANK", "WORLD_SIZE"):
        monkeypatch.delenv(name, raising=False)
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    assert (BACKEND.rank(), BACKEND.is_distributed()) == (rank, distributed)


# ------------------------------------------------------------------------------------ torchrun
def test_torchrun_two_ranks_same_script(tmp_path):
    """The job module as a torchrun script: torchrun sets the environment, the script calls
    init_process_group("gloo") itself (hccl / nccl on accelerator nodes)."""
    dump = tmp_path / "dump"
    dump.mkdir()
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nnodes", "1", "--nproc-per-node", "2",
           "--master-addr", "127.0.0.1", "--master-port", str(free_port()), "--max-restarts", "0",
           str(Path(jobs.__file__)), "online_dispatch", str(dump), "1"]
    env = dict(os.environ, GLOO_SOCKET_IFNAME="lo", OMP_NUM_THREADS="1")
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            start_new_session=True)
    try:
        out, _ = proc.communicate(timeout=180)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)  # torchrun and its workers: the group this test started
        out, _ = proc.communicate()
        pytest.fail(f"torchrun job did not finish in 180 s:\n{out[-3000:]}")
    assert proc.returncode == 0, out[-3000:]
    ranks = [json.loads((dump / f"job_rank{r}.json").read_text()) for r in (0, 1)]
    assert [r["failed"] for r in ranks] == [[], ["rank_tanh_1"]]
    assert merge_ranks(dump, "online_dispatch", world_size=2)["flagged_ranks"] == [1]


# ------------------------------------------------------------------------------------ no hang
def test_a_rank_stuck_in_a_collective_fails_the_job_instead_of_hanging():
    start = time.monotonic()
    with pytest.raises(RankJobError, match="did not finish within 4 s") as info:
        run_ranks(jobs.skips_a_collective, 2, timeout=4.0)
    assert "rank 0: killed" in str(info.value) and "rank 1: killed" in str(info.value)
    assert time.monotonic() - start < 60  # bounded: the job was killed, not waited for


def test_a_failing_rank_is_named_first_and_ends_the_job():
    with pytest.raises(RankJobError, match="rank 1 first") as info:
        run_ranks(jobs.fails_on_rank1, 2, timeout=TIMEOUT_S)
    assert "ValueError: seeded failure on rank 1" in str(info.value)


# ------------------------------------------------------------------------------------ the fixture
def test_fixture_runs_ranks_and_returns_the_merged_report(msprobe_distributed):
    run = msprobe_distributed(jobs.free_benchmark_job, 1, steps=1)
    assert run.flagged_ranks == [1] and [v["rank"] for v in run.values] == [0, 1]
    assert (run.dump_path / MERGED_NAME).exists() and (run.dump_path / REPORT_NAME).exists()
    with pytest.raises(AssertionError, match="first flagged on rank 1: Torch.expm1.0.forward"):
        run.assert_clean()
    clean = msprobe_distributed(jobs.free_benchmark_job, None, steps=1)
    assert clean.flagged_ranks == [] and clean.dump_path != run.dump_path
    clean.assert_clean()


# ------------------------------------------------------------------------------------ merge, offline
def _fb_summary(rank: int, rows: list[tuple[int, str, float]]) -> dict:
    return {"tool": "free_benchmark", "framework": "pytorch", "rank": rank, "config": {"rank": []},
            # the tool's own per-API record, so the merge reads what free_benchmark writes
            "apis": {"Torch.x": ApiStats(calls=3, checked=3, flagged=len(rows),
                                         worst_max_rel=max((r[2] for r in rows), default=None), threshold=0.002,
                                         first_flagged=rows[0][1] if rows else None).to_dict()},
            "not_checked": {},
            "flagged": [{"rank": rank, "pert_mode": "improve_precision", "stage": "forward", "step": s, "api_name": n,
                         "max_rel": m, "dtype": "torch.float16", "shape": "torch.Size([8])", "output_index": "",
                         "api": "Torch.x", "threshold": 0.002, "figure": m / 0.002, "detail": {"csv": f"r{rank}.csv"}}
                        for s, n, m in rows],
            "errors": [], "csv_files": []}


def test_merge_orders_by_step_then_rank_and_reports_missing_ranks(tmp_path):
    (tmp_path / "summary_rank0.json").write_text(json.dumps(_fb_summary(0, [(1, "Torch.x.3.forward", 0.5)])))
    (tmp_path / "summary_rank2.json").write_text(json.dumps(_fb_summary(2, [(0, "Torch.x.0.forward", 0.01)])))
    merged = merge_ranks(tmp_path, world_size=3, write=False)
    assert [(f["rank"], f["step"]) for f in merged["findings"]] == [(2, 0), (0, 1)]
    assert merged["first"]["what"] == "Torch.x.0.forward" and merged["ranks"]["rank1"]["status"] == "missing"
    assert merged["flagged_ranks"] == [0, 2] and not (tmp_path / MERGED_NAME).exists()


def test_merge_refuses_a_folder_without_per_rank_summaries(tmp_path):
    with pytest.raises(ConfigError, match="dump_path"):
        merge_ranks(tmp_path)
    with pytest.raises(ConfigError, match="tool"):
        merge_ranks(tmp_path, "free_benchmarks")
