"""The same MLP trained as compiled steps: a `mindspore.jit` step (PyNative) and a
`TrainOneStepCell` in GRAPH_MODE.

Under `--msprobe-task=grad_probe` each test writes the gradient statistics and direction files of
every step, computed inside the compiled graph (the same files as a PyNative run); under
`--msprobe-task=free_benchmark` the compiled calls are listed as not checked (free_benchmark checks
PyNative calls, as msprobe).
"""

import mindspore as ms
import numpy as np
import pytest
from mindspore import Tensor, nn, ops
from ms_models import MLP


@pytest.fixture
def data():
    rs = np.random.RandomState(1)
    return Tensor(rs.randn(16, 32).astype(np.float32)), Tensor(rs.randn(16, 10).astype(np.float32))


def test_jit_step_trains(data):
    x, y = data
    model = MLP()
    opt = nn.Adam(model.trainable_params(), learning_rate=1e-2)

    def forward(x, y):
        return ops.mse_loss(model(x), y)

    grad_fn = ms.value_and_grad(forward, None, opt.parameters)

    @ms.jit
    def step(x, y):
        loss, grads = grad_fn(x, y)
        opt(grads)
        return loss

    losses = [float(step(x, y).asnumpy()) for _ in range(3)]
    assert losses[-1] < losses[0]


def test_graph_mode_train_cell_trains(data):
    x, y = data
    ms.set_context(mode=ms.GRAPH_MODE)
    try:
        model = MLP()
        opt = nn.Adam(model.trainable_params(), learning_rate=1e-2)
        train = nn.TrainOneStepCell(nn.WithLossCell(model, nn.MSELoss()), opt)
        losses = [float(train(x, y).asnumpy()) for _ in range(3)]
    finally:
        ms.set_context(mode=ms.PYNATIVE_MODE)
    assert losses[-1] < losses[0]
