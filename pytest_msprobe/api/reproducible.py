"""Seeded Hypothesis draws that depend on the seed alone.

Hypothesis mixes "local constants" into its generation: the literal numbers and strings of every
module of the user's own code (not site-packages) that the process has imported so far. A seeded
draw then depends on which of those modules happen to be loaded, so the catalogue's inputs, and
the per-API checks' search, changed with test order, pytest-xdist's scheduling and edits to
unrelated code (importing one module with the literals 2.05, 2.0 and 0.5 changed a catalogue
case's samples and its golden figure by 3x). A precision gate must measure the same inputs on
every run of the same code, so these draws run without the local constants. Hypothesis's own
global constants (0, 1, the dtype's extremes...) stay.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

__all__ = ["without_local_constants"]


@contextlib.contextmanager
def without_local_constants() -> Iterator[None]:
    """Hypothesis draws inside the block ignore the local modules' constants (module docstring).
    With a Hypothesis that has no such pool, the block changes nothing."""
    try:
        from hypothesis.internal.conjecture import providers

        getter = providers._get_local_constants
        empty = providers.Constants()
        cache = providers.CONSTANTS_CACHE.cache
    except (ImportError, AttributeError):
        yield
        return
    providers._get_local_constants = lambda: empty
    cache.clear()  # it holds permitted local constants per choice kind
    try:
        yield
    finally:
        providers._get_local_constants = getter
        cache.clear()
