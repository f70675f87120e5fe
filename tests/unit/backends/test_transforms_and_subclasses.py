"""free_benchmark on the programs test suites are made of: torch.func transforms, tensor
subclasses, tracers. Every call is judged on its real values or skipped with a named reason;
none raises, none changes the user's result, and a defect inside a transform is still caught."""

from __future__ import annotations

import warnings

import pytest
import seeded

torch = pytest.importorskip("torch")

import torch.nn as nn  # noqa: E402
import torch.nn.functional as F  # noqa: E402

from probes.core.errors import ProbeError  # noqa: E402
from probes.pytorch import PrecisionDebugger  # noqa: E402


def _config(tmp_path, mode: str = "improve_precision", **extra) -> dict:
    fb = {"pert_mode": mode, "rule": "scaled"}
    if mode == "to_cpu":
        fb["fuzz_device"] = "cpu"
    fb.update(extra.pop("free_benchmark", {}))
    return {"task": "free_benchmark", "dump_path": str(tmp_path / "dump"), "free_benchmark": fb, **extra}


def _probed(tmp_path, fn, mode: str = "improve_precision", **extra):
    dbg = PrecisionDebugger(config=_config(tmp_path, mode, **extra))
    dbg.start()
    try:
        out = fn()
    finally:
        dbg.stop()
    return out, dbg.probe.summary()


def _same(a, b) -> bool:
    if isinstance(a, torch.Tensor):
        return type(a) is type(b) and torch.equal(a, b)
    if isinstance(a, (tuple, list)):
        return len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b))
    if isinstance(a, dict):
        return a.keys() == b.keys() and all(_same(a[k], b[k]) for k in a)
    return a == b


def _transforms():
    torch.manual_seed(0)
    w = torch.randn(4, 16)
    x = torch.randn(8, 16)
    model = nn.Linear(16, 4)
    ensemble = [nn.Linear(16, 4) for _ in range(3)]
    params, buffers = torch.func.stack_module_state(ensemble)
    return {
        "vmap": lambda: torch.vmap(lambda r: torch.tanh(F.linear(r, w)))(x),
        "vmap_nested": lambda: torch.vmap(torch.vmap(lambda r: torch.tanh(r * 2)))(x.reshape(2, 4, 16)),
        "vmap_in_dims_chunks": lambda: torch.vmap(lambda r, s: F.softmax(r * s, -1), in_dims=(1, None),
                                                  chunk_size=3)(x, 2.0),
        "vmap_randomness": lambda: torch.vmap(lambda r: torch.tanh(r) + torch.rand(()), randomness="different")(x),
        "grad": lambda: torch.func.grad(lambda v: torch.tanh(F.linear(x, v)).sum())(w),
        "vjp": lambda: torch.func.vjp(lambda v: torch.tanh(F.linear(x, v)), w)[1](torch.ones(8, 4)),
        "jacrev": lambda: torch.func.jacrev(lambda v: torch.tanh(F.linear(x[:2], v)))(w),
        "jacfwd": lambda: torch.func.jacfwd(lambda v: torch.tanh(F.linear(x[:2], v)))(w),
        "hessian": lambda: torch.func.hessian(lambda v: torch.tanh(v).sum())(x[0]),
        "functional_call": lambda: torch.func.functional_call(model, dict(model.named_parameters()), (x,)),
        "ensemble": lambda: torch.vmap(lambda p, b: torch.func.functional_call(model, (p, b), (x,)))(params, buffers),
        "functionalize": lambda: torch.func.functionalize(lambda a: torch.tanh(a * 2))(x),
    }


@pytest.mark.parametrize("mode", ["improve_precision", "add_noise", "no_change"])
@pytest.mark.parametrize("name", list(_transforms()))
def test_transformed_calls_are_judged_and_the_result_is_unchanged(tmp_path, name, mode):
    torch.manual_seed(1)
    plain = _transforms()[name]()
    torch.manual_seed(1)
    probed, summary = _probed(tmp_path, _transforms()[name], mode)
    assert _same(plain, probed)
    assert summary["errors"] == []
    checked = {api: s["checked"] for api, s in summary["apis"].items() if s["checked"]}
    hooked = "Functional.linear" if "linear" in name or name in ("vmap", "grad", "vjp", "jacrev", "jacfwd") else None
    assert checked, summary
    if hooked is not None:
        assert checked.get(hooked, 0) >= 1, checked


def test_every_call_after_a_vmapped_call_is_judged(tmp_path):
    """One vmapped call, then more calls than the deferred queue holds: every one is judged, no
    error is blamed on any of them, and the terminal's figures cover all."""
    torch.manual_seed(0)
    x, w = torch.randn(8, 16), torch.randn(4, 16)

    def run():
        torch.vmap(torch.tanh)(x)
        for _ in range(600):
            F.softmax(F.linear(x, w), dim=-1)

    _out, summary = _probed(tmp_path, run)
    assert summary["errors"] == []
    assert summary["apis"]["Torch.tanh"]["checked"] == 1
    assert summary["apis"]["Functional.linear"]["checked"] == 600
    assert summary["apis"]["Functional.softmax"]["checked"] == 600


@pytest.mark.parametrize("transform", ["vmap", "grad", "none"])
def test_a_defect_inside_a_transform_is_caught(tmp_path, monkeypatch, transform):
    """expm1 as exp(x) - 1 loses every digit for small fp16 inputs: improve_precision flags it
    inside vmap and grad as outside (the figures are taken on the real per-sample values)."""
    monkeypatch.setattr(torch, "expm1", seeded.naive_expm1)
    x = (torch.rand(8, 64) * 1e-3).to(torch.float16)
    fns = {
        "vmap": lambda: torch.vmap(torch.expm1)(x),
        "grad": lambda: torch.func.grad(lambda v: torch.expm1(v).float().sum())(x),
        "none": lambda: torch.expm1(x),
    }
    _out, summary = _probed(tmp_path, fns[transform])
    assert summary["errors"] == []
    assert summary["apis"]["Torch.expm1"]["flagged"] >= 1, summary["apis"]


def test_a_clean_call_inside_vmap_gives_the_figure_of_the_plain_call(tmp_path):
    """The figure of a vmapped call is that of the same batch computed without vmap."""
    torch.manual_seed(0)
    x = torch.randn(8, 256, dtype=torch.bfloat16)
    _o, inside = _probed(tmp_path / "a", lambda: torch.vmap(torch.exp)(x))
    _o, outside = _probed(tmp_path / "b", lambda: torch.exp(x))
    a, b = inside["apis"]["Torch.exp"], outside["apis"]["Torch.exp"]
    assert a["checked"] == b["checked"] == 1
    assert a["worst_score"] == pytest.approx(b["worst_score"], rel=1e-6)


def _subclass_cases():
    warnings.filterwarnings("ignore", category=UserWarning)
    from torch.masked import masked_tensor

    torch.manual_seed(0)
    w = torch.randn(4, 16)
    jagged = torch.nested.nested_tensor([torch.randn(3, 16), torch.randn(5, 16)], layout=torch.jagged)
    strided = torch.nested.nested_tensor([torch.randn(3, 16), torch.randn(5, 16)])
    masked = masked_tensor(torch.randn(8, 16), torch.rand(8, 16) > 0.3)
    coo = torch.randn(8, 16).relu().to_sparse()
    csr = torch.randn(8, 16).relu().to_sparse_csr()
    logged = torch.randn(8, 16).as_subclass(_Logged)
    return {
        "nested_jagged": (lambda: F.linear(torch.tanh(jagged), w), "Functional.linear"),
        "nested_strided": (lambda: torch.tanh(strided), "Torch.tanh"),
        "masked": (lambda: torch.tanh(masked).sum(), "Torch.tanh"),
        "sparse_coo": (lambda: torch.tanh(coo), "Torch.tanh"),
        "sparse_csr": (lambda: torch.tanh(csr), "Torch.tanh"),
        "torch_function_subclass": (lambda: torch.tanh(F.linear(logged, w)), "Functional.linear"),
    }


class _Logged(torch.Tensor):
    """A user's __torch_function__ subclass (real storage)."""

    @classmethod
    def __torch_function__(cls, func, types, args=(), kwargs=None):
        return super().__torch_function__(func, types, args, kwargs or {})


class _Wrapper(torch.Tensor):
    """A user's __torch_dispatch__ wrapper subclass: no storage of its own."""

    @staticmethod
    def __new__(cls, elem):
        return torch.Tensor._make_wrapper_subclass(cls, elem.shape, dtype=elem.dtype, device=elem.device)

    def __init__(self, elem):
        self.elem = elem

    @classmethod
    def __torch_dispatch__(cls, func, types, args=(), kwargs=None):
        from torch.utils._pytree import tree_map

        def unwrap(x):
            return x.elem if isinstance(x, _Wrapper) else x

        out = func(*tree_map(unwrap, args), **tree_map(unwrap, kwargs or {}))
        return tree_map(lambda x: _Wrapper(x) if isinstance(x, torch.Tensor) else x, out)


def _values(t):
    if t.is_nested:
        return t.values() if t.layout == torch.jagged else torch.cat([c.reshape(-1) for c in t.unbind()])
    if type(t).__name__ == "MaskedTensor":
        return torch.where(t.get_mask(), t.get_data(), 0)
    if t.layout != torch.strided:
        return t.to_dense()
    return t.as_subclass(torch.Tensor)


@pytest.mark.parametrize("mode", ["improve_precision", "add_noise", "bit_noise", "change_value", "to_cpu"])
@pytest.mark.parametrize("name", list(_subclass_cases()))
def test_subclass_calls_are_judged_and_the_result_is_unchanged(tmp_path, name, mode):
    fn, api = _subclass_cases()[name]
    plain = fn()
    probed, summary = _probed(tmp_path, fn, mode)
    assert type(probed) is type(plain) and torch.equal(_values(probed), _values(plain))
    assert summary["errors"] == []
    assert summary["apis"][api]["checked"] >= 1 or mode in ("add_noise", "bit_noise", "change_value") and any(
        api in users for users in summary["not_checked"].values()), summary


def test_a_defect_on_a_jagged_tensor_is_caught(tmp_path, monkeypatch):
    monkeypatch.setattr(torch, "expm1", seeded.naive_expm1)
    jagged = torch.nested.nested_tensor([torch.rand(3, 64), torch.rand(5, 64)], layout=torch.jagged) * 1e-3
    _out, summary = _probed(tmp_path, lambda: torch.expm1(jagged.to(torch.float16)))
    assert summary["errors"] == []
    assert summary["apis"]["Torch.expm1"]["flagged"] == 1


def test_a_masked_tensor_is_judged_on_its_unmasked_values(tmp_path):
    """change_value swaps the first and last stored values; masked-out values are not judged."""
    from torch.masked import masked_tensor

    warnings.filterwarnings("ignore", category=UserWarning)
    data = torch.randn(4, 8)
    mask = torch.ones(4, 8, dtype=torch.bool)
    mask[1:-1] = False
    out, summary = _probed(tmp_path, lambda: torch.exp(masked_tensor(data, mask)), "change_value")
    assert summary["errors"] == []
    assert summary["apis"]["Torch.exp"]["flagged"] == 1  # the swap moves unmasked values


def test_a_dispatch_subclass_without_readable_values_is_skipped_with_its_name(tmp_path):
    x = _Wrapper(torch.randn(8, 16))
    _out, summary = _probed(tmp_path, lambda: torch.tanh(x * 2.0))
    assert summary["errors"] == []
    reasons = [r for r in summary["not_checked"] if "_Wrapper" in r]
    assert reasons and "Torch.tanh" in summary["not_checked"][reasons[0]]


def test_meta_and_fake_tensors_are_skipped_with_a_reason(tmp_path):
    from torch._subclasses.fake_tensor import FakeTensorMode

    def run():
        F.linear(torch.randn(8, 16, device="meta"), torch.randn(4, 16, device="meta"))
        with FakeTensorMode():
            return torch.tanh(F.linear(torch.randn(8, 16), torch.randn(4, 16))).shape

    shape, summary = _probed(tmp_path, run)
    assert shape == (8, 4)
    assert summary["errors"] == []
    assert any("meta" in r and "Functional.linear" in u for r, u in summary["not_checked"].items())
    assert any("FakeTensorMode" in r for r in summary["not_checked"])


def test_a_traced_program_is_the_same_with_the_probe(tmp_path):
    from torch.fx.experimental.proxy_tensor import make_fx

    w, x = torch.randn(4, 16), torch.randn(8, 16)

    def f(a):
        return torch.tanh(F.linear(a, w))

    plain = make_fx(f)(x).code
    traced, summary = _probed(tmp_path, lambda: make_fx(f)(x).code)
    assert traced == plain
    assert any("make_fx" in r for r in summary["not_checked"])


def test_a_users_dispatch_mode_sees_no_re_run(tmp_path):
    from torch.utils.flop_counter import FlopCounterMode

    w, x = torch.randn(64, 64), torch.randn(32, 64)

    def run():
        counter = FlopCounterMode(display=False)
        with counter:
            F.linear(x, w)
        return counter.get_total_flops()

    plain = run()
    flops, summary = _probed(tmp_path, run)
    assert flops == plain > 0
    assert any("TorchDispatchMode" in r for r in summary["not_checked"])


def test_fix_and_the_backward_stage_skip_transformed_calls_with_a_reason(tmp_path):
    x = torch.randn(8, 16, dtype=torch.float16)
    plain = torch.vmap(torch.tanh)(x)
    for extra in ({"handler_type": "fix"}, {"fuzz_stage": "backward", "list": ["tanh"]}):
        out, summary = _probed(tmp_path / extra.get("handler_type", "backward"), lambda: torch.vmap(torch.tanh)(x),
                               free_benchmark=extra)
        assert torch.equal(out, plain)
        assert summary["errors"] == []
        assert any("torch.func transform" in r for r in summary["not_checked"]), summary["not_checked"]


# the deferred verdicts: nothing lost, nothing misattributed ------------------------------------


class _UnreadableFigure(RuntimeError):
    pass


def _poison_figures(monkeypatch, poisoned: set[int]) -> None:
    """Make the figures of the listed checked calls (by order) unreadable on the host."""
    from probes.backends.torch_backend import TorchBackend
    from probes.free_benchmark import deferred

    marked: set[int] = set()
    seen = [0]
    add = deferred.VerdictQueue.add

    def marking_add(self, comparison, done, failed, nbytes=0):
        index = seen[0]
        seen[0] += 1

        def wrapped():
            try:
                request = next(comparison)
            except StopIteration as done:
                return done.value
            if index in poisoned:
                marked.update(id(t) for t in request)
            while True:
                received = yield request
                try:
                    request = comparison.send(received)
                except StopIteration as done:
                    return done.value

        return add(self, wrapped(), done, failed, nbytes)

    host_floats = TorchBackend.host_floats

    def reading(self, arrays):
        if any(id(a) in marked for a in arrays):
            raise _UnreadableFigure("this figure cannot be read")
        return host_floats(self, arrays)

    monkeypatch.setattr(deferred.VerdictQueue, "add", marking_add)
    monkeypatch.setattr(TorchBackend, "host_floats", reading)
    _device_figures_only(monkeypatch)


def _device_figures_only(monkeypatch) -> None:
    """Every call's figures on the device, read at the step's end (small CPU outputs are
    otherwise measured on the host and judged at the call)."""
    from probes.backends.torch_backend import TorchBackend

    monkeypatch.setattr(TorchBackend, "host_scaled_bound", lambda self, *args: None)
    monkeypatch.setattr(TorchBackend, "host_scaled_figures", lambda self, *args: None)


def test_an_unreadable_figure_is_that_calls_error_and_every_other_call_is_judged(tmp_path, monkeypatch):
    _poison_figures(monkeypatch, {254})
    x, w = torch.randn(8, 16), torch.randn(4, 16)

    def run():
        for _ in range(300):
            F.softmax(F.linear(x, w), dim=-1)

    _out, summary = _probed(tmp_path, run)
    apis = summary["apis"]
    assert apis["Functional.linear"]["checked"] + apis["Functional.softmax"]["checked"] == 599
    assert len(summary["errors"]) == 1
    error = summary["errors"][0]
    assert error["first_call"] == "Functional.linear.127.forward"  # the 255th checked call
    assert "cannot be read" in error["error"]


def test_stop_never_raises_and_strict_mode_does(tmp_path, monkeypatch):
    from probes.backends.torch_backend import TorchBackend

    def broken(self, arrays):
        raise _UnreadableFigure("no figure can be read")

    monkeypatch.setattr(TorchBackend, "host_floats", broken)
    _device_figures_only(monkeypatch)
    x = torch.randn(8, 16)
    out, summary = _probed(tmp_path, lambda: torch.tanh(x) + torch.exp(x))
    assert torch.equal(out, torch.tanh(x) + torch.exp(x))
    assert {e["first_call"] for e in summary["errors"]} == {"Torch.tanh.0.forward", "Torch.exp.0.forward",
                                                             "Tensor.__add__.0.forward"}
    with pytest.raises(ProbeError, match="no figure can be read"):
        _probed(tmp_path / "strict", lambda: torch.tanh(x), strict=True)


def test_step_goes_on_when_its_flush_fails(tmp_path, monkeypatch):
    dbg = PrecisionDebugger(config=_config(tmp_path))
    probe = dbg.probe
    real_flush = probe.flush
    calls = {"n": 0}

    def failing_once():
        calls["n"] += 1
        if calls["n"] == 1:
            raise OSError("disk full")
        real_flush()

    monkeypatch.setattr(probe, "flush", failing_once)
    x = torch.randn(8, 16)
    dbg.start()
    torch.tanh(x)
    dbg.stop()  # the first flush fails, is recorded, and the files are written by the second
    dbg.step()
    assert probe.current_step == 1
    assert any("disk full" in e["error"] and e["first_call"].startswith("stop()") for e in probe.summary()["errors"])


def test_the_backward_stage_judges_jagged_and_masked_calls_and_skips_sparse_ones(tmp_path):
    from torch.masked import masked_tensor

    warnings.filterwarnings("ignore", category=UserWarning)
    torch.manual_seed(0)
    w = torch.randn(4, 16, requires_grad=True)

    def run():
        jagged = torch.nested.nested_tensor([torch.randn(3, 16), torch.randn(5, 16)], layout=torch.jagged,
                                            requires_grad=True)
        F.linear(torch.tanh(jagged), w).values().sum().backward()
        masked = masked_tensor(torch.randn(8, 16), torch.rand(8, 16) > 0.3, requires_grad=True)
        torch.exp(masked).sum().backward()
        sparse = torch.randn(8, 16).relu().to_sparse().requires_grad_()
        (sparse * 2.0).to_dense().sum().backward()

    _out, summary = _probed(tmp_path, run, free_benchmark={"fuzz_stage": "backward",
                                                           "list": ["tanh", "linear", "exp", "__mul__"]})
    assert summary["errors"] == []
    apis = summary["apis"]
    assert apis["Functional.linear"]["checked"] == apis["Torch.tanh"]["checked"] == apis["Torch.exp"]["checked"] == 1
    assert any("sparse" in r and "Tensor.__mul__" in u for r, u in summary["not_checked"].items())


@pytest.mark.parametrize("mode", ["improve_precision", "add_noise", "bit_noise", "no_change"])
def test_complex_calls_are_judged(tmp_path, mode):
    torch.manual_seed(0)
    c = torch.randn(8, 16, dtype=torch.complex64)
    plain = torch.exp(c) @ c.t()
    out, summary = _probed(tmp_path, lambda: torch.exp(c) @ c.t(), mode)
    assert torch.equal(out, plain)
    assert summary["errors"] == []
    assert summary["apis"]["Torch.exp"]["checked"] == summary["apis"]["Tensor.__matmul__"]["checked"] == 1


def test_a_complex_defect_is_caught(tmp_path, monkeypatch):
    """A complex64 exp whose parts go through bfloat16 is flagged against the complex128 re-run."""
    exp = torch.exp

    def lossy_exp(x):
        y = exp(x)
        if y.dtype != torch.complex64:
            return y
        return torch.view_as_complex(torch.view_as_real(y).to(torch.bfloat16).to(torch.float32).contiguous())

    monkeypatch.setattr(torch, "exp", lossy_exp)
    c = torch.randn(8, 16, dtype=torch.complex64)
    _out, summary = _probed(tmp_path, lambda: torch.exp(c))
    assert summary["apis"]["Torch.exp"]["flagged"] == 1


# online_dispatch and grad_probe -------------------------------------------------------------------


def _dispatched(tmp_path, fn):
    from probes.online_dispatch import results as od_results  # noqa: F401 - the tool's package
    from probes.pytorch.online_dispatch import PtdbgDispatch

    mode = PtdbgDispatch(dump_mode="auto", dump_path=str(tmp_path / "od"))
    with mode:
        out = fn()
    return out, mode.results.summary()


@pytest.mark.parametrize("name", list(_transforms()))
def test_online_dispatch_compares_the_kernels_inside_transforms(tmp_path, name):
    torch.manual_seed(1)
    plain = _transforms()[name]()
    torch.manual_seed(1)
    probed, summary = _dispatched(tmp_path, _transforms()[name])
    assert _same(plain, probed)
    assert not summary["probe_errors"] and summary["ops_compared"] >= 1


@pytest.mark.parametrize("name", ["nested_jagged", "masked", "torch_function_subclass"])
def test_online_dispatch_compares_a_subclass_through_its_plain_operators(tmp_path, name):
    fn, _api = _subclass_cases()[name]
    plain = fn()
    probed, summary = _dispatched(tmp_path, fn)
    assert torch.equal(_values(probed), _values(plain))
    assert not summary["probe_errors"] and summary["ops_compared"] >= 1


def test_online_dispatch_compares_a_users_dispatch_subclass_through_its_operators(tmp_path):
    x = _Wrapper(torch.randn(8, 16))
    out, summary = _dispatched(tmp_path, lambda: torch.tanh(x * 2.0))
    assert torch.equal(out.elem, torch.tanh(x.elem * 2.0))
    assert not summary["probe_errors"] and summary["ops_compared"] == 2


def test_online_dispatch_leaves_a_users_mode_and_a_tracer_as_without_it(tmp_path):
    from torch.fx.experimental.proxy_tensor import make_fx
    from torch.utils.flop_counter import FlopCounterMode

    w, x = torch.randn(64, 64), torch.randn(32, 64)

    def flops():
        counter = FlopCounterMode(display=False)
        with counter:
            with _dispatcher(tmp_path / "inner"):
                F.linear(x, w)
        return counter.get_total_flops()

    def plain_flops():
        counter = FlopCounterMode(display=False)
        with counter:
            F.linear(x, w)
        return counter.get_total_flops()

    assert flops() == plain_flops() > 0

    def f(a):
        return torch.tanh(F.linear(a, w))

    plain = make_fx(f)(x).code
    traced, summary = _dispatched(tmp_path / "fx", lambda: make_fx(f)(x).code)
    assert traced == plain
    assert not summary["probe_errors"]


def _dispatcher(path):
    from probes.pytorch.online_dispatch import PtdbgDispatch

    return PtdbgDispatch(dump_mode="auto", dump_path=str(path))


def test_grad_probe_records_gradients_computed_with_torch_func(tmp_path):
    """Per-sample gradients from vmap(grad(functional_call)), averaged into .grad: every step's
    statistics are written, and a jacrev through the model between steps changes nothing."""
    import csv

    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(16, 8), nn.Tanh(), nn.Linear(8, 1))
    dbg = PrecisionDebugger(config={"task": "grad_probe", "dump_path": str(tmp_path / "gp"),
                                    "grad_probe": {"grad_level": "L1"}})
    dbg.monitor(model)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    x, y = torch.randn(32, 16), torch.randn(32, 1)
    params = dict(model.named_parameters())

    def loss(p, xb, yb):
        return ((torch.func.functional_call(model, p, (xb,)) - yb) ** 2).mean()

    for _ in range(3):
        per_sample = torch.vmap(torch.func.grad(loss), in_dims=(None, 0, 0))(
            {k: v.detach() for k, v in params.items()}, x.unsqueeze(1), y.unsqueeze(1))
        for k, v in params.items():
            v.grad = per_sample[k].mean(0)
        opt.step()
        opt.zero_grad()
        torch.func.jacrev(lambda p: torch.func.functional_call(model, p, (x[:2],)))(params)
    dbg.stop()
    files = sorted((tmp_path / "gp" / "rank0").glob("grad_summary_*.csv"))
    assert [f.name for f in files] == [f"grad_summary_{i}.csv" for i in range(3)]
    rows = list(csv.reader(files[0].open()))
    assert len(rows) == 1 + 4  # header and the four parameters


def test_every_counted_call_is_judged_or_has_a_reason(tmp_path):
    """Backward stage: a call whose outputs never reach a backward pass is counted under its
    reason when the step ends; preheat's census step is counted under its own."""
    x = torch.randn(8, 16, requires_grad=True)
    dbg = PrecisionDebugger(config=_config(tmp_path / "bw", free_benchmark={"fuzz_stage": "backward",
                                                                             "list": ["tanh"]}))
    dbg.start()
    torch.tanh(x).sum().backward()
    torch.tanh(x * 2)  # no backward
    dbg.stop()
    dbg.step()
    s = dbg.probe.summary()
    stats = s["apis"]["Torch.tanh"]
    skipped = sum(n.get("Torch.tanh", 0) for n in s["not_checked"].values())
    assert stats["calls"] == 2 and stats["checked"] == 1 and skipped == 1
    assert any("no backward pass" in r for r in s["not_checked"])

    dbg = PrecisionDebugger(config=_config(tmp_path / "ph", "add_noise", free_benchmark={
        "if_preheat": True, "preheat_step": 2, "max_sample": 2, "rule": "reference"}))
    for _ in range(2):
        dbg.start()
        torch.tanh(x)
        dbg.stop()
        dbg.step()
    s = dbg.probe.summary()
    stats = s["apis"]["Torch.tanh"]
    skipped = sum(n.get("Torch.tanh", 0) for n in s["not_checked"].values())
    assert stats["calls"] == stats["checked"] + skipped == 2


def test_a_function_scripted_under_the_probe_compiles_and_runs(tmp_path):
    """TorchScript maps builtins by identity; the wrappers are registered as the same ops, so
    torch.jit.script (the user's, or forward-mode AD's first jacfwd) compiles as without them."""
    def f(a: torch.Tensor) -> torch.Tensor:
        return torch.tanh(a) * torch.exp(a)

    x = torch.randn(8)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        out, summary = _probed(tmp_path, lambda: torch.jit.script(f)(x))
    assert torch.equal(out, f(x))
    assert summary["errors"] == []
    from torch.jit import _builtins

    assert all(id(m.wrapper) not in _builtins._get_builtin_table() for m in PrecisionDebugger(
        config=_config(tmp_path / "after"))._tool.patcher.metas if m.wrapper is not None)


def test_a_call_whose_copies_would_not_fit_is_skipped_with_the_reason(tmp_path, monkeypatch):
    """Re-running a call, or copying it to a float64 reference, holds its tensors again: where the
    memory left is too small the call is skipped (a test near the machine's memory would otherwise
    be killed with its whole session)."""
    from probes.backends import torch_memory

    monkeypatch.setattr(torch_memory, "SMALL_BYTES", 1 << 10)
    monkeypatch.setattr(torch_memory, "available_bytes", lambda device: 8 << 10)
    x = torch.randn(64, 64)  # 16 KiB: two copies (32 KiB) exceed half of the 8 KiB left
    small = torch.randn(8)
    out, summary = _probed(tmp_path, lambda: (torch.tanh(x), torch.exp(small)))
    assert torch.equal(out[0], torch.tanh(x))
    assert summary["apis"]["Torch.exp"]["checked"] == 1
    assert any("memory left" in r and "Torch.tanh" in u for r, u in summary["not_checked"].items())
    _out, od = _dispatched(tmp_path, lambda: (torch.tanh(x), torch.exp(small)))
    assert any("memory left" in r and "aten.tanh.default" in u for r, u in od["skipped"].items())
    assert od["ops_compared"] == 1


def test_online_dispatch_steps_aside_while_jit_traces(tmp_path):
    def f(a):
        return a.reshape(a.shape[0], -1) * 2

    x = torch.randn(2, 3, 4)
    traced, summary = _dispatched(tmp_path, lambda: torch.jit.trace(f, x))
    assert torch.equal(traced(x), f(x))
    assert any("torch.jit.trace" in r for r in summary["skipped"])
    assert torch.jit.trace.__module__ == "torch.jit._trace"  # put back


def test_a_program_compiled_after_the_probe_is_not_broken_by_it(tmp_path):
    """Dynamo builds its table of in-graph torch functions once, from what torch's names hold
    then: built during a probed test, it held the wrappers, and a later fullgraph compile of
    torch.einsum failed. The table is rebuilt around torch's own functions when the probe stops."""
    from torch._dynamo import trace_rules

    trace_rules.get_torch_obj_rule_map.cache_clear()
    torch._dynamo.reset()
    w = torch.randn(5, 3)
    _out, _summary = _probed(tmp_path, lambda: torch.compile(lambda a: a @ w + 1, backend="eager")(torch.randn(4, 5)))
    torch._dynamo.reset()
    einsum = torch.compile(lambda a: torch.einsum("ij,jk->ik", a, w), fullgraph=True, backend="eager")
    x = torch.randn(4, 5)
    assert torch.allclose(einsum(x), x @ w)
    assert trace_rules.get_torch_obj_rule_map().get(torch.einsum) is not None


def test_a_clean_lerp_near_zero_is_judged_at_its_inputs_scale(tmp_path):
    """lerp adds rounded terms: outputs that cancel to near zero are off by many of their own ulps
    while within half an ulp of the inputs' magnitude; it is judged at the row's scale."""
    torch.manual_seed(0)
    a, b = torch.randn(64, 256), torch.randn(64, 256)
    b[:, ::8] = -a[:, ::8] + torch.randn(64, 32) * 1e-6  # an eighth of the midpoints cancel
    _out, summary = _probed(tmp_path, lambda: torch.lerp(a, b, 0.5))
    assert summary["apis"]["Torch.lerp"]["checked"] == 1 and summary["apis"]["Torch.lerp"]["flagged"] == 0


def test_online_dispatch_takes_an_overflow_to_inf_as_the_dtypes_rounding(tmp_path):
    x = torch.full((16,), 1e30)
    out, summary = _dispatched(tmp_path, lambda: x * x)
    assert torch.isinf(out).all()
    assert summary["failed_op_count"] == 0 and summary["ops_compared"] == 1


def test_online_dispatch_steps_aside_for_a_traced_module_that_checks_shapes(tmp_path):
    """A traced module's interpreter hands a dispatch mode aten.equal(int, int) for its shape
    checks, which cannot run from Python: script modules run with the modes off."""
    class Flatten(nn.Module):
        def forward(self, a):
            assert a.shape[1] == 3
            return a.reshape(a.shape[0], -1) * 2

    x = torch.randn(2, 3, 4)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        traced = torch.jit.trace(Flatten(), x)
    out, summary = _dispatched(tmp_path, lambda: traced(x))
    assert torch.equal(out, x.reshape(2, -1) * 2)
    assert any("TorchScript" in r for r in summary["skipped"])
    assert "__call__" not in torch.jit.ScriptModule.__dict__  # put back
