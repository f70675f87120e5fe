"""Seeded defects for MindSpore: the same defects as tests/support/seeded.py, written with mindspore.ops.

Each is installed over a real whitelisted attribute (mindspore.ops.expm1, ...) *before* the probe
is created, so the probe wraps and reports it under that attribute's name (Functional.expm1).
"""

from __future__ import annotations

import itertools

import mindspore.common.dtype as mstype
from mindspore import ops

_EXPM1 = ops.expm1  # the real kernel, whatever a test installs over ops.expm1 later


def naive_expm1(x):
    """exp(x) - 1: cancellation makes it lose all precision for small x in fp16."""
    return ops.exp(x) - 1


def accurate_expm1(x):
    """A correct half-precision expm1 (computed in float32, rounded once). The clean stand-in:
    MindSpore 2.10's own CPU Expm1 (and Log1p) kernel loses precision in float16 for small x
    (max_rel ~0.2 against float32), which improve_precision rightly flags."""
    return _EXPM1(x.astype(mstype.float32)).astype(x.dtype)


def ill_conditioned(x):
    """An output that swings with one-ulp changes of the input (condition number ~1e5)."""
    return ops.sin(x * 1e5)


def off_by_one_sum(x, *args, **kwargs):
    """A reduction kernel that forgets the last element: not invariant to reordering."""
    return x.reshape(-1)[:-1].sum()


def nondeterministic():
    """A kernel whose result depends on how often it ran (like a racy atomic accumulation)."""
    calls = itertools.count()

    def softsign(x, *args, **kwargs):
        return x / (1 + ops.abs(x)) * (1 + 1e-3 * (next(calls) % 2))

    return softsign
