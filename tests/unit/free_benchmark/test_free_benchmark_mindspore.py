"""free_benchmark on MindSpore (PyNative, CPU), end to end: the PyTorch tests' counterparts.

Hooking and restoring, naming, `list` validation, exclusions, every mode on a seeded defect and
on a clean API, bit-identical training, files, unsupported kernels, and one model run in both
frameworks with the same API flagged for the same seeded defect.
"""

from __future__ import annotations

import csv
import json

import numpy as np
import pytest

ms = pytest.importorskip("mindspore")

import mindspore.common.dtype as mstype  # noqa: E402
import mindspore.mint.nn.functional as MF  # noqa: E402
import seeded_ms  # noqa: E402
from mindspore import Tensor, mint, nn, ops  # noqa: E402
from ms_training import run_steps  # noqa: E402

from probes.backends import mindspore_xp  # noqa: E402
from probes.core.errors import ConfigError, ProbeError  # noqa: E402
from probes.core.records import FREE_BENCHMARK_COLUMNS  # noqa: E402
from probes.mindspore import PrecisionDebugger  # noqa: E402

mindspore_xp.warm_up()
ms.set_context(mode=ms.PYNATIVE_MODE, device_target="CPU")


def _t(values, dtype=mstype.float32):
    return Tensor(np.asarray(values, dtype=np.float32)).astype(dtype)


def _namespaces():
    return {"ops": dict(vars(ops)), "mint": dict(vars(mint)), "MF": dict(vars(MF)), "Tensor": dict(vars(Tensor))}


def run(config: dict, fn):
    dbg = PrecisionDebugger(config=config)
    with dbg:
        out = fn()
    return dbg, out


# --- hooking and restoring -------------------------------------------------------------------


def test_hooks_restored_after_stop_and_after_exceptions(fb_config):
    before = _namespaces()
    add, relu = ops.add, MF.relu
    dbg = PrecisionDebugger(config=fb_config())
    dbg.start()
    assert ops.add is not add and "__add__" in vars(Tensor)
    dbg.stop()
    assert ops.add is add and MF.relu is relu
    assert _namespaces() == before
    with pytest.raises(ZeroDivisionError):
        with PrecisionDebugger(config=fb_config()):
            ops.add(_t([1.0]), _t([2.0]))
            raise ZeroDivisionError
    assert _namespaces() == before
    with pytest.raises((ValueError, RuntimeError, TypeError)):  # the user's own error propagates
        with PrecisionDebugger(config=fb_config()):
            mint.matmul(_t(np.ones((2, 3))), _t(np.ones((4, 5)))).asnumpy()
    assert _namespaces() == before


def test_second_probe_while_one_runs_is_a_clear_error(fb_config):
    with PrecisionDebugger(config=fb_config()):
        with pytest.raises(ProbeError, match="already running"):
            PrecisionDebugger(config=fb_config()).start()


# --- naming, selection ----------------------------------------------------------------------------


def test_names_follow_the_pytorch_scheme_per_call_and_step(fb_config):
    dbg = PrecisionDebugger(config=fb_config(pert_mode="no_change"))
    seen = []
    probe = dbg.probe
    original_check = probe._check

    def spy(call):
        seen.append(call.name)
        return original_check(call)

    probe._check = spy
    x = _t(np.random.RandomState(0).randn(4, 4))
    dbg.start()
    ops.add(x, x)
    ops.add(x, x)
    _ = x + x
    mint.matmul(x, x)
    MF.relu(x)
    dbg.stop()
    dbg.step()
    dbg.start()
    ops.add(x, x)
    dbg.stop()
    assert seen == ["Functional.add.0.forward", "Functional.add.1.forward", "Tensor.__add__.0.forward",
                    "Mint.matmul.0.forward", "MintFunctional.relu.0.forward", "Functional.add.0.forward"]


def test_list_takes_exact_dotted_names(fb_config):
    x = _t(np.random.RandomState(0).randn(4, 4))

    def work():
        ops.add(x, x)
        ops.addcmul(x, x, x, value=_t(0.5))
        _ = x + x
        MF.relu(x)
        ops.relu(x)

    cfg = fb_config(pert_mode="no_change", list=["mindspore.ops.add", "mindspore.mint.nn.functional.relu"])
    dbg, _ = run(cfg, work)
    assert set(dbg.summary()["apis"]) == {"Functional.add", "MintFunctional.relu"}


@pytest.mark.parametrize("entry, hint", [("mindspore.ops.addd", 'did you mean "mindspore.ops.add"'),
                                         ("relu", "full names such as")])
def test_unknown_list_name_is_an_error_naming_it(fb_config, entry, hint):
    with pytest.raises(ConfigError, match=rf"free_benchmark.list.*{entry}.*{hint}"):
        PrecisionDebugger(config=fb_config(list=[entry]))


@pytest.mark.parametrize("section, key", [
    ({"pert_mode": "to_cpu", "fuzz_device": "cpu"}, "free_benchmark.pert_mode"),
])
def test_features_not_available_on_mindspore_are_refused_clearly(fb_config, section, key):
    with pytest.raises(ConfigError, match=key):
        PrecisionDebugger(config=fb_config(**section))


def test_random_and_inplace_apis_are_not_rerun(fb_config):
    x = _t(np.linspace(0.1, 0.9, 8))

    def work():
        y = x.copy()
        y += x  # Tensor.__iadd__
        ops.bernoulli(x, p=0.5)
        ops.relu(x)

    dbg, _ = run(fb_config(pert_mode="no_change"), work)
    reasons = {api: reason for reason, apis in dbg.summary()["not_checked"].items() for api in apis}
    assert reasons["Tensor.__iadd__"].startswith("in-place")
    assert reasons["Functional.bernoulli"].startswith("random")
    assert dbg.summary()["apis"]["Functional.relu"]["checked"] == 1


# --- every mode: a seeded defect it catches, a clean case it passes ------------------------------

MODE_CASES = {
    # mode: (owner, attribute to seed, defect, clean stand-in, input dtype, input)
    "improve_precision": (ops, "expm1", seeded_ms.naive_expm1, seeded_ms.accurate_expm1, mstype.float16,
                          lambda: np.linspace(1e-3, 2e-2, 64)),
    "add_noise": (ops, "softsign", seeded_ms.ill_conditioned, ops.softsign, mstype.float32,
                  lambda: np.linspace(0.5, 1.0, 64)),
    "bit_noise": (ops, "softsign", seeded_ms.ill_conditioned, ops.softsign, mstype.float32,
                  lambda: np.linspace(0.5, 1.0, 64)),
    "change_value": (ops, "sum", seeded_ms.off_by_one_sum, ops.sum, mstype.float32,
                     lambda: np.linspace(-1.0, 3.0, 64)),
    "no_change": (ops, "softsign", None, ops.softsign, mstype.float32, lambda: np.linspace(-2.0, 2.0, 64)),
}


def _mode_run(fb_config, mode, owner, attr, impl, dtype, make_x, monkeypatch, rule="reference"):
    monkeypatch.setattr(owner, attr, impl)
    x = _t(make_x(), dtype)
    return run(fb_config(pert_mode=mode, list=[f"mindspore.ops.{attr}"], rule=rule), lambda: getattr(owner, attr)(x))


@pytest.mark.parametrize("rule", ["reference", "scaled"])
@pytest.mark.parametrize("mode", list(MODE_CASES))
def test_mode_catches_seeded_defect(fb_config, mode, rule, monkeypatch):
    owner, attr, defect, _clean, dtype, make_x = MODE_CASES[mode]
    if defect is None:
        defect = seeded_ms.nondeterministic()
    dbg, _ = _mode_run(fb_config, mode, owner, attr, defect, dtype, make_x, monkeypatch, rule)
    rows = dbg.rows
    assert rows, f"{mode} missed the seeded defect in {attr}"
    assert all(r.api_name == f"Functional.{attr}.0.forward" for r in rows)
    assert all(r.pert_mode == mode and r.stage == "forward" for r in rows)


@pytest.mark.parametrize("rule", ["reference", "scaled"])
@pytest.mark.parametrize("mode", list(MODE_CASES))
def test_mode_passes_clean_api(fb_config, mode, rule, monkeypatch):
    owner, attr, _defect, clean, dtype, make_x = MODE_CASES[mode]
    dbg, _ = _mode_run(fb_config, mode, owner, attr, clean, dtype, make_x, monkeypatch, rule)
    stats = dbg.summary()["apis"]
    assert stats[f"Functional.{attr}"]["checked"] == 1, "the clean API was not actually checked"
    assert dbg.rows == []


@pytest.mark.parametrize("mode", ["add_noise", "bit_noise"])
def test_bf16_perturbations_run_on_the_cpu_target(fb_config, mode, monkeypatch):
    """No bf16 Abs kernel on MindSpore's CPU target: the gates are computed in float32."""
    monkeypatch.setattr(ops, "softsign", lambda x: seeded_ms.ill_conditioned(x.astype(mstype.float32)).astype(x.dtype))
    x = _t(np.linspace(0.5, 1.0, 64), mstype.bfloat16)
    dbg, _ = run(fb_config(pert_mode=mode, list=["mindspore.ops.softsign"]), lambda: ops.softsign(x))
    assert dbg.summary()["apis"]["Functional.softsign"]["checked"] == 1
    assert dbg.rows and dbg.rows[0].dtype == "BFloat16"


def test_missing_kernel_cancels_the_check_with_a_summary_entry(fb_config, caplog):
    """bf16 MatMul has no CPU kernel: the check is cancelled, logged, and counted; no crash."""
    x = _t(np.ones((4, 4)), mstype.bfloat16)
    dbg, out = run(fb_config(list=["mindspore.mint.matmul"]), lambda: mint.matmul(x, x))
    reasons = dbg.summary()["not_checked"]
    assert any("no MatMul kernel" in r and "Mint.matmul" in apis for r, apis in reasons.items())
    assert any("no MatMul kernel" in rec.getMessage() for rec in caplog.records)
    assert json.loads((dbg.probe.summary_path).read_text())["not_checked"] == reasons
    # the user's own bf16 MatMul fails where it would without the probe (MindSpore runs operators
    # asynchronously: the error surfaces when the result is read)
    with pytest.raises((TypeError, RuntimeError), match="MatMul"):
        out.asnumpy()
    for _ in range(3):  # and later work is unaffected
        assert (_t([1.0]) + 1).asnumpy().tolist() == [2.0]


# --- the user's training is untouched -----------------------------------------------------------


def _reduced_matmul(a, b):
    """The seeded defect: a float32 matmul whose inputs keep 10 mantissa bits (TF32/HF32-like);
    other dtypes (improve_precision's float64 re-run) multiply exactly."""
    if a.dtype == mstype.float32 and b.dtype == mstype.float32:
        mask = Tensor(np.array(~((1 << 13) - 1), np.int32))
        a = ops.bitwise_and(a.view(mstype.int32), mask).view(mstype.float32)
        b = ops.bitwise_and(b.view(mstype.int32), mask).view(mstype.float32)
    return _MATMUL(a, b)


_MATMUL = ops.matmul


@pytest.mark.parametrize("defective", [False, True], ids=["clean", "reduced"])
def test_scaled_improve_precision_judges_float32_against_float64(fb_config, defective, monkeypatch):
    if defective:
        monkeypatch.setattr(ops, "matmul", _reduced_matmul)
    rs = np.random.RandomState(0)
    x, w = _t(rs.randn(32, 128)), _t(rs.randn(128, 64) / 11.0)
    dbg, _ = run(fb_config(pert_mode="improve_precision", rule="scaled", list=["mindspore.ops.matmul"]),
                 lambda: ops.matmul(x, w))
    assert dbg.summary()["apis"]["Functional.matmul"]["checked"] == 1
    if defective:
        assert [r.api_name for r in dbg.rows] == ["Functional.matmul.0.forward"]
        assert dbg.rows[0].detail["ulps"] > 1000
    else:
        assert dbg.rows == []
    ref, _ = run(fb_config(pert_mode="improve_precision", list=["mindspore.ops.matmul"]), lambda: ops.matmul(x, w))
    assert "inputs are already float32/float64" in ref.summary()["not_checked"]  # msprobe's skip


class _Net(nn.Cell):
    def __init__(self, dtype):
        super().__init__()
        rs = np.random.RandomState(7)
        self.dtype = dtype
        self.w1 = ms.Parameter(Tensor(rs.randn(12, 24).astype(np.float32) * 0.3), name="w1")
        self.b1 = ms.Parameter(Tensor(np.zeros(24, np.float32)), name="b1")
        self.w2 = ms.Parameter(Tensor(rs.randn(24, 3).astype(np.float32) * 0.3), name="w2")

    def construct(self, x):
        h = ops.matmul(x.astype(self.dtype), self.w1.astype(self.dtype)) + self.b1.astype(self.dtype)
        h = ops.gelu(h)
        return mint.matmul(h, self.w2.astype(self.dtype)).astype(mstype.float32)


def _train(probe_config: dict | None, dtype, steps: int = 3):
    ms.set_seed(7)
    net = _Net(dtype)
    opt = nn.Adam(net.trainable_params(), learning_rate=1e-2)
    rs = np.random.RandomState(3)
    x = Tensor(rs.randn(16, 12).astype(np.float32))
    y = Tensor(rs.randint(0, 3, 16).astype(np.int32))

    def forward(x, y):
        return ops.cross_entropy(ops.softmax(net(x), -1).log(), y)

    grad_fn = ms.value_and_grad(forward, None, opt.parameters)
    dbg = PrecisionDebugger(config=probe_config) if probe_config else None
    losses = run_steps(grad_fn, opt, x, y, dbg, steps)
    params = [p.asnumpy().copy() for p in net.trainable_params()]
    return losses, params, dbg


_PLAIN: dict = {}


@pytest.mark.parametrize("mode", ["improve_precision", "add_noise", "bit_noise", "change_value", "no_change"])
@pytest.mark.parametrize("dtype", [mstype.float32, mstype.float16], ids=["fp32", "fp16"])
def test_check_mode_leaves_training_bit_identical(fb_config, dtype, mode):
    """Losses and parameters over 3 value_and_grad + Adam steps, with and without the probe."""
    if dtype not in _PLAIN:
        _PLAIN[dtype] = _train(None, dtype)[:2]
    plain_losses, plain_params = _PLAIN[dtype]
    losses, params, dbg = _train(fb_config(pert_mode=mode), dtype)
    for a, b in zip(plain_losses, losses):
        assert np.array_equal(a, b), f"loss changed under {mode}: {a} vs {b}"
    for a, b in zip(plain_params, params):
        assert np.array_equal(a, b), f"parameters changed under {mode}"
    checked = sum(s["checked"] for s in dbg.summary()["apis"].values())
    assert checked > 0 or (mode == "improve_precision" and dtype == mstype.float32)
    assert plain_losses[-1] < plain_losses[0]


def test_clean_fp32_model_gives_zero_rows_under_no_change(fb_config):
    _losses, _params, dbg = _train(fb_config(pert_mode="no_change"), mstype.float32, steps=1)
    assert dbg.rows == []
    assert {"Functional.matmul", "Functional.gelu", "Mint.matmul"} <= set(dbg.summary()["apis"])


@pytest.mark.parametrize("rule", ["reference", "scaled"])
@pytest.mark.parametrize("dtype", [mstype.float16, mstype.float32, mstype.int32, mstype.bool_])
def test_equal_outputs_are_judged_at_the_call_as_the_comparison_judges_them(dtype, rule):
    """no_change's shortcut on MindSpore: the host finds equal outputs at once, with the verdict
    the comparison gives; an output that differs, or holds NaN, is left to the comparison."""
    from probes.backends.mindspore_backend import MindSporeBackend
    from probes.free_benchmark.compare import compare_outputs, equal_at_once

    b = MindSporeBackend()
    a = _t([[0.5, -2.0, 0.0], [3.0, 1.0, -0.0]], dtype)
    fast = equal_at_once(b, a, a.copy(), pert_mode="no_change", rule=rule)
    slow = compare_outputs(b, a, a.copy(), pert_mode="no_change", rule=rule)
    assert fast is not None and len(fast) == len(slow) == 1
    keep = ("path", "consistent", "max_rel", "threshold", "figure", "dtype_repr", "shape_repr", "detail")
    assert [getattr(fast[0], k) for k in keep] == [getattr(slow[0], k) for k in keep]
    changed = _t([[0.5, -2.0, 0.0], [3.0, 1.0, 7.0]], dtype)
    assert equal_at_once(b, a, changed, pert_mode="no_change", rule=rule) is None
    with_nan = _t([[float("nan"), 1.0]], mstype.float32)
    assert b.host_equal(with_nan, with_nan.copy()) is False


@pytest.mark.parametrize("rule", ["reference", "scaled"])
@pytest.mark.parametrize("dtype", [mstype.float16, mstype.bfloat16, mstype.float32])
@pytest.mark.parametrize("mode", ["add_noise", "improve_precision"])
def test_small_outputs_are_judged_at_the_call_as_the_comparison_judges_them(dtype, rule, mode):
    """The ratio rule's and the scaled rule's at-call verdicts on MindSpore, from the host figures
    the comparison reads too: the same verdict for a clean and a slightly moved output; a far-off
    output under the scaled rule is left to the comparison (which flags it)."""
    from probes.backends.mindspore_backend import MindSporeBackend
    from probes.free_benchmark.compare import at_once, compare_outputs

    b = MindSporeBackend()
    rng = np.random.default_rng(2)
    values = rng.standard_normal((6, 8)).astype(np.float32)
    a = Tensor(values).astype(dtype)
    wide = mstype.float32 if mode == "improve_precision" else dtype
    keep = ("path", "consistent", "max_rel", "threshold", "figure", "dtype_repr", "shape_repr", "detail")
    for perturbed in (a.astype(wide), (a.astype(mstype.float32) * 1.0001).astype(wide)):
        fast = at_once(b, a, perturbed, pert_mode=mode, rule=rule, tolerance=None, stage="forward")
        slow = compare_outputs(b, a, perturbed, pert_mode=mode, rule=rule)
        assert fast is not None and len(fast) == len(slow) == 1
        assert [getattr(fast[0], k) for k in keep] == [getattr(slow[0], k) for k in keep]
    far = (a.astype(mstype.float32) * 3.0 + 1.0).astype(wide)
    if rule == "scaled":
        assert at_once(b, a, far, pert_mode=mode, rule=rule, tolerance=None, stage="forward") is None
    assert not compare_outputs(b, a, far, pert_mode=mode, rule=rule)[0].consistent


# --- files ---------------------------------------------------------------------------------------


def test_csv_layout_header_and_per_step_files(fb_config, tmp_path, monkeypatch):
    monkeypatch.setattr(ops, "expm1", seeded_ms.naive_expm1)
    dbg = PrecisionDebugger(config=fb_config(list=["mindspore.ops.expm1"]))
    x = _t(np.linspace(1e-3, 2e-2, 8), mstype.float16)
    dbg.start()
    ops.expm1(x)
    dbg.stop()
    dbg.step()
    with open(tmp_path / "dump" / "step0" / "rank0" / "free_benchmark.csv", newline="") as fh:
        rows = list(csv.reader(fh))
    assert tuple(rows[0]) == FREE_BENCHMARK_COLUMNS and rows[0][1] == "pert_mode"
    r = dict(zip(rows[0], rows[1]))
    assert r["rank"] == "0" and r["step"] == "0" and r["stage"] == "forward"
    assert r["api_name"] == "Functional.expm1.0.forward"
    assert r["dtype"] == "Float16" and r["shape"] == "(8,)" and r["output_index"] == ""
    assert float(r["max_rel"]) > 0.002
    dbg.start()
    ops.expm1(x)
    dbg.stop()
    assert (tmp_path / "dump" / "step1" / "rank0" / "free_benchmark.csv").exists()
    summary = json.loads((tmp_path / "dump" / "summary.json").read_text())
    assert summary["framework"] == "mindspore"
    assert summary["apis"]["Functional.expm1"]["flagged"] == 2


def test_tuple_outputs_report_output_index(fb_config, monkeypatch):
    def bad_aminmax(x, axis=0, keepdims=False):
        return ops.exp(ops.amin(x, axis)) - 1, ops.amax(x, axis)

    monkeypatch.setattr(ops, "aminmax", bad_aminmax)
    x = _t(np.linspace(1e-3, 2e-2, 16).reshape(4, 4), mstype.float16)
    dbg, out = run(fb_config(list=["mindspore.ops.aminmax"]), lambda: ops.aminmax(x, axis=1))
    assert isinstance(out, tuple)
    assert {r.output_index for r in dbg.rows} == {0}


def test_step_filter(fb_config):
    cfg = fb_config(pert_mode="no_change", list=["mindspore.ops.matmul"])
    cfg["step"] = [1]
    dbg = PrecisionDebugger(config=cfg)
    x = _t(np.ones((3, 3)))
    checked = []
    for _ in range(3):
        dbg.start()
        ops.matmul(x, x)
        checked.append(dbg.summary()["apis"].get("Functional.matmul", {}).get("checked", 0))
        dbg.stop()
        dbg.step()
    assert checked == [0, 1, 1]


def test_fix_substitutes_upcast_result(fb_config, monkeypatch):
    monkeypatch.setattr(ops, "expm1", seeded_ms.naive_expm1)
    x = _t(np.linspace(1e-3, 2e-2, 32), mstype.float16)
    plain = seeded_ms.naive_expm1(x).asnumpy().astype(np.float64)
    dbg, out = run(fb_config(handler_type="fix", list=["mindspore.ops.expm1"]), lambda: ops.expm1(x))
    exact = np.expm1(x.asnumpy().astype(np.float64))
    assert np.abs(out.asnumpy().astype(np.float64) - exact).max() < np.abs(plain - exact).max() / 4
    assert out.dtype == mstype.float16
    assert dbg.rows == [] and dbg.summary()["apis"]["Functional.expm1"]["fixed"] == 1


def test_fix_keeps_training_learning(fb_config):
    """fix writes into the user's outputs without cutting their gradient."""
    plain_losses, _plain_params = _PLAIN.get(mstype.float16) or _train(None, mstype.float16)[:2]
    losses, _params, dbg = _train(fb_config(handler_type="fix"), mstype.float16)
    assert sum(s["fixed"] for s in dbg.summary()["apis"].values()) >= 3 and not dbg.summary()["errors"]
    assert losses[-1] < losses[0] - 0.1
    assert np.allclose(losses, plain_losses, rtol=1e-2)


def _picky(x):
    if x.dtype == mstype.float32:
        raise RuntimeError("no float32 kernel")
    return x * 2


def test_probe_errors_are_recorded_not_raised_unless_strict(fb_config, monkeypatch):
    monkeypatch.setattr(ops, "square", _picky)
    x = _t(np.ones(4), mstype.float16)
    dbg, out = run(fb_config(list=["mindspore.ops.square"]), lambda: ops.square(x))
    assert out.asnumpy().tolist() == [2.0] * 4
    errors = dbg.summary()["errors"]
    assert errors and "no float32 kernel" in errors[0]["error"]
    cfg = fb_config(list=["mindspore.ops.square"])
    cfg["strict"] = True
    with pytest.raises(ProbeError, match="Functional.square.0.forward"):
        run(cfg, lambda: ops.square(x))


# --- the same model in both frameworks ------------------------------------------------------------


@pytest.mark.parametrize("mode", ["add_noise", "bit_noise", "no_change"])
def test_same_api_flagged_in_both_frameworks(fb_config, mode, monkeypatch, tmp_path):
    torch = pytest.importorskip("torch")
    import seeded
    import torch.nn.functional as F

    from probes.pytorch import PrecisionDebugger as TorchDebugger

    rs = np.random.RandomState(0)
    x_np = rs.uniform(0.5, 1.0, (8, 16)).astype(np.float32)
    w1_np = rs.uniform(0.0, 0.2, (16, 32)).astype(np.float32)
    w2_np = rs.randn(32, 4).astype(np.float32)
    torch_defect = seeded.nondeterministic() if mode == "no_change" else seeded.ill_conditioned
    ms_defect = seeded_ms.nondeterministic() if mode == "no_change" else seeded_ms.ill_conditioned
    monkeypatch.setattr(F, "softsign", torch_defect)
    monkeypatch.setattr(ops, "softsign", ms_defect)

    def torch_model():
        h = F.softsign(torch.matmul(torch.from_numpy(x_np), torch.from_numpy(w1_np)))
        return torch.matmul(h, torch.from_numpy(w2_np))

    def ms_model():
        h = ops.softsign(ops.matmul(Tensor(x_np), Tensor(w1_np)))
        return ops.matmul(h, Tensor(w2_np))

    flagged = {}
    for name, debugger, model in (("torch", TorchDebugger, torch_model), ("mindspore", PrecisionDebugger, ms_model)):
        cfg = fb_config(pert_mode=mode)
        cfg["dump_path"] = str(tmp_path / name)
        dbg = debugger(config=cfg)
        with dbg:
            model()
        apis = dbg.summary()["apis"]
        assert apis["Functional.softsign"]["checked"] == 1
        flagged[name] = sorted(k for k, s in apis.items() if s["flagged"])
    assert flagged["torch"] == flagged["mindspore"] == ["Functional.softsign"]


# --- the pytest plugin on a MindSpore suite ------------------------------------------------------

MS_SUITE = """
import numpy as np
import mindspore as ms
from mindspore import Tensor, ops
from probes.backends.mindspore_xp import warm_up

warm_up()
ms.set_context(mode=ms.PYNATIVE_MODE, device_target="CPU")


def test_clean():
    x = Tensor(np.linspace(-1, 1, 32).astype(np.float32))
    assert ops.softsign(x).shape == x.shape


def test_risky():
    ops.expm1(Tensor(np.linspace(1e-3, 2e-2, 32).astype(np.float16)))
"""


MS_CONFTEST = """
from mindspore import ops

_exp, _expm1 = ops.exp, ops.expm1


def naive_expm1(x):
    return _exp(x) - 1


def pytest_configure(config):  # seeded before the probe wraps ops.expm1
    ops.expm1 = naive_expm1


def pytest_unconfigure(config):
    ops.expm1 = _expm1
"""


def test_plugin_probes_a_mindspore_suite(pytester):
    pytester.makepyfile(test_ms_suite=MS_SUITE)
    pytester.makeconftest(MS_CONFTEST)
    dump = pytester.path / "out"
    result = pytester.runpytest("--msprobe-task=free_benchmark", f"--msprobe-dump-path={dump}", "-p", "no:cacheprovider")
    result.assert_outcomes(passed=1, failed=1)
    result.stdout.fnmatch_lines(["*Functional.expm1.0.forward: max_rel * > threshold * (Float16*"])
    summary = json.loads((dump / "summary.json").read_text())
    assert summary["tests"]["test_ms_suite.py::test_risky"]["flagged_apis"] == ["Functional.expm1"]
    assert summary["tests"]["test_ms_suite.py::test_clean"]["flagged_apis"] == []


# --- the debugger's grad_probe task (the monitor itself is tested in test_grad_probe_mindspore.py) ----


def test_debugger_runs_grad_probe_on_an_optimizer(tmp_path):
    pytest.importorskip("probes.grad_probe.mindspore_monitor")
    dbg = PrecisionDebugger(config={"task": "grad_probe", "dump_path": str(tmp_path / "gp"),
                                    "grad_probe": {"grad_level": "L1"}})
    net = _Net(mstype.float32)
    opt = nn.SGD(net.trainable_params(), learning_rate=0.1)
    monitor = dbg.monitor(opt)
    assert type(monitor).__name__ == "MindSporeGradMonitor" and dbg.probe is monitor
    x = Tensor(np.random.RandomState(0).randn(4, 12).astype(np.float32))
    y = Tensor(np.array([0, 1, 2, 0], np.int32))
    grad_fn = ms.value_and_grad(lambda x, y: ops.cross_entropy(net(x), y), None, opt.parameters)
    for _ in range(2):
        dbg.start()
        _loss, grads = grad_fn(x, y)
        opt(grads)
        dbg.step()
    dbg.stop()
    assert sorted(p.name for p in (tmp_path / "gp").rglob("grad_summary_*.csv")) == ["grad_summary_0.csv",
                                                                                       "grad_summary_1.csv"]
    assert dbg.summary()
    assert PrecisionDebugger(config={"task": "free_benchmark", "dump_path": str(tmp_path / "fb")}).monitor(opt) is None


TORCH_SUITE = """
import torch


def test_torch_risky():
    torch.expm1(torch.linspace(1e-3, 2e-2, 32).half())
"""

MIXED_CONFTEST = MS_CONFTEST + """
import torch
_torch_exp = torch.exp


def _naive_torch_expm1(x):
    return _torch_exp(x) - 1


torch.expm1 = _naive_torch_expm1
"""


def test_plugin_keeps_frameworks_apart_in_a_mixed_suite(pytester):
    """A suite with PyTorch and MindSpore test modules: each module is probed with its own
    framework and the session table tells the two Functional/Torch families apart."""
    pytester.makepyfile(test_ms_suite=MS_SUITE, test_torch_suite=TORCH_SUITE)
    pytester.makeconftest(MIXED_CONFTEST)
    result = pytester.runpytest_subprocess("--msprobe-task=free_benchmark", "--msprobe-fail-on=never",
                                           "-p", "no:cacheprovider")
    result.assert_outcomes(passed=3)
    result.stdout.fnmatch_lines_random(["Functional.expm1 [[]mindspore[]] *", "Torch.expm1 [[]pytorch[]] *"])


def test_scaled_improve_precision_on_a_device_without_float64_says_why(fb_config, monkeypatch):
    """On Ascend float64 is missing and a PyNative call cannot be moved to the CPU: float32 calls
    are not re-run, with the reason in summary.json (the target is simulated: no NPU here)."""
    from probes.backends.mindspore_backend import MindSporeBackend

    monkeypatch.setattr(MindSporeBackend, "_ascend", True)
    x, w = _t(np.ones((4, 8))), _t(np.ones((8, 2)))
    dbg, _ = run(fb_config(pert_mode="improve_precision", rule="scaled", list=["mindspore.ops.matmul"]),
                 lambda: ops.matmul(x, w))
    reasons = dbg.summary()["not_checked"]
    assert any("no float64" in r for r in reasons), reasons
    assert dbg.rows == []


@pytest.mark.parametrize("mode", ["add_noise", "bit_noise", "change_value"])
def test_bf16_perturbations_on_host_bits_give_torchs_bits(mode):
    """bfloat16 reaches NumPy as its int16 bit patterns (host_workspace): on the CPU target the
    perturbations of every bfloat16 pattern (in halves the host takes) are torch's, bit for bit."""
    torch = pytest.importorskip("torch")
    from probes.backends.host_arrays import HOST_ARRAYS
    from probes.backends.mindspore_backend import MindSporeBackend
    from probes.backends.torch_backend import BACKEND as TORCH
    from probes.free_benchmark.perturbations import PerturbedCall, make_perturbation

    backend = MindSporeBackend()
    for half in np.split(np.arange(-(2**15), 2**15, dtype=np.int32).astype(np.int16), 2):
        x = Tensor(half).view(mstype.bfloat16)
        assert backend.host_workspace(x, moves_only=True)[0] is HOST_ARRAYS  # the host path is the one tested
        ours = make_perturbation(mode, backend).build((x,), {})
        theirs = make_perturbation(mode, TORCH).build((torch.from_numpy(half.copy()).view(torch.bfloat16),), {})
        assert isinstance(ours, PerturbedCall) and isinstance(theirs, PerturbedCall)
        got = ours.args[0].view(mstype.int16).asnumpy()
        assert np.array_equal(got, theirs.args[0].view(torch.int16).numpy())
        assert not np.array_equal(got, half)  # something moved
