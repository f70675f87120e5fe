"""A torch test suite that the plugin runs under grad_probe (a clean test, one that blows up at
step 1, two models, no optimizer, hooks gone after): the plugin tests and the report tests run it."""

TORCH_SUITE = """
import pytest
import torch

def train(model, steps=3, poison_at=None, lr=0.1):
    opt = torch.optim.SGD(model.parameters(), lr=lr)
    x = torch.linspace(-1, 1, 32).reshape(8, 4)
    for step in range(steps):
        opt.zero_grad()
        loss = model(x).square().mean()
        if step == poison_at:  # sqrt at 0: an infinite gradient for the first layer's weight
            loss = loss + torch.sqrt(model[0].weight - model[0].weight.detach()).sum()
        loss.backward()
        opt.step()
    return opt

def mlp():
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.Tanh(), torch.nn.Linear(8, 2))

def test_clean():
    train(mlp())

def test_blows_up_at_step_1():
    train(mlp(), poison_at=1)

def test_two_models():
    train(mlp())
    train(torch.nn.Sequential(torch.nn.Linear(4, 3)), steps=2)

def test_no_optimizer():
    assert torch.ones(2).sum() == 2

@pytest.mark.msprobe_off
def test_hooks_are_gone():
    from torch.optim.optimizer import _global_optimizer_pre_hooks
    assert len(_global_optimizer_pre_hooks) == 0
"""
