"""A one-test suite the exit test runs with `pytest --msprobe-task=...` under torchrun: each rank
trains a DDP model for three steps inside a test (not collected by the main test run)."""

import torch
import torch.distributed as dist


def test_ddp_steps():
    dist.init_process_group("gloo")
    try:
        torch.manual_seed(0)
        model = torch.nn.parallel.DistributedDataParallel(
            torch.nn.Sequential(torch.nn.Linear(64, 512), torch.nn.ReLU(), torch.nn.Linear(512, 4)))
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        x, y = torch.randn(64, 64), torch.randn(64, 4)
        for _ in range(3):
            opt.zero_grad()
            loss = torch.nn.functional.mse_loss(model(x), y)
            loss.backward()
            opt.step()
        assert torch.isfinite(loss)
        dist.barrier()
    finally:
        dist.destroy_process_group()
