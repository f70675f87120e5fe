"""The host copies of an op's arguments for its reference re-run, and the dtype they compute in.

Every tensor argument is copied (a cast or a clone, never a view), so nothing the device op or
the program does afterwards changes what the reference sees, and the dumped inputs are the values
the op received (msprobe dumped an in-place op's inputs after they were mutated). Half-precision
inputs (fp16, bf16, fp8) are raised to float32; when the device under test *is* the CPU, every
floating input is raised to float64 instead (and complex to complex128). ``dtype=`` arguments are
raised like the tensors (msprobe forwarded ``dtype=torch.float16``, so its CPU run could stay in
half precision), device arguments become ``cpu``, and ``half_to_float`` is cleared (the CPU
refuses it on non-half inputs). The reference runner makes the same copies in C++
(torch_reference_runner.cpp, ``convert``) for the ops it takes; `copied_call` gives them back
as a ReferenceCall.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable

import torch

from probes.online_dispatch.call_scan import CPU

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


@dataclass
class ReferenceCall:
    """The CPU arguments of the re-run and, for in-place ops that may be dumped, a pristine copy
    of the arguments the re-run will write into."""

    args: tuple
    kwargs: dict
    pristine_args: tuple | None = None
    pristine_kwargs: dict | None = None


# (device dtype, device under test is the CPU) -> the cast of a CPU tensor to its reference dtype
# (reference_dtype), for every tensor argument of every compared op: `double()` and `float()`
# parse no arguments and take about half the time of `to(dtype)`; a tensor already in its
# reference dtype is cloned (the re-run may write into its copy)
_CASTS: dict[tuple[torch.dtype, bool], Callable[[torch.Tensor], torch.Tensor]] = {}
_CAST_METHODS = {torch.float64: torch.Tensor.double, torch.float32: torch.Tensor.float}


def _cast(dtype: torch.dtype, device_is_cpu: bool) -> Callable[[torch.Tensor], torch.Tensor]:
    target = reference_dtype(dtype, device_is_cpu)
    if target is dtype:
        return torch.Tensor.clone
    return _CAST_METHODS.get(target) or (lambda x: x.to(target))


def _copy(x: torch.Tensor, device_is_cpu: bool) -> torch.Tensor:
    """A CPU copy of `x` in its reference dtype, never a view, with no autograd history (called
    with grad mode off)."""
    if not x.is_cpu:
        return x.detach().to(device=CPU, dtype=reference_dtype(x.dtype, device_is_cpu), copy=True)
    key = (x.dtype, device_is_cpu)
    cast = _CASTS.get(key)
    if cast is None:
        cast = _CASTS[key] = _cast(x.dtype, device_is_cpu)
    return cast(x)


_AS_IS = (int, float, bool, str, type(None))  # arguments the re-run takes as they are (most besides tensors)


def _convert(x: Any, device_is_cpu: bool) -> Any:
    if isinstance(x, torch.Tensor):
        return _copy(x, device_is_cpu)
    if isinstance(x, (list, tuple)):
        items = [_copy(v, device_is_cpu) if isinstance(v, torch.Tensor) else v if isinstance(v, _AS_IS)
                 else _convert(v, device_is_cpu) for v in x]  # a tensor copied without a frame of _convert
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


def build_reference(
    args: tuple, kwargs: dict, device_is_cpu: bool, half_to_float: int | None,
    written: tuple[tuple[int, ...], tuple[str, ...]], keep_pristine: bool,
) -> ReferenceCall:
    """CPU copies of the op's arguments for the re-run (made before the device op runs)."""
    ref_args = _convert(args, device_is_cpu)
    ref_kwargs = _convert(kwargs, device_is_cpu) if kwargs else {}
    if half_to_float is not None:
        ref_args, ref_kwargs = _half_to_float_off(ref_args, ref_kwargs, half_to_float)
    call = ReferenceCall(ref_args, ref_kwargs)
    positions, names = written
    if keep_pristine and (positions or names):
        call.pristine_args = tuple(_clone(a) if i in positions else a for i, a in enumerate(ref_args))
        call.pristine_kwargs = {k: (_clone(v) if k in names else v) for k, v in ref_kwargs.items()}
    return call


def _half_to_float_off(ref_args: tuple, ref_kwargs: dict, position: int) -> tuple[tuple, dict]:
    """The re-run computes in its reference dtype: half_to_float (at `position`) set False."""
    if position < len(ref_args):
        return ref_args[:position] + (False,) + ref_args[position + 1 :], ref_kwargs
    if "half_to_float" in ref_kwargs:
        ref_kwargs["half_to_float"] = False
    return ref_args, ref_kwargs


def copied_call(args: tuple, kwargs: dict, copies: list[Any], positions: dict[str, int],
                half_to_float: int | None) -> ReferenceCall:
    """The ReferenceCall of a host op whose copies the reference runner made (`copies`: the
    reference's argument at each position of the schema where it holds tensors, else None; the
    other arguments are the call's own, which the rows and dumps read as build_reference's)."""
    ref_args = tuple([a if c is None else c for a, c in zip(args, copies)])
    ref_kwargs = {k: v if (c := copies[positions[k]]) is None else c for k, v in kwargs.items()} if kwargs else {}
    if half_to_float is not None:
        ref_args, ref_kwargs = _half_to_float_off(ref_args, ref_kwargs, half_to_float)
    return ReferenceCall(ref_args, ref_kwargs)
