"""A two-rank training job for the exit test (test_exit_under_torchrun.py), run by torchrun.

DistributedDataParallel on gloo, CPU, three steps under a probe, then a file barrier and
``dist.destroy_process_group()``: the shape of job that aborted at exit when the probes left a
thread running into the interpreter's shutdown. It writes ``done{rank}`` once its results are
written; the test checks the exit status and that every rank's results are complete.

    torchrun --standalone --nproc-per-node 2 tests/support/exit_job.py online_dispatch /tmp/dump
"""

from __future__ import annotations

import gc
import importlib
import sys
import time
from pathlib import Path

import torch
import torch.distributed as dist

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

STEPS = 3


def main(tool: str, dump: str) -> None:
    from probes.pytorch import PrecisionDebugger
    from probes.pytorch.online_dispatch import PtdbgDispatch

    # imported after the group exists, torch._dynamo (which DDP and online_dispatch's first
    # collective import) keeps the group alive past destroy_process_group: docs/multi-rank.md
    importlib.import_module("torch._dynamo")

    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    torch.manual_seed(0)
    # wide enough that online_dispatch's "auto" hands the larger ops to its reference thread
    model = torch.nn.parallel.DistributedDataParallel(
        torch.nn.Sequential(torch.nn.Linear(64, 512), torch.nn.ReLU(), torch.nn.Linear(512, 4)))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    x, y = torch.randn(64, 64), torch.randn(64, 4)
    dbg = None
    if tool == "grad_probe":
        dbg = PrecisionDebugger(config={"task": "grad_probe", "dump_path": dump})
        dbg.monitor(model)
    for _ in range(STEPS):
        opt.zero_grad()
        if tool == "online_dispatch":
            with PtdbgDispatch(dump_mode="OFF", dump_path=dump):
                torch.nn.functional.mse_loss(model(x), y).backward()
        else:
            torch.nn.functional.mse_loss(model(x), y).backward()
        opt.step()
    if dbg is not None:
        dbg.stop()
    Path(dump, f"done{rank}").touch()
    while not all(Path(dump, f"done{r}").exists() for r in range(world)):
        time.sleep(0.01)
    # DDP holds the process group: left to the interpreter's final collection, gloo's worker threads
    # end during shutdown and a plain job (no probe) aborts one run in twenty under load. Released
    # here (with the debugger, which holds the model), the group's threads are joined before the
    # runtime goes, as a careful job does.
    del model, opt, dbg
    gc.collect()
    dist.destroy_process_group()


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
