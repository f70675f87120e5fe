"""Run "NPU" code paths of PyTorch programs on a CPU-only machine.

Usage::

    from pytest_msprobe.testing import simulated_npu

    with simulated_npu() as npu:
        import torch_npu                      # a stand-in module, only importable inside the block

        x = torch.randn(4, 8, device="npu")   # factory functions accept device="npu"
        layer = torch.nn.Linear(8, 8).to("npu")
        y, rstd = torch_npu.npu_rms_norm(layer(x), torch.ones(8, device="npu"))
        assert y.device.type == "npu"
        y.sum().backward()
        print(npu.host_transfers)             # device->host transfers so far (0 here)

    # Seed a precision defect into one fused operator, e.g. for testing a precision-debugging tool:
    with simulated_npu(defects={"npu_rms_norm": "reduced_precision"}):
        ...

What is simulated
-----------------
* ``torch.device("npu:0")``: PyTorch's PrivateUse1 backend is renamed to ``"npu"``.
* Device tensors: a wrapper tensor subclass (:class:`SimulatedNPUTensor`) that reports
  ``device.type == "npu"`` while its data lives in an ordinary CPU tensor; every ATen op is run on the
  CPU through ``__torch_dispatch__`` and the results are re-wrapped.  Autograd, ``nn.Module.to("npu")``
  and optimizers work on them.
* ``x.to("npu")`` / ``x.npu()`` and factory functions with ``device="npu"`` (``torch.randn``,
  ``torch.zeros``, ``torch.empty``, ``torch.ones``, ``torch.tensor``...), through Python kernels for
  ``aten::empty.memory_format`` and ``aten::empty_strided`` registered for PrivateUse1.
* Hardware strictness: float64 tensors cannot be created on (or cast to) the device, and
  ``.numpy()`` of a device tensor fails.
* :attr:`SimulatedNPU.host_transfers` counts device->host transfers (``.cpu()``, ``.to("cpu")``,
  ``.item()``, ``.tolist()``, ``bool(t)``, ``float(t)``, ``int(t)``, ``repr``/``print``, copying a device
  tensor into a CPU tensor).
* ``torch.npu`` (``is_available``, ``device_count``, ``current_device``, ``set_device``,
  ``synchronize``...) and an importable ``torch_npu`` stand-in whose fused operators
  (``npu_rms_norm``, ``npu_swiglu``) are custom ops in the ``npu`` namespace
  (``torch.ops.npu.npu_rms_norm``) with CPU implementations.  Optional seeded defects
  (``"reduced_precision"``: compute internally in bfloat16) let other tools be tested on a known bug.

What is NOT simulated
---------------------
* Real kernels' numerics: every op runs the CPU kernel, so results match the CPU, not Ascend hardware
  (different accumulation orders, internal precisions, fused-kernel behaviour).
* Stream asynchrony: everything is synchronous; ``synchronize()`` and streams are no-ops, so races
  and missing synchronisations cannot be found with it.
* HCCL / distributed collectives, device memory limits and out-of-memory, multiple devices
  (``device_count()`` is 1), AMP/autocast for "npu", ``torch.compile``, and the rest of the real
  ``torch_npu`` API (only the operators listed above exist).
* The fused custom ops have no autograd formula (backward through them raises).
* Autograd on device tensors needs the process-global setup before the process's first backward
  pass (autograd sizes its per-device queues then): call :func:`prepare` early (conftest.py) when
  other code may have run backward first.
* Aliasing between views is kept at the data level (in-place writes through a view are visible in the
  base) but autograd's view tracking for in-place ops on views of device tensors is not guaranteed.

Process-global side effects (cannot be undone)
----------------------------------------------
``torch.utils.rename_privateuse1_backend`` can only be called once per process and cannot be reverted,
and the Python device guard / hooks for PrivateUse1 cannot be unregistered.  So the first
``simulated_npu()`` permanently makes ``torch.device("npu")`` parse and adds ``Tensor.npu()`` /
``Tensor.is_npu`` (from ``torch.utils.generate_methods_for_privateuse1_backend``).  Everything else
(``torch.npu``, ``torch_npu`` in ``sys.modules``, the ATen kernels that create device tensors, the
``npu::`` custom ops) is installed on entry and removed on exit, even on exceptions; outside the block
creating a tensor on ``"npu"`` fails (device tensors that outlive the block are plain Python objects and
keep working, e.g. ``.cpu()``, but are not counted in any ``host_transfers``).  Re-entering later in the same process works; nesting does not
(a clear :class:`SimulatedNPUError` is raised).  If a real ``torch_npu`` is imported, or PrivateUse1 was
claimed by another backend, ``simulated_npu()`` refuses with :class:`SimulatedNPUError`.
"""

from __future__ import annotations

import contextlib
import sys
import threading
import types
from typing import Any, Callable, Dict, Iterator, Mapping, Tuple

import torch
from torch.utils._pytree import tree_map

__all__ = ["SimulatedNPU", "SimulatedNPUError", "SimulatedNPUTensor", "simulated_npu", "prepare",
           "SUPPORTED_DEFECTS"]

DEVICE_TYPE = "npu"

#: operator name -> defect kinds that can be seeded into it.
SUPPORTED_DEFECTS: Dict[str, Tuple[str, ...]] = {
    "npu_rms_norm": ("reduced_precision",),
    "npu_swiglu": ("reduced_precision",),
}

_OP_SCHEMAS = {
    "npu_rms_norm": "npu_rms_norm(Tensor self, Tensor gamma, float epsilon=1e-06) -> (Tensor, Tensor)",
    "npu_swiglu": "npu_swiglu(Tensor self, int dim=-1) -> Tensor",
}

_UNSUPPORTED_DTYPES = (torch.float64,)


class SimulatedNPUError(RuntimeError):
    """Raised for misuse of the simulated NPU and for operations the (simulated) hardware refuses."""


_lock = threading.Lock()
_process_setup_done = False
_active: SimulatedNPU | None = None


def _dtype_error(dtype: torch.dtype) -> SimulatedNPUError:
    return SimulatedNPUError(
        f"{dtype} (float64/double) is not supported on the NPU: Ascend NPUs have no float64 compute; "
        "keep float64 tensors on the CPU (pytest_msprobe.testing.simulated_npu is strict like the hardware)"
    )


def _check_dtype(dtype: torch.dtype | None) -> None:
    if dtype in _UNSUPPORTED_DTYPES:
        raise _dtype_error(dtype)


def _count_host_transfer() -> None:
    if _active is not None:
        _active.host_transfers += 1


def _is_cpu_device(device: Any) -> bool:
    return device is not None and torch.device(device).type == "cpu"


class SimulatedNPUTensor(torch.Tensor):
    """A tensor that reports ``device.type == "npu"`` while its data is a CPU tensor (``._cpu``)."""

    _cpu: torch.Tensor

    @staticmethod
    def __new__(cls, cpu: torch.Tensor, requires_grad: bool = False) -> SimulatedNPUTensor:
        _check_dtype(cpu.dtype)
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
        if func is torch.ops.aten._to_copy.default and _is_cpu_device(kwargs.get("device")):
            to_host = True
        elif func is torch.ops.aten._local_scalar_dense.default:
            to_host = True
        elif func is torch.ops.aten.copy_.default and not isinstance(args[0], SimulatedNPUTensor):
            to_host = True
        if to_host:
            _count_host_transfer()
        else:
            _check_dtype(kwargs.get("dtype"))

        cpu_args = tree_map(unwrap, args)
        cpu_kwargs = tree_map(unwrap, kwargs)
        out = func(*cpu_args, **cpu_kwargs)
        if to_host:
            return out

        def wrap(x: Any) -> Any:
            if isinstance(x, torch.Tensor) and not isinstance(x, SimulatedNPUTensor):
                if id(x) in wrappers:  # in-place / out= ops return their (wrapped) argument
                    return wrappers[id(x)]
                return SimulatedNPUTensor(x)
            return x

        return tree_map(wrap, out)


# ----------------------------------------------------------------------------------------- torch.npu


class _NPUModule(types.ModuleType):
    """The ``torch.npu`` stand-in registered with ``torch._register_device_module``."""

    def __init__(self) -> None:
        super().__init__("torch.npu")
        self._current = 0

    def is_available(self) -> bool:
        return True

    def is_initialized(self) -> bool:
        return True

    def device_count(self) -> int:
        return 1

    def current_device(self) -> int:
        return self._current

    def set_device(self, device: Any) -> None:
        index = device if isinstance(device, int) else torch.device(device).index or 0
        if index != 0:
            raise SimulatedNPUError(f"simulated NPU has a single device (npu:0); got set_device({device!r})")
        self._current = index

    def synchronize(self, device: Any = None) -> None:
        """No-op: the simulated device is synchronous."""

    def _is_in_bad_fork(self) -> bool:
        return False

    def manual_seed(self, seed: int) -> None:
        torch.manual_seed(seed)

    def manual_seed_all(self, seed: int) -> None:
        torch.manual_seed(seed)

    def get_device_name(self, device: Any = None) -> str:
        return "Simulated NPU (CPU-backed)"


# -------------------------------------------------------------------------------------- fused ops


def _rms_norm_cpu(x: torch.Tensor, gamma: torch.Tensor, epsilon: float, reduced: bool) -> Any:
    dims = tuple(range(x.dim() - gamma.dim(), x.dim()))
    compute = torch.bfloat16 if reduced else torch.float32
    xc = x.to(compute)
    rstd = torch.rsqrt(xc.pow(2).mean(dim=dims, keepdim=True) + epsilon)
    y = (xc * rstd * gamma.to(compute)).to(x.dtype)
    return y, rstd.to(torch.float32)


def _swiglu_cpu(x: torch.Tensor, dim: int, reduced: bool) -> torch.Tensor:
    compute = torch.bfloat16 if reduced else torch.float32
    a, b = torch.chunk(x.to(compute), 2, dim=dim)
    return (torch.nn.functional.silu(a) * b).to(x.dtype)


def _make_op_impls(defects: Mapping[str, str]) -> Dict[str, Callable[..., Any]]:
    def rms_norm(x: torch.Tensor, gamma: torch.Tensor, epsilon: float = 1e-6) -> Any:
        return _rms_norm_cpu(x, gamma, epsilon, defects.get("npu_rms_norm") == "reduced_precision")

    def swiglu(x: torch.Tensor, dim: int = -1) -> torch.Tensor:
        return _swiglu_cpu(x, dim, defects.get("npu_swiglu") == "reduced_precision")

    return {"npu_rms_norm": rms_norm, "npu_swiglu": swiglu}


def _make_torch_npu_module(device_module: _NPUModule) -> types.ModuleType:
    mod = types.ModuleType(
        "torch_npu", "Stand-in for torch_npu installed by pytest_msprobe.testing.simulated_npu."
    )
    mod.__dict__["__simulated__"] = True
    mod.__version__ = "0.0.0+simulated"  # type: ignore[attr-defined]
    mod.npu = device_module  # type: ignore[attr-defined]

    def npu_rms_norm(x: torch.Tensor, gamma: torch.Tensor, epsilon: float = 1e-6) -> Tuple[torch.Tensor, ...]:
        return torch.ops.npu.npu_rms_norm(x, gamma, epsilon)

    def npu_swiglu(x: torch.Tensor, dim: int = -1) -> torch.Tensor:
        return torch.ops.npu.npu_swiglu(x, dim)

    mod.npu_rms_norm = npu_rms_norm  # type: ignore[attr-defined]
    mod.npu_swiglu = npu_swiglu  # type: ignore[attr-defined]
    return mod


# ------------------------------------------------------------------------------------------ setup


def _refuse_if_real_backend() -> None:
    existing = sys.modules.get("torch_npu")
    if existing is not None and not getattr(existing, "__simulated__", False):
        raise SimulatedNPUError(
            "a real torch_npu is imported in this process; simulated_npu() refuses to replace it "
            "(run simulated-NPU tests in a process without torch_npu)"
        )
    name = torch._C._get_privateuse1_backend_name()
    if not _process_setup_done and name != "privateuseone":
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
        _setup_process_once()


def _setup_process_once() -> None:
    """Process-global, irreversible part: rename PrivateUse1 and register Python device guard/hooks."""
    global _process_setup_done
    if _process_setup_done:
        return
    from torch.utils.backend_registration import _DummyDeviceGuard, _DummyPrivateUse1Hook

    torch.utils.rename_privateuse1_backend(DEVICE_TYPE)
    torch.utils.generate_methods_for_privateuse1_backend(for_storage=False)
    torch._C._acc.register_python_privateuseone_hook(_DummyPrivateUse1Hook())
    torch._C._acc.register_python_privateuseone_device_guard(_DummyDeviceGuard())
    _process_setup_done = True


def _empty_memory_format(size, dtype=None, layout=None, device=None, pin_memory=None, memory_format=None):  # type: ignore[no-untyped-def]
    dtype = dtype if dtype is not None else torch.get_default_dtype()
    _check_dtype(dtype)
    return SimulatedNPUTensor(
        torch.empty(size, dtype=dtype, memory_format=memory_format or torch.contiguous_format)
    )


def _empty_strided(size, stride, dtype=None, layout=None, device=None, pin_memory=None):  # type: ignore[no-untyped-def]
    dtype = dtype if dtype is not None else torch.get_default_dtype()
    _check_dtype(dtype)
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


class SimulatedNPU:
    """Handle returned by :func:`simulated_npu`; counts device->host transfers."""

    def __init__(self, defects: Mapping[str, str]) -> None:
        self.defects: Dict[str, str] = dict(defects)
        self.host_transfers: int = 0
        self.device = torch.device(DEVICE_TYPE, 0) if _process_setup_done else None

    def reset_host_transfers(self) -> None:
        self.host_transfers = 0


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
    global _active
    checked = _validate_defects(defects)
    with _lock:
        if _active is not None:
            raise SimulatedNPUError("simulated_npu() is already active; nesting is not supported")
        _refuse_if_real_backend()
        if hasattr(torch, DEVICE_TYPE) or "torch.npu" in sys.modules:
            raise SimulatedNPUError(
                "torch.npu is already registered by something else; refusing to replace it"
            )
        _setup_process_once()
        state = SimulatedNPU(checked)
        _active = state

    undo: list = []
    try:
        device_module = _NPUModule()
        torch._register_device_module(DEVICE_TYPE, device_module)
        undo.append(lambda: (delattr(torch, DEVICE_TYPE), sys.modules.pop("torch.npu", None)))

        aten_lib = torch.library.Library("aten", "IMPL")  # noqa: TOR901
        undo.append(aten_lib._destroy)
        aten_lib.impl("empty.memory_format", _empty_memory_format, "PrivateUse1")
        aten_lib.impl("empty_strided", _empty_strided, "PrivateUse1")
        aten_lib.impl("_copy_from", _copy_from, "PrivateUse1")
        aten_lib.impl("_copy_from_and_resize", _copy_from_and_resize, "PrivateUse1")

        npu_lib = torch.library.Library("npu", "DEF")  # noqa: TOR901
        undo.append(npu_lib._destroy)
        for name, impl in _make_op_impls(checked).items():
            npu_lib.define(_OP_SCHEMAS[name])
            npu_lib.impl(name, impl, "CPU")

        sys.modules["torch_npu"] = _make_torch_npu_module(device_module)
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
            _active = None
        if errors:  # pragma: no cover
            raise SimulatedNPUError(f"cleanup of simulated_npu() failed: {errors!r}")
