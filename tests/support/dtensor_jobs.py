"""Per-rank jobs of the DTensor tests: free_benchmark and online_dispatch on tensor-parallel
programs (tests/support/engines.py's ``tp`` and ``fsdp_tp``). Module-level, so spawned ranks import them.

Each job trains the same model once without a probe and once under each tool, and returns small
picklable dictionaries: the losses (compared bit for bit), the collectives each run issued (the
process groups' own sequence numbers, so every c10d call counts, DTensor's functional collectives
included) and what the probe's summary says. The collectives issued inside the probe's own checks
(after the user's call returned) are counted apart: they must be none.
"""

from __future__ import annotations

import json
from typing import Any

import engines
import torch
import torch.distributed as dist

STEPS = 2
_LINEAR = torch.nn.functional.linear  # the real one, for the seeded row-wise defect


def issued() -> int:
    """Collectives this rank has issued so far, over every process group (c10d's sequence numbers)."""
    from torch.distributed.distributed_c10d import _world

    return sum(pg._get_sequence_number_for_group() for pg in list(_world.pg_map))


def naive_expm1(x: torch.Tensor) -> torch.Tensor:
    """exp(x) - 1: cancellation loses every digit of small x in half precision (the seeded defect,
    installed over torch.expm1 before the probe wraps it; here it runs on each rank's shard)."""
    return torch.exp(x) - 1


def fp8_rowwise_linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
    """F.linear with a broken half-precision kernel for row-parallel layers: each rank's partial
    sum (its input shard times its weight shard, plus its part of the bias) is kept in float8
    before the layer's all-reduce (the seeded defect on the row-wise layers' local computation,
    installed over F.linear before the probe wraps it). Column-wise layers, float32 calls and the
    float32 re-run of improve_precision are exact, so only the row-wise layers are wrong."""
    y = _LINEAR(x, weight, bias)
    if y.dtype in (torch.bfloat16, torch.float16) and _row_parallel(weight):
        return y.to(torch.float8_e4m3fn).to(y.dtype)  # DTensor keeps the partial sum: no collective
    return y


def _row_parallel(weight: Any) -> bool:
    from torch.distributed.tensor import Shard

    return any(isinstance(p, Shard) and p.dim in (1, -1) for p in getattr(weight, "placements", ()))


class ExpBlock(torch.nn.Module):
    """A column-parallel layer whose sharded output (a DTensor) goes through torch.expm1, then a
    row-parallel one: the seeded API sees DTensor arguments."""

    def __init__(self) -> None:
        super().__init__()
        self.up = torch.nn.Linear(engines.IN, engines.HIDDEN)
        self.down = torch.nn.Linear(engines.HIDDEN, engines.OUT)
        with torch.no_grad():
            self.up.weight.mul_(1e-2)  # small activations: where exp(x) - 1 cancels
            self.up.bias.mul_(1e-2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down(torch.expm1(self.up(x)))


def build_exp_block(dtype: torch.dtype) -> torch.nn.Module:
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module

    torch.manual_seed(0)
    model = ExpBlock().to(dtype)
    plan = {"up": ColwiseParallel(use_local_output=False), "down": RowwiseParallel()}
    return parallelize_module(model, init_device_mesh("cpu", (dist.get_world_size(),)), plan)


def _train(engine: str, dtype: torch.dtype, tool: str | None, dump: str, model: torch.nn.Module | None = None,
           pert_mode: str = "improve_precision", extra: Any = None, rule: str | None = None) -> dict[str, Any]:
    """STEPS SGD steps of the engine's model, under ``tool`` (None: none); returns the losses, the
    collectives the steps issued, those issued inside the probe's checks, and the summary."""
    from probes.pytorch import PrecisionDebugger
    from probes.pytorch.online_dispatch import PtdbgDispatch

    model = engines.build(engine, dtype=dtype) if model is None else model
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    debugger = None
    in_checks = [0]
    if tool == "free_benchmark":
        section = {"pert_mode": pert_mode} if rule is None else {"pert_mode": pert_mode, "rule": rule}
        debugger = PrecisionDebugger(config={"task": "free_benchmark", "dump_path": dump, "free_benchmark": section})
        probe = debugger.probe
        check = probe._check

        def counted_check(call: Any) -> None:  # the probe's own work on a call: re-run, figures
            before = issued()
            try:
                check(call)
            finally:
                in_checks[0] += issued() - before

        probe._check = counted_check
        from probes.free_benchmark import usual_call

        usual_check = getattr(usual_call._check, "unwrapped", usual_call._check)  # this job's count only

        def counted_usual(*call: Any) -> None:  # the usual path's checks (plain tensors) counted too
            before = issued()
            try:
                usual_check(*call)
            finally:
                in_checks[0] += issued() - before

        counted_usual.unwrapped = usual_check  # type: ignore[attr-defined]
        usual_call._check = counted_usual
    dispatch = PtdbgDispatch(dump_mode="auto", dump_path=dump) if tool == "online_dispatch" else None
    losses = []
    start = issued()
    for step in range(STEPS):
        x = engines.batch(engine, step, dtype)
        if debugger is not None:
            debugger.start()
        if dispatch is not None:
            dispatch.__enter__()
        try:
            loss = engines.loss_of(engine, model(x))
            loss.backward()
            if extra is not None:
                extra()
        finally:
            if dispatch is not None:
                dispatch.__exit__(None, None, None)
            if debugger is not None:
                debugger.stop()
        opt.step()
        opt.zero_grad()
        if debugger is not None:
            debugger.step()
        losses.append(float(engines.full_value(loss.detach()).item()))
    result: dict[str, Any] = {"losses": losses, "collectives": issued() - start, "in_checks": in_checks[0]}
    if debugger is not None:
        s = debugger.summary()
        result.update(apis={k: {"calls": v["calls"], "checked": v["checked"], "flagged": v["flagged"]}
                            for k, v in s["apis"].items()},
                      not_checked=s["not_checked"], errors=s["errors"],
                      flagged=sorted({r["api_name"] for r in s["flagged"]}))
    if dispatch is not None:
        s = json.loads((dispatch.results.run_dir / "summary.json").read_text())
        result.update(ops_compared=s["ops_compared"], compared_by_op=s["ops_compared_by_op"],
                      skipped=s["skipped"], failed=[f["name"] for f in s["failed_ops"]],
                      errors=s["probe_errors"])
    return result


def partial_input() -> Any:
    """A call on a partial sum (what a row-parallel matmul returns before its all-reduce) and a
    softmax over a sharded dimension (DTensor all-gathers it first), as a function to call inside
    the probed window (the mesh and the tensors are made here, outside)."""
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import DTensor, Partial, Shard

    mesh = init_device_mesh("cpu", (dist.get_world_size(),))
    partial = DTensor.from_local(torch.full((2, 3), 0.25), mesh, [Partial()], run_check=False)
    rank = float(dist.get_rank())
    sharded = DTensor.from_local(torch.full((2, 3), rank), mesh, [Shard(1)], run_check=False)

    def calls() -> None:  # DTensor all-reduces / all-gathers first: the user's collectives, issued once
        torch.tanh(partial)
        torch.softmax(sharded, dim=1)

    return calls


def tensor_parallel_job(dump: str) -> dict[str, Any]:
    """The ``tp`` engine: bf16 under improve_precision, float32 under add_noise and online_dispatch,
    each against the same run without a probe (the float32 ones with a call on a partial sum and a
    softmax over shards), no_change (the re-runs, through DTensor included, compute the rank's values
    bit for bit); FSDP2 alone, whose calls are on plain tensors; then the seeded expm1 on the shards
    and the seeded float8 partial sums of the row-wise layers."""
    out: dict[str, Any] = {"rank": dist.get_rank()}
    bf16, fp32 = torch.bfloat16, torch.float32
    out["plain_bf16"] = _train("tp", bf16, None, dump)
    out["improve_precision"] = _train("tp", bf16, "free_benchmark", f"{dump}/ip")
    out["scaled"] = _train("tp", bf16, "free_benchmark", f"{dump}/sc", rule="scaled")
    out["plain_fp32"] = _train("tp", fp32, None, dump, extra=partial_input())
    out["add_noise"] = _train("tp", fp32, "free_benchmark", f"{dump}/an", pert_mode="add_noise",
                              extra=partial_input())
    out["online_dispatch"] = _train("tp", fp32, "online_dispatch", f"{dump}/od", extra=partial_input())
    out["no_change"] = _train("tp", bf16, "free_benchmark", f"{dump}/nc", pert_mode="no_change")
    out["plain_fsdp"] = _train("fsdp", bf16, None, dump)  # FSDP2 alone computes on all-gathered plain tensors
    out["fsdp"] = _train("fsdp", bf16, "free_benchmark", f"{dump}/fsdp")
    saved = torch.expm1
    torch.expm1 = naive_expm1
    try:
        out["defect"] = _train("tp", bf16, "free_benchmark", f"{dump}/defect", model=build_exp_block(bf16))
    finally:
        torch.expm1 = saved
    out["rowwise_defect"] = _rowwise_defect("tp", dump)
    return out


def _rowwise_defect(engine: str, dump: str) -> dict[str, Any]:
    functional = torch.nn.functional
    functional.linear = fp8_rowwise_linear
    try:
        return _train(engine, torch.bfloat16, "free_benchmark", f"{dump}/rowwise_defect")
    finally:
        functional.linear = _LINEAR


def fsdp_tp_job(dump: str) -> dict[str, Any]:
    """The ``fsdp_tp`` engine (4 ranks, dp=2 x tp=2): bf16 under improve_precision, float32 under
    add_noise and online_dispatch, each against the same run without a probe; then the seeded
    float8 partial sums of the row-wise layers."""
    out: dict[str, Any] = {"rank": dist.get_rank()}
    bf16, fp32 = torch.bfloat16, torch.float32
    out["plain_bf16"] = _train("fsdp_tp", bf16, None, dump)
    out["improve_precision"] = _train("fsdp_tp", bf16, "free_benchmark", f"{dump}/ip")
    out["scaled"] = _train("fsdp_tp", bf16, "free_benchmark", f"{dump}/sc", rule="scaled")
    out["plain_fp32"] = _train("fsdp_tp", fp32, None, dump)
    out["add_noise"] = _train("fsdp_tp", fp32, "free_benchmark", f"{dump}/an", pert_mode="add_noise")
    out["online_dispatch"] = _train("fsdp_tp", fp32, "online_dispatch", f"{dump}/od")
    out["rowwise_defect"] = _rowwise_defect("fsdp_tp", dump)
    return out
