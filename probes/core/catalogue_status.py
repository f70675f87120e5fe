"""The statuses of the API precision catalogue's rows, and the order they are listed in.

The catalogue's gate (pytest_msprobe.catalogue.gate) gives each API x dtype one of them and
catalogue.csv's "status" column holds it; the terminal summary, report.html and ``python -m probes
summary`` list and sort by them. The command line reads catalogue.csv without the plugin, so the
names live in the framework-free core.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

OK, ACCEPTED, REGRESSED, NEWLY_FLAGGED, BROKEN = "ok", "accepted", "regressed", "newly flagged", "broken"
NEW, MEASURED, FLAGGED, REGENERATED, SKIPPED = "new", "measured", "flagged", "regenerated", "skipped"
OVER_LIMIT = "over limit"
FAILING = (REGRESSED, OVER_LIMIT, NEWLY_FLAGGED, BROKEN, FLAGGED)
# the order statuses are listed and sorted in (terminal summary, report): failures first
STATUS_ORDER = (REGRESSED, OVER_LIMIT, NEWLY_FLAGGED, BROKEN, FLAGGED, ACCEPTED, NEW, MEASURED, REGENERATED, OK,
                SKIPPED)
STATUS_RANK = {s: i for i, s in enumerate(STATUS_ORDER)}


def failing(result: Mapping[str, Any]) -> bool:
    """Whether a catalogue row's status fails the session."""
    return result.get("status") in FAILING
