"""Per-rank jobs of the sharded grad_probe tests (module-level, so spawned ranks import them).

Each job trains tests/support/engines.py's MLP (with its unevenly sharded head) under one engine with
grad_probe attached and returns the losses and the collectives the job issued through
torch.distributed, counted from before the probe started.
"""

from __future__ import annotations

from typing import Any

import engines
import torch
from multirank_jobs import CollectiveCounter

STEPS = 2
#: (parameter, value): element [0, 0] of the parameter's gradient is set to the value at the
#: last step, on every rank that holds it: an outlier, at whose FP8 scale the rest underflows
OUTLIER = ("l2.weight", 100.0)


def grad_probe_job(dump: str, engine: str, level: str = "L2", steps: int = STEPS, ranks: list[int] | None = None,
                   flip: tuple[int, str, int] | None = None, probe: bool = True,
                   fail: tuple[int, tuple[int, ...]] | None = None, step_filter: list[int] | None = None,
                   fp8: list[str] | None = None, outlier: bool = False) -> dict[str, Any]:
    """``flip=(rank, param, step)``: on that rank only, the sign of its own slice of that
    parameter's gradient is flipped at that step, before the optimizer step (a seeded defect on
    one rank's shard). ``fail=(rank, shape)``: on that rank only, the probe cannot read its slice
    of the gradient of that (full) shape. ``outlier``: OUTLIER is seeded (after the last loss:
    the losses stay those of a run without it)."""
    import torch.distributed as dist

    from probes.backends import torch_shards
    from probes.pytorch import PrecisionDebugger

    if fail is not None and dist.get_rank() == fail[0]:
        describe = torch_shards.describe

        def failing(t: Any) -> Any:
            if tuple(t.shape) == tuple(fail[1]):
                raise RuntimeError("seeded: this rank's slice cannot be read")
            return describe(t)

        torch_shards.describe = failing

    model = engines.build(engine, head=True)
    counter = CollectiveCounter()
    debugger = None
    if probe:
        config: dict[str, Any] = {"task": "grad_probe", "dump_path": dump, "grad_probe": {"grad_level": level}}
        if ranks is not None:
            config["rank"] = ranks
        if step_filter is not None:
            config["step"] = step_filter
        if fp8 is not None:
            config["grad_probe"]["fp8_health"] = fp8
        debugger = PrecisionDebugger(config=config, model=model)
        debugger.monitor(model)

    def seeded(model: torch.nn.Module, _opt: Any, step: int) -> None:
        if outlier and step == steps - 1:
            _seed_outlier(model)
        if flip is None or (dist.get_rank(), step) != (flip[0], flip[2]):
            return
        for name, p in model.named_parameters():
            if name.removeprefix("module.") == flip[1]:
                local = getattr(p.grad, "_local_tensor", p.grad)
                local.neg_()

    try:
        losses = engines.train(engine, steps, seeded, model=model)
    finally:
        calls = counter.restore()
        if debugger is not None:
            debugger.stop()
    return {"losses": losses, "calls": calls}


def _seed_outlier(model: torch.nn.Module) -> None:
    from probes.backends import torch_shards

    name, value = OUTLIER
    for n, p in model.named_parameters():
        if n.removeprefix("module.") != name:
            continue
        g = p.grad
        if torch_shards.is_sharded(g):
            part = torch_shards.describe(g)
            if part.index is None or not all(len(ix) and ix[0] == 0 for ix in part.index):
                return  # this rank's slice does not start at [0, 0]
            g = part.local
        g[(0,) * g.ndim] = value


def grad_probe_jobs(dump: str, engine: str, fp8_dump: str, fp8: list[str]) -> dict[str, Any]:
    """grad_probe_job, then the same training with the FP8 health columns of ``fp8`` on and
    OUTLIER seeded (written to ``fp8_dump``), in the same processes: a launch costs seconds, a
    second run on its mesh a fraction of one. The second run's results are under ``"fp8"``."""
    out = grad_probe_job(dump, engine)
    out["fp8"] = grad_probe_job(fp8_dump, engine, fp8=fp8, outlier=True)
    return out


def partial_gradient_job(dump: str) -> dict[str, Any]:
    """A replicated parameter whose gradient is a ``Partial`` DTensor (each rank a summand), as
    some tensor-parallel plans leave it: the figures are those of the sum."""
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import DTensor, Partial, Replicate

    from probes.pytorch import PrecisionDebugger

    mesh = init_device_mesh("cpu", (dist.get_world_size(),))
    rank = dist.get_rank()
    weight = torch.nn.Parameter(DTensor.from_local(torch.zeros(4, 3), mesh, [Replicate()]))
    opt = torch.optim.SGD([weight], lr=0.1)
    debugger = PrecisionDebugger(config={"task": "grad_probe", "dump_path": dump,
                                         "grad_probe": {"grad_level": "L1"}}, model={"w": weight})
    debugger.monitor({"w": weight})
    summand = torch.arange(12, dtype=torch.float32).reshape(4, 3) * (rank + 1) - 5.0
    weight.grad = DTensor.from_local(summand, mesh, [Partial()])
    opt.step()
    debugger.stop()
    return {"summand": summand.tolist()}


def tools_job(dump: str, engine: str, tool: str, rank_filter: list[int] | None = None,
              defect_rank: int | None = None, dtype: torch.dtype = torch.float32) -> dict[str, Any]:
    """Two training steps of the engine's MLP (in ``dtype``) under free_benchmark or
    online_dispatch, with a seeded defect on ``defect_rank`` only: free_benchmark's naive
    half-precision expm1, or the tanh kernel online_dispatch's reference disagrees with
    (tests/support/multirank_jobs.py)."""
    import os

    import multirank_jobs
    import torch.distributed as dist

    rank = dist.get_rank()
    model = engines.build(engine, dtype=dtype)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    small = torch.linspace(1e-3, 2e-2, 8).half()
    saved_expm1 = torch.expm1
    losses = []
    if tool == "free_benchmark":
        from probes.pytorch import PrecisionDebugger

        config: dict[str, Any] = {"task": tool, "dump_path": dump, "free_benchmark": {"pert_mode": "improve_precision"}}
        if rank_filter is not None:
            config["rank"] = rank_filter
        if rank == defect_rank:  # before the debugger, which takes the APIs it wraps when it is made
            torch.expm1 = multirank_jobs.naive_expm1
        debugger = PrecisionDebugger(config=config)
        try:
            for step in range(STEPS):
                debugger.start()
                loss = engines.loss_of(engine, model(engines.batch(engine, step, dtype)))
                loss.backward()
                torch.expm1(small)
                debugger.stop()
                opt.step()
                opt.zero_grad()
                debugger.step()
                losses.append(float(engines.full_value(loss.detach()).item()))
        finally:
            torch.expm1 = saved_expm1
    else:
        from probes.pytorch.online_dispatch import PtdbgDispatch

        if defect_rank is not None:
            os.environ["MULTIRANK_DEFECT_RANK"] = str(defect_rank)
        try:
            with PtdbgDispatch(dump_mode="auto", dump_path=dump):
                for step in range(STEPS):
                    loss = engines.loss_of(engine, model(engines.batch(engine, step, dtype)))
                    loss.backward()
                    torch.ops.multirank_jobs.rank_tanh(-small.float())  # negative: its sign is lost
                    opt.step()
                    opt.zero_grad()
                    losses.append(float(engines.full_value(loss.detach()).item()))
        finally:
            os.environ.pop("MULTIRANK_DEFECT_RANK", None)
    return {"rank": rank, "losses": losses}


def main(argv: list[str]) -> int:
    """Under torchrun: ``sharded_jobs.py ENGINE DUMP`` runs grad_probe, free_benchmark and
    online_dispatch jobs one after the other on the engine and writes each rank's losses."""
    import json
    import os

    import torch.distributed as dist

    engine, dump = argv
    dist.init_process_group("gloo")
    try:
        out = {"grad_probe": grad_probe_job(os.path.join(dump, "grad_probe"), engine)["losses"]}
        for tool in ("free_benchmark", "online_dispatch"):
            for dtype in (torch.float32, torch.bfloat16):
                key = f"{tool}_{str(dtype).removeprefix('torch.')}"
                out[key] = tools_job(os.path.join(dump, key), engine, tool, dtype=dtype)["losses"]
        out["plain"] = grad_probe_job(os.path.join(dump, "plain"), engine, probe=False)["losses"]
        with open(os.path.join(dump, f"done{dist.get_rank()}.json"), "w", encoding="utf-8") as f:
            json.dump(out, f)
    finally:
        dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    import sys

    raise SystemExit(main(sys.argv[1:]))
