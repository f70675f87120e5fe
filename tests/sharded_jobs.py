"""Per-rank jobs of the sharded grad_probe tests (module-level, so spawned ranks import them).

Each job trains tests/engines.py's MLP (with its unevenly sharded head) under one engine with
grad_probe attached and returns the losses and the collectives the job issued through
torch.distributed, counted from before the probe started.
"""

from __future__ import annotations

from typing import Any

import engines
import torch
from multirank_jobs import CollectiveCounter

STEPS = 2


def grad_probe_job(dump: str, engine: str, level: str = "L2", steps: int = STEPS, ranks: list[int] | None = None,
                   flip: tuple[int, str, int] | None = None, probe: bool = True,
                   fail: tuple[int, tuple[int, ...]] | None = None) -> dict[str, Any]:
    """``flip=(rank, param, step)``: on that rank only, the sign of its own slice of that
    parameter's gradient is flipped at that step, before the optimizer step (a seeded defect on
    one rank's shard). ``fail=(rank, shape)``: on that rank only, the probe cannot read its slice
    of the gradient of that (full) shape."""
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
        debugger = PrecisionDebugger(config=config, model=model)
        debugger.monitor(model)

    def seeded(model: torch.nn.Module, _opt: Any, step: int) -> None:
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
