"""Seeded defects: APIs made imprecise on purpose, to prove each detector can find something.

Each is installed over a real torch attribute *before* the probe is created, so the probe wraps
and reports it under that attribute's name (e.g. Torch.expm1).
"""

from __future__ import annotations

import itertools

import torch


def naive_expm1(x: torch.Tensor) -> torch.Tensor:
    """exp(x) - 1: cancellation makes it lose all precision for small x in fp16/bf16."""
    return torch.exp(x) - 1


def ill_conditioned(x: torch.Tensor) -> torch.Tensor:
    """An output that swings with one-ulp changes of the input (condition number ~1e5)."""
    return torch.sin(x * 1e5)


def off_by_one_sum(x: torch.Tensor, *args, **kwargs) -> torch.Tensor:
    """A reduction kernel that forgets the last element: not invariant to reordering."""
    return x.reshape(-1)[:-1].sum()


def nondeterministic():
    """A kernel whose result depends on how often it ran (like a racy atomic accumulation)."""
    calls = itertools.count()

    def softsign(x: torch.Tensor, *args, **kwargs) -> torch.Tensor:
        return x / (1 + x.abs()) * (1 + 1e-3 * (next(calls) % 2))

    return softsign


def wrong_half_kernel(x: torch.Tensor) -> torch.Tensor:
    """A kernel that is right in float32 but 1 % off in half precision (what to_cpu looks for:
    the device's low-precision kernel disagreeing with the CPU)."""
    y = torch.special.expm1(x)
    return y * 1.01 if x.dtype in (torch.float16, torch.bfloat16) else y
