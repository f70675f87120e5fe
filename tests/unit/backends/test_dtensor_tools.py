"""free_benchmark and online_dispatch on DTensor programs (tensor parallelism, FSDP2 x TP).

free_benchmark judges a DTensor call on what the rank computes: the API re-run on the plain local
tensors against the output's local tensor, when DTensor did nothing but run local kernels, or
re-run through DTensor on the perturbed local tensors wrapped back as the inputs' DTensors, when
DTensor only redistributed without a collective (the row-wise linear's bias); every other case is
a skip with its reason. online_dispatch compares a DTensor op through its local
kernels and names collectives and redistributions apart. The single-process tests run on a 1-rank
mesh in this process (a HashStore group, nothing on the network); the multi-rank ones launch the
jobs of dtensor_jobs.py once per module (a few seconds each) under a hard time limit.
"""

from __future__ import annotations

import json

import dtensor_jobs as jobs
import pytest
import torch
import torch.distributed as dist
import torch.nn.functional as F

from probes.backends import torch_dtensor as td
from probes.backends.torch_backend import TorchBackend
from probes.free_benchmark import exclusions
from probes.online_dispatch import skip_list
from probes.pytorch import PrecisionDebugger
from probes.pytorch.online_dispatch import PtdbgDispatch
from pytest_msprobe.distributed import run_ranks

TIMEOUT_S = 120.0  # per job: a deadlock fails the test after this, it never hangs
BF16 = torch.bfloat16
ALL_GATHERED = td.REDISTRIBUTED.format(what="Shard(dim=1) -> Replicate()")


@pytest.fixture(scope="module")
def mesh():
    """A 1-rank mesh over a process group of this process only (put back at the module's end)."""
    if dist.is_initialized():
        pytest.skip("a process group is already initialised in this process")
    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    from torch.distributed.device_mesh import init_device_mesh

    try:
        yield init_device_mesh("cpu", (1,))
    finally:
        dist.destroy_process_group()


def dtensor(mesh, shape, placement, dtype=BF16, seed=0, scale=1.0):
    from torch.distributed.tensor import DTensor

    local = (torch.randn(*shape, generator=torch.Generator().manual_seed(seed)) * scale).to(dtype)
    return DTensor.from_local(local, mesh, [placement], run_check=False)


def placements():
    from torch.distributed.tensor import Partial, Replicate, Shard

    return Partial, Replicate, Shard


def run(tmp_path, fn, **section):
    section.setdefault("pert_mode", "improve_precision")
    dbg = PrecisionDebugger(config={"task": "free_benchmark", "dump_path": str(tmp_path / "dump"),
                                    "free_benchmark": section})
    dbg.start()
    try:
        out = fn()
    finally:
        dbg.stop()
    return out, dbg.summary()


def reasons_of(summary, api):
    return {reason for reason, apis in summary["not_checked"].items() if api in apis}


# ------------------------------------------------------------------------------------ one rank
@pytest.mark.parametrize("rule", ["reference", "scaled"])
def test_column_parallel_linear_is_judged_on_the_local_tensors(mesh, tmp_path, monkeypatch, rule):
    Partial, Replicate, Shard = placements()
    x, w, b = dtensor(mesh, (4, 6), Replicate(), seed=1), dtensor(mesh, (3, 6), Shard(0), seed=2), \
        dtensor(mesh, (3,), Shard(0), seed=3)
    expected = F.linear(x, w, b).to_local()
    measured = []
    for name in ("ratio_reductions", "host_ratio_reductions", "scaled_figures", "scaled_bound_figures", "host_scaled_bound",
                 "host_scaled_figures", "any_differ", "host_floats"):
        real = getattr(TorchBackend, name)

        def spy(self, *arrays, _real=real, **kw):
            flat = [a for x in arrays for a in (x if isinstance(x, list) else [x]) if isinstance(a, torch.Tensor)]
            measured.extend(type(a) for a in flat)
            return _real(self, *arrays, **kw)

        monkeypatch.setattr(TorchBackend, name, spy)
    through = []
    monkeypatch.setattr(td.LocalCall, "_through", lambda self, *a: through.append(a))
    out, s = run(tmp_path, lambda: F.linear(x, w, b), rule=rule)
    assert type(out).__name__ == "DTensor" and torch.equal(out.to_local(), expected)  # bit-identical, same type
    assert s["apis"]["Functional.linear"]["checked"] == 1 and not s["flagged"] and not s["errors"]
    assert not reasons_of(s, "Functional.linear")
    assert measured and set(measured) == {torch.Tensor}  # figures and reads: plain local tensors only
    assert through == []  # no redistribution: the cheaper re-run on the plain local tensors


def test_calls_dtensor_redistributes_without_collectives_are_judged_through_dtensor(mesh, tmp_path, monkeypatch):
    Partial, Replicate, Shard = placements()
    h, w, b = dtensor(mesh, (4, 6), Shard(1), seed=1), dtensor(mesh, (5, 6), Shard(1), seed=2), \
        dtensor(mesh, (5,), Replicate(), seed=3)
    expected = F.linear(h, w, b).to_local(), torch.softmax(h, dim=-1).to_local()
    through = []
    real = td.LocalCall._through
    monkeypatch.setattr(td.LocalCall, "_through", lambda self, fn, args, kwargs: through.append(
        [type(a).__name__ for a in args]) or real(self, fn, args, kwargs))
    out, s = run(tmp_path, lambda: (F.linear(h, w, b), torch.softmax(h, dim=-1)))
    assert all(torch.equal(o.to_local(), e) for o, e in zip(out, expected))  # bit-identical
    # row-wise linear: DTensor turns the replicated bias into a partial sum (bias / n) locally; a
    # softmax over a sharded dimension all-gathers it, which on one rank is the shard itself
    for api in ("Functional.linear", "Torch.softmax"):
        assert s["apis"][api]["checked"] == 1 and not reasons_of(s, api), api
    assert not s["errors"] and not s["flagged"]
    assert through == [["Tensor"] * 3, ["Tensor"]]  # given the perturbed local tensors, wrapped inside


def test_a_rerun_through_dtensor_runs_the_function_on_dtensors(mesh, tmp_path, monkeypatch):
    Partial, Replicate, Shard = placements()
    monkeypatch.setattr(torch, "expm1", softmax_on_dtensors_only)
    x = dtensor(mesh, (4, 6), Shard(1), seed=1)
    out, s = run(tmp_path, lambda: torch.expm1(x))
    assert s["apis"]["Torch.expm1"]["checked"] == 1 and not reasons_of(s, "Torch.expm1") and not s["errors"]
    assert torch.equal(out.to_local(), torch.softmax(x, dim=1).to_local())


def test_a_seeded_row_wise_defect_is_caught_through_dtensor(mesh, tmp_path, monkeypatch):
    Partial, Replicate, Shard = placements()
    monkeypatch.setattr(F, "linear", jobs.fp8_rowwise_linear)  # before the probe wraps it
    h, w, b = dtensor(mesh, (8, 16), Shard(1), seed=1), dtensor(mesh, (8, 16), Shard(1), seed=2), \
        dtensor(mesh, (8,), Replicate(), seed=3)
    _, s = run(tmp_path, lambda: F.linear(h, w, b))
    assert s["apis"]["Functional.linear"] == dict(s["apis"]["Functional.linear"], checked=1, flagged=1)
    assert [r["api_name"] for r in s["flagged"]] == ["Functional.linear.0.forward"]


def test_a_redistribution_with_collectives_is_skipped_with_it(mesh, tmp_path, monkeypatch):
    Partial, Replicate, Shard = placements()
    monkeypatch.setattr(torch, "expm1", lambda x: (communicating(x), torch.softmax(x, dim=1))[1])
    x = dtensor(mesh, (4, 6), Shard(1), seed=1)
    out, s = run(tmp_path, lambda: torch.expm1(x))
    assert reasons_of(s, "Torch.expm1") == {ALL_GATHERED}
    assert s["apis"]["Torch.expm1"]["checked"] == 0 and not s["errors"]


def test_a_rerun_through_dtensor_that_communicates_is_a_probe_error(mesh, tmp_path, monkeypatch):
    """The call issued no collective, its float32 re-run does: the ranks' collectives could differ,
    which is an error (never a skip), and the user's output is untouched."""
    Partial, Replicate, Shard = placements()

    def softmax(x):
        if x.dtype == torch.float32:
            communicating(x)
        return torch.softmax(x, dim=1)

    monkeypatch.setattr(torch, "expm1", softmax)
    x = dtensor(mesh, (4, 6), Shard(1), seed=1)
    expected = torch.softmax(x, dim=1).to_local()
    out, s = run(tmp_path, lambda: torch.expm1(x))
    assert torch.equal(out.to_local(), expected)
    assert [e["error"].split(":")[0] for e in s["errors"]] == ["DivergedRerun"]
    assert "issued collectives" in s["errors"][0]["error"] and s["apis"]["Torch.expm1"]["checked"] == 0


def test_a_rerun_through_dtensor_that_computes_otherwise_is_skipped(mesh, tmp_path, monkeypatch):
    Partial, Replicate, Shard = placements()
    monkeypatch.setattr(torch, "expm1", lambda x: torch.softmax(x, dim=1) if x.dtype == BF16 else x * 2)
    x = dtensor(mesh, (4, 6), Shard(1), seed=1)
    _, s = run(tmp_path, lambda: torch.expm1(x))
    assert reasons_of(s, "Torch.expm1") == {td.THROUGH_DIFFERS.format(
        what="redistributed nothing where the call redistributed Shard(dim=1) -> Replicate()")}
    assert not s["errors"]


def test_preheat_samples_on_the_cpu_only_calls_rerun_on_the_local_tensors(mesh, tmp_path, monkeypatch):
    """The preheat's CPU sample runs the API on the plain local tensors: a row-wise linear (re-run
    through DTensor) is judged without one, a column-wise one is sampled."""
    from probes.free_benchmark.service import FreeBenchmarkProbe

    Partial, Replicate, Shard = placements()
    sampled = []
    real = FreeBenchmarkProbe._preheat_sample
    monkeypatch.setattr(FreeBenchmarkProbe, "_preheat_sample",
                        lambda self, call, verdicts: sampled.append(call.name) or real(self, call, verdicts))
    h, w, b = dtensor(mesh, (4, 6), Shard(1), seed=1), dtensor(mesh, (5, 6), Shard(1), seed=2), \
        dtensor(mesh, (5,), Replicate(), seed=3)
    x, wc = dtensor(mesh, (4, 6), Replicate(), seed=4), dtensor(mesh, (5, 6), Shard(0), seed=5)
    dbg = PrecisionDebugger(config={"task": "free_benchmark", "dump_path": str(tmp_path / "dump"), "free_benchmark": {
        "pert_mode": "bit_noise", "if_preheat": True, "preheat_step": 3, "max_sample": 3}})
    for _step in range(3):
        dbg.start()
        F.linear(h, w, b)  # row-wise: through DTensor
        F.linear(x, wc)  # column-wise: on the local tensors
        dbg.stop()
        dbg.step()
    s = dbg.summary()
    assert s["apis"]["Functional.linear"]["checked"] == 4 and not s["errors"]
    assert sampled and all(name.startswith("Functional.linear.1.") for name in sampled)


def test_a_rerun_through_dtensor_is_refused_off_the_mesh_device(mesh):
    Partial, Replicate, Shard = placements()
    x = dtensor(mesh, (4, 6), Shard(1), seed=1)
    call = td.local_call((x, 1), {})
    with call.watching():
        out = torch.softmax(x, 1)
    assert call.through and not isinstance(call.after(out), str)
    with pytest.raises(Exception) as caught:
        call.rerunner(pytest.fail)(torch.ones(4, 6, device="meta"), 1)  # refused before anything runs
    assert call.rerun_failed(caught.value) == td.THROUGH_DEVICE.format(what="meta")


def test_partial_sum_mixed_and_handled_inputs_are_skipped_with_their_reasons(mesh, tmp_path):
    from torch.distributed.tensor.experimental import implicit_replication

    Partial, Replicate, Shard = placements()
    partial, sharded = dtensor(mesh, (4, 6), Partial(), seed=1), dtensor(mesh, (4, 6), Shard(0), seed=2)

    def calls():
        torch.tanh(partial)
        torch.argmax(sharded, dim=1)  # DTensor's own handler (an argmax over shards communicates)
        with implicit_replication():
            torch.add(sharded, torch.ones(4, 6, dtype=BF16))
        torch.mul(sharded, torch.tensor(2.0, dtype=BF16))  # a 0-d plain tensor is a scalar: judged

    _, s = run(tmp_path, calls)
    assert reasons_of(s, "Torch.tanh") == {td.PARTIAL_INPUT.format(what="P(sum)")}
    assert reasons_of(s, "Torch.argmax") == {td.CUSTOM_HANDLER.format(what="aten.argmax.default")}
    assert reasons_of(s, "Torch.add") == {td.MIXED_INPUTS}
    assert s["apis"]["Torch.mul"]["checked"] == 1 and not reasons_of(s, "Torch.mul")


def test_inputs_on_two_meshes_are_not_rerun(mesh):
    from torch.distributed.device_mesh import init_device_mesh

    Partial, Replicate, Shard = placements()
    other = init_device_mesh("cpu", (1,), mesh_dim_names=("tp",))
    a, b = dtensor(mesh, (4, 6), Shard(0)), dtensor(other, (4, 6), Shard(0))
    assert td.local_call((a, b), {}) == td.MESHES_DIFFER
    assert td.local_call(([a, a],), {"other": a}).mesh is mesh  # nested and keyword DTensors: one mesh
    assert td.local_call((torch.ones(2), 3.0), {}) is None  # no DTensor: the usual path


def test_fix_and_the_backward_stage_leave_dtensor_calls_to_check(mesh, tmp_path):
    Partial, Replicate, Shard = placements()
    x = dtensor(mesh, (4, 6), Shard(0), seed=1)
    before = x.to_local().clone()
    out, s = run(tmp_path, lambda: torch.sigmoid(x), handler_type="fix")
    assert reasons_of(s, "Torch.sigmoid") == {exclusions.DISTRIBUTED_FIX}
    assert torch.equal(out.to_local(), torch.sigmoid(before))
    y = dtensor(mesh, (4, 6), Shard(0), seed=2, dtype=torch.float32).requires_grad_()
    _, s = run(tmp_path / "bw", lambda: torch.sigmoid(y).sum().backward(), fuzz_stage="backward",
               pert_mode="add_noise", list=["sigmoid"])
    assert reasons_of(s, "Torch.sigmoid") == {exclusions.DISTRIBUTED_BACKWARD}


def test_a_compiled_graph_on_dtensors_is_left_unchecked(mesh, tmp_path):
    from probes.backends.patching import ApiMeta

    Partial, Replicate, Shard = placements()
    x = dtensor(mesh, (4, 6), Shard(0), seed=1)
    graph = ApiMeta("Graph", "forward_0", None, "forward_0", torch.sin, reference=torch.sin,
                    review=lambda *a: pytest.fail("a DTensor graph must not be judged"))
    dbg = PrecisionDebugger(config={"task": "free_benchmark", "dump_path": str(tmp_path / "dump"),
                                    "free_benchmark": {"pert_mode": "improve_precision"}})
    dbg.start()
    try:
        out = dbg.probe.on_call(graph, torch.sin, (x,), {})  # what FreeBenchmarkGraphs hands the probe
    finally:
        dbg.stop()
    assert torch.equal(out.to_local(), torch.sin(x.to_local()))
    assert reasons_of(dbg.summary(), "Graph.forward_0") == {exclusions.DISTRIBUTED_GRAPH}


def test_a_seeded_half_precision_defect_on_the_shards_is_caught(mesh, tmp_path, monkeypatch):
    Partial, Replicate, Shard = placements()
    monkeypatch.setattr(torch, "expm1", jobs.naive_expm1)  # before the probe wraps it
    x = dtensor(mesh, (8, 16), Shard(1), seed=1, scale=1e-2)
    _, s = run(tmp_path, lambda: torch.expm1(x))
    assert s["apis"]["Torch.expm1"]["flagged"] == 1
    assert [r["api_name"] for r in s["flagged"]] == ["Torch.expm1.0.forward"]


def softmax_on_dtensors_only(x):
    """A softmax over the sharded dimension that refuses plain tensors: a re-run on the local
    tensors would raise, one through DTensor does not."""
    if type(x) is torch.Tensor:
        raise RuntimeError("no local kernel")
    return torch.softmax(x, dim=1)


def communicating(x):
    """A collective on the DTensor's mesh (on one rank, a sum over itself)."""
    import torch.distributed._functional_collectives as funcol

    return funcol.all_reduce(torch.zeros(1), "sum", (x.device_mesh, 0)).trigger_wait()


def dtensor_only(x):
    """A kernel that runs on DTensors only (the local re-run raises)."""
    if type(x) is torch.Tensor:
        raise RuntimeError("no local kernel")
    return x * 2


def reshaped_locally(x):
    """A function that gives plain tensors another shape than DTensors' local tensors."""
    return x.sum(0) if type(x) is torch.Tensor else x * 2


def with_random(x):
    return x + torch.rand_like(x) * 0  # DTensor draws through its RNG tracker


def summed_over_mesh(x):
    import torch.distributed._functional_collectives as funcol

    return funcol.all_reduce(x.to_local(), "sum", (x.device_mesh, 0)).trigger_wait()


@pytest.mark.parametrize("fn, reason", [
    (dtensor_only, td.RERUN_FAILED.format(what="RuntimeError")),
    (reshaped_locally, td.LOCAL_MISMATCH.format(what="gave shape (6,) where the rank's output is (4, 6)")),
    (with_random, td.RANDOM_OP.format(what="aten.rand_like.default")),
    (summed_over_mesh, td.COMMUNICATED),
], ids=["rerun-fails", "local-shape", "random", "collective"])
@pytest.mark.filterwarnings("ignore:DTensor random operators:UserWarning")
def test_calls_whose_local_rerun_would_differ_are_skipped(mesh, tmp_path, monkeypatch, fn, reason):
    from torch.distributed.tensor import _random

    monkeypatch.setattr(_random, "_rng_tracker", _random._rng_tracker)  # the one DTensor makes is dropped after
    Partial, Replicate, Shard = placements()
    monkeypatch.setattr(torch, "expm1", fn)
    x = dtensor(mesh, (4, 6), Shard(0), seed=1, dtype=torch.float32)
    out, s = run(tmp_path, lambda: torch.expm1(x), pert_mode="add_noise")
    assert reasons_of(s, "Torch.expm1") == {reason}
    assert not s["errors"] and s["apis"]["Torch.expm1"]["checked"] == 0


def test_dtensor_dispatcher_is_put_back_at_stop(mesh, tmp_path):
    from torch.distributed.tensor import DTensor
    from torch.distributed.tensor._utils import ExplicitRedistributionContext

    Partial, Replicate, Shard = placements()
    dispatcher = DTensor._op_dispatcher
    before = (vars(ExplicitRedistributionContext)["observe_redistribution"], dispatcher._random_ops,
              dict(dispatcher._custom_op_handlers))
    x = dtensor(mesh, (4, 6), Shard(0), seed=1)
    run(tmp_path, lambda: torch.exp(x))
    after = (vars(ExplicitRedistributionContext)["observe_redistribution"], dispatcher._random_ops,
             dict(dispatcher._custom_op_handlers))
    assert after[0] is before[0] and after[1] is before[1] and after[2] == before[2]
    assert type(dispatcher._random_ops) is set


def test_online_dispatch_compares_a_dtensor_op_through_its_local_kernels(mesh, tmp_path):
    Partial, Replicate, Shard = placements()
    x, w = dtensor(mesh, (4, 6), Shard(1), dtype=torch.float32), dtensor(mesh, (3, 6), Shard(1), seed=1,
                                                                       dtype=torch.float32)
    expected = F.linear(x, w).to_local()
    with PtdbgDispatch(dump_mode="OFF", dump_path=str(tmp_path)) as d:
        y = F.linear(x, w)
    assert torch.equal(y.to_local(), expected)
    s = json.loads((d.results.run_dir / "summary.json").read_text())
    assert s["skipped"][skip_list.THROUGH_DTENSOR]["aten.mm.default"] == 1  # the DTensor-level op
    assert s["ops_compared_by_op"]["aten.mm.default"] == 1  # its local kernel
    assert skip_list.THROUGH_SUBCLASS not in s["skipped"] and not s["failed_ops"]


def test_online_dispatch_names_collectives_and_redistributions():
    ops = torch.ops._c10d_functional
    for op in (ops.all_reduce.default, ops.all_gather_into_tensor.default, ops.wait_tensor.default):
        assert skip_list.skip_reason(op) == skip_list.COLLECTIVE
    assert skip_list.skip_reason(torch.ops._dtensor.shard_dim_alltoall.default) == skip_list.REDISTRIBUTION


# ------------------------------------------------------------------------------------ multi-rank
@pytest.fixture(scope="module")
def tp(tmp_path_factory):
    """The tp job on 2 ranks (its runs: dtensor_jobs.tensor_parallel_job)."""
    dump = tmp_path_factory.mktemp("dtensor_tp")
    return run_ranks(jobs.tensor_parallel_job, 2, (str(dump),), timeout=TIMEOUT_S).values


@pytest.fixture(scope="module")
def fsdp_tp(tmp_path_factory):
    """The fsdp_tp job on 4 ranks (dp=2 x tp=2)."""
    dump = tmp_path_factory.mktemp("dtensor_fsdp_tp")
    return run_ranks(jobs.fsdp_tp_job, 4, (str(dump),), timeout=TIMEOUT_S).values


PROBED = {"improve_precision": "plain_bf16", "scaled": "plain_bf16", "add_noise": "plain_fp32",
          "online_dispatch": "plain_fp32"}


def _same_program(rank_values, probed=PROBED):
    """Every probed run has the losses of its run without a probe, bit for bit, and issued exactly
    its collectives; the probe's own checks issued none."""
    for v in rank_values:
        for run_name, plain in probed.items():
            got, ref = v[run_name], v[plain]
            assert got["losses"] == ref["losses"], (v["rank"], run_name)
            assert got["collectives"] == ref["collectives"] > 0, (v["rank"], run_name)
            assert got["in_checks"] == 0 and not got["errors"], (v["rank"], run_name)


def _linear_judged(rank_values, runs=("improve_precision", "scaled", "add_noise")):
    for v in rank_values:
        for run_name in runs:
            r = v[run_name]
            # every linear judged on every rank (4 a step): the column-wise ones on the local
            # tensors, the row-wise ones (bias made a partial sum locally) through DTensor
            assert r["apis"]["Functional.linear"] == {"calls": 8, "checked": 8, "flagged": 0}, (v["rank"], run_name)
            assert not any("Functional.linear" in apis for apis in r["not_checked"].values())
            assert r["apis"]["Torch.relu"]["checked"] == 6 and r["apis"]["Tensor.square"]["checked"] == 2
            assert r["flagged"] == []


def _rowwise_defect_caught(rank_values):
    for v in rank_values:
        d = v["rowwise_defect"]
        # the float8 partial sums of l2 and l4 (calls 1 and 3 of each step), on every rank
        assert d["apis"]["Functional.linear"] == {"calls": 8, "checked": 8, "flagged": 4}, v["rank"]
        assert d["flagged"] == ["Functional.linear.1.forward", "Functional.linear.3.forward"]
        assert d["in_checks"] == 0 and not d["errors"]


def test_tp_probed_runs_compute_what_the_plain_runs_do(tp):
    _same_program(tp, dict(PROBED, fsdp="plain_fsdp", no_change="plain_bf16"))


def test_tp_linear_is_judged_on_every_rank_and_the_clean_model_is_clean(tp):
    _linear_judged(tp)


def test_tp_reruns_compute_the_ranks_local_values_bit_for_bit(tp):
    """no_change flags any difference: the row-wise linears' re-runs through DTensor give the
    rank's own partial sums (a re-run on the raw local tensors would add the whole bias)."""
    for v in tp:
        r = v["no_change"]
        assert r["apis"]["Functional.linear"] == {"calls": 8, "checked": 8, "flagged": 0}, v["rank"]
        assert r["flagged"] == [] and not r["errors"]


def test_tp_partial_sum_input_and_gathering_redistribution_are_skipped_with_their_reasons(tp):
    for v in tp:
        assert v["add_noise"]["not_checked"][td.PARTIAL_INPUT.format(what="P(sum)")] == {"Torch.tanh": 2}
        assert v["add_noise"]["not_checked"][ALL_GATHERED] == {"Torch.softmax": 2}  # all-gathered first


def test_tp_seeded_row_wise_defect_is_caught_on_every_rank(tp):
    _rowwise_defect_caught(tp)


def test_tp_seeded_defect_on_the_shards_is_caught_on_every_rank(tp):
    for v in tp:
        d = v["defect"]
        assert d["apis"]["Torch.expm1"] == {"calls": 2, "checked": 2, "flagged": 2}
        assert d["flagged"] == ["Torch.expm1.0.forward"]  # its one call of each step (calls are counted per step)
        assert d["apis"]["Functional.linear"]["flagged"] == 0 and d["in_checks"] == 0


def test_fsdp_alone_is_checked_on_plain_tensors(tp):
    for v in tp:
        r = v["fsdp"]
        assert r["apis"]["Functional.linear"] == {"calls": 8, "checked": 8, "flagged": 0}
        assert not any(reason.startswith("the DTensor") or reason == td.MIXED_INPUTS for reason in r["not_checked"])


def test_tp_online_dispatch_compares_local_kernels_and_names_collectives(tp):
    for v in tp:
        od = v["online_dispatch"]
        assert od["failed"] == [] and od["ops_compared"] > 0
        assert od["skipped"][skip_list.THROUGH_DTENSOR]["aten.addmm.default"] == 8
        assert od["compared_by_op"]["aten.addmm.default"] == 8  # the local kernels of the same calls
        # every collective the run issued (the row-wise layers', the partial sum's, the softmax's) is
        # named, none compared
        named = od["skipped"][skip_list.COLLECTIVE]
        assert named["_c10d_functional.all_reduce.default"] == 8
        assert named["_c10d_functional.all_gather_into_tensor.default"] == 2 and od["collectives"] == 10
        assert od["compared_by_op"]["aten.tanh.default"] == 2  # the partial sum's tanh, after its all-reduce
        assert skip_list.THROUGH_SUBCLASS not in od["skipped"] or \
            "aten.addmm.default" not in od["skipped"][skip_list.THROUGH_SUBCLASS]


def test_fsdp_tp_probed_runs_compute_what_the_plain_runs_do(fsdp_tp):
    _same_program(fsdp_tp)


def test_fsdp_tp_seeded_row_wise_defect_is_caught_on_every_rank(fsdp_tp):
    _rowwise_defect_caught(fsdp_tp)


def test_fsdp_tp_linear_is_judged_on_every_rank(fsdp_tp):
    _linear_judged(fsdp_tp)
    for v in fsdp_tp:
        od = v["online_dispatch"]
        assert od["failed"] == [] and od["skipped"][skip_list.THROUGH_DTENSOR]["aten.addmm.default"] == 8
        assert {"c10d._allgather_base_.default", "_c10d_functional.all_reduce.default"} <= \
            set(od["skipped"][skip_list.COLLECTIVE])
