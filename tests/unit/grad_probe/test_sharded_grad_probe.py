"""grad_probe under FSDP2, HSDP, tensor parallelism and FSDP2 x TP: every row describes the full
parameter, the direction data compares across shardings, and no rank waits in a collective another
rank skipped.

The multi-rank jobs (tests/support/sharded_jobs.py) train tests/support/engines.py's MLP, whose gradients equal the
single process's on the same global batch under every engine; each launch has a time limit, so a
deadlock fails. The first tests need no process group: the shard arithmetic and the file formats.
"""

from __future__ import annotations

import csv
import json
import math
from pathlib import Path

import numpy as np
import pytest
import sharded_jobs as jobs
import torch

from probes import GradComparator
from probes.backends import torch_xp
from probes.grad_probe import csv_format, stats
from probes.grad_probe.sharded_directions import ShardedRun
from pytest_msprobe.distributed import run_ranks
from pytest_msprobe.reports.ranks import merge_ranks

pytestmark = pytest.mark.slow  # subprocess pytest sessions / multi-process jobs: minutes in all

TIMEOUT_S = 90.0
BOUNDS = [-1e-3, 0.0, 1e-3]
WORLD = {"ddp": 2, "fsdp": 2, "tp": 2, "ddp4": 4, "hsdp": 4, "fsdp_tp": 4}
#: process-group chains grad_probe combines over, per engine (fsdp_tp: the 2-D mesh, and the
#: head's data-parallel mesh)
CHAINS = {"ddp": 0, "fsdp": 1, "tp": 1, "ddp4": 0, "hsdp": 1, "fsdp_tp": 2}
FP8 = ["float8_e5m2", "float8_e4m3fn"]
FP8_COLUMNS = [f"{f} {figure}" for f in FP8 for figure in stats.FP8_HEALTH_FIGURES]


# ------------------------------------------------------------------ no process group


def _exchange(per_rank: list[list[stats.SliceShare]], histogram: bool, batched: bool) -> torch.Tensor:
    """The combined columns of one exchange: each rank's shares summed and maxed as the
    all-reduces would."""
    ns = torch_xp_ns()
    figures = [stats.shard_figures(ns, shares, BOUNDS, histogram, torch.float64, torch.device("cpu"),
                                   batched=torch_xp if batched else None) for shares in per_rank]
    summed = torch.stack([s for s, _m in figures]).sum(0)
    maxed = torch.stack([m for _s, m in figures]).amax(0)
    return stats.combine_shards(ns, summed, maxed, BOUNDS, histogram)


def torch_xp_ns():
    from probes.backends.torch_backend import BACKEND

    return BACKEND.namespace(torch.zeros(1))


@pytest.mark.parametrize("batched", [False, True])
@pytest.mark.parametrize("histogram", [False, True])
@pytest.mark.parametrize("case", ["even", "uneven_with_empty", "nan", "inf", "all_empty"])
def test_slices_combine_to_the_full_tensors_figures(case, histogram, batched):
    g = torch.randn(7, 5, generator=torch.Generator().manual_seed(3), dtype=torch.float32) * 1e-3
    g[0, :2] = 0.0
    if case == "nan":
        g[3, 1] = math.nan
    if case == "inf":
        g[5, 4] = -math.inf
    if case == "all_empty":
        g = g[:0]
    # a second gradient of another dtype in the same exchange, sliced the same way
    h = (torch.arange(35, dtype=torch.float32).reshape(7, 5) - 17).to(torch.bfloat16)[: len(g)]
    cuts = [0, 3, 7] if case != "uneven_with_empty" else [0, 4, 4, 6, 7]
    per_rank = [[stats.SliceShare(g[a:b], True), stats.SliceShare(h[a:b], True)] for a, b in zip(cuts, cuts[1:])]
    per_rank += [[stats.SliceShare(None, True), stats.SliceShare(None, True)]] * 2  # replicas, not counted
    got = _exchange(per_rank, histogram, batched)
    for column, full in enumerate((g, h)):
        want = stats.stat_vector(torch_xp_ns(), full, BOUNDS, histogram)
        torch.testing.assert_close(got[:, column], want, rtol=1e-12, atol=0.0, equal_nan=True)
        if histogram:  # the interval fractions and "=0" are counts: exactly the full tensor's
            assert torch.equal(got[3:, column], want[3:])


def test_a_failed_share_is_neutral_and_counted():
    ns = torch_xp_ns()
    s, m = stats.shard_figures(ns, [stats.SliceShare(None, had=False, failed=True)], BOUNDS, True,
                               torch.float64, torch.device("cpu"))
    assert s[:, 0].tolist()[:4] == [0.0, 0.0, 0.0, 1.0] and torch.all(s[4:] == 0) and torch.all(m == -math.inf)


def test_flat_partitions_reassemble(tmp_path):
    """An engine that partitions the flattened parameter (DeepSpeed ZeRO) writes 1-D slices."""
    from probes.grad_probe.comparator import rank_dirs, step_dirs

    full = np.random.default_rng(1).random((6, 4)) > 0.5
    _write_sharded_dump(tmp_path, full, [(0, range(0, 10)), (1, range(10, 24))])
    signs, held = ShardedRun.of(rank_dirs(tmp_path), step_dirs).assemble(0, "w")
    assert held.all() and np.array_equal(signs, full)
    assert csv_format.slice_indices({"shape": [6, 4], "flat": [10, 24]}) == range(10, 24)
    with pytest.raises(ValueError):
        csv_format.slice_indices({"shape": [6, 4], "flat": [10, 25]})


def test_slice_entries_round_trip_and_bad_entries_are_refused():
    entry = csv_format.slice_entry((6, 4), (range(2, 4), (0, 2, 3)))
    assert entry == {"shape": [6, 4], "index": [[2, 4], {"take": [0, 2, 3]}]}
    assert csv_format.slice_indices(json.loads(json.dumps(entry))) == (range(2, 4), [0, 2, 3])
    for bad in ({"shape": [6], "index": [[2, 9]]}, {"shape": [6], "index": [{"take": [6]}]},
                {"shape": [6, 4], "index": [[0, 6]]}, {"shape": [6], "index": ["x"]}):
        with pytest.raises(ValueError):
            csv_format.slice_indices(bad)


def _write_sharded_dump(root: Path, full: np.ndarray, layout: list[tuple[int, tuple | range]], step: int = 0) -> None:
    """A dump whose ranks each wrote the slices ``layout`` gives them (rank, per-dimension index,
    or a range of the flattened parameter)."""
    per_rank: dict[int, dict] = {}
    for rank, index in layout:
        if isinstance(index, range):
            part = full.reshape(-1)[index.start : index.stop]
        else:
            part = full[np.ix_(*[np.asarray(list(i)) for i in index])]
        csv_format.write_direction(csv_format.direction_path(root, rank, step, "w"), part)
        per_rank.setdefault(rank, {})["w"] = csv_format.slice_entry(full.shape, index)
    for rank, params in per_rank.items():
        csv_format.write_slices(root, rank, step, params)
        csv_format.write_summary_csv(csv_format.summary_csv_path(root, rank, step), "L1", BOUNDS,
                                     [stats.GradStats("w", full.shape, 1.0, -1.0, 1.0)])


def test_sharded_run_reassembles_strided_slices_and_masks_what_is_missing(tmp_path):
    full = np.random.default_rng(0).random((6, 4)) > 0.5
    rows_even, rows_odd = (0, 2, 4), (1, 3, 5)
    _write_sharded_dump(tmp_path / "a", full, [(0, (rows_even, range(0, 4))), (1, (rows_odd, range(0, 4)))])
    from probes.grad_probe.comparator import rank_dirs, step_dirs

    run = ShardedRun.of(rank_dirs(tmp_path / "a"), step_dirs)
    signs, held = run.assemble(0, "w")
    assert held.all() and np.array_equal(signs, full)
    _write_sharded_dump(tmp_path / "b", full, [(0, (rows_even, range(0, 4)))])  # rank 1's slice lost
    signs, held = ShardedRun.of(rank_dirs(tmp_path / "b"), step_dirs).assemble(0, "w")
    assert held.sum() == 12 and np.array_equal(signs[held], full[held])


# ------------------------------------------------------------------ the engines


def _run(dump: Path, engine: str, **kwargs) -> list[dict]:
    name = "ddp" if engine == "ddp4" else engine
    job = run_ranks(jobs.grad_probe_job, WORLD[engine], (str(dump), name), kwargs, timeout=TIMEOUT_S)
    return job.values


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """Every engine's two-step L2 run (and the single process's), with its rank results; in the
    same launch, the run with the FP8 health columns on, under ``{engine}_fp8`` (its rank results
    under each rank's ``"fp8"``)."""
    root = tmp_path_factory.mktemp("sharded")
    out = {"plain": (root / "plain", [jobs.grad_probe_job(str(root / "plain"), "plain")]),
           "plain_fp8": (root / "plain_fp8", [jobs.grad_probe_job(str(root / "plain_fp8"), "plain", fp8=FP8, outlier=True)])}
    for engine in WORLD:
        name = "ddp" if engine == "ddp4" else engine
        values = run_ranks(jobs.grad_probe_jobs, WORLD[engine], (str(root / engine), name, str(root / f"{engine}_fp8"),
                                                                 FP8), timeout=TIMEOUT_S).values
        out[engine] = (root / engine, values)
        out[f"{engine}_fp8"] = (root / f"{engine}_fp8", [v["fp8"] for v in values])
    return out


def _rows(dump: Path, rank: int, step: int) -> dict[str, dict[str, str]]:
    with open(csv_format.summary_csv_path(dump, rank, step), encoding="utf-8-sig", newline="") as f:
        return {r["param_name"].removeprefix("module."): r for r in csv.DictReader(f)}


@pytest.mark.parametrize("fp8", ["", "_fp8"])
@pytest.mark.parametrize("engine", ["fsdp", "tp", "hsdp", "fsdp_tp"])
def test_every_rank_writes_the_full_parameters_figures(runs, engine, fp8):
    """With ``_fp8``, the FP8 health columns too, and an outlier on one rank's slice: each rank
    counts its slices at the full gradient's amax, so the fractions are the single process's."""
    plain_dump, _ = runs[f"plain{fp8}"]
    dump, values = runs[f"{engine}{fp8}"]
    for step in range(jobs.STEPS):
        want = _rows(plain_dump, 0, step)
        if fp8:
            assert list(next(iter(want.values())))[-len(FP8_COLUMNS):] == FP8_COLUMNS
            if step == jobs.STEPS - 1:  # the outlier's scale: most of the rest of its gradient underflows
                assert float(want[jobs.OUTLIER[0]]["float8_e4m3fn underflow"]) > 0.5
        for rank in range(WORLD[engine]):
            got = _rows(dump, rank, step)
            assert list(got) == list(want), f"rank {rank} step {step}: other parameters"
            for name, row in want.items():
                assert list(got[name]) == list(row)
                assert got[name]["shape"] == row["shape"], f"{name}: the full shape, not the local one"
                for column, value in row.items():
                    if column in ("param_name", "shape"):
                        continue
                    assert float(got[name][column]) == pytest.approx(float(value), rel=1e-4, abs=1e-12), (
                        f"rank {rank} step {step} {name} {column}")
        summaries = [json.loads((dump / f"rank{r}" / "summary.json").read_text()) for r in range(WORLD[engine])]
        assert all(s["errors"] == [] and s["steps_written"] == [0, 1] for s in summaries)


@pytest.mark.parametrize("engine", list(WORLD))
def test_every_rank_issues_the_same_collectives(runs, engine):
    _, values = runs[engine]
    counts = [v["calls"] for v in values]
    assert all(c == counts[0] for c in counts), counts
    if engine != "hsdp":  # HSDP's own gradient all-reduce over its replicas is counted too
        assert counts[0].get("all_reduce", 0) == 2 * CHAINS[engine] * jobs.STEPS, counts[0]
    # the FP8 health columns add one small all-reduce (the counts) per chain and step, on every rank
    with_fp8 = [v["calls"] for v in runs[f"{engine}_fp8"][1]]
    assert all(c == with_fp8[0] for c in with_fp8), with_fp8
    added = with_fp8[0].get("all_reduce", 0) - counts[0].get("all_reduce", 0)
    assert added == CHAINS[engine] * jobs.STEPS, (with_fp8[0], counts[0])
    assert [v["losses"] for v in runs[f"{engine}_fp8"][1]] == [v["losses"] for v in values]


def test_hsdp_adds_two_small_all_reduces_per_step(runs, tmp_path):
    plain = _run(tmp_path, "hsdp", probe=False)
    probed = runs["hsdp"][1]
    for a, b in zip(plain, probed):
        assert b["calls"]["all_reduce"] - a["calls"].get("all_reduce", 0) == 2 * jobs.STEPS
        assert a["losses"] == b["losses"]  # the probe leaves training bit-identical


@pytest.mark.parametrize("a,b", [("ddp", "fsdp"), ("tp", "ddp"), ("fsdp", "tp"), ("ddp4", "hsdp"),
                                 ("fsdp_tp", "ddp4"), ("hsdp", "fsdp_tp")])
def test_direction_data_compares_equal_across_shardings(runs, a, b, tmp_path):
    res = GradComparator.compare_distributed(runs[a][0], runs[b][0], tmp_path / "cmp", plots=False)
    assert sorted(res) == list(range(WORLD[a])) and res.ok
    for rank, cmp in res.items():
        assert cmp.steps == [0, 1]
        assert all(cmp.summary[n] == 1.0 for n in cmp.steps), (rank, cmp.summary)
        assert all(cmp.status[p][n] == "ok" for p in cmp.params for n in cmp.steps), cmp.status
        assert len(cmp.params) == 10  # 4 layers and the head, weight and bias, matched across "module."


def test_a_single_process_run_compares_with_rank0_of_a_sharded_one(runs):
    res = GradComparator.compare_distributed(runs["plain"][0], runs["fsdp_tp"][0], None, plots=False)
    assert res[0].summary == {0: 1.0, 1: 1.0}
    assert res.rank_status[1] == "missing_a"


def test_a_sign_flip_on_one_ranks_shard_is_flagged_at_its_parameter_and_step(runs, tmp_path):
    _run(tmp_path / "flip", "fsdp", flip=(1, "l2.weight", 1))
    res = GradComparator.compare_distributed(runs["fsdp"][0], tmp_path / "flip", None, plots=False)
    for rank in (0, 1):  # rank 0 holds none of the flipped rows: its comparison sees them all the same
        cmp = res[rank]
        assert [(f.param, f.step) for f in cmp.flags if f.param != "summary"] == [("l2.weight", 1)]
        assert cmp.similarity["l2.weight"][1] < 0.6  # rank 1 holds half of the rows
        assert cmp.similarity["l2.weight"][0] == 1.0 and cmp.similarity["l1.weight"][1] == 1.0


def test_the_rank_filter_writes_one_rank_and_leaves_no_rank_waiting(runs, tmp_path):
    _run(tmp_path, "fsdp", ranks=[1])
    assert not (tmp_path / "rank0").exists()
    want = _rows(runs["plain"][0], 0, 1)
    got = _rows(tmp_path, 1, 1)
    for name, row in want.items():
        assert float(got[name]["norm"]) == pytest.approx(float(row["norm"]), rel=1e-4)
    assert sorted(p.name for p in (tmp_path / "rank1" / "step1").iterdir())[-1] == "shards.json"
    # rank 0's slices are missing from the direction data: only the elements both runs hold count
    res = GradComparator.compare_distributed(runs["fsdp"][0], tmp_path, None, plots=False)
    assert res.rank_status[0] == "missing_b" and res[1].summary[1] == 1.0
    assert res[1].counts["l1.weight"][1][1] == 16 * 16  # rank 1's half of the 32 x 16 weight


def test_l0_checksums_are_shard_wise_and_compare_equal_across_identical_runs(tmp_path):
    for name in ("a", "b"):
        _run(tmp_path / name, "fsdp", level="L0", steps=1)
    a0, a1 = _rows(tmp_path / "a", 0, 0), _rows(tmp_path / "a", 1, 0)
    assert a0["l1.weight"]["MD5"] != a1["l1.weight"]["MD5"]  # each rank's own slice
    assert a0["l1.weight"]["shape"] == "[32, 16]"
    res = GradComparator.compare_distributed(tmp_path / "a", tmp_path / "b", None, plots=False)
    assert all(cmp.summary[0] == 1.0 and cmp.mode[0] == "md5" for cmp in res.values())


def test_a_partial_gradient_is_reduced_before_its_figures(tmp_path):
    values = run_ranks(jobs.partial_gradient_job, 2, (str(tmp_path),), timeout=TIMEOUT_S).values
    total = sum(torch.tensor(v["summand"]) for v in values)
    for rank in (0, 1):
        row = _rows(tmp_path, rank, 0)["w"]
        assert float(row["max"]) == float(total.max()) and float(row["min"]) == float(total.min())
        assert float(row["norm"]) == pytest.approx(float(total.double().norm()), rel=1e-12)
        assert row["shape"] == "[4, 3]"


def test_the_merged_report_reads_a_four_rank_two_dimensional_mesh(runs):
    merged = merge_ranks(runs["fsdp_tp"][0], "grad_probe", world_size=4)
    assert [merged["ranks"][f"rank{r}"]["status"] for r in range(4)] == ["clean"] * 4
    assert merged["probe"]["errors"] == 0 and merged["probe"]["checked"] == 4 * 10 * jobs.STEPS


def test_a_slice_failing_on_one_rank_is_an_error_on_every_rank_and_nobody_waits(runs, tmp_path):
    values = _run(tmp_path, "fsdp", fail=(1, (16, 32)))  # l2.weight, on rank 1 only
    assert values[0]["losses"] == runs["fsdp"][1][0]["losses"]
    want = _rows(runs["plain"][0], 0, 1)
    for rank in (0, 1):
        got = _rows(tmp_path, rank, 1)
        assert "l2.weight" not in got and set(got) == set(want) - {"l2.weight"}
        errors = json.loads((tmp_path / f"rank{rank}" / "summary.json").read_text())["errors"]
        assert [(e["step"], e["param"]) for e in errors] == [(0, "l2.weight"), (1, "l2.weight")]
        assert "1 rank(s)' slices" in errors[0]["error"]


def test_the_rank_filter_selects_global_ranks_of_a_two_dimensional_mesh(runs, tmp_path):
    values = _run(tmp_path, "fsdp_tp", ranks=[2])  # dp coordinate 1, tp coordinate 0
    assert values[2]["losses"] == runs["fsdp_tp"][1][2]["losses"]
    assert sorted(p.name for p in tmp_path.iterdir() if p.name.startswith("rank")) == ["rank2"]
    want, got = _rows(runs["plain"][0], 0, 1), _rows(tmp_path, 2, 1)
    assert [float(got[n]["max"]) for n in want] == pytest.approx([float(r["max"]) for r in want.values()], rel=1e-6)


@pytest.mark.parametrize("tool", ["free_benchmark", "online_dispatch"])
def test_rank_filter_per_rank_files_and_the_merged_report_on_a_two_dimensional_mesh(tool, tmp_path):
    """FSDP2 x TP on 4 ranks, a defect seeded on rank 2 only: the merged report names rank 2
    first; free_benchmark's rank filter [1, 2] leaves ranks 0 and 3 'not selected'."""
    ranks = [1, 2] if tool == "free_benchmark" else None
    values = run_ranks(jobs.tools_job, 4, (str(tmp_path), "fsdp_tp", tool, ranks, 2), timeout=TIMEOUT_S).values
    plain = run_ranks(jobs.tools_job, 4, (str(tmp_path / "plain"), "fsdp_tp", tool), timeout=TIMEOUT_S).values
    assert [v["losses"] for v in values] == [v["losses"] for v in plain]  # the probe changes nothing
    merged = merge_ranks(tmp_path, tool, world_size=4)
    statuses = [merged["ranks"][f"rank{r}"]["status"] for r in range(4)]
    if tool == "free_benchmark":
        assert statuses == ["not selected", "clean", "flagged", "not selected"]
    else:
        assert statuses == ["clean", "clean", "flagged", "clean"]
    assert merged["flagged_ranks"] == [2] and merged["first"]["rank"] == 2


def test_the_step_filter_under_fsdp(runs, tmp_path):
    _run(tmp_path, "fsdp", step_filter=[1])
    for rank in (0, 1):
        assert sorted(p.name for p in (tmp_path / f"rank{rank}").glob("grad_summary_*.csv")) == ["grad_summary_1.csv"]
        assert _rows(tmp_path, rank, 1) == _rows(runs["fsdp"][0], rank, 1)


def test_wrapper_prefixes_are_matched_as_whole_module_names_only():
    from probes.grad_probe.comparator import _wrapper_aliases

    a = ["l1.weight", "submodule.w", "head.bias"]
    b = ["module.l1.weight", "module.submodule.w", "_orig_mod.module.head.bias"]
    assert _wrapper_aliases(a, b) == dict(zip(b, a))
    assert _wrapper_aliases(["subw"], ["module.submodule.w"]) == {}  # "submodule" is not a wrapper
    assert _wrapper_aliases(["w", "module.w"], ["module.module.w"]) == {}  # no rename without a one-to-one match
