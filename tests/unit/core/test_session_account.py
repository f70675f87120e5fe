"""The probe's account of a session: what it checked, and which tests gave it nothing and why."""

from __future__ import annotations

from probes.core.session_tables import ProbeAccount


def _entry(checked: int, nothing: str | None, outcome: str) -> dict:
    return {"errors": [], "checked": checked, "not_checked": {}, "nothing_checked": nothing, "outcome": outcome}


def test_a_test_that_skipped_itself_is_not_listed_as_giving_the_probe_nothing():
    account = ProbeAccount.of({
        "t::ran": _entry(3, None, "passed"),
        "t::empty": _entry(0, "it called no API free_benchmark checks", "passed"),
        "t::skipped": _entry(0, "it called no API free_benchmark checks", "skipped"),
    })
    assert account.tests == 3 and account.checked == 3
    assert account.nothing_checked == {"t::empty": "it called no API free_benchmark checks"}
