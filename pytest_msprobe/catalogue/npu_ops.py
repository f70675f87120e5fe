"""torch_npu's fused operators in the catalogue (when torch_npu imports: on an Ascend node, or on
the simulated NPU of pytest_msprobe.testing.simulated_npu).

These operators have no CPU kernel; their reference is their documented math in float64
(probes.backends.npu_references), the definition the fused kernel approximates. Inputs are seeded
normal values in the case's dtype (exact in it), in shapes a transformer layer uses.
"""

from __future__ import annotations

from typing import Any, Callable

# operator -> sample builders: each returns (args, kwargs) on the CPU in `dtype`
_HIDDEN = (64, 128)


def _rms_norm(torch: Any, dtype: Any, hidden: int) -> tuple[tuple, dict]:
    return (torch.randn(2, 8, hidden).to(dtype), (1 + 0.1 * torch.randn(hidden)).to(dtype)), {}


def _swiglu(torch: Any, dtype: Any, hidden: int) -> tuple[tuple, dict]:
    return (torch.randn(2, 8, 2 * hidden).to(dtype),), {"dim": -1}


def _rotary(torch: Any, dtype: Any, hidden: int) -> tuple[tuple, dict]:
    angle = torch.rand(1, 8, 1, hidden) * 6.28
    return (torch.randn(2, 8, 4, hidden).to(dtype), torch.cos(angle).to(dtype), torch.sin(angle).to(dtype)), {}


BUILDERS: dict[str, Callable[..., tuple[tuple, dict]]] = {
    "npu_rms_norm": _rms_norm, "npu_swiglu": _swiglu, "npu_rotary_mul": _rotary,
}


def available() -> list[str]:
    """The fused operators of the installed torch_npu the catalogue measures ([] without torch_npu)."""
    import importlib.util
    import sys

    if "torch_npu" not in sys.modules and importlib.util.find_spec("torch_npu") is None:
        return []
    try:
        import torch_npu  # type: ignore[import-not-found]
    except Exception:  # torch_npu present but not importable here (no CANN): nothing to measure
        return []
    from probes.backends.npu_references import reference_for

    return [name for name in BUILDERS if callable(getattr(torch_npu, name, None)) and reference_for(name)]


def samples(name: str, dtype: Any, count: int) -> list[tuple[Any, tuple, dict]]:
    import torch

    out = []
    for i in range(count):
        args, kwargs = BUILDERS[name](torch, dtype, _HIDDEN[i % len(_HIDDEN)])
        out.append((args[0], args[1:], kwargs))
    return out


def call(name: str) -> Callable[..., Any]:
    """Calls torch_npu.<name> on the device (looked up at call time: a probe's wrapper when one
    runs), and its float64 reference on the CPU."""
    import torch

    from probes.backends.npu_references import reference_for

    def run(inp: Any, args: tuple, kwargs: dict) -> Any:
        if inp.device.type == "cpu" and inp.dtype == torch.float64:
            return reference_for(name)(inp, *args, **kwargs)
        import torch_npu  # type: ignore[import-not-found]

        return getattr(torch_npu, name)(inp, *args, **kwargs)

    return run
