"""The reference side of a comparison: which device is under test, and the CPU inputs of the re-run.

The device under test is where the op's tensors are. The reference always runs on the CPU:
half-precision inputs (fp16, bf16, fp8) are raised to float32 there; when the device under test
*is* the CPU, every floating input is raised to float64 instead (and complex to complex128), so a
CPU-only CI compares float32 kernels against something more exact (msprobe needed torch_npu and
did nothing without it).

Every tensor argument is copied (``.to(..., copy=True)``) *before* the device op runs, so an
in-place op on the device cannot change what the reference sees, and the dumped inputs are the
values the op received (msprobe dumped an in-place op's inputs after they were mutated).
``dtype=`` arguments are raised like the tensors (msprobe forwarded ``dtype=torch.float16``, so
its CPU run could stay in half precision), device
arguments become ``cpu``, and ``half_to_float`` is cleared (the CPU refuses it on non-half inputs).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

CPU = torch.device("cpu")
_LOW_PRECISION = {torch.float16, torch.bfloat16}
for _name in ("float8_e4m3fn", "float8_e5m2", "float8_e4m3fnuz", "float8_e5m2fnuz"):
    if hasattr(torch, _name):
        _LOW_PRECISION.add(getattr(torch, _name))


def reference_dtype(dtype: torch.dtype, device_is_cpu: bool) -> torch.dtype:
    """The dtype the reference computes in for a device tensor of `dtype`."""
    if dtype.is_complex:
        return torch.complex128 if device_is_cpu else dtype
    if not dtype.is_floating_point:
        return dtype
    if device_is_cpu:
        return torch.float64
    return torch.float32 if dtype in _LOW_PRECISION else dtype


def device_under_test(args: tuple, kwargs: dict) -> torch.device | None:
    """The device of the first non-CPU tensor argument, else CPU; None without tensors."""
    found: torch.device | None = None
    stack: list[Any] = [args, kwargs]
    while stack:
        x = stack.pop()
        if isinstance(x, torch.Tensor):
            if x.device.type != "cpu":
                return x.device
            found = CPU
        elif isinstance(x, (list, tuple)):
            stack.extend(x)
        elif isinstance(x, dict):
            stack.extend(x.values())
    return found


def plain_strided(args: tuple, kwargs: dict) -> bool:
    """True when every tensor argument is an ordinary dense tensor with data (not meta/sparse)."""
    stack: list[Any] = [args, kwargs]
    while stack:
        x = stack.pop()
        if isinstance(x, torch.Tensor):
            if x.layout is not torch.strided or x.device.type == "meta" or x.is_quantized:
                return False
        elif isinstance(x, (list, tuple)):
            stack.extend(x)
        elif isinstance(x, dict):
            stack.extend(x.values())
    return True


@dataclass
class ReferenceCall:
    """The CPU arguments of the re-run and, for in-place ops that may be dumped, a pristine copy
    of the arguments the re-run will write into."""

    args: tuple
    kwargs: dict
    pristine_args: tuple | None = None
    pristine_kwargs: dict | None = None


def _convert(x: Any, device_is_cpu: bool) -> Any:
    if isinstance(x, torch.Tensor):
        return x.detach().to(device=CPU, dtype=reference_dtype(x.dtype, device_is_cpu), copy=True)
    if isinstance(x, (list, tuple)):
        items = [_convert(v, device_is_cpu) for v in x]
        return items if isinstance(x, list) else tuple(items)
    if isinstance(x, dict):
        return {k: _convert(v, device_is_cpu) for k, v in x.items()}
    if isinstance(x, torch.dtype):
        return reference_dtype(x, device_is_cpu)
    if isinstance(x, torch.device):
        return CPU
    return x


def _clone(x: Any) -> Any:
    if isinstance(x, torch.Tensor):
        return x.clone()
    if isinstance(x, (list, tuple)):
        items = [_clone(v) for v in x]
        return items if isinstance(x, list) else tuple(items)
    return x


def half_to_float_index(func: Any) -> int | None:
    """Position of a ``half_to_float`` argument (``_softmax``, ``_log_softmax``), else None."""
    for i, a in enumerate(func._schema.arguments):
        if a.name == "half_to_float":
            return i
    return None


def written_arguments(func: Any) -> tuple[tuple[int, ...], tuple[str, ...]]:
    """Positions and names of the arguments the op writes into (``add_``'s self, ``out=``)."""
    pos: list[int] = []
    names: list[str] = []
    for i, a in enumerate(func._schema.arguments):
        if a.alias_info is not None and a.alias_info.is_write:
            pos.append(i)
            names.append(a.name)
    return tuple(pos), tuple(names)


def build_reference(
    args: tuple, kwargs: dict, device_is_cpu: bool, half_to_float: int | None,
    written: tuple[tuple[int, ...], tuple[str, ...]], keep_pristine: bool,
) -> ReferenceCall:
    """CPU copies of the op's arguments for the re-run (made before the device op runs)."""
    ref_args = _convert(args, device_is_cpu)
    ref_kwargs = _convert(kwargs, device_is_cpu)
    if half_to_float is not None:
        if half_to_float < len(ref_args):
            ref_args = ref_args[:half_to_float] + (False,) + ref_args[half_to_float + 1 :]
        elif "half_to_float" in ref_kwargs:
            ref_kwargs["half_to_float"] = False
    call = ReferenceCall(ref_args, ref_kwargs)
    positions, names = written
    if keep_pristine and (positions or names):
        call.pristine_args = tuple(_clone(a) if i in positions else a for i, a in enumerate(ref_args))
        call.pristine_kwargs = {k: (_clone(v) if k in names else v) for k, v in ref_kwargs.items()}
    return call
