"""Seeded Hypothesis draws: the catalogue's inputs, the same on every run (PyTorch's and MindSpore's)."""

from __future__ import annotations

from typing import Any

from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import seed as hseed

from pytest_msprobe.api.reproducible import without_local_constants


def draw_examples(strategy: Any, count: int, seed: int) -> list[Any]:
    """`count` examples of a Hypothesis strategy, the same ones on every run (seeded generation,
    no database, no shrinking, no constants of whatever local modules are imported): the catalogue
    compares runs, so its inputs must not move.
    Hypothesis starts from the simplest example (all zeros): callers skip it."""
    out: list[Any] = []

    @hseed(seed)
    @settings(max_examples=count, database=None, deadline=None, phases=[Phase.generate],
              suppress_health_check=list(HealthCheck))
    @given(strategy)
    def collect(example: Any) -> None:
        if len(out) < count:
            out.append(example)

    with without_local_constants():
        collect()
    return out
