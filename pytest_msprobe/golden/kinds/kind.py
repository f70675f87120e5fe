"""What every kind of golden is made of, and what its comparison answers.

A :class:`Kind` is four functions (snapshot, render, load, compare) and the check of its options;
the store runs the same routine for every kind with them, so a kind never writes files, formats
messages or reads ``meta.json`` itself. A :class:`Comparison` is what the store turns into the
failure message: failures listed by :class:`Category`, worst first.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import IntEnum
from pathlib import Path
from typing import Any, Callable

from probes.core.errors import ConfigError
from pytest_msprobe.golden.kinds.cells import jsonable


class Category(IntEnum):
    """What a failure is about, in the order failures are listed (highest first): a run of another
    shape makes its figures moot, and a verdict that changed says more than a figure that grew."""

    FIGURE = 0  # a figure beyond its bound
    DIRECTION = 1  # a gradient-direction flag
    VERDICT = 2  # a verdict word that appeared or changed (symbol_flipping, nan_mismatch, ...)
    STRUCTURE = 3  # ranks, steps, parameters or shapes that differ from the golden's


@dataclass
class Failure:
    """One offending item: ``text`` is its message line. Failures are listed by category, then by
    ``severity`` (how far out: bounds exceeded, or how far a similarity fell), largest first."""

    item: str
    reason: str
    text: str
    category: Category
    severity: float = 0.0
    golden: Any = None
    now: Any = None
    allowed: Any = None

    @property
    def rank(self) -> tuple[int, float]:
        """The sort key of the listing, worst largest."""
        return (int(self.category), self.severity)

    def to_dict(self) -> dict[str, Any]:
        return {"item": self.item, "reason": self.reason, "text": self.text, "golden": jsonable(self.golden),
                "now": jsonable(self.now), "allowed": jsonable(self.allowed)}


@dataclass
class Comparison:
    failures: list[Failure]
    headline: str  # the count summary: "3 of 41 APIs regressed"
    rule: str = ""  # the bounds applied, in words
    info: list[str] = field(default_factory=list)  # changes that are not failures
    counts: dict[str, int] = field(default_factory=dict)
    data: dict[str, Any] = field(default_factory=dict)  # per-item figures for reports (JSON-able)


def no_options() -> dict[str, Any]:
    """The options of a kind that takes none."""
    return {}


@dataclass(frozen=True)
class Kind:
    """A kind of golden. ``name`` is what ``meta.json`` records; ``snapshot(result)`` turns what a
    tool produced into the figures a golden keeps, ``render(snapshot)`` into its files (name ->
    bytes), ``load(folder)`` reads them back, and ``compare(golden, now, **options)`` judges a run,
    with ``options(**given)`` validating the options (ConfigError) before anything is read. A kind
    that is only ever written, never checked (the API catalogue's, gathered over a session), leaves
    snapshot and compare out."""

    name: str
    render: Callable[[Any], dict[str, bytes]]
    load: Callable[[Path], Any]
    snapshot: Callable[[Any], Any] | None = None
    compare: Callable[..., Comparison] | None = None
    options: Callable[..., dict[str, Any]] = no_options


def non_negative(key: str, value: object) -> None:
    """A margin or tolerance: a number >= 0, else ConfigError."""
    if not isinstance(value, (int, float)) or isinstance(value, bool) or not value >= 0:
        raise ConfigError(key, value, "a number >= 0")


def unit_interval(key: str, value: object) -> None:
    """A similarity limit: a number in [0, 1], else ConfigError."""
    if not isinstance(value, (int, float)) or isinstance(value, bool) or not 0.0 <= value <= 1.0:
        raise ConfigError(key, value, "a number in [0, 1]")
