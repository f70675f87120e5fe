"""The example suite: small models users recognise, trained for a few steps.

Run it under a probe with `pytest examples --msprobe-task=free_benchmark`.
"""

import pytest

try:  # the MindSpore examples (examples/mindspore) run without PyTorch installed
    import torch
except ImportError:  # pragma: no cover - depends on the environment
    torch = None


@pytest.fixture(autouse=True)
def _seed():
    if torch is not None:
        torch.manual_seed(0)
