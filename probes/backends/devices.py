"""Which device is under test: `auto` means an NPU when torch_npu imports, else CUDA when
available, else the CPU (DESIGN.md, Devices). torch and torch_npu are imported only here, and
only when a device must be resolved."""

from __future__ import annotations

DEVICES = ("auto", "npu", "cuda", "cpu")


class DeviceUnavailable(RuntimeError):
    """The device asked for is not on this machine."""


def npu_available() -> bool:
    try:
        import torch
        import torch_npu  # noqa: F401 - registers torch.npu
    except Exception:  # not installed, or no driver: the NPU path cannot run here
        return False
    npu = getattr(torch, "npu", None)
    return bool(npu is not None and npu.is_available())


def cuda_available() -> bool:
    try:
        import torch
    except ImportError:
        return False
    return bool(torch.cuda.is_available())


def resolve_device(choice: str = "auto") -> str:
    """"npu", "cuda" or "cpu" for a choice among DEVICES."""
    if choice not in DEVICES:
        raise ValueError(f"device {choice!r}; allowed: {', '.join(DEVICES)}")
    if choice == "cpu":
        return "cpu"
    if choice == "npu":
        if not npu_available():
            raise DeviceUnavailable("no NPU here: torch_npu does not import or sees no device; "
                                    "use --msprobe-device=auto or cpu")
        return "npu"
    if choice == "cuda":
        if not cuda_available():
            raise DeviceUnavailable("no CUDA device here (torch.cuda.is_available() is False); "
                                    "use --msprobe-device=auto or cpu")
        return "cuda"
    if npu_available():
        return "npu"
    return "cuda" if cuda_available() else "cpu"
