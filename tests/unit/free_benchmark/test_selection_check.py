"""The one check of free_benchmark's `list`/`scope` entries both frameworks run."""

from __future__ import annotations

import logging

import pytest

from probes.core.errors import ConfigError
from probes.free_benchmark.selection import note_never_rerun, reject_unmatched


def test_the_error_names_the_key_the_entry_and_what_is_allowed():
    with pytest.raises(ConfigError) as raised:
        reject_unmatched("free_benchmark.list", ["Functional.softmaxx"], ["Functional.softmax", "Torch.matmul"],
                         "it selects no PyTorch API", "entries are substrings", cutoff=0.5)
    assert raised.value.key == "free_benchmark.list" and raised.value.value == "Functional.softmaxx"
    assert raised.value.allowed == "it selects no PyTorch API"
    assert 'did you mean "Functional.softmax"' in str(raised.value)


def test_without_a_close_name_the_example_is_shown():
    with pytest.raises(ConfigError, match=r"free_benchmark.scope.*Nothing.0.forward.*call names such as"):
        reject_unmatched("free_benchmark.scope", ["Nothing.0.forward"], (), "it names no API", "call names such as x")


def test_the_stage_is_left_off_before_suggesting():
    with pytest.raises(ConfigError, match='did you mean "Torch.matmul"'):
        reject_unmatched("free_benchmark.scope", ["Torch.matmull.forward"], ["Torch.matmul"], "no API", "e.g.")


def test_nothing_unmatched_passes():
    reject_unmatched("free_benchmark.list", [], ["Torch.matmul"], "no API", "e.g.")


def test_excluded_selections_are_logged_up_to_a_limit(caplog):
    with caplog.at_level(logging.INFO, logger="probes.free_benchmark"):
        note_never_rerun(((f"Torch.rand{i}", "random") for i in range(30)), most=3)
    assert [r.getMessage() for r in caplog.records] == [
        f"free_benchmark: Torch.rand{i} is selected but is never re-run: random" for i in range(3)]
