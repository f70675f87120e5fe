"""Tests for pytest_msprobe.testing.simulated_npu (CPU-only simulation of an Ascend NPU)."""

import os
import subprocess
import sys

import pytest
from repo_paths import REPO

torch = pytest.importorskip("torch")

from pytest_msprobe.testing import SimulatedNPUError, simulated_npu  # noqa: E402
from pytest_msprobe.testing.simulated_npu import SimulatedNPUTensor  # noqa: E402


def _mode_stack_depths():
    return torch._C._len_torch_dispatch_stack(), torch._C._len_torch_function_stack()


def test_device_tensors_factories_arithmetic_and_host_copy():
    with simulated_npu():
        x = torch.arange(6, dtype=torch.float32).reshape(2, 3)
        xd = x.to("npu")
        assert xd.device.type == "npu" and xd.device == torch.device("npu:0")
        assert x.npu().device.type == "npu"
        for made in (
            torch.randn(3, device="npu"),
            torch.zeros(2, 2, device="npu"),
            torch.ones(3, device="npu:0"),
            torch.tensor([1.0, 2.0], device="npu"),
            torch.arange(4, device="npu"),
        ):
            assert made.device.type == "npu"
        assert torch.tensor([1.0, 2.0], device="npu").cpu().tolist() == [1.0, 2.0]

        y = xd * 2 + xd
        assert y.device.type == "npu"
        z = y @ xd.t()
        assert z.device.type == "npu"
        view = y[0]
        assert view.device.type == "npu"

        for back in (y.cpu(), y.to("cpu")):
            assert type(back) is torch.Tensor and back.device.type == "cpu"
            torch.testing.assert_close(back, x * 3)
        torch.testing.assert_close(z.cpu(), (x * 3) @ x.t())

        # in-place ops keep the same device tensor object
        w = xd.clone()
        assert w.add_(1) is w
        torch.testing.assert_close(w.cpu(), x + 1)


_AUTOGRAD_SCRIPT = """
import sys
import torch
from pytest_msprobe.testing import prepare, simulated_npu

if sys.argv[1] == "prepared":
    prepare()
if sys.argv[1] != "fresh":  # something ran backward before the block (another test, the user's code)
    torch.ones(2, requires_grad=True).sum().backward()
torch.manual_seed(0)
ref = torch.nn.Linear(3, 2)
inp = torch.randn(4, 3)
with simulated_npu():
    layer = torch.nn.Linear(3, 2)
    layer.load_state_dict(ref.state_dict())
    layer = layer.to("npu")
    assert layer.weight.device.type == "npu" and isinstance(layer.weight, torch.nn.Parameter)
    loss = layer(inp.to("npu")).pow(2).sum()
    loss.backward()
    assert layer.weight.grad.device.type == "npu" and layer.bias.grad.device.type == "npu"
    ref_loss = ref(inp).pow(2).sum()
    ref_loss.backward()
    torch.testing.assert_close(loss.cpu(), ref_loss.detach())
    torch.testing.assert_close(layer.weight.grad.cpu(), ref.weight.grad)
    torch.optim.SGD(layer.parameters(), lr=0.1).step()
    torch.optim.SGD(ref.parameters(), lr=0.1).step()
    assert layer.weight.device.type == "npu"
    torch.testing.assert_close(layer.weight.detach().cpu(), ref.weight.detach())
    torch.testing.assert_close(layer.bias.detach().cpu(), ref.bias.detach())
print("OK")
"""


@pytest.mark.parametrize("order", ["fresh", "prepared"])
def test_autograd_and_optimizer_step_on_device(order):
    """In a fresh process each (the setup is process-global): a process whose first backward runs
    inside the block, and one that ran backward before but called prepare() first."""
    root = REPO
    done = subprocess.run([sys.executable, "-c", _AUTOGRAD_SCRIPT, order], capture_output=True, text=True,
                          cwd=root, timeout=120, env=dict(os.environ, PYTHONPATH=str(root)))
    assert done.returncode == 0 and "OK" in done.stdout, done.stderr[-2000:]


def test_backward_before_setup_is_the_documented_limit():
    root = REPO
    done = subprocess.run([sys.executable, "-c", _AUTOGRAD_SCRIPT, "late"], capture_output=True, text=True,
                          cwd=root, timeout=120, env=dict(os.environ, PYTHONPATH=str(root)))
    assert done.returncode != 0  # why prepare() exists: autograd sized its device queues too early


def test_float64_and_numpy_are_refused_like_the_hardware():
    with simulated_npu():
        with pytest.raises(SimulatedNPUError, match="float64.*NPU"):
            torch.zeros(2, device="npu", dtype=torch.float64)
        with pytest.raises(SimulatedNPUError, match="float64.*NPU"):
            torch.ones(2, dtype=torch.float64).to("npu")
        xd = torch.ones(2, device="npu")
        with pytest.raises(SimulatedNPUError, match="float64.*NPU"):
            xd.double()
        with pytest.raises(SimulatedNPUError, match="float64.*NPU"):
            xd.to(torch.float64)
        # casting while moving to the host is fine (float64 lives on the CPU)
        assert xd.to("cpu", torch.float64).dtype == torch.float64
        with pytest.raises((TypeError, RuntimeError)):
            xd.numpy()


def test_host_transfers_are_counted_exactly():
    with simulated_npu() as npu:
        x = torch.ones(3, device="npu")
        s = x.sum()
        assert npu.host_transfers == 0  # creation and device compute do not transfer
        x.cpu()
        assert npu.host_transfers == 1
        x.to("cpu")
        assert npu.host_transfers == 2
        s.item()
        assert npu.host_transfers == 3
        assert x.tolist() == [1.0, 1.0, 1.0]
        assert npu.host_transfers == 4
        assert bool(s)
        assert npu.host_transfers == 5
        assert float(s) == 3.0
        assert npu.host_transfers == 6
        text = repr(x)
        assert "device='npu:0'" in text
        assert npu.host_transfers == 7
        str(x)
        assert npu.host_transfers == 8
        torch.empty(3).copy_(x)
        assert npu.host_transfers == 9
        torch.ones(3).to("npu")  # host -> device is not counted
        assert npu.host_transfers == 9


def test_torch_npu_device_module_lifecycle():
    assert not torch.npu.is_available() and torch.npu.device_count() == 0
    assert torch.accelerator.is_available() is False  # PyTorch's accelerator API keeps working
    with simulated_npu():
        assert torch.accelerator.is_available() is True
        assert torch.npu.is_available() is True
        assert torch.npu.device_count() == 1
        torch.npu.set_device(0)
        torch.npu.set_device("npu:0")
        assert torch.npu.current_device() == 0
        torch.npu.synchronize()
        with pytest.raises(SimulatedNPUError, match="single device"):
            torch.npu.set_device(1)
    assert not torch.npu.is_available() and torch.npu.device_count() == 0


def _rms_reference(x, gamma, eps):
    x64 = x.double()
    rstd = torch.rsqrt(x64.pow(2).mean(-1, keepdim=True) + eps)
    return x64 * rstd * gamma.double(), rstd


def test_torch_npu_stand_in_fused_ops_and_seeded_defect():
    torch.manual_seed(0)
    x = torch.randn(8, 64) * 3
    gamma = torch.rand(64) + 0.5
    ref_y, ref_rstd = _rms_reference(x, gamma, 1e-6)
    gate = torch.randn(8, 64)

    with simulated_npu() as npu:
        import torch_npu

        y, rstd = torch_npu.npu_rms_norm(x.to("npu"), gamma.to("npu"), epsilon=1e-6)
        assert y.device.type == "npu" and rstd.device.type == "npu"
        assert rstd.shape == (8, 1) and rstd.dtype == torch.float32
        clean = y.cpu()
        torch.testing.assert_close(clean.double(), ref_y, rtol=1e-5, atol=1e-5)
        torch.testing.assert_close(rstd.cpu().double(), ref_rstd, rtol=1e-5, atol=1e-6)
        # registered as a custom op in the "npu" namespace
        op_y, _ = torch.ops.npu.npu_rms_norm(x.to("npu"), gamma.to("npu"), 1e-6)
        torch.testing.assert_close(op_y.cpu(), clean)

        sw = torch_npu.npu_swiglu(gate.to("npu"), dim=-1)
        assert sw.device.type == "npu" and sw.shape == (8, 32)
        a, b = gate.double().chunk(2, dim=-1)
        torch.testing.assert_close(sw.cpu().double(), torch.nn.functional.silu(a) * b, rtol=1e-5, atol=1e-6)
        assert npu.defects == {}

    with simulated_npu(defects={"npu_rms_norm": "reduced_precision"}) as npu:
        import torch_npu

        bad, _ = torch_npu.npu_rms_norm(x.to("npu"), gamma.to("npu"))
        bad = bad.cpu()
        assert npu.defects == {"npu_rms_norm": "reduced_precision"}
    clean_err = (clean.double() - ref_y).abs().max().item()
    bad_err = (bad.double() - ref_y).abs().max().item()
    assert bad_err > 1e-3 and bad_err > 100 * clean_err

    with pytest.raises(ValueError, match="unknown defect"):
        with simulated_npu(defects={"npu_rms_norm": "nonsense"}):
            pass
    with pytest.raises(ValueError, match="unknown operator"):
        with simulated_npu(defects={"npu_nonexistent": "reduced_precision"}):
            pass


def test_exit_restores_everything_even_on_exception_and_refuses_nesting():
    depths = _mode_stack_depths()
    with pytest.raises(KeyError):
        with simulated_npu():
            import torch_npu  # noqa: F401

            assert "torch_npu" in sys.modules
            raise KeyError("boom")
    assert not torch.npu.is_available()
    assert "torch_npu" not in sys.modules
    with pytest.raises(ImportError):
        import torch_npu  # noqa: F401
    # the npu:: custom ops are unregistered again
    for op in ("npu::npu_swiglu", "npu::npu_rms_norm"):
        with pytest.raises(RuntimeError, match="does not exist"):
            torch._C._dispatch_has_kernel_for_dispatch_key(op, "CPU")
    assert _mode_stack_depths() == depths
    # device tensors cannot be created once the simulation is over
    with pytest.raises((RuntimeError, NotImplementedError)):
        torch.zeros(2, device="npu")

    with simulated_npu():
        with pytest.raises(SimulatedNPUError, match="already active"):
            with simulated_npu():
                pass
        # the outer simulation is still intact after the refused nesting
        assert torch.npu.is_available() and torch.zeros(1, device="npu").device.type == "npu"
    assert not torch.npu.is_available()

    # sequential re-entry works (the PrivateUse1 rename is process-global and done only once)
    with simulated_npu():
        assert isinstance(torch.ones(1, device="npu"), SimulatedNPUTensor)


def test_refuses_when_real_torch_npu_is_imported(monkeypatch):
    import types

    fake_real = types.ModuleType("torch_npu")
    monkeypatch.setitem(sys.modules, "torch_npu", fake_real)
    with pytest.raises(SimulatedNPUError, match="real torch_npu"):
        with simulated_npu():
            pass
    assert sys.modules["torch_npu"] is fake_real
    assert not torch.npu.is_available()


def test_fused_ops_run_on_the_device_only_with_autograd_and_rotary_mul():
    """As with the real torch_npu: no CPU kernel; gradients are the math's own (checked against
    float64 autograd of an independent formula); npu_rotary_mul is x * r1 + rotate_half(x) * r2."""
    torch.manual_seed(0)
    x, gamma = torch.randn(4, 32), torch.rand(32) + 0.5
    r1, r2 = torch.randn(4, 32), torch.randn(4, 32)
    with simulated_npu():
        import torch_npu

        with pytest.raises(NotImplementedError, match="CPU"):
            torch.ops.npu.npu_rms_norm(x, gamma, 1e-6)
        xd = x.to("npu").requires_grad_()
        gd = gamma.to("npu").requires_grad_()
        y, _ = torch_npu.npu_rms_norm(xd, gd)
        (y * torch.arange(32.0, device="npu")).sum().backward()
        got_x, got_g = xd.grad.cpu(), gd.grad.cpu()

        rot = torch_npu.npu_rotary_mul(x.to("npu"), r1.to("npu"), r2.to("npu")).cpu()
    x64, g64 = x.double().requires_grad_(), gamma.double().requires_grad_()
    ref = x64 * torch.rsqrt(x64.pow(2).mean(-1, keepdim=True) + 1e-6) * g64
    (ref * torch.arange(32.0, dtype=torch.float64)).sum().backward()
    torch.testing.assert_close(got_x.double(), x64.grad, rtol=1e-4, atol=1e-5)
    torch.testing.assert_close(got_g.double(), g64.grad, rtol=1e-4, atol=1e-5)
    x1, x2 = x.chunk(2, -1)
    torch.testing.assert_close(rot, x * r1 + torch.cat((-x2, x1), -1) * r2)


def test_seeded_wrong_backward_negates_the_gradient_only():
    torch.manual_seed(0)
    x = torch.randn(4, 16)
    grads, outs = {}, {}
    for defects in ({}, {"npu_swiglu": "wrong_backward"}):
        with simulated_npu(defects=defects):
            import torch_npu

            xd = x.to("npu").requires_grad_()
            out = torch_npu.npu_swiglu(xd)
            out.sum().backward()
            key = bool(defects)
            grads[key], outs[key] = xd.grad.cpu(), out.detach().cpu()
    torch.testing.assert_close(outs[True], outs[False], rtol=0, atol=0)
    torch.testing.assert_close(grads[True], -grads[False], rtol=0, atol=0)


def test_seeding_is_the_cpu_generator_and_rng_state_round_trips():
    with simulated_npu():
        torch.manual_seed(3)  # calls torch.npu.manual_seed_all: must not recurse
        a = torch.randn(5, device="npu").cpu()
        torch.npu.manual_seed(3)
        b = torch.randn(5, device="npu").cpu()
        state = torch.npu.get_rng_state()
        c = torch.randn(5, device="npu").cpu()
        torch.npu.set_rng_state(state)
        d = torch.randn(5, device="npu").cpu()
    torch.testing.assert_close(a, b, rtol=0, atol=0)
    torch.testing.assert_close(c, d, rtol=0, atol=0)


def test_module_dtype_casts_and_data_assignment_keep_data_and_metadata_together():
    with simulated_npu():
        layer = torch.nn.Linear(4, 4).to("npu").to(torch.bfloat16)
        assert layer.weight.dtype == torch.bfloat16 and layer.weight.cpu().dtype == torch.bfloat16
        out = layer(torch.ones(2, 4, device="npu", dtype=torch.bfloat16))
        assert out.dtype == torch.bfloat16 and out.device.type == "npu"
        with pytest.raises(SimulatedNPUError, match="another device"):
            layer.weight.data = torch.zeros(4, 4, dtype=torch.bfloat16)


def test_a_dispatch_mode_sees_device_tensors_and_moves_them_to_the_host():
    """What online_dispatch relies on: inside a TorchDispatchMode, aten.to(cpu) is not decomposed
    into _to_copy; it must still produce a CPU copy (and count a transfer)."""
    from torch.utils._python_dispatch import TorchDispatchMode

    seen = []

    class Mode(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            out = func(*args, **(kwargs or {}))
            if func is torch.ops.aten.mul.Tensor:
                host = out.to(torch.device("cpu"))
                seen.append((type(host), host.device.type, [t.__simulated_device__ for t in types]))
                host.add_(1)  # a copy: the device result is untouched
            return out

    with simulated_npu() as npu:
        x = torch.ones(3, device="npu")
        with Mode():
            y = x * 2
        assert npu.host_transfers == 1
        assert y.cpu().tolist() == [2.0, 2.0, 2.0]
    assert seen == [(torch.Tensor, "cpu", ["npu"])]


def test_device_detection_finds_it_as_the_real_thing():
    """probes.backends.devices resolves `auto` and `npu` through import torch_npu and
    torch.npu.is_available(), the same calls a real Ascend machine answers."""
    from probes.backends.devices import DeviceUnavailable, npu_available, resolve_device

    assert not npu_available() and resolve_device("auto") == "cpu"
    with pytest.raises(DeviceUnavailable, match="no NPU"):
        resolve_device("npu")
    with simulated_npu():
        assert npu_available()
        assert resolve_device("auto") == "npu" and resolve_device("npu") == "npu"
    assert resolve_device("auto") == "cpu"
