"""free_benchmark's fixed costs, checked by what is done rather than by timing: a
listed run wraps only what it may check (plus pass-through guards on Python-level APIs, so
nested calls stay unchecked), the originals are back after stop(), and summary.json is not
rewritten by steps that changed nothing in it. The timings are in benchmarks/llama_overhead.py (fixed_costs)."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

import torch.nn.functional as F  # noqa: E402

import probes.free_benchmark.ledger as ledger  # noqa: E402
from probes.pytorch import PrecisionDebugger  # noqa: E402


def _namespaces():
    return {"torch": dict(vars(torch)), "F": dict(vars(F)), "Tensor": dict(vars(torch.Tensor))}


def _cfg(tmp_path, **section):
    return {"task": "free_benchmark", "dump_path": str(tmp_path), "free_benchmark": section}


def test_a_listed_run_wraps_only_what_it_may_check_and_restores_everything(tmp_path):
    before = _namespaces()
    dbg = PrecisionDebugger(config=_cfg(tmp_path, list=["softmax"]))
    patcher = dbg._tool.patcher
    keys = {m.key for m in patcher.metas}
    assert {"Functional.softmax", "Tensor.softmax", "Torch.softmax"} <= keys
    assert "Torch.add" not in keys and "Tensor.__add__" not in keys  # C functions it never checks
    assert "Functional.layer_norm" in keys  # Python-level: guarded, so what it calls stays nested
    assert len(keys) < 300
    dbg.start()
    assert torch.add is before["torch"]["add"] and F.softmax is not before["F"]["softmax"]
    dbg.stop()
    assert _namespaces() == before


def test_nested_calls_stay_unchecked_under_a_pass_through_guard(tmp_path):
    """F.softmax calls Tensor.softmax; listing only Tensor.softmax checks direct calls of it,
    not the one inside F.softmax (outermost only, as when every API is wrapped)."""
    x = torch.randn(4, 8)
    dbg = PrecisionDebugger(config=_cfg(tmp_path, list=["Tensor.softmax"], pert_mode="no_change"))
    with dbg:
        F.softmax(x, dim=-1)
        x.softmax(dim=-1)
    apis = dbg.summary()["apis"]
    assert apis["Tensor.softmax"]["checked"] == 1
    assert "Functional.softmax" not in apis


def test_summary_json_is_not_rewritten_by_steps_that_change_nothing(tmp_path, monkeypatch):
    writes = []
    real = ledger.write_json_atomic
    monkeypatch.setattr(ledger, "write_json_atomic", lambda path, data: writes.append(data) or real(path, data))
    dbg = PrecisionDebugger(config=_cfg(tmp_path, list=["softmax"]))
    x = torch.randn(4, 8)
    dbg.start()
    F.softmax(x, dim=-1)
    dbg.stop()
    dbg.step()
    first = len(writes)
    assert first >= 1
    for _ in range(5):  # steps that call nothing selected
        dbg.start()
        torch.add(x, x)
        dbg.stop()
        dbg.step()
    assert len(writes) == first
    dbg.start()
    F.softmax(x, dim=-1)  # a change: written at the next flush
    dbg.stop()
    assert len(writes) == first + 1 and writes[-1]["steps_seen"] == 7
    dbg._tool.close()  # at exit: steps_seen brought up to date
    assert writes[-1]["steps_seen"] == 7
