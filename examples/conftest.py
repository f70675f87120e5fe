"""The example suite: small models users recognise, trained for a few steps.

Run it under a probe with `pytest examples --msprobe-task=free_benchmark`.
"""

import pytest
import torch


@pytest.fixture(autouse=True)
def _seed():
    torch.manual_seed(0)
