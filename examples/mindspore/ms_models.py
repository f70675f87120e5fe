"""A small MindSpore MLP written with whitelisted functional APIs, and a training loop."""

from __future__ import annotations

import mindspore as ms
import mindspore.common.dtype as mstype
import numpy as np
from mindspore import Parameter, Tensor, mint, nn, ops


class MLP(nn.Cell):
    """Linear → GELU → Linear, computed in `dtype` (parameters stay float32, as in mixed precision)."""

    def __init__(self, d_in: int = 32, hidden: int = 64, d_out: int = 10, dtype=mstype.float32) -> None:
        super().__init__()
        rs = np.random.RandomState(0)
        self.dtype = dtype
        self.w1 = Parameter(Tensor((rs.randn(d_in, hidden) / np.sqrt(d_in)).astype(np.float32)), name="w1")
        self.b1 = Parameter(Tensor(np.zeros(hidden, np.float32)), name="b1")
        self.w2 = Parameter(Tensor((rs.randn(hidden, d_out) / np.sqrt(hidden)).astype(np.float32)), name="w2")
        self.b2 = Parameter(Tensor(np.zeros(d_out, np.float32)), name="b2")

    def construct(self, x: Tensor) -> Tensor:
        h = ops.matmul(x.astype(self.dtype), self.w1.astype(self.dtype)) + self.b1.astype(self.dtype)
        h = ops.gelu(h)
        return mint.matmul(h, self.w2.astype(self.dtype)) + self.b2.astype(self.dtype)


def train(model: nn.Cell, x: Tensor, y: Tensor, steps: int = 3) -> list[float]:
    opt = nn.Adam(model.trainable_params(), learning_rate=1e-2)

    def forward(x, y):
        return ops.mse_loss(model(x).astype(mstype.float32), y)

    grad_fn = ms.value_and_grad(forward, None, opt.parameters)
    losses = []
    for _ in range(steps):
        loss, grads = grad_fn(x, y)
        opt(grads)
        losses.append(float(loss.asnumpy()))
    return losses
