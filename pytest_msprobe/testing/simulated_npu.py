"""A simulated Ascend NPU for PyTorch on a CPU-only machine: the probes' NPU paths (device
tensors, torch_npu's fused operators, device-to-host transfers) are tested where no NPU exists.

Usage::

    with simulated_npu() as npu:
        import torch_npu                      # a stand-in, importable only inside the block

        x = torch.randn(4, 8, device="npu")
        y, rstd = torch_npu.npu_rms_norm(x, torch.ones(8, device="npu"))
        y.sum().backward()
        print(npu.host_transfers)             # device-to-host transfers so far

    with simulated_npu(defects={"npu_rms_norm": "reduced_precision"}):
        ...                                   # a known precision bug, to test a precision tool on

Simulated: the ``"npu"`` device (PyTorch's PrivateUse1 backend, renamed), whose tensors wrap CPU
tensors and run every ATen op with the CPU kernel (autograd, ``Module.to("npu")`` and optimizers
work, and so do FP8 tensors and ``torch._scaled_mm``, as on Ascend parts with FP8); ``torch.npu``
with one device; the hardware's refusals (no float64 and no AMD fnuz FP8 formats on the device, no
``.numpy()`` of a device tensor); a count of device-to-host transfers; and a ``torch_npu``
stand-in whose fused operators (the keys of `SUPPORTED_DEFECTS`, FP8 ``npu_quant_matmul``
among them) are ``npu::`` custom ops with, as on the hardware, no CPU kernel, and autograd where
torch_npu has a backward. A fused operator can be seeded with a defect: ``"reduced_precision"``
computes its forward in bfloat16, ``"wrong_backward"`` negates its gradients.

Not simulated: the hardware's numerics (results are the CPU's), asynchrony (streams and
``synchronize()`` do nothing), collectives, memory limits, autocast, ``torch.compile``, the rest of
torch_npu, and npu_fusion_attention beyond dense, dropout-free attention.

The first ``simulated_npu()`` or `prepare` changes the process for good: PrivateUse1 cannot be
renamed back, so ``torch.device("npu")`` parses from then on and ``torch.npu`` stays registered
(reporting no device outside a block). Autograd sizes its per-device queues at the process's first
backward pass, so call `prepare` in conftest.py when a backward may run before the first block.
The rest is installed on entry and removed on exit. Nesting, a real torch_npu, or a PrivateUse1
claimed by another backend raise `SimulatedNPUError`.

This module is the block's setup and teardown, and the names to import; each other job has a
sibling module, so none grows past reading: the device and its registration
(``simulated_npu_device``), the device tensors and the host-transfer count (``simulated_npu_tensor``),
the fused operators' math (``simulated_npu_kernels``) and the ``torch_npu`` stand-in
(``simulated_npu_torch_npu``).
"""

from __future__ import annotations

import contextlib
import sys
import threading
from typing import Dict, Iterator, Mapping, Tuple

import torch

from pytest_msprobe.testing.simulated_npu_device import (
    DEVICE_TYPE,
    SimulatedNPUError,
    device_module,
    process_setup_done,
    set_enabled,
    setup_process_once,
)
from pytest_msprobe.testing.simulated_npu_tensor import (
    SimulatedNPU,
    SimulatedNPUTensor,
    active,
    fused_impls,
    register_kernels,
    set_active,
)
from pytest_msprobe.testing.simulated_npu_torch_npu import define_fused_ops, make_torch_npu_module

__all__ = ["SimulatedNPU", "SimulatedNPUError", "SimulatedNPUTensor", "simulated_npu", "prepare", "active",
           "SUPPORTED_DEFECTS"]

#: operator name -> defect kinds that can be seeded into it.
SUPPORTED_DEFECTS: Dict[str, Tuple[str, ...]] = {
    "npu_rms_norm": ("reduced_precision", "wrong_backward"),
    "npu_swiglu": ("reduced_precision", "wrong_backward"),
    "npu_rotary_mul": ("reduced_precision", "wrong_backward"),
    "npu_fusion_attention": ("reduced_precision", "wrong_backward"),
    # inference only in torch_npu (no backward), so no "wrong_backward"
    "npu_quant_matmul": ("reduced_precision",),
}


_lock = threading.Lock()


def _refuse_if_real_backend() -> None:
    existing = sys.modules.get("torch_npu")
    if existing is not None and not getattr(existing, "__simulated__", False):
        raise SimulatedNPUError(
            "a real torch_npu is imported in this process; simulated_npu() refuses to replace it "
            "(run simulated-NPU tests in a process without torch_npu)"
        )
    name = torch._C._get_privateuse1_backend_name()
    if not process_setup_done() and name != "privateuseone":
        raise SimulatedNPUError(
            f"PyTorch's PrivateUse1 backend is already claimed as {name!r} by another backend in this "
            "process; simulated_npu() needs it (the rename cannot be undone)"
        )


def prepare() -> None:
    """Do the process-global part of the simulation now (rename PrivateUse1 to "npu", register
    its device guard). Autograd sizes its per-device queues at a process's first backward pass, so
    a block that runs backward on device tensors needs this before that first backward: call it at
    the top of conftest.py (``simulated_npu()`` calls it too, which is enough when nothing ran
    backward before). Idempotent; refuses, as ``simulated_npu()`` does, when a real torch_npu is
    imported or PrivateUse1 belongs to another backend."""
    with _lock:
        _refuse_if_real_backend()
        setup_process_once()


def _validate_defects(defects: Mapping[str, str] | None) -> Dict[str, str]:
    result = dict(defects or {})
    for op, kind in result.items():
        if op not in SUPPORTED_DEFECTS:
            raise ValueError(f"unknown operator {op!r} in defects; supported: {sorted(SUPPORTED_DEFECTS)}")
        if kind not in SUPPORTED_DEFECTS[op]:
            raise ValueError(f"unknown defect {kind!r} for {op}; supported: {SUPPORTED_DEFECTS[op]}")
    return result


@contextlib.contextmanager
def simulated_npu(defects: Mapping[str, str] | None = None) -> Iterator[SimulatedNPU]:
    """Make ``torch.device("npu:0")``, ``torch.npu`` and ``import torch_npu`` work on a CPU-only machine.

    Args:
        defects: optional ``{operator: defect}`` to seed into the fused ops, e.g.
            ``{"npu_rms_norm": "reduced_precision"}`` (see :data:`SUPPORTED_DEFECTS`).

    Yields:
        A :class:`SimulatedNPU` whose ``host_transfers`` counts device->host transfers.

    Raises:
        SimulatedNPUError: when nested, when a real torch_npu is imported, or when PrivateUse1 is
            already used by another backend.
        ValueError: for unknown defects.
    """
    checked = _validate_defects(defects)
    with _lock:
        if active() is not None:
            raise SimulatedNPUError("simulated_npu() is already active; nesting is not supported")
        _refuse_if_real_backend()
        if getattr(torch, DEVICE_TYPE, device_module()) is not device_module():
            raise SimulatedNPUError(
                "torch.npu is already registered by something else; refusing to replace it"
            )
        setup_process_once()
        state = SimulatedNPU(checked)
        set_active(state)

    undo: list = []
    try:
        npu_module = device_module()
        assert npu_module is not None
        set_enabled(npu_module, True)
        undo.append(lambda: set_enabled(npu_module, False))

        aten_lib = torch.library.Library("aten", "IMPL")  # noqa: TOR901
        undo.append(aten_lib._destroy)
        register_kernels(aten_lib)

        npu_lib = torch.library.Library("npu", "DEF")  # noqa: TOR901
        undo.append(npu_lib._destroy)
        define_fused_ops(npu_lib, checked, fused_impls)
        undo.append(fused_impls.clear)

        sys.modules["torch_npu"] = make_torch_npu_module(npu_module)
        undo.append(lambda: sys.modules.pop("torch_npu", None))
        yield state
    finally:
        errors = []
        for step in reversed(undo):
            try:
                step()
            except Exception as exc:  # pragma: no cover - best effort cleanup
                errors.append(exc)
        with _lock:
            set_active(None)
        if errors:  # pragma: no cover
            raise SimulatedNPUError(f"cleanup of simulated_npu() failed: {errors!r}")
