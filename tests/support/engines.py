"""The distributed engines the multi-rank tests run a model under, and the model they run.

``build(engine, seed)`` returns the same 4-layer MLP (same initial weights on every rank, whatever
the engine) wrapped as each engine wraps it:

* ``plain``: no wrapping (the single-process reference, run on the whole global batch);
* ``ddp``: DistributedDataParallel, each rank its slice of the global batch;
* ``fsdp``: FSDP2 ``fully_shard`` per layer and on the root (1-D mesh of every rank);
* ``hsdp``: FSDP2 on a 2-D (replicate, shard) mesh (4 ranks);
* ``tp``: tensor parallelism, Colwise / Rowwise pairs (every rank holds the whole batch);
* ``fsdp_tp``: tensor parallelism on the mesh's ``tp`` dimension and FSDP2 on its ``dp`` one.

:func:`batch` gives each rank the part of the global batch its engine feeds it, so that every
engine computes the same gradients as ``plain`` on the whole batch (the loss is a mean over the
global batch). Module-level, so spawned rank processes can import it.
"""

from __future__ import annotations

from typing import Any

import torch

ENGINES = ("plain", "ddp", "fsdp", "hsdp", "tp", "fsdp_tp")
#: engines whose ranks each see a slice of the batch (the others see all of it on every rank)
DATA_PARALLEL = {"ddp": "all", "fsdp": "all", "hsdp": "all", "fsdp_tp": "dp"}
IN, HIDDEN, OUT, HEAD = 16, 32, 8, 3
GLOBAL_BATCH = 8


class MLP(torch.nn.Module):
    """``head=True`` adds a small last layer (3 outputs) that tensor parallelism leaves plain and
    FSDP2 shards unevenly (rows 2 + 1 on two ranks; 1 + 1 + 1 + 0, an empty shard, on four), on
    the data-parallel mesh only under FSDP2 x TP."""

    def __init__(self, head: bool = False) -> None:
        super().__init__()
        self.l1 = torch.nn.Linear(IN, HIDDEN)
        self.l2 = torch.nn.Linear(HIDDEN, IN)
        self.l3 = torch.nn.Linear(IN, HIDDEN)
        self.l4 = torch.nn.Linear(HIDDEN, OUT)
        self.head = torch.nn.Linear(OUT, HEAD) if head else None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = torch.relu(self.l1(x))
        x = torch.relu(self.l2(x))
        x = torch.relu(self.l3(x))
        x = self.l4(x)
        return x if self.head is None else self.head(torch.relu(x))


def _tp_plan() -> dict[str, Any]:
    from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel

    return {"l1": ColwiseParallel(), "l2": RowwiseParallel(), "l3": ColwiseParallel(), "l4": RowwiseParallel()}


def _shard_layers(model: MLP, mesh: Any) -> None:
    from torch.distributed.fsdp import fully_shard

    for layer in (model.l1, model.l2, model.l3, model.l4):
        fully_shard(layer, mesh=mesh)
    fully_shard(model, mesh=mesh)


def build(engine: str, seed: int = 0, dtype: torch.dtype = torch.float32, head: bool = False) -> torch.nn.Module:
    """The MLP under ``engine`` (the process group is initialised already, except for ``plain``)."""
    if engine not in ENGINES:
        raise ValueError(f"engine must be one of {ENGINES}, got {engine!r}")
    torch.manual_seed(seed)
    model = MLP(head).to(dtype)
    if engine == "plain":
        return model
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh

    world = dist.get_world_size()
    if engine == "ddp":
        return torch.nn.parallel.DistributedDataParallel(model)
    if engine == "fsdp":
        _shard_layers(model, init_device_mesh("cpu", (world,)))
    elif engine == "hsdp":
        _shard_layers(model, init_device_mesh("cpu", (2, world // 2), mesh_dim_names=("replicate", "shard")))
    elif engine == "tp":
        from torch.distributed.tensor.parallel import parallelize_module

        parallelize_module(model, init_device_mesh("cpu", (world,)), _tp_plan())
    elif engine == "fsdp_tp":
        from torch.distributed.tensor.parallel import parallelize_module

        mesh = init_device_mesh("cpu", (world // 2, 2), mesh_dim_names=("dp", "tp"))
        parallelize_module(model, mesh["tp"], _tp_plan())
        _shard_layers(model, mesh["dp"])
    return model


def global_batch(step: int, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    return torch.randn(GLOBAL_BATCH, IN, generator=torch.Generator().manual_seed(1000 + step)).to(dtype)


def batch(engine: str, step: int, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """The part of step ``step``'s global batch this rank feeds its model under ``engine``."""
    x = global_batch(step, dtype)
    split = DATA_PARALLEL.get(engine)
    if split is None:
        return x
    import torch.distributed as dist

    rank, world = dist.get_rank(), dist.get_world_size()
    if split == "dp":  # ranks of one tp group share a slice
        parts, index = world // 2, rank // 2
    else:
        parts, index = world, rank
    return x.chunk(parts)[index]


def loss_of(engine: str, out: torch.Tensor) -> torch.Tensor:
    """A loss whose gradients equal the plain run's on the global batch: the mean over the global
    batch (data-parallel engines average their ranks' gradients, so each rank takes its slice's mean)."""
    return out.square().mean()


def full_value(t: torch.Tensor) -> torch.Tensor:
    """A plain tensor of ``t``'s full value (a DTensor gathered: for tests only, never in a probe)."""
    return t.full_tensor() if hasattr(t, "full_tensor") else t


def train(engine: str, steps: int, on_step: Any = None, dtype: torch.dtype = torch.float32,
          model: torch.nn.Module | None = None, head: bool = False) -> list[float]:
    """SGD steps of the MLP under ``engine``; ``on_step(model, optimizer, step)`` (optional) runs
    after backward, before the optimizer step. Returns the losses (each a Python float)."""
    model = build(engine, dtype=dtype, head=head) if model is None else model
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    losses = []
    for step in range(steps):
        loss = loss_of(engine, model(batch(engine, step, dtype)))
        loss.backward()
        if on_step is not None:
            on_step(model, opt, step)
        opt.step()
        opt.zero_grad()
        losses.append(float(full_value(loss.detach()).item()))
    return losses
