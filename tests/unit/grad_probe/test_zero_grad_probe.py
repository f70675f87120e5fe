"""grad_probe under DeepSpeed ZeRO stages 1, 2 and 3 on two gloo ranks: every row describes the full
parameter (equal to a single-process run's), the flat slices' direction data compares with other
runs, a sign flip on one rank's partition is found, and no rank waits in a collective another
skipped.

One launch (tests/support/zero_jobs.py) runs every stage and every variant in the same two processes;
the single-process references run here. Each launch has a time limit, so a deadlock fails.
"""

from __future__ import annotations

import csv
import importlib.util
import json
import math
from pathlib import Path
from types import SimpleNamespace

import pytest

torch = pytest.importorskip("torch")
# deepspeed is imported by the ranks only: imported here it would change this process for the other tests
if importlib.util.find_spec("deepspeed") is None:
    pytest.skip("the ZeRO tests need deepspeed (the dev extra)", allow_module_level=True)

import zero_jobs as jobs  # noqa: E402

from probes import GradComparator  # noqa: E402
from probes.backends import torch_zero  # noqa: E402
from probes.grad_probe import csv_format  # noqa: E402
from pytest_msprobe.distributed import run_ranks  # noqa: E402

pytestmark = pytest.mark.slow  # subprocess pytest sessions / multi-process jobs: minutes in all

TIMEOUT_S = 120.0
STAGES = (1, 2, 3)
WORLD = 2
#: runs written by the probe, and the reference each must equal
REFERENCE_OF = {"probed": "single", "two_groups": "two_groups", "clipped": "clipped", "rank1": "single",
                "attached_first": "single", "fp8": "fp8"}


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    root = tmp_path_factory.mktemp("zero")
    refs = {"single": {}, "two_groups": {"groups": 2}, "clipped": {"clip": jobs.CLIP},
            "two_groups_clipped": {"groups": 2, "clip": jobs.CLIP}, "fp8": {"fp8": jobs.FP8, "outlier": True}}
    for name, kwargs in refs.items():
        jobs.reference(str(root / f"ref_{name}"), **kwargs)
    values = run_ranks(jobs.zero_job, WORLD, (str(root),), timeout=TIMEOUT_S).values
    return root, values


def _rows(dump: Path, rank: int, step: int) -> dict[str, dict[str, str]]:
    with open(csv_format.summary_csv_path(dump, rank, step), encoding="utf-8-sig", newline="") as f:
        return {r["param_name"]: r for r in csv.DictReader(f)}


def _summary(dump: Path, rank: int) -> dict:
    return json.loads((dump / f"rank{rank}" / "summary.json").read_text())


@pytest.mark.parametrize("run", list(REFERENCE_OF))
@pytest.mark.parametrize("stage", STAGES)
def test_every_rank_writes_the_full_parameters_figures(runs, stage, run):
    root, _values = runs
    dump, ref = root / f"stage{stage}_{run}", root / f"ref_{REFERENCE_OF[run]}"
    ranks = [1] if run == "rank1" else range(WORLD)
    for step in range(jobs.STEPS):
        want = _rows(ref, 0, step)
        if run == "fp8":  # the FP8 health columns, compared with the others below
            assert list(want["l1.weight"])[-4:] == [f"{f} {x}" for f in jobs.FP8 for x in ("underflow", "saturated")]
            if step == jobs.STEPS - 1:  # the outlier's scale: most of the rest of its gradient underflows
                assert float(want[jobs.OUTLIER[0]]["float8_e4m3fn underflow"]) > 0.5
        for rank in ranks:
            got = _rows(dump, rank, step)
            assert list(got) == list(want), f"rank {rank} step {step}: other parameters"
            for name, row in want.items():
                assert list(got[name]) == list(row)
                assert got[name]["shape"] == row["shape"], f"{name}: the full shape, not the partition's"
                for column, value in row.items():
                    if column in ("param_name", "shape"):
                        continue
                    assert float(got[name][column]) == pytest.approx(float(value), rel=1e-4, abs=1e-12), (
                        f"rank {rank} step {step} {name} {column}")
    for rank in ranks:
        summary = _summary(dump, rank)
        assert summary["errors"] == [] and summary["steps_written"] == [0, 1] and summary["optimizer_steps"] == 2
        assert summary["params_without_grad"] == {}
    if run == "rank1":
        assert not (dump / "rank0").exists()



@pytest.mark.parametrize("stage", STAGES)
def test_with_two_groups_and_clipping_the_later_group_is_read_before_its_clipping(runs, stage):
    """The documented limit: DeepSpeed clips each group just before stepping it, and the probe
    reads every group at the first group's step (the weights clipped, the biases not yet)."""
    root, _values = runs
    clipped, unclipped = _rows(root / "ref_two_groups_clipped", 0, 0), _rows(root / "ref_two_groups", 0, 0)
    for rank in range(WORLD):
        got = _rows(root / f"stage{stage}_two_groups_clipped", rank, 0)
        for name, row in got.items():
            want = clipped if name.endswith("weight") else unclipped
            assert float(row["norm"]) == pytest.approx(float(want[name]["norm"]), rel=1e-4), (rank, name)
        assert float(got["l1.bias"]["norm"]) != pytest.approx(float(clipped["l1.bias"]["norm"]), rel=1e-2)


@pytest.mark.parametrize("stage", STAGES)
def test_a_part_failing_on_one_rank_is_an_error_on_every_rank_and_nobody_waits(runs, stage):
    root, values = runs
    name, _rank = jobs.FAIL
    dump, want = root / f"stage{stage}_slice_fails", _rows(root / "ref_single", 0, 1)
    for rank in range(WORLD):
        assert values[rank][stage]["slice_fails"]["losses"] == values[rank][stage]["plain"]["losses"]
        got = _rows(dump, rank, 1)
        assert set(got) == set(want) - {name}
        errors = _summary(dump, rank)["errors"]
        assert [(e["step"], e["param"]) for e in errors] == [(0, name), (1, name)]
        assert "1 rank(s)' slices" in errors[0]["error"]

@pytest.mark.parametrize("stage", STAGES)
def test_the_flat_slices_cover_each_parameter_once(runs, stage):
    root, _values = runs
    dump = root / f"stage{stage}_probed"
    want = _rows(root / "ref_single", 0, 0)
    for step in range(jobs.STEPS):
        held: dict[str, list[range]] = {}
        for rank in range(WORLD):
            entries = json.loads((dump / f"rank{rank}" / f"step{step}" / csv_format.SLICES_JSON).read_text())["params"]
            for name, entry in entries.items():
                held.setdefault(name, []).append(csv_format.slice_indices(entry))
                assert entry["shape"] == json.loads(want[name]["shape"])
        for name, row in want.items():
            numel = math.prod(json.loads(row["shape"]))
            parts = sorted(held[name], key=lambda r: r.start)
            assert parts[0].start == 0 and parts[-1].stop == numel, (name, parts)
            assert all(a.stop == b.start for a, b in zip(parts, parts[1:])), (name, parts)
    if stage == 3:  # every parameter halved; the last rank's padding cut off
        assert held["head.bias"] == [range(0, 2), range(2, 3)]
    else:  # the flat buffer halved: l2.weight straddles the ranks, rank 0 holds none of the head
        assert len(held["l2.weight"]) == 2 and held["head.weight"] == [range(0, 24)]


@pytest.mark.parametrize("stage", STAGES)
def test_every_rank_issues_the_same_collectives_and_training_is_unchanged(runs, stage):
    _root, values = runs
    for name in jobs.RUNS:
        counts = [v[stage][name]["calls"] for v in values]
        assert all(c == counts[0] for c in counts), (name, counts)
    for v in values:
        plain = v[stage]["plain"]
        # the rank filter's left-out rank still takes part; FP8 health adds one all-reduce (the counts)
        for name, per_step in (("probed", 2), ("rank1", 2), ("attached_first", 2), ("fp8", 3)):
            assert v[stage][name]["losses"] == plain["losses"], name  # bit-identical
            added = v[stage][name]["calls"]["all_reduce"] - plain["calls"].get("all_reduce", 0)
            assert added == per_step * jobs.STEPS, (name, v[stage][name]["calls"], plain["calls"])
            assert {k: n for k, n in v[stage][name]["calls"].items() if k != "all_reduce"} == {
                k: n for k, n in plain["calls"].items() if k != "all_reduce"}
    reference = jobs.reference(None)  # the ranks' micro-batch losses average to the global one
    for step in range(jobs.STEPS):
        mean = sum(v[stage]["plain"]["losses"][step] for v in values) / WORLD
        assert mean == pytest.approx(reference[step], rel=1e-6)


def test_nothing_was_compiled(runs):
    _root, values = runs
    assert all(v["compiled"] == [] for v in values)


@pytest.mark.parametrize("stage", STAGES)
def test_direction_data_compares_equal_with_a_single_process_run(runs, stage):
    root, _values = runs
    res = GradComparator.compare_distributed(root / "ref_single", root / f"stage{stage}_probed", None, plots=False)
    assert res[0].summary == {0: 1.0, 1: 1.0}
    assert res.rank_status[1] == "missing_a"
    assert len(res[0].params) == 10


@pytest.mark.parametrize("a,b", [(1, 3), (2, 3), (1, 2)])
def test_direction_data_compares_equal_across_stages(runs, a, b):
    root, _values = runs
    res = GradComparator.compare_distributed(root / f"stage{a}_probed", root / f"stage{b}_probed", None, plots=False)
    assert sorted(res) == [0, 1] and res.ok
    for rank, cmp in res.items():
        assert cmp.steps == [0, 1]
        assert all(cmp.summary[n] == 1.0 for n in cmp.steps), (rank, cmp.summary)
        assert all(cmp.status[p][n] == "ok" for p in cmp.params for n in cmp.steps), cmp.status


@pytest.mark.parametrize("stage", STAGES)
def test_a_sign_flip_on_one_ranks_partition_is_flagged_at_its_parameter_and_step(runs, stage):
    root, _values = runs
    name, _rank, step = jobs.FLIP
    res = GradComparator.compare_distributed(root / f"stage{stage}_probed", root / f"stage{stage}_flipped", None,
                                             plots=False)
    for rank in range(WORLD):  # both ranks compare the reassembled parameter
        cmp = res[rank]
        assert [(f.param, f.step) for f in cmp.flags if f.param != "summary"] == [(name, step)]
        assert cmp.similarity[name][step] < 0.9
        assert cmp.similarity[name][0] == 1.0 and cmp.similarity["l1.weight"][step] == 1.0


def test_the_inner_optimizer_is_recognised_by_the_partitions_it_holds():
    """Stages 1/2: a fragment is a view of its group's flat partition, and DeepSpeed steps the inner
    optimizer once per group, holding only that group's partition."""
    flats = [torch.zeros(6, requires_grad=True), torch.zeros(4, requires_grad=True)]
    params = []
    for group, flat in enumerate(flats):
        mapping = SimpleNamespace(hp_fragment=flat.narrow(0, 1, 2), param_group_index=group)
        params.append(SimpleNamespace(_hp_mapping=mapping))
    params.append(SimpleNamespace(_hp_mapping=None))  # a parameter this rank holds none of
    inner = torch.optim.SGD([flats[0]], lr=0.1)
    inner.add_param_group({"params": [flats[1]]})
    other = torch.optim.SGD([torch.zeros(2, requires_grad=True)], lr=0.1)
    assert torch_zero.steps_for(inner, params) and not torch_zero.steps_for(other, params)
    groups = inner.param_groups
    inner.param_groups = [groups[0]]
    assert not torch_zero.continues_step(inner)
    inner.param_groups = [groups[1]]
    assert torch_zero.continues_step(inner)
    assert not torch_zero.continues_step(other)
    assert not torch_zero.steps_for(inner, [SimpleNamespace(_hp_mapping=object())])  # never raises

