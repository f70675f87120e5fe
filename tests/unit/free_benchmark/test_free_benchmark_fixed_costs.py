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
    monkeypatch.setattr(ledger, "write_json_atomic", lambda path, data, **kw: writes.append(data) or real(path, data, **kw))
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


def test_probes_started_in_turn_each_see_their_own_selection(tmp_path):
    """Install sets the catalog's shared pass-through flags only when another probe set them
    last: two probes with different selections, started in turn, each run with their own."""
    x = torch.randn(4, 8)
    listed = PrecisionDebugger(config=_cfg(tmp_path / "listed", list=["Tensor.softmax"], pert_mode="no_change"))
    every = PrecisionDebugger(config=_cfg(tmp_path / "every", pert_mode="no_change"))
    layer_norm = next(m for m in listed._tool.patcher.metas if m.key == "Functional.layer_norm")
    before = _namespaces()
    for _ in range(2):
        for dbg in (listed, every, every, listed):
            with dbg:
                # a Python-level API the listed probe never checks: guarded, passed straight through
                assert layer_norm.passthrough is (dbg is listed)
                F.layer_norm(x, (8,))
                x.softmax(dim=-1)
            assert _namespaces() == before
    assert listed.summary()["apis"]["Tensor.softmax"]["checked"] == 4
    assert "Functional.layer_norm" not in listed.summary()["apis"]
    assert every.summary()["apis"]["Functional.layer_norm"]["checked"] == 4
    assert every.summary()["apis"]["Tensor.softmax"]["checked"] == 4


def test_an_install_that_fails_half_way_puts_back_what_it_set(tmp_path, monkeypatch):
    dbg = PrecisionDebugger(config=_cfg(tmp_path, pert_mode="no_change"))
    patcher = dbg._tool.patcher
    before = _namespaces()
    dbg.start()
    dbg.stop()
    assert _namespaces() == before
    sets = list(patcher._sets)

    class Frozen:  # an owner that refuses the wrapper, half-way through the list
        def __setattr__(self, name, value):
            raise AttributeError(f"{name} is read-only")

    monkeypatch.setattr(patcher, "_sets", tuple(sets[:500] + [(Frozen(), "x", None)] + sets[500:]))
    with pytest.raises(AttributeError, match="read-only"):
        patcher.install(lambda *a: None)
    assert _namespaces() == before


def test_stop_restores_the_rest_when_the_user_deleted_a_wrapper_meanwhile(tmp_path):
    """The wrappers of inherited Tensor methods are deleted at stop() (one pass in C); one the
    user's code deleted already must not keep the others installed."""
    dbg = PrecisionDebugger(config=_cfg(tmp_path, pert_mode="no_change"))
    before = _namespaces()
    dbg.start()
    inherited = [attr for owner, attr in dbg._tool.patcher._deletes if owner is torch.Tensor]
    assert len(inherited) > 100 and "softmax" in inherited
    del torch.Tensor.softmax  # the user's code removes one wrapper while the probe runs
    dbg.stop()
    assert _namespaces() == before


def test_a_long_run_keeps_no_writer_per_step_and_lists_every_csv(tmp_path):
    """Every step that flags a call gets its CSV, and summary.json lists them all, sorted as
    text; but the writers of written steps are let go, so what a step's flush walks and encodes
    does not grow with the run. A step flushed twice (two start/stop in one step) appends to
    its file under one header."""
    import csv
    import json

    x = torch.arange(8.0).reshape(1, 8)  # change_value swaps its first and last: flagged each call
    dbg = PrecisionDebugger(config=_cfg(tmp_path, list=["softmax"], pert_mode="change_value"))
    led = dbg._tool.probe.ledger
    for step in range(12):
        for _ in range(2 if step == 3 else 1):
            dbg.start()
            F.softmax(x, dim=-1)
            dbg.stop()
            assert led.writers == {}
        dbg.step()
    dbg._tool.close()
    found = sorted(str(p) for p in tmp_path.rglob("free_benchmark.csv"))
    assert len(found) == 12
    summary = json.loads(next(tmp_path.rglob("summary.json")).read_text())
    assert summary["csv_files"] == found  # "step10" before "step2": sorted as text, as before
    with open(found[found.index(str(tmp_path / "step3" / "rank0" / "free_benchmark.csv"))], newline="") as fh:
        rows = list(csv.reader(fh))
    assert rows[0][0] == "rank" and sum(r[0] == "rank" for r in rows) == 1 and len(rows) == 3
