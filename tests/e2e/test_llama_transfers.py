"""Issue 16's transfer targets on its own model: a probed training step of the Llama-style
transformer adds at most two device->host transfers, whatever the number of checked calls
(counted exactly on the simulated NPU by benchmarks/llama_overhead.py's `transfers`)."""

from __future__ import annotations

import sys

import pytest

pytest.importorskip("torch")
pytest.importorskip("transformers")

from repo_paths import REPO  # noqa: E402

sys.path.insert(0, str(REPO / "benchmarks"))

import llama_overhead  # noqa: E402

PATHS = [p for p, (_tool, _dtype, _section) in llama_overhead.PATHS.items() if p != "online_dispatch"]


@pytest.mark.parametrize("path", PATHS)
def test_a_probed_llama_step_adds_at_most_the_target_transfers(path):
    added = llama_overhead.transfers(path)
    target = llama_overhead.TARGETS[path][1]
    assert 0 <= added <= target, f"{path}: {added} host transfers per step (target <= {target})"
