"""free_benchmark's backward stage, PyTorch and MindSpore.

A backward-only seeded defect is caught in the backward stage and not in the forward stage; the
compared gradients are recomputed against the real cotangent; clean models give no rows under
no_change; scope and list select backward names; a call whose backward never runs leaves nothing
behind; memory is flat over 200 steps; training is bit-identical.
"""

from __future__ import annotations

import dataclasses
import gc

import numpy as np
import pytest
import seeded_backward
import torch
import torch.nn as nn
import torch.nn.functional as F
from ms_training import run_steps
from training_loops import train

from probes.core.config import load_config
from probes.core.errors import ProbeError
from probes.free_benchmark import backward as bw
from probes.pytorch import PrecisionDebugger


def bw_config(fb_config, **section):
    section.setdefault("fuzz_stage", "backward")
    return fb_config(**section)


def scoped_config(fb_config, scope: list[str]):
    """A backward-stage config selected by `scope` (exact backward names). The config loader still asks for `list`
    with the backward stage, so the scope is put on a validated forward config."""
    cfg = load_config(fb_config(pert_mode="no_change", scope=scope))
    return dataclasses.replace(cfg, free_benchmark=dataclasses.replace(cfg.free_benchmark, fuzz_stage="backward"))


def spy_vjps(monkeypatch):
    """Record (call name, g_orig, g_pert) of every backward check."""
    seen = []
    real = bw.BackwardCheck._vjp

    def vjp(self, call, args, kwargs, cotangents, original=None):
        grads = real(self, call, args, kwargs, cotangents, original)
        if original is None:  # the original VJP (the perturbed one is given the re-run's callable)
            seen.append([call.name, grads, None])
        else:
            seen[-1][2] = grads
        return grads

    monkeypatch.setattr(bw.BackwardCheck, "_vjp", vjp)
    return seen


# --- PyTorch: the seeded backward-only defect -----------------------------------------------------


def _softsign_model(x, w):
    return F.softsign(F.linear(x, w) + 0.7).sum()


@pytest.mark.parametrize("rule", ["reference", "scaled"])
@pytest.mark.parametrize("mode", ["add_noise", "bit_noise"])
def test_backward_only_defect_is_caught_in_backward_and_not_in_forward(fb_config, mode, rule, monkeypatch):
    monkeypatch.setattr(F, "softsign", seeded_backward.ill_conditioned_backward_softsign)
    torch.manual_seed(0)
    w = (torch.randn(8, 8) * 0.1).requires_grad_()
    x = torch.linspace(0.5, 1.0, 64).reshape(8, 8)
    found = {}
    for stage in ("forward", "backward"):
        dbg = PrecisionDebugger(config=fb_config(pert_mode=mode, fuzz_stage=stage, list=["softsign", "linear"],
                                                 rule=rule))
        with dbg:
            _softsign_model(x, w).backward()
        apis = dbg.summary()["apis"]
        assert apis["Functional.softsign"]["checked"] == 1 and apis["Functional.linear"]["checked"] == 1
        found[stage] = dbg.rows
    assert found["forward"] == []
    rows = found["backward"]
    assert rows and {r.api_name for r in rows} == {"Functional.softsign.0.backward"}
    assert all(r.stage == "backward" and r.step == 0 and r.output_index == 0 and r.pert_mode == mode for r in rows)
    assert all(isinstance(r.max_rel, float) and r.max_rel > 2e-4 for r in rows)


def test_output_index_is_the_position_among_differentiable_inputs(fb_config, monkeypatch):
    monkeypatch.setattr(torch, "mul", seeded_backward.ill_conditioned_backward_mul)
    a = torch.linspace(0.5, 1.0, 32).requires_grad_()
    b = torch.linspace(0.6, 1.2, 32).requires_grad_()
    dbg = PrecisionDebugger(config=bw_config(fb_config, pert_mode="bit_noise", list=["Torch.mul"]))
    with dbg:
        torch.mul(a, b).sum().backward()
    assert dbg.rows and {r.output_index for r in dbg.rows} == {1}
    assert dbg.rows[0].api_name == "Torch.mul.0.backward"


def test_gradients_are_recomputed_against_the_real_cotangent(fb_config, monkeypatch):
    """The recomputed original VJP equals the gradient autograd gave the call's only input; the
    perturbed one used the same cotangent (no_change: identical)."""
    seen = spy_vjps(monkeypatch)
    torch.manual_seed(0)
    x = torch.randn(6, 5).requires_grad_()
    c = torch.randn(6, 5)
    dbg = PrecisionDebugger(config=bw_config(fb_config, pert_mode="no_change", list=["gelu"]))
    with dbg:
        (F.gelu(x) * c).sum().backward()
    (name, g_orig, g_pert), = seen
    assert name == "Functional.gelu.0.backward"
    assert torch.equal(g_orig[0], x.grad)
    assert torch.equal(g_pert[0], x.grad)
    assert dbg.rows == [] and dbg.summary()["apis"]["Functional.gelu"]["checked"] == 1


def test_an_input_with_several_consumers_is_judged_on_this_calls_gradient(fb_config, monkeypatch):
    """x.grad accumulates gelu's gradient and another consumer's; the check compares gelu's
    own VJP only, so no_change finds nothing."""
    seen = spy_vjps(monkeypatch)
    x = torch.linspace(-1.0, 1.0, 16).requires_grad_()
    dbg = PrecisionDebugger(config=bw_config(fb_config, pert_mode="no_change", list=["gelu"]))
    with dbg:
        (F.gelu(x) + x * 3).sum().backward()
    (_name, g_orig, g_pert), = seen
    assert torch.allclose(g_orig[0] + 3, x.grad) and torch.equal(g_orig[0], g_pert[0])
    assert dbg.rows == []


def test_an_unused_output_counts_as_zero_cotangent(fb_config, monkeypatch):
    """std_mean returns two differentiable outputs; only `mean` is used, so the hook of `std`
    never fires and the check runs at the end of the backward pass."""
    seen = spy_vjps(monkeypatch)
    x = torch.linspace(-1.0, 2.0, 12).reshape(3, 4).requires_grad_()
    dbg = PrecisionDebugger(config=bw_config(fb_config, pert_mode="no_change", list=["std_mean"]))
    with dbg:
        _std, mean = torch.std_mean(x, dim=1)
        (mean * torch.tensor([1.0, 2.0, 3.0])).sum().backward()
    (_name, g_orig, _g_pert), = seen
    assert torch.allclose(g_orig[0], x.grad) and dbg.rows == []
    assert dbg.summary()["apis"]["Torch.std_mean"]["checked"] == 1


# --- PyTorch: clean models, selection -------------------------------------------------------------

CLEAN_APIS = ["linear", "layer_norm", "gelu", "softmax", "matmul"]


@pytest.mark.parametrize("mode", ["no_change", "add_noise"])
def test_clean_model_gives_no_backward_rows(fb_config, mode):
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(16, 32), nn.LayerNorm(32), nn.GELU(), nn.Linear(32, 16))
    x = torch.randn(8, 16)
    dbg = PrecisionDebugger(config=bw_config(fb_config, pert_mode=mode, list=CLEAN_APIS))
    with dbg:
        h = model(x).softmax(-1)
        torch.matmul(h, h.t()).mean().backward()
    apis = dbg.summary()["apis"]
    assert dbg.rows == []
    assert sum(s["checked"] for s in apis.values()) >= 5, apis
    assert dbg.summary()["errors"] == []


def test_scope_and_list_select_backward_names(fb_config, monkeypatch):
    monkeypatch.setattr(F, "softsign", seeded_backward.ill_conditioned_backward_softsign)
    x = torch.linspace(0.5, 1.0, 64).requires_grad_()

    def work(dbg):
        with dbg:
            (F.softsign(x) + F.softsign(x * 1.5)).sum().backward()

    dbg = PrecisionDebugger(config=scoped_config(fb_config, ["Functional.softsign.1.backward"]))
    work(dbg)
    assert dbg.summary()["apis"]["Functional.softsign"]["checked"] == 1
    dbg = PrecisionDebugger(config=bw_config(fb_config, pert_mode="bit_noise", list=["softsign.1.backward"]))
    work(dbg)
    assert dbg.summary()["apis"]["Functional.softsign"]["checked"] == 1
    assert {r.api_name for r in dbg.rows} == {"Functional.softsign.1.backward"}
    dbg = PrecisionDebugger(config=bw_config(fb_config, pert_mode="bit_noise", list=["softsign"]))
    work(dbg)
    assert {r.api_name for r in dbg.rows} == {"Functional.softsign.0.backward", "Functional.softsign.1.backward"}


# --- PyTorch: nothing outlives its graph or its step ----------------------------------------------


def test_calls_whose_backward_never_runs_leave_nothing_behind(fb_config):
    x = torch.linspace(0.5, 1.0, 16).requires_grad_()
    dbg = PrecisionDebugger(config=bw_config(fb_config, pert_mode="no_change", list=["softsign"]))
    waiting = dbg.probe.backward.waiting
    with dbg:
        with torch.no_grad():
            F.softsign(x)  # not recorded: nothing saved
        assert len(waiting) == 0
        F.softsign(x)  # recorded, output dropped at once: the graph and the call die with it
        assert len(waiting) == 0  # by reference counting alone: no cycle holds the inputs
        kept = F.softsign(x)  # recorded and kept, but its backward never runs in this step
        assert len(waiting) == 1
        calls = list(waiting)
    reasons = dbg.summary()["not_checked"]
    assert reasons[bw.NOT_RECORDED] == {"Functional.softsign": 1}
    dbg.step()
    assert len(waiting) == 0
    assert all(c.args is None and c.kwargs is None and c.hooks is None for c in calls)
    assert len(kept._backward_hooks or {}) == 0  # the hook was unregistered at the end of the step
    kept.sum().backward()  # a late backward: no check, no error
    assert dbg.rows == [] and dbg.summary()["errors"] == []
    assert dbg.summary()["apis"]["Functional.softsign"]["checked"] == 0


def test_input_modified_in_place_before_backward_is_not_compared(fb_config):
    a = torch.linspace(0.5, 1.0, 8).requires_grad_()
    dbg = PrecisionDebugger(config=bw_config(fb_config, pert_mode="no_change", list=["Torch.add"]))
    with dbg:
        h = a * 2
        y = torch.add(h, 1.0)
        h.detach().mul_(3)  # add's backward does not need h: autograd lets this pass
        y.sum().backward()
    assert dbg.summary()["not_checked"][bw.MODIFIED] == {"Torch.add": 1}
    assert dbg.rows == []


def _probe_owned(o) -> bool:
    module = getattr(o, "__module__", None) if type(o).__name__ == "function" else type(o).__dict__.get("__module__")
    return isinstance(module, str) and module.startswith("probes.")  # call records, gatherers, hook closures


def census(tensor_type, probe) -> tuple[int, int, list[int]]:
    """Live tensors, live objects of the probe's own making (call records, hook gatherers, hook
    closures) and the sizes of the probe's tables. Totals of the interpreter are not used: the
    frameworks' own caches and pytest's log capture drift with or without the probe."""
    gc.collect()
    objects = gc.get_objects()
    tensors = sum(1 for o in objects if issubclass(type(o), tensor_type))
    owned = sum(1 for o in objects if _probe_owned(o))
    tables = [len(probe.backward.waiting), len(probe.skipped), len(probe.errors), len(probe.stats),
              len(probe.ledger.writers), len(probe.rows)]
    return tensors, owned, tables


def test_memory_is_flat_over_200_steps(fb_config):
    """Saved inputs, hooks and bookkeeping do not grow: the same live tensors, gc-tracked objects
    and probe tables after step 50 and after step 200, with steps that never run backward (eval
    with grad on, no_grad) mixed in."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 16), nn.GELU(), nn.Linear(16, 4))
    opt = torch.optim.SGD(model.parameters(), lr=1e-3)
    x = torch.randn(4, 8)
    dbg = PrecisionDebugger(config=bw_config(fb_config, pert_mode="no_change", list=["linear", "gelu"]))
    waiting = dbg.probe.backward.waiting
    with dbg:
        for step in range(200):
            if step % 5 == 3:
                model(x).sum()  # eval without no_grad: recorded, backward never runs
            elif step % 5 == 4:
                with torch.no_grad():
                    model(x)
            else:
                opt.zero_grad()
                model(x).pow(2).mean().backward()
                opt.step()
            dbg.step()
            assert len(waiting) == 0
            if step == 49:
                marks = census(torch.Tensor, dbg.probe)
        after = census(torch.Tensor, dbg.probe)
    # no growth: the probe's objects and tables stay the same; the process's live tensors may only
    # drop (another test's leftovers, held by a finishing thread or a compile cache, can be freed meanwhile)
    assert after[0] <= marks[0] and after[1:] == marks[1:] and after[1] > 0
    assert dbg.summary()["apis"]["Functional.linear"]["checked"] == 2 * 120
    assert dbg.rows == []


# --- PyTorch: the user's training is untouched ----------------------------------------------------


@pytest.mark.parametrize("mode, dtype", [("no_change", torch.float32), ("add_noise", torch.float32),
                                         ("improve_precision", torch.bfloat16)])
def test_backward_check_leaves_training_bit_identical(fb_config, mode, dtype):
    cfg = bw_config(fb_config, pert_mode=mode, list=["linear", "batch_norm", "gelu", "softmax", "dropout"])
    probed = train(cfg, dtype=dtype)
    train(None, dtype=dtype).assert_identical(probed, f"under {mode}")
    apis = probed.debugger.summary()["apis"]
    assert apis["Functional.batch_norm"]["checked"] == 3 and apis["Functional.linear"]["checked"] == 6


# --- PyTorch: errors ---------------------------------------------------------------------------


def _fp16_only(x):
    if x.dtype == torch.float32:
        raise RuntimeError("no float32 kernel")
    return x * 2


def test_errors_in_the_backward_check_are_recorded_not_raised(fb_config, monkeypatch):
    monkeypatch.setattr(torch, "square", _fp16_only)
    x = torch.ones(4, dtype=torch.float16, requires_grad=True)
    dbg = PrecisionDebugger(config=bw_config(fb_config, pert_mode="improve_precision", list=["square"]))
    with dbg:
        torch.square(x).sum().backward()
    assert torch.equal(x.grad, torch.full((4,), 2.0, dtype=torch.float16))
    errors = dbg.summary()["errors"]
    assert errors and "no float32 kernel" in errors[0]["error"] and errors[0]["first_call"] == "Torch.square.0.backward"
    cfg = bw_config(fb_config, pert_mode="improve_precision", list=["square"])
    cfg["strict"] = True
    x.grad = None
    with pytest.raises(ProbeError, match="Torch.square.0.backward"):
        with PrecisionDebugger(config=cfg):
            torch.square(x).sum().backward()


# --- MindSpore ------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def ms():
    ms = pytest.importorskip("mindspore")
    from probes.backends import mindspore_xp

    mindspore_xp.warm_up()
    ms.set_context(mode=ms.PYNATIVE_MODE, device_target="CPU")
    return ms


def _ms_debugger(config):
    from probes.mindspore import PrecisionDebugger as MsDebugger

    return MsDebugger(config=config)


def _ms_softsign_setup(ms):
    from mindspore import Parameter, Tensor, ops

    rs = np.random.RandomState(0)
    w = Parameter(Tensor((rs.randn(8, 8) * 0.1).astype(np.float32)), name="w")
    x = Tensor(np.linspace(0.5, 1.0, 64).reshape(8, 8).astype(np.float32))

    def loss(x):
        return ops.softsign(ops.matmul(x, w) + 0.7).sum()

    return ms.value_and_grad(loss, 0, [w]), x


@pytest.mark.parametrize("rule", ["reference", "scaled"])
@pytest.mark.parametrize("mode", ["add_noise", "bit_noise"])
def test_ms_backward_only_defect_is_caught_in_backward_and_not_in_forward(ms, fb_config, mode, rule, monkeypatch):
    from mindspore import ops

    monkeypatch.setattr(ops, "softsign", seeded_backward.mindspore_ill_conditioned_backward_softsign())
    grad_fn, x = _ms_softsign_setup(ms)
    found = {}
    for stage in ("forward", "backward"):
        dbg = _ms_debugger(fb_config(pert_mode=mode, fuzz_stage=stage, rule=rule,
                                     list=["mindspore.ops.softsign", "mindspore.ops.matmul"]))
        with dbg:
            grad_fn(x)
        apis = dbg.summary()["apis"]
        assert apis["Functional.softsign"]["checked"] == 1 and apis["Functional.matmul"]["checked"] == 1
        found[stage] = dbg.rows
    assert found["forward"] == []
    rows = found["backward"]
    assert rows and {r.api_name for r in rows} == {"Functional.softsign.0.backward"}
    assert all(r.stage == "backward" and r.output_index == 0 and r.max_rel > 2e-4 for r in rows)


def test_ms_gradients_are_recomputed_against_the_real_cotangent(ms, fb_config, monkeypatch):
    from mindspore import Tensor, ops

    seen = spy_vjps(monkeypatch)
    rs = np.random.RandomState(0)
    x = Tensor(rs.randn(6, 5).astype(np.float32))
    c = Tensor(rs.randn(6, 5).astype(np.float32))
    grad_fn = ms.grad(lambda x: (ops.gelu(x) * c).sum())
    dbg = _ms_debugger(bw_config(fb_config, pert_mode="no_change", list=["mindspore.ops.gelu"]))
    with dbg:
        gx = grad_fn(x)
    (name, g_orig, g_pert), = seen
    assert name == "Functional.gelu.0.backward"
    assert np.array_equal(g_orig[0].asnumpy(), gx.asnumpy())
    assert np.array_equal(g_pert[0].asnumpy(), gx.asnumpy())
    assert dbg.rows == []


def test_ms_clean_model_no_rows_scope_and_nothing_left_behind(ms, fb_config):
    from mindspore import Tensor, ops

    grad_fn, x = _ms_softsign_setup(ms)
    dbg = _ms_debugger(bw_config(fb_config, pert_mode="no_change",
                                 list=["mindspore.ops.softsign", "mindspore.ops.matmul"]))
    waiting = dbg.probe.backward.waiting
    with dbg:
        grad_fn(x)
        ops.softsign(Tensor(np.ones(4, np.float32)))  # outside a grad function: not recorded
        assert len(waiting) == 0
    assert dbg.rows == []
    assert dbg.summary()["apis"]["Functional.softsign"]["checked"] == 1
    assert dbg.summary()["not_checked"][bw.NOT_RECORDED] == {"Functional.softsign": 1}
    dbg = _ms_debugger(scoped_config(fb_config, ["Functional.matmul.0.backward"]))
    with dbg:
        grad_fn(x)
    assert {k: s["checked"] for k, s in dbg.summary()["apis"].items()} == {"Functional.matmul": 1}


def _ms_train(ms, cfg, steps: int):
    import mindspore.common.dtype as mstype
    from mindspore import Parameter, Tensor, mint, nn, ops

    ms.set_seed(7)
    rs = np.random.RandomState(7)
    w1 = Parameter(Tensor(rs.randn(12, 24).astype(np.float32) * 0.3), name="w1")
    b1 = Parameter(Tensor(np.zeros(24, np.float32)), name="b1")
    w2 = Parameter(Tensor(rs.randn(24, 3).astype(np.float32) * 0.3), name="w2")
    params = [w1, b1, w2]
    opt = nn.Adam(params, learning_rate=1e-2)
    x = Tensor(rs.randn(16, 12).astype(np.float32))
    y = Tensor(rs.randint(0, 3, 16).astype(np.int32))

    def forward(x, y):
        h = ops.gelu(ops.matmul(x, w1) + b1)
        return ops.cross_entropy(ops.softmax(mint.matmul(h, w2), -1).log(), y)

    grad_fn = ms.value_and_grad(forward, None, opt.parameters)
    dbg = _ms_debugger(cfg) if cfg else None
    losses = run_steps(grad_fn, opt, x, y, dbg, steps)
    assert all(p.dtype == mstype.float32 for p in params)
    return losses, [p.asnumpy().copy() for p in params], dbg


@pytest.mark.parametrize("mode", ["no_change", "add_noise"])
def test_ms_backward_check_leaves_training_bit_identical_and_clean(ms, fb_config, mode):
    cfg = bw_config(fb_config, pert_mode=mode,
                    list=["mindspore.ops.matmul", "mindspore.ops.gelu", "mindspore.mint.matmul", "mindspore.ops.softmax"])
    plain_losses, plain_params, _ = _ms_train(ms, None, 3)
    losses, params, dbg = _ms_train(ms, cfg, 3)
    for a, b in zip(plain_losses, losses):
        assert np.array_equal(a, b), f"loss changed under {mode}"
    for a, b in zip(plain_params, params):
        assert np.array_equal(a, b), f"parameters changed under {mode}"
    apis = dbg.summary()["apis"]
    assert apis["Functional.matmul"]["checked"] == 3 and apis["Mint.matmul"]["checked"] == 3
    assert dbg.rows == [] and dbg.summary()["errors"] == []
    assert len(dbg.probe.backward.waiting) == 0


def test_ms_memory_is_flat_over_40_steps(ms, fb_config):
    """As the PyTorch test, over 40 steps (a PyNative grad step costs ~10x a torch one)."""
    from mindspore import Parameter, Tensor, ops

    rs = np.random.RandomState(1)
    w = Parameter(Tensor(rs.randn(12, 24).astype(np.float32) * 0.3), name="w")
    x = Tensor(rs.randn(16, 12).astype(np.float32))
    grad_fn = ms.grad(lambda x: ops.gelu(ops.matmul(x, w)).sum(), None, [w])
    dbg = _ms_debugger(bw_config(fb_config, pert_mode="no_change", list=["mindspore.ops.gelu"]))
    waiting = dbg.probe.backward.waiting

    with dbg:
        for step in range(40):
            if step % 5 == 4:
                ops.gelu(x)  # outside a grad function: not recorded
            else:
                grad_fn(x)
            dbg.step()
            assert len(waiting) == 0
            if step == 9:
                marks = census(Tensor, dbg.probe)
        after = census(Tensor, dbg.probe)
    # no growth: the probe's objects and tables stay the same; the process's live tensors may only
    # drop (another test's leftovers, held by a finishing thread or a compile cache, can be freed meanwhile)
    assert after[0] <= marks[0] and after[1:] == marks[1:] and after[1] > 0
    assert dbg.summary()["apis"]["Functional.gelu"]["checked"] == 32
