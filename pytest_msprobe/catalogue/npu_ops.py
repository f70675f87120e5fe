"""torch_npu's fused operators in the catalogue (when torch_npu imports: on an Ascend node, or on
the simulated NPU of pytest_msprobe.testing.simulated_npu).

These operators have no CPU kernel; their reference is their documented math in float64
(probes.backends.npu_references), the definition the fused kernel approximates. Inputs are seeded
normal values in the case's dtype (exact in it), in shapes a transformer layer uses. The FP8
matmul ``npu_quant_matmul`` is the exception: its dtype is the output's, its operands are FP8
(e4m3fn) as quantised inference makes them (one scale per tensor, or per token of x1 and per
channel of x2), with K of 512 and 1,024 terms, so the accumulating family's test ratio applies.
"""

from __future__ import annotations

from typing import Any, Callable

# operator -> sample builders: each returns (args, kwargs) on the CPU in `dtype` for sample `i`
_HIDDEN = (64, 128)


def _rms_norm(torch: Any, dtype: Any, i: int) -> tuple[tuple, dict]:
    hidden = _HIDDEN[i % 2]
    return (torch.randn(2, 8, hidden).to(dtype), (1 + 0.1 * torch.randn(hidden)).to(dtype)), {}


def _swiglu(torch: Any, dtype: Any, i: int) -> tuple[tuple, dict]:
    return (torch.randn(2, 8, 2 * _HIDDEN[i % 2]).to(dtype),), {"dim": -1}


def _rotary(torch: Any, dtype: Any, i: int) -> tuple[tuple, dict]:
    hidden = _HIDDEN[i % 2]
    angle = torch.rand(1, 8, 1, hidden) * 6.28
    return (torch.randn(2, 8, 4, hidden).to(dtype), torch.cos(angle).to(dtype), torch.sin(angle).to(dtype)), {}


def _quant_matmul(torch: Any, dtype: Any, i: int) -> tuple[tuple, dict]:
    """x1 (m, k) and x2 (k, n) cast to e4m3fn by their amax: on even samples one scale per tensor
    (their product is the dequantisation scale), on odd ones per token of x1 (pertoken_scale) and
    per channel of x2 (scale), with a float32 bias."""
    fmt = torch.float8_e4m3fn
    top = torch.finfo(fmt).max
    m, k, n = 16, 8 * _HIDDEN[i % 2], 32
    a, w = torch.randn(m, k) * 4, torch.randn(k, n) / 4
    if i % 2 == 0:
        sa, sw = a.abs().max() / top, w.abs().max() / top
        return (a.div(sa).to(fmt), w.div(sw).to(fmt), (sa * sw).reshape(1)), {"output_dtype": dtype}
    sa, sw = a.abs().amax(dim=1) / top, w.abs().amax(dim=0) / top
    kwargs = {"pertoken_scale": sa, "bias": torch.randn(n), "output_dtype": dtype}
    return (a.div(sa.unsqueeze(1)).to(fmt), w.div(sw).to(fmt), sw), kwargs


BUILDERS: dict[str, Callable[..., tuple[tuple, dict]]] = {
    "npu_rms_norm": _rms_norm, "npu_swiglu": _swiglu, "npu_rotary_mul": _rotary, "npu_quant_matmul": _quant_matmul,
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
        args, kwargs = BUILDERS[name](torch, dtype, i)
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
