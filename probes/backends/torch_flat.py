"""The usual call's inputs, read in C: plain tensors and scalar-like values, no container and no
tensor subclass (`F.linear(x, w, b)`, `x * 0.5`, `torch.softmax(x, dim=-1)`).

Every checked call asks a few questions of its inputs: is one a meta tensor, a DTensor, an FP8
tensor, how many bytes do they hold. A Python loop over the arguments answers each in a few
microseconds on the training thread; for a flat call `map` answers them without running a line
of Python. A call with a container or a subclass among its inputs (`torch.cat([a, b])`, a
DTensor, torchao's FP8 tensors, a nested tensor's Python subclass) gets False from `flat` and
takes the callers' general walk.
"""

from __future__ import annotations

from collections.abc import Iterable
from itertools import repeat
from typing import Any

import torch

#: the types of a flat call's inputs: torch's plain tensors and values that hold no tensor
FLAT_TYPES = frozenset({
    torch.Tensor, torch.nn.Parameter, int, float, bool, complex, str, type(None),
    torch.dtype, torch.device, torch.layout, torch.memory_format,
})


def flat(values: Iterable[Any]) -> bool:
    """Every value a plain tensor or one of the scalar-like types (no container, no subclass)."""
    return all(map(FLAT_TYPES.__contains__, map(type, values)))


def flat_call(args: tuple, kwargs: dict) -> bool:
    return flat(args) and (not kwargs or flat(kwargs.values()))


def any_true(values: Iterable[Any], attr: str) -> bool:
    """Whether a value's boolean `attr` is set (the scalar-like values have none: False)."""
    return any(map(getattr, values, repeat(attr), repeat(False)))


def values_of(values: Iterable[Any], attr: str) -> Iterable[Any]:
    """Each value's `attr`, None for the scalar-like values, which have none."""
    return map(getattr, values, repeat(attr), repeat(None))


def total(values: Iterable[Any], attr: str) -> int:
    """The sum of the values' integer `attr` (0 for the scalar-like values, which have none)."""
    return sum(map(getattr, values, repeat(attr), repeat(0)))
