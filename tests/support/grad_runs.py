"""A small grad_probe training run that more than one test module compares dumps of."""

import torch
import torch.nn.functional as F
from torch import nn

from probes.pytorch import PrecisionDebugger


def grad_run(dump, *, flip_from_step=None, steps=4, level="L1"):
    """An MLP trained `steps` SGD steps under grad_probe into `dump`; `flip_from_step`: the seeded
    defect, the last layer's weight gradient negated from that step on."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 16), nn.Tanh(), nn.Linear(16, 2))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    x, y = torch.randn(32, 8), torch.randn(32, 2)
    dbg = PrecisionDebugger(config={"task": "grad_probe", "dump_path": str(dump),
                                    "grad_probe": {"grad_level": level}})
    dbg.monitor(model)
    for step in range(steps):
        opt.zero_grad()
        F.mse_loss(model(x), y).backward()
        if flip_from_step is not None and step >= flip_from_step:
            model[2].weight.grad.neg_()  # the seeded defect: a backward kernel with the wrong sign
        opt.step()
    dbg.stop()


def step_with_grads(dump, grads, level="L1"):
    """One monitored optimizer step (SGD, lr 0: nothing moves) of parameters holding exactly the
    gradients `grads` (name -> tensor), in strict mode, into `dump`."""
    params = {}
    for name, g in grads.items():
        p = torch.nn.Parameter(torch.zeros_like(g))
        p.grad = g
        params[name] = p
    opt = torch.optim.SGD(params.values(), lr=0.0)
    dbg = PrecisionDebugger(config={"task": "grad_probe", "dump_path": str(dump), "strict": True,
                                    "grad_probe": {"grad_level": level}})
    dbg.monitor(params, opt)
    opt.step()
    dbg.stop()
    return dbg
