"""The interface between the framework-free tools and a framework (torch, mindspore)."""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterable, Mapping, Sequence
from contextlib import AbstractContextManager
from typing import Any, Protocol

from probes.core.thresholds import FLOAT8_DTYPES


class Autodiff(Protocol):
    """What free_benchmark's backward stage needs from a framework's autodiff.

    The forward call saves its inputs; the backward pass hands the real cotangents of the call's
    outputs to a one-shot callback; the callback recomputes vector-Jacobian products there.
    Nothing here may outlive the autograd graph it is attached to."""

    def recording(self) -> bool:
        """True when the current call is being recorded for a backward pass."""
        ...

    def requires_grad(self, t: Any) -> bool:
        """True when a gradient can flow to (input) or from (output) this tensor."""
        ...

    def in_backward_pass(self) -> bool:
        """True while a backward pass runs the current call (a framework that cannot tell may
        leave it out: its backward passes are then never seen)."""
        ...

    def save_input(self, t: Any, copy: bool) -> Any:
        """The input as kept until the backward pass: on its device, detached, shared storage
        unless `copy` (the API mutates its inputs)."""
        ...

    def version(self, t: Any) -> int | None:
        """A counter that changes when the tensor is modified in place (None: not tracked)."""
        ...

    def forward_context(self) -> Any:
        """The ambient state of the forward call (autocast) the recomputation must replay."""
        ...

    def recompute(self, context: Any) -> AbstractContextManager[Any]:
        """Where the backward callback recomputes: grad recording on, the forward's context."""
        ...

    def on_backward(self, outputs: Sequence[Any], callback: Callable[[list[Any]], None]) -> Any:
        """Call `callback(cotangents)` once, during the backward pass, with the real upstream
        gradient of each output (None for an output that received none); the gradients flow on
        unchanged. The hooks die with the outputs' graph. Returns a handle (weak-referenceable)
        with `remove()`, which drops the callback and is safe inside a backward pass, and
        `release()`, which also unregisters the hooks and is called outside one."""
        ...

    def vjp(self, fn: Callable[..., Sequence[Any]], primals: Sequence[Any], cotangents: Sequence[Any]) -> list[Any]:
        """Gradients of <fn(*primals), cotangents> with respect to each primal (None when a
        primal does not reach the outputs). `fn` returns a sequence aligned with `cotangents`;
        a None cotangent counts as zeros; a cotangent is cast to its output's dtype/device."""
        ...


class Backend(Protocol):
    """What a tool needs from a framework. Dtype names are neutral ("float16", ...)."""

    name: str

    def is_tensor(self, x: Any) -> bool: ...
    def is_float(self, t: Any) -> bool: ...
    def dtype_name(self, t: Any) -> str: ...
    def dtype_repr(self, t: Any) -> str: ...
    def shape_repr(self, t: Any) -> str: ...
    def numel(self, t: Any) -> int: ...
    def shape(self, t: Any) -> tuple[int, ...]: ...
    def namespace(self, t: Any) -> Any: ...
    def to_compute(self, t: Any, like: Any) -> Any: ...
    def upcast(self, t: Any) -> Any: ...
    def cast_like(self, t: Any, like: Any) -> Any: ...
    def clone(self, t: Any) -> Any: ...
    def to_cpu_float(self, t: Any) -> Any: ...
    def to_float64_cpu(self, t: Any) -> Any: ...
    def bit_view(self, t: Any) -> Any: ...
    def from_bit_view(self, bits: Any, like: Any) -> Any: ...
    def host_floats(self, arrays: list[Any]) -> list[list[float]]: ...
    def any_differ(self, a: Any, b: Any) -> Any: ...
    def no_grad(self) -> AbstractContextManager[Any]: ...
    def rng_snapshot(self, args: Any) -> Any: ...
    def rng_restore(self, snapshot: Any) -> None: ...
    def rank(self) -> int: ...
    def replace_data(self, target: Any, source: Any) -> None: ...

    autodiff: Autodiff  # the backward stage's hooks and vector-Jacobian products


#: The integer format a float's bits are edited and compared in: the same width, and signed, so
#: +1 on the view is one ulp away from zero for either sign; FP8 bytes unsigned, as the
#: perturbations clear the sign bit to order them (probes/free_benchmark/perturbations.py).
BIT_VIEW_DTYPES: Mapping[str, str] = {"float16": "int16", "bfloat16": "int16", "float32": "int32",
                                      "float64": "int64", **dict.fromkeys(FLOAT8_DTYPES, "uint8")}


def bit_view_table(dtype_of: Callable[[str], Any], names: Iterable[str] = BIT_VIEW_DTYPES) -> dict[Any, Any]:
    """BIT_VIEW_DTYPES in a framework's own dtypes (`dtype_of` a name, None where the framework
    lacks it), for the float formats `names` it edits bit by bit. Keyed by the framework's dtype,
    so a view costs one lookup on the tensor's dtype, not a name's."""
    table = {dtype_of(name): dtype_of(BIT_VIEW_DTYPES[name]) for name in names}
    table.pop(None, None)
    return table


class BitViews:
    """bit_view and from_bit_view for any array type with NumPy's ``view(dtype)``: a backend
    supplies only its table (bit_view_table), so every framework views a format at one width."""

    bit_dtypes: Mapping[Any, Any] = {}

    def bit_view(self, t: Any) -> Any:
        return t.view(self.bit_dtypes[t.dtype])

    def from_bit_view(self, bits: Any, like: Any) -> Any:
        return bits.view(like.dtype)


class BackendDefaults(BitViews):
    """Implementations a backend inherits unless it has a faster one of its own."""

    def namespace(self, t: Any) -> Any:  # pragma: no cover - every backend defines it
        raise NotImplementedError

    def to_compute(self, t: Any, like: Any) -> Any:  # pragma: no cover - every backend defines it
        raise NotImplementedError

    def measured_leaves(self, t: Any) -> list[tuple[tuple[str, ...], Any]]:
        """The plain tensors a comparison measures for output leaf `t`, each with the sub-path
        it is shown under; raises probes.core.errors.NotMeasurable when there are none."""
        return [((), t)]

    def value_parts(self, t: Any) -> tuple[Any, Callable[[Any], Any]] | str | None:
        """None when a perturbation edits `t`'s elements as they are; else (values, rebuild) for
        a tensor edited through its values buffer, or why its elements cannot be edited."""
        return None

    def backward_reason(self, args: tuple, kwargs: dict) -> str | None:
        """Why the backward stage cannot recompute this call's gradients (its inputs' layout), or None."""
        return None

    def local_call(self, args: tuple, kwargs: dict) -> Any:
        """For a call on distributed tensors (DTensor), what re-runs it on this rank's local
        tensors (probes/backends/torch_dtensor.py LocalCall) or why nothing can (a str); None for
        a call on the framework's ordinary tensors."""
        return None

    def fp8_inputs(self, args: tuple, kwargs: dict) -> list[Any]:
        """The call's inputs in an 8-bit float format with their range figures
        (probes/backends/torch_fp8.py Fp8Input); a framework without FP8 tensors has none."""
        return []

    def is_scaled_fp8(self, t: Any) -> bool:
        """A tensor that holds FP8 data and its scale (torchao's): improve_precision dequantises it."""
        return False

    def note_fp8_cast(self, args: tuple, kwargs: dict, out: Any) -> None:
        """Remember the range use of a cast to FP8 for the matmuls that read its result."""

    def fp8_reference(self, qualname: str, prefix: str = "Torch") -> Callable[..., Any] | None:
        """improve_precision's re-run of an API whose inputs are FP8 data and scales (no
        float32 kernel to raise them to), or None."""
        return None

    def copies_too_large(self, args: tuple, kwargs: dict, out: Any) -> str | None:
        """Why a re-run with copies of the call's tensors would not fit in the memory left, or None."""
        return None

    def is_complex(self, t: Any) -> bool:
        """A complex tensor: perturbed and compared through its real and imaginary parts."""
        return False

    def in_transform(self) -> bool:
        """True while a function transform (torch.func) wraps the tensors of the current call."""
        return False

    def outside_transforms(self) -> AbstractContextManager[Any]:
        """Where figures are computed: outside every function transform, so they are plain
        tensors that can be read after the transform ends, and the transform sees none of them."""
        return contextlib.nullcontext()

    def real_view(self, t: Any) -> Any:
        """A complex tensor as a float tensor of its real and imaginary parts; others as they are."""
        return t

    def host_callable(self, prefix: str, qualname: str, original: Callable[..., Any]) -> Callable[..., Any] | str:
        """What re-runs an API on the host (to_cpu, a float64 re-run off a device without it,
        preheat's CPU sample): the API itself, or a stand-in for a device-only operator; a
        string (the reason) when there is none."""
        return original

    def lacks_float64(self, t: Any) -> bool:
        """True when the tensor's device cannot run float64 kernels (the re-run goes to the CPU)."""
        return False

    def scaled_figures(self, a: Any, b: Any, eps: float, elementwise: bool = False, finite: bool = False) -> Any:
        """The scaled rule's device figures (probes.core.scaled.scaled_error) of an original
        leaf `a` against a reference leaf `b`, in b's compute dtype and on b's device
        (`elementwise`: each element at its own magnitude). `finite`: the fast pass, whose result
        is non-finite whenever a value is (the caller then asks again without it); a backend
        whose reductions drop NaN ignores it.

        Both sides are compared in a's compute dtype (at least float32) on a's device: a float64
        reference of a float32 output is rounded to float32 first, which moves the figure by at
        most half an fp32 ulp (the thresholds are hundreds to thousands of ulps) and halves the
        bytes every pass reads."""
        from probes.core import scaled

        if not finite and self.lacks_float64(a):
            # the robust pass computes in float64, which the device lacks: it runs on the host
            # (only for outputs holding inf/NaN, so the copy is rare)
            a, b = self.to_cpu_float(a), self.to_cpu_float(b)
        return scaled.scaled_error(self.scaled_namespace(a), self.to_compute(a, a), self.to_compute(b, a), eps,
                                   self.shape(b), finite=finite and self.nan_propagating,
                                   **scaled_options(elementwise))

    def scaled_bound_figures(self, a: Any, b: Any) -> Any:
        """probes.core.scaled.bound_figures of a against b, compared as in `scaled_figures`."""
        from probes.core import scaled

        return scaled.bound_figures(self.scaled_namespace(a), self.to_compute(a, a), self.to_compute(b, a))

    def scaled_namespace(self, t: Any) -> Any:
        return self.namespace(t)

    nan_propagating = False  # whether max/min reductions return NaN when an element is NaN

    def ratio_reductions(self, a: Any, b: Any, tol: float) -> Any:
        """The ratio rule's device figures (probes.core.metrics.ratio_reductions) for an
        original leaf `a` and a perturbed leaf `b` of any float dtype."""
        from probes.core import metrics

        return metrics.ratio_reductions(self.namespace(b), self.to_compute(a, b), self.to_compute(b, b), tol)


def scaled_options(elementwise: bool) -> dict[str, Any]:
    """scaled_error's arguments for judging every element at its own magnitude."""
    return {"floor": 0.0, "min_row": 1} if elementwise else {}
