"""The simulated NPU as PyTorch's device registry sees it: the name, the hardware's refusals and the
``torch.npu`` stand-in, with the process-global, irreversible registration that makes them exist.
Kept apart from the tensors and the fused operators, which all lean on it, so that every other
piece of the simulation can import it without a cycle (see
:mod:`pytest_msprobe.testing.simulated_npu`)."""

from __future__ import annotations

import types
from typing import Any, Dict

import torch

DEVICE_TYPE = "npu"

# dtypes the hardware has no storage or compute for, with why: a probe that asks the device for
# one fails here as it would on an Ascend NPU
_UNSUPPORTED_DTYPES: Dict[torch.dtype, str] = {
    torch.float64: "Ascend NPUs have no float64 compute; keep float64 tensors on the CPU",
    **{getattr(torch, name): ("an AMD FP8 variant; Ascend's FP8 formats are float8_e4m3fn and float8_e5m2 "
                              "(and HiFloat8, which PyTorch has no dtype for)")
       for name in ("float8_e4m3fnuz", "float8_e5m2fnuz") if hasattr(torch, name)},
}


class SimulatedNPUError(RuntimeError):
    """Raised for misuse of the simulated NPU and for operations the (simulated) hardware refuses."""


_process_setup_done = False
_device_module: _NPUModule | None = None


def _dtype_error(dtype: torch.dtype) -> SimulatedNPUError:
    alias = " (float64/double)" if dtype == torch.float64 else ""
    return SimulatedNPUError(
        f"{dtype}{alias} is not supported on the NPU: {_UNSUPPORTED_DTYPES[dtype]} "
        "(pytest_msprobe.testing.simulated_npu is strict like the hardware)"
    )


def check_dtype(dtype: torch.dtype | None) -> None:
    """Refuse, as the hardware would, a dtype the device has no storage for: a probe that would
    fail on an Ascend NPU must fail in the simulation too."""
    if dtype in _UNSUPPORTED_DTYPES:
        raise _dtype_error(dtype)


class _NPUModule(types.ModuleType):
    """The ``torch.npu`` stand-in registered with ``torch._register_device_module``."""

    def __init__(self) -> None:
        super().__init__("torch.npu")
        self._current = 0
        self._enabled = False  # True inside a simulated_npu() block

    def is_available(self) -> bool:
        return self._enabled

    def is_initialized(self) -> bool:
        return self._enabled

    def device_count(self) -> int:
        return 1 if self._enabled else 0

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
        # Device random ops run on the CPU generator. Not torch.manual_seed: that calls back into
        # this module's manual_seed_all (unbounded recursion).
        torch.default_generator.manual_seed(seed)

    def manual_seed_all(self, seed: int) -> None:
        torch.default_generator.manual_seed(seed)

    def get_device_name(self, device: Any = None) -> str:
        return "Simulated NPU (CPU-backed)"

    def get_rng_state(self, device: Any = None) -> torch.Tensor:
        return torch.default_generator.get_state()

    def set_rng_state(self, state: torch.Tensor, device: Any = None) -> None:
        torch.default_generator.set_state(state)


def set_enabled(module: _NPUModule, enabled: bool) -> None:
    """Switch ``torch.npu`` between reporting the one device and none. A function of this module, so
    the flag stays private to it and ``torch.npu`` gains no attribute for the simulation's sake."""
    module._enabled = enabled


def process_setup_done() -> bool:
    """Whether `setup_process_once` has run: the rename cannot be undone, so the checks before it
    differ from the ones after."""
    return _process_setup_done


def device_module() -> _NPUModule | None:
    """The ``torch.npu`` stand-in once the process is set up (None before)."""
    return _device_module


def setup_process_once() -> None:
    """Process-global, irreversible part: rename PrivateUse1 and register Python device guard/hooks."""
    global _process_setup_done
    if _process_setup_done:
        return
    from torch.utils.backend_registration import _DummyDeviceGuard, _DummyPrivateUse1Hook

    global _device_module
    torch.utils.rename_privateuse1_backend(DEVICE_TYPE)
    torch.utils.generate_methods_for_privateuse1_backend(for_storage=False)
    torch._C._acc.register_python_privateuseone_hook(_DummyPrivateUse1Hook())
    torch._C._acc.register_python_privateuseone_device_guard(_DummyDeviceGuard())
    # torch.npu stays registered (PyTorch's accelerator API looks it up once PrivateUse1 has hooks,
    # and caches it): outside a simulated_npu() block it reports no device
    _device_module = _NPUModule()
    torch._register_device_module(DEVICE_TYPE, _device_module)
    _process_setup_done = True
