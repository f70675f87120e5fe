"""The simulated NPU's tensors: a CPU tensor dressed as a device one, so that every ATen op runs
with the CPU kernel while the probes see device tensors, and the handle of the active
``simulated_npu()`` block that counts the transfers to the host (what a probe's cost on a real NPU
comes down to). Apart from the fused operators' math and from the block's setup and teardown,
which only hand this module the operators to run (see :mod:`pytest_msprobe.testing.simulated_npu`)."""

from __future__ import annotations

from typing import Any, Callable, Dict, Mapping

import torch
from torch.utils._pytree import tree_map

from pytest_msprobe.testing.simulated_npu_device import (
    DEVICE_TYPE,
    SimulatedNPUError,
    check_dtype,
    process_setup_done,
)

_aten = torch.ops.aten

_active: SimulatedNPU | None = None

#: "npu::<name>" -> implementation (with this block's defects) while a simulation is active; the
#: device tensors' dispatch runs these, as the ops have no CPU kernel
fused_impls: Dict[str, Callable[..., Any]] = {}


class SimulatedNPU:
    """Handle returned by :func:`simulated_npu`; counts device->host transfers."""

    def __init__(self, defects: Mapping[str, str]) -> None:
        self.defects: Dict[str, str] = dict(defects)
        self.host_transfers: int = 0
        self.device = torch.device(DEVICE_TYPE, 0) if process_setup_done() else None

    def reset_host_transfers(self) -> None:
        self.host_transfers = 0


def active() -> SimulatedNPU | None:
    """The simulation active in this process, if any."""
    return _active


def set_active(state: SimulatedNPU | None) -> None:
    """Make `state` the block whose host transfers the device tensors count (None: no block); the
    caller holds the simulation's lock, which guards the one-block-at-a-time rule."""
    global _active
    _active = state


def _count_host_transfer() -> None:
    if _active is not None:
        _active.host_transfers += 1


def _is_cpu_device(device: Any) -> bool:
    return device is not None and torch.device(device).type == "cpu"


# ops that may move a tensor between devices: aten.to is not decomposed into _to_copy when a
# TorchDispatchMode is active (a probe's), so both are seen here
_MOVES = (torch.ops.aten._to_copy, torch.ops.aten.to)


def _target_device(args: tuple, kwargs: dict) -> Any:
    """The device an aten.to / _to_copy call moves to (None: it stays)."""
    if kwargs.get("device") is not None:
        return kwargs["device"]
    for a in args[1:]:
        if isinstance(a, (torch.device, str)):
            return a
        if isinstance(a, torch.Tensor):  # to.other: the other tensor's device
            return a.device
    return None


class SimulatedNPUTensor(torch.Tensor):
    """A tensor that reports ``device.type == "npu"`` while its data is a CPU tensor (``._cpu``)."""

    _cpu: torch.Tensor
    #: Tells tools that intercept ops (a TorchDispatchMode sees this subclass in ``types``) that
    #: it stands for an ordinary tensor of this device type, to be treated as one.
    __simulated_device__ = DEVICE_TYPE

    @staticmethod
    def __new__(cls, cpu: torch.Tensor, requires_grad: bool = False) -> SimulatedNPUTensor:
        check_dtype(cpu.dtype)
        return torch.Tensor._make_wrapper_subclass(  # type: ignore[attr-defined]
            cls,
            cpu.size(),
            strides=cpu.stride(),
            storage_offset=cpu.storage_offset(),
            dtype=cpu.dtype,
            layout=cpu.layout,
            device=torch.device(DEVICE_TYPE, 0),
            requires_grad=requires_grad,
        )

    def __init__(self, cpu: torch.Tensor, requires_grad: bool = False) -> None:
        self._cpu = cpu

    __torch_function__ = torch._C._disabled_torch_function_impl

    # ``param.data = new`` (nn.Module.to(dtype), user code) replaces the tensor's metadata in C++;
    # the CPU data behind it must follow, or the wrapper would describe one dtype and hold another
    @property  # type: ignore[override]
    def data(self) -> torch.Tensor:
        return torch._C.TensorBase.data.__get__(self)  # type: ignore[attr-defined]

    @data.setter
    def data(self, value: torch.Tensor) -> None:
        if not isinstance(value, SimulatedNPUTensor):
            raise SimulatedNPUError(
                "cannot set .data of an NPU tensor to a tensor on another device; move it first (.to('npu'))")
        torch._C.TensorBase.data.__set__(self, value)  # type: ignore[attr-defined]
        self._cpu = value._cpu

    def __repr__(self, *, tensor_contents: Any = None) -> str:  # type: ignore[override]
        _count_host_transfer()
        text = repr(self._cpu)
        extra = f", device='{self.device}'"
        if self.requires_grad and self.grad_fn is None:
            extra += ", requires_grad=True"
        if self.grad_fn is not None:
            extra += f", grad_fn=<{type(self.grad_fn).__name__}>"
        return text[:-1] + extra + ")"

    def tolist(self) -> Any:  # type: ignore[override]
        _count_host_transfer()
        return self._cpu.tolist()

    @classmethod
    def __torch_dispatch__(cls, func, types, args=(), kwargs=None):  # type: ignore[no-untyped-def]
        kwargs = kwargs or {}
        wrappers: Dict[int, SimulatedNPUTensor] = {}

        def unwrap(x: Any) -> Any:
            if isinstance(x, SimulatedNPUTensor):
                wrappers[id(x._cpu)] = x
                return x._cpu
            if isinstance(x, torch.device) and x.type == DEVICE_TYPE:
                return torch.device("cpu")
            return x

        to_host = False
        if func.overloadpacket in _MOVES and _is_cpu_device(_target_device(args, kwargs)):
            to_host = True
        elif func is torch.ops.aten._local_scalar_dense.default:
            to_host = True
        elif func is torch.ops.aten.copy_.default and not isinstance(args[0], SimulatedNPUTensor):
            to_host = True
        if to_host:
            _count_host_transfer()
        else:
            check_dtype(kwargs.get("dtype"))

        cpu_args = tree_map(unwrap, args)
        cpu_kwargs = tree_map(unwrap, kwargs)
        fused = fused_impls.get(func._schema.name) if getattr(func, "namespace", "") == "npu" else None
        out = fused(*cpu_args, **cpu_kwargs) if fused is not None else func(*cpu_args, **cpu_kwargs)
        if to_host:
            # aten.to returns its argument when nothing changes: a move to the host is a copy
            return _aten.clone.default(out) if id(out) in wrappers else out

        def wrap(x: Any) -> Any:
            if isinstance(x, torch.Tensor) and not isinstance(x, SimulatedNPUTensor):
                if id(x) in wrappers:  # in-place / out= ops return their (wrapped) argument
                    return wrappers[id(x)]
                return SimulatedNPUTensor(x)
            return x

        return tree_map(wrap, out)


# ------------------------------------------------------------------------- PrivateUse1 kernels


def _empty_memory_format(size, dtype=None, layout=None, device=None, pin_memory=None, memory_format=None):  # type: ignore[no-untyped-def]
    dtype = dtype if dtype is not None else torch.get_default_dtype()
    check_dtype(dtype)
    return SimulatedNPUTensor(
        torch.empty(size, dtype=dtype, memory_format=memory_format or torch.contiguous_format)
    )


def _empty_strided(size, stride, dtype=None, layout=None, device=None, pin_memory=None):  # type: ignore[no-untyped-def]
    dtype = dtype if dtype is not None else torch.get_default_dtype()
    check_dtype(dtype)
    return SimulatedNPUTensor(torch.empty_strided(size, stride, dtype=dtype))


def _as_cpu(t: torch.Tensor) -> torch.Tensor:
    return t._cpu if isinstance(t, SimulatedNPUTensor) else t


def _copy_from(src: torch.Tensor, dst: torch.Tensor, non_blocking: bool = False) -> torch.Tensor:
    # Reached when the Python dispatch key is excluded (e.g. ``torch.tensor(data, device="npu")``).
    if not isinstance(src, SimulatedNPUTensor) and isinstance(dst, SimulatedNPUTensor):
        pass  # host -> device
    elif isinstance(src, SimulatedNPUTensor) and not isinstance(dst, SimulatedNPUTensor):
        _count_host_transfer()
    _as_cpu(dst).copy_(_as_cpu(src))
    return dst


def _copy_from_and_resize(src: torch.Tensor, dst: torch.Tensor) -> torch.Tensor:
    _as_cpu(dst).resize_(src.shape)
    return _copy_from(src, dst)


def register_kernels(aten_lib: Any) -> None:
    """Give PrivateUse1 the factory and copy kernels that reach the device without the Python
    dispatch key (``torch.empty(..., device="npu")``, ``torch.tensor(data, device="npu")``), so those
    too make device tensors; the caller owns `aten_lib` and destroys it when its block ends."""
    aten_lib.impl("empty.memory_format", _empty_memory_format, "PrivateUse1")
    aten_lib.impl("empty_strided", _empty_strided, "PrivateUse1")
    aten_lib.impl("_copy_from", _copy_from, "PrivateUse1")
    aten_lib.impl("_copy_from_and_resize", _copy_from_and_resize, "PrivateUse1")
