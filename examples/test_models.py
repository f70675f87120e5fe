"""Training steps of an MLP and a transformer block in fp32 and bf16.

Plain `pytest examples` checks that they train; under `--msprobe-task=free_benchmark` each test
also reports the APIs whose outputs move more than their dtype's threshold.
"""

import pytest
import torch
from models import MLP, TransformerBlock, train


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
def test_mlp_trains(dtype):
    model = MLP().to(dtype)
    x = torch.randn(16, 32, dtype=dtype)
    y = torch.randn(16, 10)
    losses = train(model, x, y)
    assert losses[-1] < losses[0]


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
def test_transformer_block_trains(dtype):
    model = TransformerBlock().to(dtype)
    x = torch.randn(2, 8, 32, dtype=dtype)
    y = torch.randn(2, 8, 32)
    losses = train(model, x, y)
    assert losses[-1] < losses[0]
