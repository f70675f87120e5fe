"""The training loop the bit-identity tests run twice, plain and probed: BatchNorm (running
statistics), Dropout (the random stream), AdamW, start/stop/step around every iteration."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from probes.pytorch import PrecisionDebugger


class BatchNormNet(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc1 = nn.Linear(12, 24)
        self.bn = nn.BatchNorm1d(24)
        self.drop = nn.Dropout(0.2)
        self.fc2 = nn.Linear(24, 3)

    def forward(self, x):
        return self.fc2(self.drop(F.gelu(self.bn(self.fc1(x))))).softmax(-1)


@dataclass
class Training:
    losses: list[torch.Tensor]
    grads: list[list[torch.Tensor]]
    state: list[torch.Tensor]  # parameters and BatchNorm running statistics after training
    rng_after: torch.Tensor  # the next draws of the random stream after training
    debugger: Any

    def assert_identical(self, other: Training, label: str = "") -> None:
        """Losses, gradients, model state and the random stream bit for bit."""
        for a, b in zip(self.losses, other.losses):
            assert torch.equal(a, b), f"loss changed {label}: {a} vs {b}"
        for ga, gb in zip(self.grads, other.grads):
            assert all(torch.equal(a, b) for a, b in zip(ga, gb)), f"gradients changed {label}"
        for a, b in zip(self.state, other.state):
            assert torch.equal(a, b), f"model state changed {label}"
        assert torch.equal(self.rng_after, other.rng_after), f"the random stream after training changed {label}"


def train(probe_config: Any = None, steps: int = 3, dtype: torch.dtype = torch.float32) -> Training:
    torch.manual_seed(7)
    model = BatchNormNet().to(dtype)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    x = torch.randn(16, 12, dtype=dtype)
    target = torch.randint(0, 3, (16,))
    dbg = PrecisionDebugger(config=probe_config) if probe_config else None
    losses, grads = [], []
    for _ in range(steps):
        if dbg:
            dbg.start()
        opt.zero_grad()
        loss = F.nll_loss(model(x).float().log(), target)
        loss.backward()
        grads.append([p.grad.clone() for p in model.parameters()])
        opt.step()
        losses.append(loss.detach().clone())
        if dbg:
            dbg.stop()
            dbg.step()
    return Training(losses, grads, [p.detach().clone() for p in model.state_dict().values()], torch.rand(3), dbg)
