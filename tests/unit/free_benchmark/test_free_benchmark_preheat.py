"""free_benchmark preheat on PyTorch: thresholds learned against the CPU, with msprobe's preheat
defects fixed (max_sample default 15, step-0-only census, P - 1 sampling steps, dtypes blocking
each other, a crash on outputs without tensors)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import seeded
import torch
from training_loops import train

from probes.free_benchmark import preheat as ph
from probes.pytorch import PrecisionDebugger

BF16 = "torch.bfloat16"


def _cfg(fb_config, steps=None, **section):
    section.setdefault("if_preheat", True)
    cfg = fb_config(**section)
    if steps is not None:
        cfg["step"] = steps
    return cfg


def _loop(cfg: dict, body, steps: int) -> PrecisionDebugger:
    """`steps` training steps: start, body(step), stop, step."""
    dbg = PrecisionDebugger(config=cfg)
    for step in range(steps):
        dbg.start()
        body(step)
        dbg.stop()
        dbg.step()
    return dbg


def _inputs(step: int, dtype: torch.dtype, n: int = 4096, low: float = 0.5, high: float = 2.0) -> torch.Tensor:
    g = torch.Generator().manual_seed(1000 + step)
    return (low + (high - low) * torch.rand(n, generator=g)).to(dtype)


def _csv_steps(dump: Path) -> set[int]:
    return {int(p.parent.parent.name[4:]) for p in dump.glob("step*/rank*/free_benchmark.csv")}


def _mul_calls(step: int, calls: int = 4) -> None:
    for i in range(calls):
        x, y = _inputs(step * 10 + i, torch.bfloat16), _inputs(step * 10 + i + 5, torch.bfloat16)
        torch.mul(x, y)


# --- the heuristic alone (framework-free) -----------------------------------------------------


def test_sampling_spreads_k_calls_per_step_over_the_preheat_steps():
    # B = 100 calls, P = 15, S = 20: k = ceil(100/15) = 7 samples per step
    sets = [ph.sample_set(100, 15, 20, j) for j in range(1, 16)]
    assert all(len(s) == 7 for s in sets)
    assert len(set().union(*sets)) == 100  # together they cover every call number
    assert ph.sample_set(100, 2, 3, 1) == {1, 3, 5}  # capped by max_sample
    assert ph.sample_set(0, 15, 20, 1) == frozenset()


def test_adjustment_rule_widens_tightens_and_freezes():
    consistent = ph.DtypeState(floor=1.004)
    consistent.pending = [(1.1, True)]
    consistent.adjust(1)
    assert consistent.threshold == 1 + ph.TIGHTEN_FACTOR * (ph.INITIAL_THRESHOLD - 1)  # 1.525
    consistent.pending = [(1.6, True)]  # a false alarm at T = 1.525: widen, at least HEADROOM x 0.6
    consistent.adjust(2)
    assert consistent.threshold == pytest.approx(1 + ph.HEADROOM * 0.6)
    for step in range(3, 30):  # tightening stops above the ratios the CPU vouched for
        consistent.pending = [(1.001, True)]
        consistent.adjust(step)
    assert consistent.threshold == pytest.approx(1 + ph.HEADROOM * 0.6) and not consistent.frozen
    plain = ph.DtypeState(floor=1.004)
    for step in range(1, 30):  # an API always well inside: down to the dtype's default threshold
        plain.pending = [(1.0001, True)]
        plain.adjust(step)
    assert plain.threshold == 1.004
    rejected = ph.DtypeState(floor=1.004)
    rejected.pending = [(1.01, True), (1.2, False), (1.1, False)]
    rejected.adjust(1)
    assert rejected.frozen and rejected.threshold == pytest.approx(1 + ph.TIGHTEN_FACTOR * 0.1)
    rejected.pending = [(1.001, True)]
    rejected.adjust(2)
    assert rejected.threshold == pytest.approx(1 + ph.TIGHTEN_FACTOR * 0.1) and rejected.steps == [1]
    floor = ph.DtypeState(floor=1.004)
    floor.pending = [(1.001, False)]
    floor.adjust(1)
    assert floor.threshold == 1.004  # never below the dtype's default threshold


# --- end to end ---------------------------------------------------------------------------------


def test_structural_bf16_ratio_agreeing_with_cpu_ends_preheat_widened_and_silent(fb_config, tmp_path):
    """bf16 multiplication under bit_noise moves by one bf16 ulp (up to 0.78 % > bf16's 0.4 %): flagged
    without preheat, yet the CPU agrees, so preheat widens its threshold and no row follows."""
    dump = tmp_path / "dump"
    plain = _loop(_cfg(fb_config, pert_mode="bit_noise", list=["Torch.mul"], if_preheat=False), _mul_calls, 2)
    assert plain.summary()["apis"]["Torch.mul"]["flagged"] > 0  # the false alarm preheat is for

    for f in dump.rglob("*.csv"):
        f.unlink()
    dbg = _loop(_cfg(fb_config, pert_mode="bit_noise", list=["Torch.mul"], preheat_step=3, max_sample=2),
                _mul_calls, 8)
    summary = json.loads((dump / "summary.json").read_text())
    api = summary["apis"]["Torch.mul"]
    learned = api["preheat"]["dtypes"][BF16]
    assert api["preheat"]["phase"] == "done"
    assert api["preheat"]["census_step"] == 0 and api["preheat"]["census_calls"] == 4
    assert api["preheat"]["sampling_steps"] == [1, 2, 3]
    assert learned["threshold"] > 1.004 and not learned["frozen"]  # widened beyond bf16's default
    assert learned["threshold"] >= 1 + ph.HEADROOM * (learned["max_cpu_consistent_ratio"] - 1)
    assert learned["samples"] == 3 * 2 and learned["steps"] == [1, 2, 3]
    assert api["checked"] == 7 * 4  # every call after the census step is checked
    assert api["flagged"] == 0 and dbg.rows == []
    assert _csv_steps(dump) == set()


def test_seeded_half_kernel_that_disagrees_with_cpu_is_still_flagged_after_preheat(fb_config, tmp_path, monkeypatch):
    """Same ratio structure as the multiplication above, but the bf16 kernel is 1 % off the CPU: the
    samples freeze its threshold and it keeps being flagged after preheat; during preheat its rows are
    preheat rows (summary.json only, no CSV)."""
    monkeypatch.setattr(torch, "expm1", seeded.wrong_half_kernel)
    dump = tmp_path / "dump"

    def body(step):
        for i in range(4):
            torch.expm1(_inputs(step * 10 + i, torch.bfloat16, low=0.5, high=1.5))

    plain = _loop(_cfg(fb_config, pert_mode="bit_noise", list=["expm1"], if_preheat=False), body, 1)
    assert plain.rows  # flagged without preheat too
    for f in dump.rglob("*.csv"):
        f.unlink()
    dbg = _loop(_cfg(fb_config, pert_mode="bit_noise", list=["expm1"], preheat_step=3, max_sample=2), body, 8)
    summary = dbg.summary()
    learned = summary["apis"]["Torch.expm1"]["preheat"]["dtypes"][BF16]
    assert learned["frozen"] and learned["steps"] == [1]  # frozen at the first sampling step
    after = [r for r in dbg.rows if r.api == "Torch.expm1"]
    assert after and {r.step for r in after} <= {4, 5, 6, 7}
    assert all(r.threshold == round(learned["threshold"] - 1, 12) for r in after)
    assert min(_csv_steps(dump)) >= 4  # nothing in the CSV before preheat has ended


def test_rows_during_preheat_are_preheat_rows_outside_the_csv(fb_config, tmp_path, monkeypatch):
    """A half kernel 3x off is beyond even the warm-up threshold (2.05): during preheat its rows go to
    summary.json as preheat rows, never to the CSV or `rows`; afterwards they are ordinary rows."""

    def three_times_off_in_half(x):
        y = torch.special.expm1(x)
        return y * 3 if x.dtype == torch.float16 else y

    monkeypatch.setattr(torch, "expm1", three_times_off_in_half)
    dump = tmp_path / "dump"

    def body(step):
        for i in range(3):
            torch.expm1(_inputs(step * 10 + i, torch.float16, n=64))

    dbg = _loop(_cfg(fb_config, pert_mode="improve_precision", list=["expm1"], preheat_step=2), body, 5)
    summary = json.loads((dump / "summary.json").read_text())
    api, pre = summary["apis"]["Torch.expm1"], summary["preheat"]
    assert api["preheat_flagged"] == 2 * 3  # every call of sampling steps 1 and 2
    assert pre["applied"] and pre["rows_total"] >= api["preheat_flagged"]
    assert pre["rows"] and all(r["preheat"] for r in pre["rows"])
    assert {r["step"] for r in pre["rows"]} == {1, 2}
    assert api["preheat"]["dtypes"]["torch.float16"]["frozen"]  # the CPU disagrees too
    assert api["flagged"] == 2 * 3 and {r.step for r in dbg.rows} == {3, 4}  # still flagged afterwards
    assert _csv_steps(dump) == {3, 4}


def test_census_on_first_active_step_and_exactly_p_sampling_steps(fb_config, tmp_path, monkeypatch):
    """A step filter that starts at step 3 (msprobe then never sampled) still gets a census (step 3) and P = 2 sampling
    steps (4 and 5); the learned threshold judges from step 6 on."""
    monkeypatch.setattr(torch, "expm1", seeded.wrong_half_kernel)
    dump = tmp_path / "dump"

    def body(step):
        for i in range(3):
            torch.expm1(_inputs(step * 10 + i, torch.bfloat16))

    dbg = _loop(_cfg(fb_config, steps=list(range(3, 9)), pert_mode="bit_noise", list=["expm1"], preheat_step=2,
                     max_sample=5), body, 9)
    pre = dbg.summary()["apis"]["Torch.expm1"]["preheat"]
    assert pre["census_step"] == 3 and pre["census_calls"] == 3
    assert pre["sampling_steps"] == [4, 5] and pre["phase"] == "done"
    assert pre["dtypes"][BF16]["samples"] == 2 * 2  # k = min(ceil(3/2), 5) = 2 per step
    assert dbg.summary()["apis"]["Torch.expm1"]["checked"] == 3 * 5  # steps 4..8
    assert dbg.rows and min(r.step for r in dbg.rows) >= 6
    assert min(_csv_steps(dump)) >= 6


def test_two_dtypes_of_one_api_are_adjusted_independently(fb_config, monkeypatch):
    """The bf16 kernel is wrong (frozen at the first sampling step), the fp16 one is right; the
    fp16 threshold keeps being adjusted at every sampling step."""
    def wrong_bf16_only(x):
        y = torch.special.expm1(x)
        return y * 1.01 if x.dtype == torch.bfloat16 else y

    monkeypatch.setattr(torch, "expm1", wrong_bf16_only)

    def body(step):
        for i in range(2):
            torch.expm1(_inputs(step * 10 + i, torch.bfloat16))
            torch.expm1(_inputs(step * 10 + i, torch.float16))

    dbg = _loop(_cfg(fb_config, pert_mode="bit_noise", list=["expm1"], preheat_step=3, max_sample=4), body, 5)
    dtypes = dbg.summary()["apis"]["Torch.expm1"]["preheat"]["dtypes"]
    bf16, fp16 = dtypes[BF16], dtypes["torch.float16"]
    assert bf16["frozen"] and bf16["steps"] == [1]
    assert not fp16["frozen"] and fp16["steps"] == [1, 2, 3]
    assert fp16["samples"] == bf16["samples"] == 3  # k = 2 of the 4 calls per step, alternating dtypes
    assert fp16["threshold"] != bf16["threshold"]
    assert not [r for r in dbg.rows if r.dtype == "torch.float16"]


def test_outputs_without_tensors_do_not_crash(fb_config, monkeypatch):
    """The reference failed on an output holding no tensor (its dtype was undefined)."""
    monkeypatch.setattr(torch, "expm1", lambda x: float(x.double().sum()))
    monkeypatch.setattr(torch, "exp2", lambda x: "done")

    def body(step):
        torch.expm1(_inputs(step, torch.float32, n=16))
        torch.exp2(_inputs(step, torch.float32, n=16))

    dbg = _loop(_cfg(fb_config, pert_mode="add_noise", list=["expm1", "exp2"], preheat_step=2), body, 4)
    summary = dbg.summary()
    assert summary["errors"] == []
    assert summary["apis"]["Torch.expm1"]["checked"] == 3 and summary["apis"]["Torch.exp2"]["checked"] == 3
    assert summary["apis"]["Torch.exp2"]["preheat"]["dtypes"] == {}  # nothing to learn from a string
    assert "float" in summary["apis"]["Torch.expm1"]["preheat"]["dtypes"]


def test_max_sample_defaults_to_20(fb_config):
    dbg = PrecisionDebugger(config=_cfg(fb_config))
    assert dbg.summary()["config"]["free_benchmark"]["max_sample"] == 20  # msprobe's docs say 20, its code used 15
    assert dbg.probe.preheat.max_sample == 20 and dbg.probe.preheat.preheat_step == 15


def test_backward_stage_keeps_default_thresholds_and_says_so(fb_config):
    dbg = PrecisionDebugger(config=_cfg(fb_config, fuzz_stage="backward", list=["linear"]))
    assert dbg.probe.preheat is None
    note = dbg.summary()["preheat"]
    assert not note["applied"] and "backward" in note["note"]


def test_check_mode_with_preheat_leaves_training_bit_identical(fb_config):
    probed = train(_cfg(fb_config, pert_mode="add_noise", preheat_step=2, max_sample=3), 5, torch.bfloat16)
    train(None, 5, torch.bfloat16).assert_identical(probed, "with preheat")
    apis = probed.debugger.summary()["apis"]
    sampled = [k for k, v in apis.items() if any(d["samples"] for d in (v["preheat"] or {}).get("dtypes", {}).values())]
    assert "Functional.batch_norm" in sampled  # an API that updates its inputs was run on the CPU too
    assert probed.debugger.summary()["errors"] == []
