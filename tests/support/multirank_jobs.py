"""Per-rank jobs of the multi-rank tests: module-level functions, so a spawned or forked rank can
import them, and a ``__main__`` so torchrun can run the very same jobs.

Every job runs inside an initialised process group (gloo here; hccl/nccl on accelerator nodes)
and returns a small picklable dictionary. The seeded defects are active on one rank only, as a
broken kernel on one device of a job would be. Each job counts the collectives it issues through
``torch.distributed`` (wrapped before the probe starts): a probe that re-ran one would raise the
count, or hang the job (which the harness turns into a failure).

Run under torchrun (the README's multi-rank section):

    torchrun --nnodes 1 --nproc-per-node 2 --master-addr 127.0.0.1 --master-port 29511 \\
        tests/support/multirank_jobs.py free_benchmark /tmp/dump 1
"""

from __future__ import annotations

import importlib
import json
import os
import sys
from collections import Counter
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

COLLECTIVES = ("all_reduce", "broadcast", "all_gather", "barrier")
NAMESPACE = "multirank_jobs"


@torch.library.custom_op(f"{NAMESPACE}::rank_tanh", mutates_args=())
def rank_tanh(x: torch.Tensor) -> torch.Tensor:
    """tanh; its float32 kernel loses the sign of negative inputs on the rank named by the
    environment variable MULTIRANK_DEFECT_RANK (a device kernel broken on one rank only). The
    float64 reference online_dispatch computes on the same rank is right."""
    if x.dtype == torch.float32 and os.environ.get("MULTIRANK_DEFECT_RANK") == os.environ.get("RANK", "0"):
        return torch.tanh(x.abs())
    return torch.tanh(x)


@rank_tanh.register_fake
def _(x: torch.Tensor) -> torch.Tensor:
    return torch.empty_like(x)


def naive_expm1(x: torch.Tensor) -> torch.Tensor:
    """exp(x) - 1: cancellation loses every digit for small x in half precision (seeded defect)."""
    return torch.exp(x) - 1


class CollectiveCounter:
    """Counts calls of torch.distributed's collectives; installed before any probe."""

    def __init__(self) -> None:
        self.calls: Counter[str] = Counter()
        self._saved = {name: getattr(dist, name) for name in COLLECTIVES}
        for name, fn in self._saved.items():
            setattr(dist, name, self._counting(name, fn))

    def _counting(self, name: str, fn: Any) -> Any:
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            self.calls[name] += 1
            return fn(*args, **kwargs)

        return wrapper

    def restore(self) -> dict[str, int]:
        for name, fn in self._saved.items():
            setattr(dist, name, fn)
        return dict(self.calls)


def _collectives(t: torch.Tensor) -> dict[str, Any]:
    """all_reduce, broadcast and all_gather of small tensors whose exact results are known."""
    rank, world = dist.get_rank(), dist.get_world_size()
    s = torch.full((4,), float(rank + 1), dtype=t.dtype)
    dist.all_reduce(s)
    b = torch.full((3,), float(rank), dtype=t.dtype)
    dist.broadcast(b, src=world - 1)
    parts = [torch.zeros(2, dtype=t.dtype) for _ in range(world)]
    dist.all_gather(parts, torch.full((2,), float(rank), dtype=t.dtype))
    return {"all_reduce": s.tolist(), "broadcast": b.tolist(), "all_gather": [p.tolist() for p in parts]}


# ------------------------------------------------------------------------------------ free_benchmark
def free_benchmark_job(dump: str, defect_rank: int | None, rank_filter: list[int] | None = None,
                       steps: int = 2) -> dict[str, Any]:
    """A half-precision step (expm1, matmul, softmax, collectives) under PrecisionDebugger, every
    API probed (no list); torch.expm1 is the naive one on ``defect_rank`` only."""
    from probes.pytorch import PrecisionDebugger

    rank = dist.get_rank()
    saved_expm1 = torch.expm1
    if rank == defect_rank:
        torch.expm1 = naive_expm1
    counter = CollectiveCounter()
    config: dict[str, Any] = {"task": "free_benchmark", "dump_path": dump,
                              "free_benchmark": {"pert_mode": "improve_precision"}}
    if rank_filter is not None:
        config["rank"] = rank_filter
    results = []
    try:
        debugger = PrecisionDebugger(config=config)
        x = torch.linspace(1e-3, 2e-2, 8).half()
        w = torch.linspace(-1, 1, 64).reshape(8, 8).half()
        for _ in range(steps):
            debugger.start()
            y = torch.matmul(torch.expm1(x), w).softmax(-1)
            results.append(_collectives(y))
            debugger.stop()
            debugger.step()
        summary = debugger.summary()
    finally:
        torch.expm1 = saved_expm1
        calls = counter.restore()
    return {"rank": rank, "calls": calls, "results": results, "rows": len(summary["flagged"]),
            "apis": sorted(summary["apis"]), "checked": sum(s["checked"] for s in summary["apis"].values())}


# ------------------------------------------------------------------------------------ grad_probe
def _train(dump: str, flip_rank: int | None, nan_rank: int | None, rank_filter: list[int] | None,
           steps: int) -> dict[str, int]:
    from probes.pytorch import PrecisionDebugger

    rank = dist.get_rank()
    torch.manual_seed(0)  # the same model on every rank (as DDP makes it)
    model = torch.nn.Sequential(torch.nn.Linear(6, 8), torch.nn.Tanh(), torch.nn.Linear(8, 2))
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    config: dict[str, Any] = {"task": "grad_probe", "dump_path": dump, "grad_probe": {"grad_level": "L1"}}
    if rank_filter is not None:
        config["rank"] = rank_filter
    debugger = PrecisionDebugger(config=config)
    debugger.monitor(model)
    counter = CollectiveCounter()
    try:
        gen = torch.Generator().manual_seed(100 + rank)  # each rank its own shard of the data
        for step in range(steps):
            x = torch.randn(16, 6, generator=gen)
            target = torch.randn(16, 2, generator=gen)
            if rank == nan_rank and step == steps - 1:
                x[0, 0] = float("inf")
            loss = torch.nn.functional.mse_loss(model(x), target)
            if rank == flip_rank and step >= 1:
                loss = -loss  # a sign bug on one rank: its gradients point the other way
            opt.zero_grad()
            loss.backward()
            logged = loss.detach().clone()
            dist.all_reduce(logged)  # the usual loss logging collective
            opt.step()
    finally:
        debugger.stop()
        calls = counter.restore()
    return calls


def grad_probe_job(dump_a: str, dump_b: str, defect_rank: int | None, rank_filter: list[int] | None = None,
                   steps: int = 3) -> dict[str, Any]:
    """Two runs of the same local training: run A clean, run B with a sign flip (from step 1) and
    an infinite input (last step) on ``defect_rank`` only."""
    calls_a = _train(dump_a, None, None, rank_filter, steps)
    calls_b = _train(dump_b, defect_rank, defect_rank, rank_filter, steps)
    return {"rank": dist.get_rank(), "calls": [calls_a, calls_b]}


# ------------------------------------------------------------------------------------ online_dispatch
def online_dispatch_job(dump: str, defect_rank: int | None) -> dict[str, Any]:
    """A linear layer, the rank_tanh op (broken on ``defect_rank``) and collectives inside
    PtdbgDispatch: the collectives must run once and be skipped, not compared."""
    from probes.pytorch.online_dispatch import PtdbgDispatch

    if defect_rank is not None:
        os.environ["MULTIRANK_DEFECT_RANK"] = str(defect_rank)
    rank = dist.get_rank()
    torch.manual_seed(0)
    lin = torch.nn.Linear(8, 8)
    x = torch.randn(4, 8)
    counter = CollectiveCounter()
    try:
        with PtdbgDispatch(dump_mode="auto", dump_path=dump) as d:
            y = torch.ops.multirank_jobs.rank_tanh(lin(x))
            results = _collectives(y)
    finally:
        calls = counter.restore()
        os.environ.pop("MULTIRANK_DEFECT_RANK", None)
    summary = json.loads((d.results.run_dir / "summary.json").read_text())
    return {"rank": rank, "calls": calls, "results": results, "run_dir": str(d.results.run_dir),
            "failed": [f["name"] for f in summary["failed_ops"]], "skipped": summary["skipped"]}


# ------------------------------------------------------------------------------------ before init
def probes_started_before_init(dump: str, defect_rank: int) -> dict[str, Any]:
    """A script that starts free_benchmark, grad_probe and online_dispatch before calling
    init_process_group (torchrun has set RANK/WORLD_SIZE already): files must still carry the
    global rank, not rank 0 on every rank."""
    from probes.pytorch import PrecisionDebugger
    from probes.pytorch.online_dispatch import PtdbgDispatch

    rank = int(os.environ["RANK"])
    saved_expm1 = torch.expm1
    if rank == defect_rank:
        torch.expm1 = naive_expm1
    try:
        fb = PrecisionDebugger(config={"task": "free_benchmark", "dump_path": f"{dump}/fb",
                                       "free_benchmark": {"pert_mode": "improve_precision", "list": ["expm1"]}})
        fb.start()
        torch.expm1(torch.linspace(1e-3, 2e-2, 8).half())
        fb.stop()
        model = torch.nn.Linear(4, 2)
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        gp = PrecisionDebugger(config={"task": "grad_probe", "dump_path": f"{dump}/gp", "grad_probe": {}})
        gp.monitor(model)
        with PtdbgDispatch(dump_mode="auto", dump_path=f"{dump}/od"):
            model(torch.ones(3, 4)).sum().backward()
        dist.init_process_group("gloo")
        opt.step()
        dist.all_reduce(torch.ones(1))
        fb.step()
        gp.stop()
    finally:
        torch.expm1 = saved_expm1
    return {"rank": rank}


# ------------------------------------------------------------------------------------ failures
def skips_a_collective() -> None:
    """Rank 1 never joins rank 0's all_reduce (a collective inside a branch taken on one rank)."""
    if dist.get_rank() == 0:
        dist.all_reduce(torch.ones(2))
    else:
        import time

        time.sleep(600)


def fails_on_rank1() -> None:
    """Rank 1 raises before the collective rank 0 waits in."""
    if dist.get_rank() == 1:
        raise ValueError("seeded failure on rank 1")
    dist.all_reduce(torch.ones(2))


JOBS = {"free_benchmark": free_benchmark_job, "online_dispatch": online_dispatch_job}


def main(argv: list[str]) -> int:
    """torchrun entry: ``multirank_jobs.py TOOL DUMP DEFECT_RANK``; writes DUMP/job_rank{R}.json."""
    tool, dump, defect = argv[0], argv[1], int(argv[2])
    # PyTorch imports torch._dynamo when the first collective goes through a Python dispatch mode
    # (online_dispatch's); imported while a process group exists, it keeps the group alive past
    # destroy_process_group, and gloo's worker threads then run into the interpreter's shutdown
    # and abort ~1 run in 30 after every file is written. Imported before, it does not.
    importlib.import_module("torch._dynamo")

    dist.init_process_group("gloo")  # torchrun's env://; "hccl" on NPU nodes, "nccl" on CUDA
    try:
        out = JOBS[tool](dump, defect)
    finally:
        dist.destroy_process_group()
    Path(dump, f"job_rank{out['rank']}.json").write_text(json.dumps(out))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))


# ------------------------------------------------------------------------------ simulated NPU
def npu_fused_op_job(dump: str) -> dict[str, Any]:
    """A rank of a job dry-run on the simulated NPU (inherited from the parent process, defects
    included): torch_npu.npu_rms_norm on device tensors under free_benchmark, then a collective.
    gloo reduces host tensors (HCCL is not simulated), so the result crosses to the host first."""
    import torch_npu  # type: ignore[import-not-found]

    from probes.pytorch import PrecisionDebugger

    rank = dist.get_rank()
    torch.manual_seed(0)
    x = torch.randn(4, 16, device="npu")
    gamma = torch.rand(16, device="npu") + 0.5
    debugger = PrecisionDebugger(config={"task": "free_benchmark", "dump_path": dump, "strict": True,
                                         "free_benchmark": {"pert_mode": "improve_precision", "rule": "scaled"}})
    debugger.start()
    y, _rstd = torch_npu.npu_rms_norm(x, gamma)
    debugger.stop()
    debugger.step()
    total = y.sum().cpu().reshape(1)
    dist.all_reduce(total)
    flagged = sorted({row["api_name"] for row in debugger.summary()["flagged"]})
    return {"rank": rank, "device": y.device.type, "flagged": flagged, "total": float(total)}
