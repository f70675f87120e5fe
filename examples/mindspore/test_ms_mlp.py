"""Training steps of a MindSpore MLP in fp32 and fp16 (PyNative, CPU).

Plain `pytest examples/mindspore` checks that it trains; under `--msprobe-task=free_benchmark`
each test also reports the MindSpore APIs whose outputs move more than their dtype's threshold.
"""

import mindspore.common.dtype as mstype
import numpy as np
import pytest
from mindspore import Tensor
from ms_models import MLP, train


@pytest.mark.parametrize("dtype", [mstype.float32, mstype.float16], ids=["fp32", "fp16"])
def test_mlp_trains(dtype):
    rs = np.random.RandomState(1)
    x = Tensor(rs.randn(16, 32).astype(np.float32))
    y = Tensor(rs.randn(16, 10).astype(np.float32))
    losses = train(MLP(dtype=dtype), x, y)
    assert losses[-1] < losses[0]
