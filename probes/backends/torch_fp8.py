"""FP8 inputs for free_benchmark on PyTorch: what an FP8 call's reference is and how much of the
format's range its inputs used.

An FP8 matmul comes in two shapes. torchao's training (`Float8TrainingTensor`, a dispatch
subclass holding ``_data`` in an FP8 format and ``_scale``, which *multiplies* a high-precision
tensor into the format's range) reaches the hooks as a `Torch.mm` on two such tensors, whose
``__torch_dispatch__`` calls ``torch._scaled_mm``; a user can also call ``torch._scaled_mm`` on
plain FP8 tensors and their *inverse* scales. Neither runs on float32 inputs (the subclass
refuses ``.float()``, the kernel wants FP8 operands), so improve_precision's usual raise fails
on them. Their reference is instead the call on the dequantised inputs in float64: the exact
product of the very FP8 values and scales the kernel multiplied, so a correct kernel scores the
output's own rounding and nothing else (probes/backends/fp8_references.py, online_dispatch's
``_scaled_mm`` reference too).

The matmul cannot show a bad scale: its reference starts from the already-cast values. That is
seen at the cast, where the values before it are at hand: a ``Tensor.to`` to an FP8 dtype
(torchao's cast, inside its autograd function, is one) records `probes.core.fp8`'s range use of
its input (saturated, underflowed, flushed) and the cast's own error (2-norm of the dequantised
minus the pre-cast values, relative), as one device array kept against the FP8 result, weakly:
the figures live as long as the FP8 tensor does, the pre-cast values are not kept. torchao clamps
before casting (a saturated cast), so the values the cast sees never exceed the largest one: the
elements exactly *at* it beyond the first (the amax itself lands there) count as saturated. The matmul
then reports the figures of each FP8 input it was given. For FP8 data the probe did not see cast
only the underflow is known (a saturated or a flushed value cannot be told from one that was
448 or 0 before the cast).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable

import torch
from torch.utils.weak import WeakIdKeyDictionary

from probes.backends.torch_flat import flat_call, values_of
from probes.core import fp8
from probes.core.errors import NotMeasurable
from probes.core.thresholds import FLOAT8_DTYPES, LARGEST_FINITE

FP8_TORCH_DTYPES = {getattr(torch, n): n for n in FLOAT8_DTYPES if hasattr(torch, n)}
# [saturated, underflowed, flushed, elements, |deq - x|^2, |x|^2] of the cast's input
CAST_FIGURES = fp8.RANGE_COUNT + 2

_SEEN: WeakIdKeyDictionary = WeakIdKeyDictionary()


@dataclass(frozen=True)
class Fp8Input:
    """One FP8 input of a call: where it is, its format and data, and the range figures of its
    cast when the probe saw it (else figures of the FP8 values themselves, `before_cast` False)."""

    where: str
    format: str
    data: torch.Tensor
    figures: Any  # device float64 array, CAST_FIGURES long
    before_cast: bool


def fp8_name(t: Any) -> str | None:
    return FP8_TORCH_DTYPES.get(t.dtype) if isinstance(t, torch.Tensor) else None


def training_parts(t: Any) -> tuple[torch.Tensor, torch.Tensor] | None:
    """(FP8 data, scale) of a torchao-style scaled subclass (``_data`` in an FP8 dtype and a
    ``_scale`` tensor, its own ``__torch_dispatch__``), else None. By shape, not by import: the
    probe does not depend on torchao."""
    if type(t) is torch.Tensor or not isinstance(t, torch.Tensor):
        return None
    data, scale = getattr(t, "_data", None), getattr(t, "_scale", None)
    if fp8_name(data) is None or not isinstance(scale, torch.Tensor):
        return None
    return data, scale


def is_training_fp8(t: Any) -> bool:
    return training_parts(t) is not None


NOT_REBUILT = ("an FP8 input of tensor subclass {what} without __tensor_flatten__ / __tensor_unflatten__: "
               "its perturbed data cannot be put back around its scale")


def data_parts(t: Any) -> tuple[torch.Tensor, Any] | str:
    """(FP8 data, rebuild) of a torchao-style FP8 tensor, for the noise modes: they edit the data
    in its format's grid, and `rebuild` puts the edited data back with the very same scale and
    metadata through the subclass's own ``__tensor_flatten__`` / ``__tensor_unflatten__`` (the
    protocol torch.compile uses), so the re-run is the same FP8 kernel on the perturbed operand
    and the probe still imports no torchao. A str: why the data cannot be edited."""
    parts = training_parts(t)
    flatten, unflatten = getattr(t, "__tensor_flatten__", None), getattr(type(t), "__tensor_unflatten__", None)
    if parts is None or flatten is None or unflatten is None:
        return NOT_REBUILT.format(what=type(t).__name__)
    names, meta = flatten()
    inner = {n: getattr(t, n) for n in names}
    key = next((n for n, v in inner.items() if v is parts[0]), None)
    if key is None:
        return NOT_REBUILT.format(what=type(t).__name__)
    size, stride = t.size(), t.stride()

    def rebuild(data: torch.Tensor) -> Any:
        return unflatten({**inner, key: data}, meta, size, stride)

    return parts[0], rebuild


def dequantised(t: Any) -> Any:
    """A torchao FP8 tensor as the float64 values it stands for (data / scale), else None."""
    parts = training_parts(t)
    if parts is None:
        return None
    data, scale = parts
    return data.double() / scale.double()


def _figures(values: torch.Tensor, data: torch.Tensor, inverse_scale: Any, name: str, wide: torch.dtype,
             clipped: bool = False) -> torch.Tensor:
    xp = _xp()
    use = fp8.range_use_figures(xp, values, name, wide)
    v = values.to(wide)
    if clipped:  # clamped before the cast: what saturated sits on the largest value, but the amax's own element
        at_top = (v.abs() == LARGEST_FINITE[name]).sum().to(wide)
        use = use + torch.stack([(at_top - 1.0).clamp(min=0.0), *(at_top * 0.0,) * (fp8.RANGE_COUNT - 1)])
    deq = data.to(wide) if inverse_scale is None else data.to(wide) * inverse_scale
    err = (deq.reshape(-1) - v.reshape(-1)).square().sum()
    return torch.cat([use, torch.stack([err, v.square().sum()])])


def _xp() -> Any:
    import array_api_compat.torch as xp_torch

    return xp_torch


def note_cast(args: tuple, kwargs: dict, out: Any, wide_of: Callable[[torch.device], torch.dtype]) -> None:
    """Keep the range use of a cast to FP8 against its result (module docstring). The values
    cast are the scaled ones (torchao multiplies before casting), so the cast's error is measured
    in the format's own units, where it is the same relative error as after dequantising."""
    name = fp8_name(out)
    src = args[0] if args else None
    if name is None or not isinstance(src, torch.Tensor) or type(src) is not torch.Tensor or fp8_name(src):
        return
    if not src.is_floating_point() or src.numel() == 0 or src.shape != out.shape:
        return
    with torch.no_grad():
        _SEEN[out] = _figures(src.detach(), out, None, name, wide_of(out.device), clipped=True)


def no_fp8_data(values: Any) -> bool:
    """No value of a flat call (torch_flat) is a plain tensor of an FP8 dtype."""
    return FP8_TORCH_DTYPES.keys().isdisjoint(values_of(values, "dtype"))


def fp8_inputs(args: tuple, kwargs: dict, wide_of: Callable[[torch.device], torch.dtype]) -> list[Fp8Input]:
    """The call's FP8 inputs: torchao FP8 tensors and plain FP8 tensors, positional then keyword."""
    if flat_call(args, kwargs) and no_fp8_data((*args, *kwargs.values())):
        return []  # the usual call, on every checked call: plain tensors of other dtypes
    found: list[Fp8Input] = []
    for i, x in enumerate((*args, *kwargs.values())):
        if type(x) is torch.Tensor and x.dtype not in FP8_TORCH_DTYPES or not isinstance(x, torch.Tensor):
            continue  # the usual input, on every checked call: no FP8 data
        where = f"args[{i}]" if i < len(args) else list(kwargs)[i - len(args)]
        parts = training_parts(x)
        data = parts[0] if parts is not None else x if fp8_name(x) else None
        if data is None:
            continue
        name = fp8_name(data)
        assert name is not None
        seen = _SEEN.get(data)
        before_cast = seen is not None
        if seen is None:
            with torch.no_grad():
                seen = _figures(data, data, None, name, wide_of(data.device))
        found.append(Fp8Input(where, name, data, seen, before_cast))
    return found


def raised(x: Any) -> Any:
    """improve_precision's argument of an FP8 call: torchao FP8 tensors dequantised, every other
    floating tensor in float64 too (one dtype for the float64 product)."""
    deq = dequantised(x)
    if deq is not None:
        return deq
    if isinstance(x, torch.Tensor) and x.is_floating_point() and fp8_name(x) is None:
        return x.detach().double()
    return x


def _on_host(tree: Any) -> Any:
    """Device tensors copied to the CPU, where the float64 references run (an NPU has no float64)."""
    from torch.utils._pytree import tree_map

    return tree_map(lambda x: x.detach().to("cpu") if isinstance(x, torch.Tensor) and x.device.type != "cpu" else x,
                    tree)


def scaled_mm_reference(*args: Any, **kwargs: Any) -> Any:
    """``torch._scaled_mm``'s improve_precision re-run: online_dispatch's float64 product of the
    call's own FP8 operands and scales (probes/backends/fp8_references.py), on the CPU; a layout it does not model is a skip (NotMeasurable)."""
    from probes.backends.fp8_references import scaled_mm

    args, kwargs = _on_host((args, kwargs))
    try:
        return scaled_mm(*args, **kwargs)
    except NotImplementedError as exc:
        raise NotMeasurable(f"torch._scaled_mm: {exc}") from exc


def quant_matmul_reference(*args: Any, **kwargs: Any) -> Any:
    """torch_npu's ``npu_quant_matmul``'s improve_precision re-run: its float64 definition on the
    CPU (probes/backends/npu_references.py); raising its FP8 operands to float32 would only
    re-run a kernel that takes none. A call it does not model is a skip (NotMeasurable)."""
    from probes.backends.npu_references import npu_quant_matmul

    args, kwargs = _on_host((args, kwargs))
    try:
        return npu_quant_matmul(*args, **kwargs)
    except NotImplementedError as exc:
        raise NotMeasurable(str(exc)) from exc
