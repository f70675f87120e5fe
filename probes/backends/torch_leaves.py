"""What of a torch tensor a probe can read, perturb and re-run, in the programs users really run.

A user's test suite is made of more than plain strided tensors: `torch.func` transforms wrap
them (vmap's BatchedTensor, grad's and jvp's GradTrackingTensor, functionalize's wrapper),
`torch.nested` jagged tensors, `torch.masked.MaskedTensor`, sparse layouts, their own
`__torch_function__` / `__torch_dispatch__` subclasses; tracers (make_fx, FakeTensorMode,
torch.jit.trace) run the program on tensors without values. free_benchmark's figures are plain
torch operators read on the host later, so each of these needs a decision:

- a DTensor is measured through its local tensor, when its call computed nothing but the local
  kernels (probes/backends/torch_dtensor.py decides, and says why not otherwise), an
  AsyncCollectiveTensor through the collective's result it wraps;
- a call being traced, or run under a user's dispatch mode (a FlopCounterMode, a logging
  mode), is not re-run at all: the re-run would enter the traced graph or be seen by the mode;
- a tensor without values (meta, fake) or of an unknown `__torch_dispatch__` subclass: the
  call is skipped, with the type named;
- a functorch-wrapped tensor is measured on its real values: unwrapped down to the plain
  tensor below every transform level (each vmap level's batch dimension moved to the front),
  with the interpreter stack cleared, so the figures are plain tensors that outlive the
  transform and the transform sees none of the probe's operators;
- nested, masked and sparse tensors are measured through their values (and their structure,
  compared exactly); the perturbations that edit elements edit the values and rebuild the tensor;
  a torchao FP8 tensor is re-run as it is (improve_precision: dequantised), and edited through
  its FP8 data, rebuilt around the same scale;
- a `__torch_function__`-only subclass is measured through a plain view of its storage, so the
  user's subclass does not see the measure's operators.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from typing import Any

import torch

from probes.backends import torch_dtensor, torch_fp8
from probes.backends.torch_flat import any_true, flat_call
from probes.core.errors import NotMeasurable

_functorch = torch._C._functorch
_MODE_KEYS = torch._C._TorchDispatchModeKey
_PLAIN_DISPATCH = torch.Tensor.__torch_dispatch__

# reasons a call is not re-run (summary.json's not_checked keys)
TRACING = "traced ({what}): a re-run would enter the traced program, and its tensors have no values to compare"
DISPATCH_MODE = ("a TorchDispatchMode is active ({what}): the re-run's operators would be seen by it (counted, "
                 "logged or recorded as the program's)")
NO_VALUES = "a {what} input has no values to compare (shape propagation or tracing)"
SUBCLASS = ("input of tensor subclass {what}, which defines its own __torch_dispatch__: its values are not a "
            "tensor free_benchmark can read (nested, masked, sparse and functorch tensors are measured)")



def in_transform() -> bool:
    """True while a torch.func transform (vmap, grad, vjp, jvp, jacrev, functionalize...) runs."""
    return _functorch.peek_interpreter_stack() is not None


_NO_TRANSFORM = contextlib.nullcontext()


def outside_transforms() -> contextlib.AbstractContextManager[Any]:
    """Run the enclosed operators as if no transform were active (the levels come back after);
    outside a transform, a shared no-op (this is on every checked call's path)."""
    if _functorch.peek_interpreter_stack() is None:
        return _NO_TRANSFORM
    from torch._functorch.pyfunctorch import temporarily_clear_interpreter_stack

    return temporarily_clear_interpreter_stack()


def _mode_name(mode: Any) -> str:
    return type(mode).__name__


def state_reason() -> str | None:
    """Why no call may be re-run now (a tracer or a user's dispatch mode is active), or None."""
    if torch._C._is_tracing():  # torch.jit.is_tracing() in eager code
        return TRACING.format(what="torch.jit.trace")
    if not torch._C._len_torch_dispatch_stack():  # the usual call: no mode at all (the count includes
        return None  # the proxy and fake modes of make_fx and export)
    proxy = torch._C._get_dispatch_mode(_MODE_KEYS.PROXY)
    if proxy is not None:
        return TRACING.format(what=f"make_fx / export, {_mode_name(proxy)}")
    fake = torch._C._get_dispatch_mode(_MODE_KEYS.FAKE)
    if fake is not None:
        return TRACING.format(what=f"{_mode_name(fake)}")
    if torch._C._len_torch_dispatch_stack():
        mode = torch._C._get_dispatch_stack_at(torch._C._len_torch_dispatch_stack() - 1)
        return DISPATCH_MODE.format(what=_mode_name(mode))
    return None


def _known_subclass(t: torch.Tensor) -> bool:
    """A dispatch subclass whose values the probe knows how to read (see `measured`)."""
    return t.is_nested or _is_masked(t)


def _device_stand_in(kind: type) -> bool:
    """A subclass that stands for a plain tensor of a device (pytest_msprobe.testing's simulated
    NPU says so with ``__simulated_device__``): measured as the device tensor it stands for."""
    return getattr(kind, "__simulated_device__", None) is not None


def _is_masked(t: Any) -> bool:
    return type(t).__name__ == "MaskedTensor" and hasattr(t, "get_mask")


def input_reason(t: torch.Tensor) -> str | None:
    """Why a call with this tensor among its inputs is not re-run, or None when it can be."""
    kind = type(t)
    if kind is torch.Tensor or kind is torch.nn.Parameter:
        if t.device.type == "meta":
            return NO_VALUES.format(what="meta")
        return None
    if _functorch.is_functorch_wrapped_tensor(t) or _device_stand_in(kind):
        return None
    if getattr(kind, "__torch_dispatch__", _PLAIN_DISPATCH) is _PLAIN_DISPATCH:
        return NO_VALUES.format(what="meta") if t.device.type == "meta" else None
    if "FakeTensor" in kind.__name__:
        return NO_VALUES.format(what=kind.__name__)
    if _known_subclass(t) or torch_fp8.is_training_fp8(t):
        return None  # an FP8 tensor: re-run dequantised, or with its FP8 data perturbed (torch_fp8)
    if torch_dtensor.handled(kind):
        return None  # DTensor, a collective's result: re-run on the local tensors when torch_dtensor finds it safe
    return SUBCLASS.format(what=kind.__name__)


def _args_reason(args: tuple, kwargs: dict) -> str | None:
    for x in args:
        if isinstance(x, torch.Tensor):
            if type(x) is not torch.Tensor or x.device.type == "meta":
                why = input_reason(x)
                if why is not None:
                    return why
        elif isinstance(x, (list, tuple)) and x and isinstance(x[0], torch.Tensor):  # cat, stack, einsum
            why = _args_reason(tuple(x), {})
            if why is not None:
                return why
    if kwargs:
        return _args_reason(tuple(kwargs.values()), {})
    return None


SPARSE_BACKWARD = ("a sparse input: the backward stage's vector-Jacobian products run on strided tensors "
                   "(the forward stage judges sparse calls)")


def backward_reason(args: tuple, kwargs: dict) -> str | None:
    """Why the backward stage cannot recompute this call's gradients, or None."""
    try:
        for x in (*args, *kwargs.values()):
            if isinstance(x, torch.Tensor) and x.layout not in (torch.strided, torch.jagged):
                return SPARSE_BACKWARD
            if torch_fp8.is_training_fp8(x):
                return FP8_BACKWARD if torch.is_grad_enabled() else FP8_IN_FUNCTION
    except Exception as exc:
        return INSPECT_FAILED.format(what=type(exc).__name__)
    return None


# torchao differentiates its FP8 matmuls in its own autograd Function (Float8Linear's
# matmul_with_hp_or_float8_args), whose forward runs them unrecorded and whose backward computes
# the gradients with FP8 matmuls of its own, on the gradient cast to e5m2: those are the matmul's
# vector-Jacobian product, and the backward stage judges them as calls of the backward pass
FP8_IN_FUNCTION = ("an FP8 (torchao) call that an autograd Function's forward runs unrecorded: its "
                   "vector-Jacobian product is that Function's backward, whose FP8 matmuls the backward stage "
                   "judges as calls of the backward pass")
FP8_BACKWARD = ("an FP8 (torchao) input of a recorded call: through the subclass its vector-Jacobian product "
                "multiplies a plain gradient by an FP8 tensor, which torchao refuses (its autograd Function's "
                "backward, judged as calls of the backward pass, is how FP8 matmuls are differentiated)")
INSPECT_FAILED = "its inputs could not be inspected ({what}); the call ran unchanged"


def call_reason(args: tuple, kwargs: dict) -> str | None:
    """Why this call is not re-run, from the state it runs in and its inputs; None: it is.
    Never raises: an input the checks cannot inspect is itself the reason."""
    try:
        why = state_reason()
        if why is None and flat_call(args, kwargs):  # the usual call, read in C (torch_flat)
            meta = any_true(args, "is_meta") or bool(kwargs) and any_true(kwargs.values(), "is_meta")
            return NO_VALUES.format(what="meta") if meta else None
        return why or _args_reason(args, kwargs)
    except Exception as exc:
        return INSPECT_FAILED.format(what=type(exc).__name__)


def usual_call(args: tuple, kwargs: dict) -> bool:
    """Whether the call is the usual one, that free_benchmark's usual path (usual_call.py) checks:
    plain tensors (no meta, no FP8 data) and scalar-like values, outside any tracer, dispatch mode
    and torch.func transform. False sends it down the general path, which asks each question in turn."""
    if state_reason() is not None or in_transform() or not flat_call(args, kwargs):
        return False
    values = (*args, *kwargs.values()) if kwargs else args
    return not any_true(values, "is_meta") and torch_fp8.no_fp8_data(values)


# measuring ---------------------------------------------------------------------------------------


def _unwrap_functorch(t: torch.Tensor) -> torch.Tensor:
    """The plain tensor below every transform level, each vmap level's batch dimension in front
    (innermost level first): the same layout for an output and its re-run, whose levels match."""
    bdims = []
    while _functorch.is_functorch_wrapped_tensor(t):
        bdims.append(_functorch.maybe_get_bdim(t) if _functorch.is_batchedtensor(t) else None)
        t = _functorch.get_unwrapped(t)
    front = 0
    for bdim in reversed(bdims):
        if bdim is not None:
            t = t.movedim(bdim + front, front)
            front += 1
    return t


def measured(t: torch.Tensor) -> list[tuple[tuple[str, ...], torch.Tensor]]:
    """The plain strided tensors a probe measures for an output leaf, with the sub-path each
    is shown under (() for the leaf itself); NotMeasurable says why there are none. Call it
    outside any transform (`outside_transforms`)."""
    if _functorch.is_functorch_wrapped_tensor(t):
        t = _unwrap_functorch(t)
    kind = type(t)
    if kind is not torch.Tensor and not _device_stand_in(kind):
        if getattr(kind, "__torch_dispatch__", _PLAIN_DISPATCH) is _PLAIN_DISPATCH:
            t = t.as_subclass(torch.Tensor)  # the user's __torch_function__ sees none of the measure
        elif t.is_nested:
            return [(("values",), t.values())]
        elif _is_masked(t):
            data, mask = t.get_data(), t.get_mask()
            return [(("data",), torch.where(mask, data, torch.zeros((), dtype=data.dtype))), (("mask",), mask)]
        elif "FakeTensor" in kind.__name__:
            raise NotMeasurable(NO_VALUES.format(what=kind.__name__))
        else:
            raise NotMeasurable(f"an output of tensor subclass {kind.__name__} (its own __torch_dispatch__) has no "
                                "values free_benchmark can read")
    if t.device.type == "meta":
        raise NotMeasurable(NO_VALUES.format(what="meta"))
    if t.is_nested:  # strided nested tensor: its components, one after the other
        return [(("values",), torch.cat([c.reshape(-1) for c in t.unbind()]))]
    if t.layout != torch.strided:
        coo = t.to_sparse_coo().coalesce() if t.layout != torch.sparse_coo else t.coalesce()
        return [(("values",), coo.values()), (("indices",), coo.indices())]
    return [((), t)]


def value_parts(t: torch.Tensor) -> tuple[torch.Tensor, Callable[[torch.Tensor], torch.Tensor]] | str | None:
    """For the perturbations that edit elements: None when `t` is edited as it is; else its
    values buffer and how to rebuild a tensor of its kind around edited values, or why it
    cannot be edited."""
    if type(t) is torch.Tensor and t.layout == torch.strided and not t.is_nested:
        if t.is_complex():  # edited through its real and imaginary parts
            return torch.view_as_real(t.resolve_conj()), torch.view_as_complex
        return None
    if _functorch.is_functorch_wrapped_tensor(t) or _device_stand_in(type(t)):
        return None  # element-wise operators run through the transform
    if type(t) is not torch.Tensor and getattr(type(t), "__torch_dispatch__", _PLAIN_DISPATCH) is _PLAIN_DISPATCH:
        return None
    if t.is_nested and t.layout == torch.jagged:
        offsets, lengths = t.offsets(), t.lengths()
        return t.values(), lambda v: torch.nested.nested_tensor_from_jagged(v, offsets=offsets, lengths=lengths)
    if torch_fp8.is_training_fp8(t):  # its FP8 data, rebuilt around the same scale
        return torch_fp8.data_parts(t)
    if _is_masked(t):
        from torch.masked import masked_tensor

        mask = t.get_mask()
        return t.get_data(), lambda v: masked_tensor(v, mask)
    if t.layout == torch.sparse_coo:
        coo = t.coalesce()
        return coo.values(), lambda v: torch.sparse_coo_tensor(coo.indices(), v, coo.shape, is_coalesced=True)
    return f"a {t.layout} tensor's elements cannot be edited one by one"
