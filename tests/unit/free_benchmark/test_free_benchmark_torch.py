"""free_benchmark on PyTorch, end to end: hooking, naming, exclusions, modes, files, safety."""

from __future__ import annotations

import csv
import json

import pytest
import seeded
import torch
import torch.nn as nn
import torch.nn.functional as F
from training_loops import train

from probes.core.errors import ConfigError, ProbeError
from probes.core.records import FREE_BENCHMARK_COLUMNS
from probes.free_benchmark import exclusions
from probes.pytorch import PrecisionDebugger


def _namespaces():
    return {
        "torch": dict(vars(torch)),
        "F": dict(vars(F)),
        "Tensor": dict(vars(torch.Tensor)),
        "linalg": dict(vars(torch.linalg)),
    }


def run(config: dict, fn):
    dbg = PrecisionDebugger(config=config)
    with dbg:
        out = fn()
    return dbg, out


# --- hooking and restoring -------------------------------------------------------------------


def test_hooks_restored_after_stop(fb_config):
    before = _namespaces()
    linear = F.linear
    dbg = PrecisionDebugger(config=fb_config())
    dbg.start()
    assert F.linear is not linear  # wrapped while running
    assert "__add__" in vars(torch.Tensor)
    dbg.stop()
    assert F.linear is linear is torch._C._nn.linear
    assert _namespaces() == before


def test_hooks_restored_after_exception_inside_window(fb_config):
    before = _namespaces()
    with pytest.raises(ZeroDivisionError):
        with PrecisionDebugger(config=fb_config()):
            torch.ones(3) @ torch.ones(3)
            raise ZeroDivisionError
    assert _namespaces() == before
    # the user's own exception from a hooked API also propagates untouched
    with pytest.raises(RuntimeError, match="size mismatch|shapes cannot be multiplied"):
        with PrecisionDebugger(config=fb_config()):
            F.linear(torch.ones(2, 3), torch.ones(4, 5))
    assert _namespaces() == before


def test_second_probe_while_one_runs_is_a_clear_error(fb_config):
    with PrecisionDebugger(config=fb_config()):
        with pytest.raises(ProbeError, match="already running"):
            PrecisionDebugger(config=fb_config()).start()


# --- naming, counters, selection --------------------------------------------------------------


def test_names_counters_and_outermost_only(fb_config):
    cfg = fb_config(pert_mode="no_change")
    dbg = PrecisionDebugger(config=cfg)
    seen = []
    ledger = dbg.probe.ledger
    original_record = ledger.record

    def spy(key, name, *rest, **kw):  # every checked call's verdicts, whichever path judged it
        seen.append(name)
        return original_record(key, name, *rest, **kw)

    ledger.record = spy
    x = torch.randn(4, 4)
    dbg.start()
    torch.matmul(x, x)
    torch.matmul(x, x)
    F.softmax(x, dim=-1)  # calls Tensor.softmax inside: only the outer call is hooked
    torch.linalg.norm(x)
    dbg.stop()
    dbg.step()
    dbg.start()
    torch.matmul(x, x)
    dbg.stop()
    assert seen == [
        "Torch.matmul.0.forward", "Torch.matmul.1.forward", "Functional.softmax.0.forward",
        "Torch.linalg.norm.0.forward", "Torch.matmul.0.forward",
    ]


def test_list_selects_by_substring_and_scope_by_exact_name(fb_config):
    x = torch.randn(4, 4)

    def work():
        torch.matmul(x, x)
        torch.matmul(x, x)
        F.relu(x)

    dbg, _ = run(fb_config(pert_mode="no_change", list=["relu"]), work)
    assert set(dbg.summary()["apis"]) == {"Functional.relu"}
    dbg, _ = run(fb_config(pert_mode="no_change", scope=["Torch.matmul.1.forward"]), work)
    assert dbg.summary()["apis"]["Torch.matmul"]["checked"] == 1
    assert "Functional.relu" not in dbg.summary()["apis"]


def test_list_entry_that_selects_nothing_is_an_error_with_suggestion(fb_config):
    with pytest.raises(ConfigError, match=r"free_benchmark.list.*softmaxx.*did you mean"):
        PrecisionDebugger(config=fb_config(list=["Functional.softmaxx"]))


# --- exclusions -------------------------------------------------------------------------------


def test_inplace_out_and_random_apis_are_not_rerun(fb_config):
    x = torch.randn(8)
    y = torch.empty(8)

    def work():
        x.add_(1.0)
        torch.add(x, 1.0, out=y)
        F.relu(x, inplace=True)
        F.relu(x.clone(), True)
        F.dropout(x, 0.5)

    dbg, _ = run(fb_config(pert_mode="no_change"), work)
    not_checked = dbg.summary()["not_checked"]
    reasons = {api: reason for reason, apis in not_checked.items() for api in apis}
    assert reasons["Tensor.add_"].startswith("in-place")
    assert reasons["Torch.add"].startswith("writes into an out=")
    assert reasons["Functional.relu"].startswith("in-place")
    assert not_checked[reasons["Functional.relu"]]["Functional.relu"] == 2
    assert reasons["Functional.dropout"].startswith("random")
    assert "Tensor.add_" not in dbg.summary()["apis"]


@pytest.mark.parametrize("pert_mode", ["change_value", "no_change"])
def test_values_the_api_rejects_are_a_reason_not_an_error(fb_config, pert_mode):
    """change_value leaves a barely positive-definite matrix indefinite: cholesky's perturbed
    re-run raises where the call itself did not. The call is not checked, with that reason, and
    no probe error is recorded; the user's result is the call's own."""
    torch.manual_seed(0)
    a = torch.randn(8, 8)
    spd = a @ a.T + 0.01 * torch.eye(8)
    dbg, out = run(fb_config(pert_mode=pert_mode), lambda: torch.linalg.cholesky(spd))
    assert torch.equal(out, torch.linalg.cholesky(spd))
    summary = dbg.summary()
    assert summary["errors"] == []
    if pert_mode == "change_value":
        (reason,) = [r for r, apis in summary["not_checked"].items() if "Torch.linalg.cholesky" in apis]
        assert "outside what the API accepts" in reason and "_LinAlgError" in reason
        assert summary["apis"]["Torch.linalg.cholesky"]["checked"] == 0
    else:  # the same values: checked, and consistent
        assert summary["apis"]["Torch.linalg.cholesky"]["checked"] == 1 and not summary["not_checked"]


def test_a_rerun_that_fails_on_the_calls_own_values_too_stays_an_error():
    """Only values the perturbation made are a reason to skip: a re-run that raises on the call's
    own arguments as well (and any failure of a mode that keeps the values) is raised, so the
    probe records it as an error."""
    from probes.backends.torch_backend import BACKEND
    from probes.core.errors import NotMeasurable
    from probes.free_benchmark.replay import perturbed_replay

    calls = []

    def picky(x):
        calls.append(x)
        if x.min() < 0:
            raise ValueError("negative")
        return x.sqrt()

    def broken(x):
        calls.append(x)
        raise ValueError("always")

    own, perturbed = torch.ones(4), -torch.ones(4)
    snapshot = BACKEND.rng_snapshot(None)
    with pytest.raises(NotMeasurable, match="change_value takes its input outside .*ValueError"):
        perturbed_replay(BACKEND, snapshot, picky, (perturbed,), {}, (own,), {}, "change_value")
    assert len(calls) == 2  # the perturbed re-run, then the call's own values
    with pytest.raises(ValueError, match="always"):
        perturbed_replay(BACKEND, snapshot, broken, (perturbed,), {}, (own,), {}, "add_noise")
    calls.clear()
    with pytest.raises(ValueError, match="negative"):
        perturbed_replay(BACKEND, snapshot, picky, (perturbed,), {}, (own,), {}, "improve_precision")
    assert len(calls) == 1  # a mode that keeps the values: no second run
    assert torch.equal(perturbed_replay(BACKEND, snapshot, picky, (own,), {}, (own,), {}, "bit_noise"), own)


# --- the user's training is untouched -----------------------------------------------------------


@pytest.mark.parametrize("mode", ["improve_precision", "add_noise", "bit_noise", "change_value", "no_change", "to_cpu"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
def test_check_mode_leaves_training_bit_identical(fb_config, mode, dtype):
    section = {"pert_mode": mode}
    if mode == "to_cpu":
        section["fuzz_device"] = "cpu"
    train(None, dtype=dtype).assert_identical(train(fb_config(**section), dtype=dtype), f"under {mode}")


# --- every mode: a seeded defect it catches, a clean case it passes ------------------------------

MODE_CASES = {
    # mode: (attribute to seed, defect, clean stand-in, input dtype, input)
    "improve_precision": (torch, "expm1", seeded.naive_expm1, torch.expm1, torch.float16,
                          lambda: torch.linspace(1e-3, 2e-2, 64)),
    "add_noise": (F, "softsign", seeded.ill_conditioned, F.softsign, torch.float32,
                  lambda: torch.linspace(0.5, 1.0, 64)),
    "bit_noise": (F, "softsign", seeded.ill_conditioned, F.softsign, torch.float32,
                  lambda: torch.linspace(0.5, 1.0, 64)),
    "change_value": (torch, "sum", seeded.off_by_one_sum, torch.sum, torch.float32,
                     lambda: torch.linspace(-1.0, 3.0, 64)),
    "no_change": (F, "softsign", None, F.softsign, torch.float32, lambda: torch.linspace(-2.0, 2.0, 64)),
    "to_cpu": (torch, "expm1", seeded.wrong_half_kernel, torch.expm1, torch.float16,
               lambda: torch.linspace(0.5, 2.0, 64)),
}


def _mode_run(fb_config, mode, fn_owner, attr, impl, dtype, make_x, monkeypatch):
    monkeypatch.setattr(fn_owner, attr, impl)
    section = {"pert_mode": mode, "list": [attr]}
    if mode == "to_cpu":
        section["fuzz_device"] = "cpu"
    x = make_x().to(dtype)
    dbg, out = run(fb_config(**section), lambda: getattr(fn_owner, attr)(x))
    return dbg, out


@pytest.mark.parametrize("rule", ["reference", "scaled"])
@pytest.mark.parametrize("mode", list(MODE_CASES))
def test_mode_catches_seeded_defect(fb_config, mode, rule, monkeypatch):
    owner, attr, defect, _clean, dtype, make_x = MODE_CASES[mode]
    if defect is None:
        defect = seeded.nondeterministic()
    dbg, _ = _mode_run(lambda **s: fb_config(rule=rule, **s), mode, owner, attr, defect, dtype, make_x, monkeypatch)
    rows = dbg.rows
    assert rows, f"{mode} missed the seeded defect in {attr}"
    assert all(r.api_name.endswith(".0.forward") and attr in r.api_name for r in rows)
    assert all(r.pert_mode == mode and r.stage == "forward" for r in rows)


@pytest.mark.parametrize("rule", ["reference", "scaled"])
@pytest.mark.parametrize("mode", list(MODE_CASES))
def test_mode_passes_clean_api(fb_config, mode, rule, monkeypatch):
    owner, attr, _defect, clean, dtype, make_x = MODE_CASES[mode]
    dbg, _ = _mode_run(lambda **s: fb_config(rule=rule, **s), mode, owner, attr, clean, dtype, make_x, monkeypatch)
    stats = dbg.summary()["apis"]
    key = next(k for k in stats if k.endswith("." + attr))
    assert stats[key]["checked"] == 1, "the clean API was not actually checked"
    assert dbg.rows == []


@pytest.mark.parametrize("rule", ["reference", "scaled"])
@pytest.mark.parametrize("mode", ["no_change", "improve_precision"])
def test_clean_fp32_model_gives_zero_rows(fb_config, mode, rule):
    def work():
        torch.manual_seed(0)
        model = nn.Sequential(nn.Linear(16, 32), nn.LayerNorm(32), nn.GELU(), nn.Linear(32, 4))
        loss = model(torch.randn(8, 16)).softmax(-1).log().mean()
        loss.backward()
        return loss

    dbg, _ = run(fb_config(pert_mode=mode, rule=rule), work)
    assert dbg.rows == []
    if mode == "no_change" or rule == "scaled":  # the scaled rule re-runs float32 in float64
        assert sum(s["checked"] for s in dbg.summary()["apis"].values()) >= 5


# --- files ---------------------------------------------------------------------------------------


def test_csv_layout_header_and_per_step_flush(fb_config, tmp_path, monkeypatch):
    monkeypatch.setattr(torch, "expm1", seeded.naive_expm1)
    cfg = fb_config(pert_mode="improve_precision", list=["expm1"])
    dbg = PrecisionDebugger(config=cfg)
    x = torch.linspace(1e-3, 2e-2, 8).half()
    dbg.start()
    torch.expm1(x)
    dbg.stop()
    dbg.step()  # flushed here, before the run ends
    path = tmp_path / "dump" / "step0" / "rank0" / "free_benchmark.csv"
    with open(path, newline="") as fh:
        rows = list(csv.reader(fh))
    assert tuple(rows[0]) == FREE_BENCHMARK_COLUMNS
    r = dict(zip(rows[0], rows[1]))
    assert r["rank"] == "0" and r["step"] == "0" and r["stage"] == "forward"
    assert r["api_name"] == "Torch.expm1.0.forward"
    assert r["dtype"] == "torch.float16" and r["shape"] == "torch.Size([8])" and r["output_index"] == ""
    assert float(r["max_rel"]) > 0.002
    dbg.start()
    torch.expm1(x)
    dbg.stop()
    assert (tmp_path / "dump" / "step1" / "rank0" / "free_benchmark.csv").exists()
    summary = json.loads((tmp_path / "dump" / "summary.json").read_text())
    assert summary["apis"]["Torch.expm1"]["flagged"] == 2
    assert summary["rows_total"] == 2


def test_tuple_outputs_report_output_index(fb_config, monkeypatch):
    def bad_max(x, dim):
        values, idx = torch.max(x, dim)
        return torch.return_types.max((torch.exp(values) - 1, idx))

    monkeypatch.setattr(torch, "aminmax", bad_max)
    x = torch.linspace(1e-3, 2e-2, 16).reshape(4, 4).half()
    dbg, out = run(fb_config(list=["aminmax"]), lambda: torch.aminmax(x, 1))
    assert isinstance(out, torch.return_types.max)
    assert {r.output_index for r in dbg.rows} == {0}


# --- step and rank filters ------------------------------------------------------------------------


def test_step_filter_and_finish(fb_config):
    cfg = fb_config(pert_mode="no_change", list=["matmul"])
    cfg["step"] = [1]
    dbg = PrecisionDebugger(config=cfg)
    x = torch.randn(3, 3)
    linear = F.linear
    checked = []
    for _ in range(3):
        dbg.start()
        torch.matmul(x, x)
        checked.append(dbg.summary()["apis"].get("Torch.matmul", {}).get("checked", 0))
        dbg.stop()
        dbg.step()
    assert checked == [0, 1, 1]
    assert F.linear is linear


@pytest.mark.parametrize("ranks, expected", [([0], 1), ([1], 0), (["0-3"], 1)])
def test_rank_filter_single_process_is_rank_0(fb_config, ranks, expected):
    cfg = fb_config(pert_mode="no_change", list=["matmul"])
    cfg["rank"] = ranks
    x = torch.randn(3, 3)
    dbg, _ = run(cfg, lambda: torch.matmul(x, x))
    assert dbg.summary()["apis"].get("Torch.matmul", {}).get("checked", 0) == expected


# --- fix, errors, strict ----------------------------------------------------------------------------


def test_fix_substitutes_upcast_result_and_keeps_autograd(fb_config, monkeypatch):
    monkeypatch.setattr(torch, "expm1", seeded.naive_expm1)
    x = torch.linspace(1e-3, 2e-2, 32).half().requires_grad_()
    plain = seeded.naive_expm1(x)
    dbg, out = run(fb_config(handler_type="fix", list=["expm1"]), lambda: torch.expm1(x))
    exact = torch.expm1(x.detach().double())
    assert (out.double() - exact).abs().max() < (plain.detach().double() - exact).abs().max() / 4
    assert out.dtype == torch.float16 and out.grad_fn is not None
    out.sum().backward()
    assert x.grad is not None
    assert dbg.rows == [] and dbg.summary()["apis"]["Torch.expm1"]["fixed"] == 1


def _picky(x):
    if x.dtype == torch.float32:
        raise RuntimeError("no float32 kernel")
    return x * 2


def test_probe_errors_are_recorded_not_raised(fb_config, monkeypatch):
    monkeypatch.setattr(torch, "square", _picky)
    x = torch.ones(4, dtype=torch.float16)
    dbg, out = run(fb_config(list=["square"]), lambda: torch.square(x))
    assert torch.equal(out, x * 2)
    errors = dbg.summary()["errors"]
    assert errors and "no float32 kernel" in errors[0]["error"]


def test_strict_mode_raises_probe_errors(fb_config, monkeypatch):
    monkeypatch.setattr(torch, "square", _picky)
    cfg = fb_config(list=["square"])
    cfg["strict"] = True
    with pytest.raises(ProbeError, match="Torch.square.0.forward"):
        run(cfg, lambda: torch.square(torch.ones(4, dtype=torch.float16)))



def test_rows_kept_in_memory_are_capped_but_the_csv_gets_all(fb_config, monkeypatch, tmp_path):
    from probes.free_benchmark import ledger

    monkeypatch.setattr(ledger, "ROWS_KEPT", 3)
    monkeypatch.setattr(torch, "expm1", seeded.naive_expm1)
    x = torch.linspace(1e-3, 2e-2, 8).half()

    def work():
        for _ in range(5):
            torch.expm1(x)

    dbg, _ = run(fb_config(list=["expm1"]), work)
    assert len(dbg.rows) == 3 and dbg.summary()["rows_total"] == 5
    with open(tmp_path / "dump" / "step0" / "rank0" / "free_benchmark.csv") as fh:
        assert len(fh.readlines()) == 1 + 5


# --- optimizer steps --------------------------------------------------------------------------


class _RaisingSGD(torch.optim.SGD):
    def step(self, closure=None):
        super().step(closure)
        raise RuntimeError("optimizer failed")


def test_calls_inside_optimizer_step_are_left_out_with_the_reason(fb_config):
    """The same APIs are checked whether the optimizer runs per tensor (CPU's default), foreach or
    fused (msprobe excludes fused optimizer kernels); a step that raised does not leave the probe
    off."""
    torch.manual_seed(0)
    lin = nn.Linear(8, 8)
    x = torch.randn(4, 8)
    dbg = PrecisionDebugger(config=fb_config(pert_mode="no_change"))
    for opt in (torch.optim.Adam(lin.parameters(), foreach=False), torch.optim.Adam(lin.parameters(), foreach=True)):
        with dbg:
            opt.zero_grad()
            lin(x).square().sum().backward()
            opt.step()
    summary = dbg.summary()
    left_out = summary["not_checked"].get(exclusions.IN_OPTIMIZER_STEP, {})
    assert left_out, summary["not_checked"]  # the per-tensor Adam's calls, with the reason
    assert summary["apis"]["Functional.linear"]["checked"] == 2
    assert not any(api.startswith("Tensor.add") or api == "Tensor.lerp_" for api, s in summary["apis"].items()
                   if s["checked"])
    bad = _RaisingSGD(lin.parameters(), lr=0.1)
    with pytest.raises(RuntimeError, match="optimizer failed"):
        with dbg:
            lin(x).sum().backward()
            bad.step()
    with dbg:
        F.linear(x, lin.weight)  # checked again: the failed step's window was closed at stop()
    assert dbg.summary()["apis"]["Functional.linear"]["checked"] == 4


def test_every_call_left_out_of_an_optimizer_step_is_counted(fb_config):
    """The calls of an optimizer step are counted per API and call (told to the ledger when the
    step ends, or when a step that raised is closed at stop()), as many each step."""
    torch.manual_seed(0)
    lin = nn.Linear(8, 8)
    x = torch.randn(4, 8)
    opt = torch.optim.Adam(lin.parameters(), foreach=False)
    dbg = PrecisionDebugger(config=fb_config(pert_mode="no_change"))
    counts = []
    for _ in range(3):  # (the first step also makes the optimizer's state)
        with dbg:
            opt.zero_grad()
            lin(x).square().sum().backward()
            opt.step()
        counts.append(dict(dbg.summary()["not_checked"][exclusions.IN_OPTIMIZER_STEP]))
    assert counts[0]["Tensor.lerp_"] == 2  # one per parameter (weight, bias)
    second = {api: n - counts[0].get(api, 0) for api, n in counts[1].items()}
    assert {api: counts[1].get(api, 0) + n for api, n in second.items()} == counts[2]
    with pytest.raises(RuntimeError, match="optimizer failed"):
        with dbg:
            _RaisingSGD(lin.parameters(), lr=0.1).step()
    after = dbg.summary()["not_checked"][exclusions.IN_OPTIMIZER_STEP]
    assert any(after[api] > counts[1].get(api, 0) for api in after), "the raising step's calls were dropped"


@pytest.mark.parametrize("fix", [False, True])
def test_vector_norm_with_a_dtype_argument_under_improve_precision(fb_config, fix):
    """vector_norm(bf16 x, dtype=float32): the upcast re-run keeps the dtype argument, the call is
    checked (not an error), nothing is flagged on a clean kernel, and the output keeps its dtype
    and value."""
    x = torch.randn(64, dtype=torch.bfloat16, generator=torch.Generator().manual_seed(0))
    plain = torch.linalg.vector_norm(x, dtype=torch.float32)
    dbg = PrecisionDebugger(config=fb_config(pert_mode="improve_precision", handler_type="fix" if fix else "check"))
    with dbg:
        y = torch.linalg.vector_norm(x, dtype=torch.float32)
        z = torch.linalg.vector_norm(x, 2.0, -1, False, dtype=torch.float64)
    s = dbg.summary()
    assert s["errors"] == []
    stats = s["apis"]["Torch.linalg.vector_norm"]
    assert stats["checked"] == 2 and stats["flagged"] == 0
    assert y.dtype == torch.float32 and z.dtype == torch.float64
    assert torch.equal(y, plain)


def test_a_clean_api_records_how_close_it_came(tmp_path):
    dbg = PrecisionDebugger(config={"task": "free_benchmark", "dump_path": str(tmp_path),
                                    "free_benchmark": {"pert_mode": "add_noise", "list": ["tanh"]}})
    with dbg:
        torch.tanh(torch.randn(64, 64))
        torch.tanh(torch.randn(64, 64))
    stats = dbg.summary()["apis"]["Torch.tanh"]
    assert stats["checked"] == 2 and stats["flagged"] == 0
    assert isinstance(stats["worst_score"], float) and 0.0 <= stats["worst_score"] < 1.0
