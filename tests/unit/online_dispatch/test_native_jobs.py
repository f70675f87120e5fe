"""The reference runner (probes.backends.torch_reference_runner, probes.online_dispatch.native_jobs):
ops re-run and measured on a native thread give the inline rows byte for byte, in op order, whatever
the user's program writes meanwhile."""

from __future__ import annotations

import json
import os
import shutil

import pytest
import torch
import torch.nn.functional as F
from dispatch_files import read_rows

from probes.backends import torch_kernels, torch_reference_runner
from probes.online_dispatch import mode, native_jobs
from probes.pytorch.online_dispatch import PtdbgDispatch


@pytest.fixture(scope="module")
def runner_built():
    if shutil.which("ninja") is None or shutil.which(os.environ.get("CXX", "c++")) is None:
        pytest.skip("no C++ compiler or ninja here: online_dispatch judges inline (covered elsewhere)")
    torch_reference_runner.reset()
    module = torch_reference_runner.runner_module(wait=True)
    assert module is not None, torch_reference_runner.why_not()
    return module


@pytest.fixture
def taken(runner_built, monkeypatch):
    """Forces the runner on (a host that can overlap) and counts the ops it took. The runner is
    loaded first: a test before may have reset it (a context would then load it in the background
    and take only the ops after the load)."""
    assert torch_reference_runner.runner_module(wait=True) is not None, torch_reference_runner.why_not()
    monkeypatch.setattr(mode, "use_reference_thread", lambda background: True)
    counts = {"taken": 0, "most_in_flight": 0}
    take = native_jobs.NativeQueue.take

    def counting(self, job, out):
        ok = take(self, job, out)
        counts["taken"] += ok
        counts["most_in_flight"] = max(counts["most_in_flight"], len(self.jobs))
        return ok

    monkeypatch.setattr(native_jobs.NativeQueue, "take", counting)
    return counts


def _files(run_dir) -> tuple[str, dict]:
    (csv_path,) = run_dir.glob("compare_result_rank*.csv")
    report = json.loads((run_dir / "summary.json").read_text())
    report.pop("config"), report.pop("csv")
    return csv_path.read_text(), report


def _program(dtype: torch.dtype) -> None:
    """Forward and gradients of a small block (tuple outputs, integer outputs, an in-place write
    on an output still in flight, an op whose float64 re-run raises), gradients by
    autograd.grad (AccumulateGrad would copy a gradient still held in flight: another op)."""
    torch.manual_seed(0)
    w1 = torch.randn(64, 96, dtype=dtype, requires_grad=True)
    w2 = torch.randn(96, 32, dtype=dtype, requires_grad=True)
    x = torch.randn(16, 64, dtype=dtype)
    h = F.gelu(F.layer_norm(x @ w1, (96,)))
    h = torch.softmax(h, -1) @ w2
    values, idx = torch.topk(h.detach(), 3)
    low, high = torch.aminmax(h.detach())
    y = torch.mm(x.detach(), w1.detach())
    y.mul_(2.0)  # writes the output of an op that may still be in flight
    (idx + 1).sum()
    torch.ops.aten._weight_int8pack_mm(x.float(), torch.randint(-8, 8, (8, 64), dtype=torch.int8), torch.rand(8))
    torch.autograd.grad(h.float().pow(2).sum() + y.float().sum() * 0 + values.sum() * 0 + low * high, (w1, w2))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_the_runner_writes_the_inline_rows_byte_for_byte(tmp_path, taken, dtype):
    with PtdbgDispatch(dump_path=str(tmp_path / "inline"), background=False) as inline:
        _program(dtype)
    assert taken["taken"] == 0
    with PtdbgDispatch(dump_path=str(tmp_path / "runner")) as native:
        _program(dtype)
    assert taken["taken"] > 20  # the runner took most ops (not the in-place ones, nor a failing one's judging)
    assert _files(inline.run_dir) == _files(native.run_dir)
    rows = read_rows(native.run_dir)
    assert any(r["NPU Name"].startswith("_weight_int8pack_mm_1_output") for r in rows)  # judged, not dropped
    assert _files(native.run_dir)[1]["probe_errors"] or any("_weight_int8pack_mm" in r["Err_message"] for r in rows)


def test_an_op_writing_an_output_in_flight_waits_for_its_judgement(tmp_path, taken):
    """A large float64 re-run is still running when the program writes its output in place: the
    write waits, so the row measures the output as the op made it (doubled, the figures would fail)."""
    a, b = torch.randn(384, 384), torch.randn(384, 384)
    with PtdbgDispatch(dump_path=str(tmp_path / "runner")) as d:
        for _ in range(3):
            y = torch.mm(a, b)
            y.mul_(2.0)
    assert taken["taken"] >= 3
    mm_rows = [r for r in read_rows(d.run_dir) if r["NPU Name"].startswith("mm_") and "_output" in r["NPU Name"]]
    assert len(mm_rows) == 3 and all(r["Accuracy Reached or Not"] == "Yes" for r in mm_rows), mm_rows


def test_the_runner_measures_the_leaves_and_keeps_a_bounded_window(tmp_path, taken, monkeypatch):
    measured_here = []
    parts = torch_kernels.dispatch_parts
    monkeypatch.setattr(torch_kernels, "dispatch_parts", lambda d, r: measured_here.append(1) or parts(d, r))
    x = torch.randn(64, 64)
    with PtdbgDispatch(dump_path=str(tmp_path / "runner")) as d:
        for _ in range(3 * native_jobs.WINDOW):
            x = torch.tanh(x @ x)
    assert taken["taken"] == 6 * native_jobs.WINDOW
    assert taken["most_in_flight"] <= native_jobs.WINDOW
    assert measured_here == []  # every leaf's sums came from the runner
    assert d._native is None  # the runner's thread stops with the context
    rows = [r for r in read_rows(d.run_dir) if "_output" in r["NPU Name"]]
    assert [r["NPU Name"] for r in rows[:4]] == ["mm_1_output", "tanh_1_output", "mm_2_output", "tanh_2_output"]


def test_the_switch_turns_the_runner_off(monkeypatch):
    monkeypatch.setenv(torch_reference_runner.SWITCH, "0")
    torch_reference_runner.reset()
    try:
        assert torch_reference_runner.runner_module(wait=True) is None
        assert torch_reference_runner.SWITCH in torch_reference_runner.why_not()
    finally:
        torch_reference_runner.reset()


def _signatures() -> None:
    """Ops whose arguments the runner must copy as build_reference does: dtype and list arguments,
    optional tensors, Python numbers for Tensor arguments, tuple outputs, integer outputs. (Tensor
    literals are named, and linspace's tensor bounds left out: torch then adds an alias op that
    summary.json counts among the skipped calls when an op in flight still holds the tensor;
    docs/online_dispatch.md says so.)"""
    torch.manual_seed(0)
    x = torch.randn(6, 5)
    y = torch.randn(6, 5, dtype=torch.bfloat16)
    rows, cols, other_rows = torch.tensor([0, 2]), torch.tensor([0, 4]), torch.tensor([1, 3])
    low, start, end = torch.tensor(-0.5), torch.tensor(0.0), torch.tensor(1.0)
    ints, repeated, ones = torch.arange(6), torch.tensor([3, 1, 3, 2]), torch.ones(5, dtype=torch.bfloat16)
    torch.sum(x, dim=1, dtype=torch.float64)
    torch.softmax(y, -1, dtype=torch.float32)
    torch.log_softmax(x, 0)
    x.to(torch.bfloat16)
    torch.cat([x, x * 2], 0)
    torch.stack((x, x + 1))
    x[rows, None]
    x[other_rows, cols]
    torch.where(x > 0, x, 0.5)
    torch.clamp(x, min=low, max=0.5)
    torch.addcmul(x, x, x, value=0.25)
    torch.add(x, 2)
    torch.mul(ints, 3)
    torch.lerp(x, x * start, end)
    torch.var_mean(y.float(), dim=0, correction=0)
    torch.unique(repeated, return_counts=True)
    torch.nn.functional.layer_norm(y, (5,), ones, None)
    q, k, v = (torch.randn(1, 2, 8, 4) for _ in range(3))
    torch.nn.functional.scaled_dot_product_attention(q, k, v)


@pytest.mark.parametrize("program", [_signatures], ids=["signatures"])
def test_every_kind_of_argument_is_copied_as_inline(tmp_path, taken, program):
    with PtdbgDispatch(dump_path=str(tmp_path / "inline"), background=False) as inline:
        program()
    with PtdbgDispatch(dump_path=str(tmp_path / "runner")) as native:
        program()
    assert taken["taken"] >= 15
    assert _files(inline.run_dir) == _files(native.run_dir)


def test_attention_reference_runs_on_the_runner_and_its_grads_match(tmp_path, taken):
    """attention's reference is Python: called on the runner's thread with the GIL, in its turn."""
    def program():
        torch.manual_seed(0)
        q, k, v = (torch.randn(2, 2, 16, 8, requires_grad=True) for _ in range(3))
        out = F.scaled_dot_product_attention(torch.tanh(q), k, v, is_causal=True)
        torch.autograd.grad(out.pow(2).sum(), (q, k, v))

    calls = []
    submit_python = torch_reference_runner.ReferenceRunner.__init__

    def spying(self, module):
        submit_python(self, module)
        real = self.submit_python
        self.submit_python = lambda *a: calls.append(a[0]) or real(*a)

    with PtdbgDispatch(dump_path=str(tmp_path / "inline"), background=False) as inline:
        program()
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(torch_reference_runner.ReferenceRunner, "__init__", spying)
        with PtdbgDispatch(dump_path=str(tmp_path / "runner")) as native:
            program()
    assert len(calls) == 2  # the forward's and the backward's references
    assert _files(inline.run_dir) == _files(native.run_dir)


def test_under_a_process_group_the_runner_reads_only_private_copies(tmp_path, taken, monkeypatch):
    """distributed engines free memory outside the dispatcher: the runner is then given the host
    copies made on the user's thread and no device leaf, and the rows are the same."""
    monkeypatch.setattr(mode, "distributed_run", lambda: True)
    seen = []
    init = torch_reference_runner.ReferenceRunner.__init__

    def spying(self, module):
        init(self, module)
        real = self.submit
        self.submit = lambda index, args, kwargs, leaves, inference, cast, half: (
            seen.append((cast, leaves)) or real(index, args, kwargs, leaves, inference, cast, half))

    monkeypatch.setattr(torch_reference_runner.ReferenceRunner, "__init__", spying)
    with PtdbgDispatch(dump_path=str(tmp_path / "inline"), background=False) as inline:
        _signatures()
    with PtdbgDispatch(dump_path=str(tmp_path / "runner")) as native:
        _signatures()
    assert seen and all(not cast and all(leaf is None for leaf in leaves) for cast, leaves in seen)
    assert _files(inline.run_dir) == _files(native.run_dir)


def test_a_leaf_the_kernel_cannot_read_is_left_to_the_user_thread(runner_built):
    """A sparse output (or any the one pass cannot read) comes back without sums, never an error
    on the runner's thread."""
    runner = torch_reference_runner.ReferenceRunner(runner_built)
    dense = torch.eye(4)
    sparse = dense.to_sparse()
    index = runner.index(torch.ops.aten.mul.Tensor)
    assert runner.submit(index, (sparse, 2.0), {}, [sparse], False, True, -1)
    assert runner.submit(index, (dense, 2.0), {}, [dense * 2.0], False, True, -1)
    failed, out, parts, copies = runner.next()
    assert not failed and out.layout == torch.sparse_coo and parts == [None]
    failed, out, parts, copies = runner.next()
    assert not failed and out.dtype == torch.float64 and parts[0] is not None and copies[0].dtype == torch.float64
    assert runner.pending() == 0


@pytest.mark.parametrize("cast", [True, False], ids=["runner_copies", "copies_given"])
def test_the_runner_finishes_ops_while_the_user_thread_holds_the_gil(runner_built, cast):
    """PyTorch takes the GIL when the last C++ reference beside a tensor's Python object ends: the
    runner must leave the user's tensors (arguments, device leaves) to the user's thread, or it
    waits for the GIL at every op. Here the user's thread keeps the GIL (no switch for 100 s) while
    the runner works: each op must still finish."""
    import sys
    import time

    runner = torch_reference_runner.ReferenceRunner(runner_built)
    index = runner.index(torch.ops.aten.mul.Tensor)
    x, y = torch.randn(64), torch.randn(64)  # Python objects whose only C++ references are the runner's
    args = (x, y) if cast else (x.double(), y.double())
    switch = sys.getswitchinterval()
    sys.setswitchinterval(100.0)
    try:
        for _ in range(3):
            assert runner.submit(index, args, {}, [x * y], False, cast, -1)
            deadline = time.monotonic() + 5.0
            while not runner.ready() and time.monotonic() < deadline:  # spins with the GIL held
                pass
            assert runner.ready(), "the runner waited for the GIL"
            failed, out, parts, _copies = runner.next()
            assert not failed and out.dtype == torch.float64 and parts[0] is not None
    finally:
        sys.setswitchinterval(switch)


def test_one_process_builds_and_the_others_look_again(tmp_path, monkeypatch):
    """A build marker held by a live process keeps the others from starting builds of their own
    (short test processes would each start one); a dead process's or an old marker is taken over."""
    import subprocess
    import sys
    import time

    marker = tmp_path / "runner.building"
    sleeper = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        marker.write_text(str(sleeper.pid))
        assert not torch_reference_runner._claim(marker)
        old = time.time() - 2 * torch_reference_runner._BUILD_SECONDS
        os.utime(marker, (old, old))
        assert torch_reference_runner._claim(marker) and marker.read_text() == str(os.getpid())
    finally:
        sleeper.kill()
        sleeper.wait()
    marker.write_text(str(sleeper.pid))  # that process is gone
    assert torch_reference_runner._claim(marker)

    loads = iter([None, "the module"])
    monkeypatch.setattr(torch_reference_runner, "_load", lambda: next(loads))
    monkeypatch.delenv(torch_reference_runner.SWITCH, raising=False)
    torch_reference_runner.reset()
    try:
        torch_reference_runner.runner_module()
        torch_reference_runner._state["builder"].join()
        assert torch_reference_runner.why_not() == torch_reference_runner.ELSEWHERE
        assert torch_reference_runner.runner_module(wait=True) == "the module"  # asked again: built by then
    finally:
        torch_reference_runner.reset()


def test_the_stack_walk_in_c_gives_the_python_walks_frames(runner_built):
    """capture_stack walks in C where the extension is loaded: the same frames, torch's and the
    probes' own left out (here a torch decorator's frame between the test's)."""
    import sys

    from probes.online_dispatch import call_stack

    def inner(depth: int):
        if depth:
            return inner(depth - 1)
        frame = sys._getframe(0)
        return runner_built.user_frames(frame, call_stack._SKIPPED), call_stack.python_capture_stack(frame)

    native, python = torch.no_grad()(lambda: inner(4))()
    assert native == python and len(native) >= 6
    assert not any(name.startswith(call_stack._SKIPPED) for name, _line, _fn in native)
    assert native[-1][2] == "inner" and isinstance(native[-1][1], int)


def test_the_lazy_frames_resolve_to_the_lines_of_when_they_were_taken(runner_built):
    """capture_stack keeps code objects and offsets: resolved after the frames have moved on
    (here returned), they give the lines of the moment they were taken."""
    import sys

    from probes.online_dispatch import call_stack

    def taken():
        frame = sys._getframe(0)
        return runner_built.user_code_frames(frame, call_stack._SKIPPED), call_stack.python_capture_stack(frame)

    lazy, python = taken()
    moved_on = [taken() for _ in range(3)]  # the same frames' code objects, taken again elsewhere
    assert call_stack.frames_of(lazy) == python
    assert call_stack.frames_of(lazy) != call_stack.frames_of(moved_on[0][0])  # another line of this test
    assert call_stack.format_stack(lazy) == call_stack.format_stack(python)
