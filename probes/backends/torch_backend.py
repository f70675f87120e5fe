"""PyTorch adapter: dtypes, casts, bit views, RNG, rank. Imported only by torch-facing code."""

from __future__ import annotations

import os
from typing import Any

import torch

from probes.backends import (
    torch_autodiff,
    torch_dtensor,
    torch_fp8,
    torch_host,
    torch_kernels,
    torch_leaves,
    torch_memory,
    torch_xp,
)
from probes.backends.base import BackendDefaults, bit_view_table, scaled_options
from probes.backends.host_arrays import bound_figures, ratio_figures
from probes.backends.host_arrays import scaled_figures as host_scaled_figures
from probes.backends.torch_equality import host_equal
from probes.backends.torch_rerun import GradOff, replayed, rng_state, set_rng_state
from probes.core import metrics
from probes.core.precision_raise import raised_dtype

try:  # array-api-compat gives the torch namespace the core's formulas are written against
    import array_api_compat.torch as _xp_torch
except ImportError:  # pragma: no cover - declared dependency; keep a clear message
    _xp_torch = None

_DTYPE_NAMES = {
    torch.float16: "float16",
    torch.bfloat16: "bfloat16",
    torch.float32: "float32",
    torch.float64: "float64",
}
# the dtypes improve_precision raises to float32 (probes.core.precision_raise.LOW_PRECISION)
_VF: Any = torch._C._VariableFunctions
_LOW_PRECISION = {torch.float16, torch.bfloat16}
_WIDER_COMPLEX = {("half", torch.complex32): torch.complex64, ("float32", torch.complex64): torch.complex128}
# Devices whose kernels largely lack float64 (Ascend NPUs, Apple MPS): improve_precision's float64
# re-run of a float32 call happens on the CPU there, with the inputs copied over.
NO_FLOAT64_DEVICES = frozenset({"npu", "mps"})
# (prefix, API) -> improve_precision's float64 re-run of an API that multiplies FP8 operands
_FP8_REFERENCES = {("Torch", "_scaled_mm"): torch_fp8.scaled_mm_reference,
                   ("NPU", "npu_quant_matmul"): torch_fp8.quant_matmul_reference}


def widest_float(device: Any) -> torch.dtype:
    """float64, or float32 on a device without float64 (what figures and statistics compute or
    cross to the host in there)."""
    return torch.float32 if torch.device(device).type in NO_FLOAT64_DEVICES else torch.float64
for _name in ("float8_e4m3fn", "float8_e5m2", "float8_e4m3fnuz", "float8_e5m2fnuz", "float8_e8m0fnu"):
    if hasattr(torch, _name):
        _LOW_PRECISION.add(getattr(torch, _name))


_max = torch._C.TensorBase.max


class TorchBackend(BackendDefaults):
    name = "pytorch"
    Tensor = torch.Tensor
    bit_dtypes = bit_view_table(lambda name: getattr(torch, name, None))  # FP8 formats too

    def is_tensor(self, x: Any) -> bool:
        return isinstance(x, torch.Tensor)

    def is_float(self, t: Any) -> bool:
        return t.is_floating_point() and not t.is_meta  # (is_meta: no device object made)

    def dtype_name(self, t: Any) -> str:
        name = _DTYPE_NAMES.get(t.dtype)  # (the default is made only when needed: every checked call asks)
        return name if name is not None else str(t.dtype).replace("torch.", "")

    def dtype_repr(self, t: Any) -> str:
        return str(t.dtype)

    shape_repr = staticmethod(torch_host.shape_repr)  # str(t.shape), each shape's made once

    def numel(self, t: Any) -> int:
        return t.numel()

    def shape(self, t: Any) -> tuple[int, ...]:
        return tuple(t.shape)

    def namespace(self, t: Any) -> Any:
        if _xp_torch is None:
            raise ImportError("array-api-compat is required: pip install array-api-compat")
        return _xp_torch

    def is_low_precision(self, t: Any) -> bool:
        return t.dtype in _LOW_PRECISION or t.dtype == torch.complex32

    def is_complex(self, t: Any) -> bool:
        return t.is_complex() and t.device.type != "meta"

    def upcast(self, t: Any) -> Any:
        """float32 copy of a low-precision float tensor (same device), else the tensor itself."""
        if isinstance(t, torch.Tensor) and t.dtype in _LOW_PRECISION:
            return t.detach().to(torch.float32)
        return t

    def raise_precision(self, x: Any, source: str, on_cpu: bool = False) -> Any:
        """improve_precision's raise of one argument leaf, or None when it stays as it is.
        source "fp8": a torchao FP8 tensor among the inputs, dequantised with every other
        floating input in float64; "half": fp16/bf16/fp8 tensors and dtype arguments become float32; "float32":
        float32 tensors and every narrower dtype argument become float64 (`on_cpu`: copied to
        the CPU first, for devices without float64). Raising `dtype=` with the tensors keeps
        calls like vector_norm(x, dtype=torch.bfloat16) checkable."""
        if source == "fp8":  # an FP8 (torchao) call: everything in float64 (torch_fp8.raised)
            if isinstance(x, torch.dtype) and x.is_floating_point:
                return torch.float64
            return torch_fp8.raised(x)
        if isinstance(x, torch.Tensor):
            if x.is_complex():  # complex32 -> complex64 (half), complex64 -> complex128 (float32)
                wider = _WIDER_COMPLEX.get((source, x.dtype))
                if wider is None:
                    return x.detach().to("cpu") if on_cpu else None
                return x.detach().to(device="cpu" if on_cpu else x.device, dtype=wider)
            target = raised_dtype(source, self.dtype_name(x))
            if target is None:
                return x.detach().to("cpu") if on_cpu and source != "half" else None
            if source == "half":
                return x.detach().to(torch.float32)
            return x.detach().to(device="cpu" if on_cpu else x.device, dtype=torch.float64)
        if isinstance(x, torch.dtype) and x.is_floating_point:
            target = raised_dtype(source, _DTYPE_NAMES.get(x, str(x).replace("torch.", "")), argument=True)
            return None if target is None else getattr(torch, target)
        return None

    def measured_leaves(self, t: Any) -> list[tuple[tuple[str, ...], Any]]:
        return torch_leaves.measured(t)

    value_parts = staticmethod(torch_leaves.value_parts)  # (on every checked call: no method frame around it)

    def in_transform(self) -> bool:
        return torch_leaves.in_transform()

    usual_call = staticmethod(torch_leaves.usual_call)  # free_benchmark's usual path (usual_call.py)

    copies_too_large = staticmethod(torch_memory.copies_too_large)

    def backward_reason(self, args: tuple, kwargs: dict) -> str | None:
        return torch_leaves.backward_reason(args, kwargs)

    def fp8_inputs(self, args: tuple, kwargs: dict) -> list[Any]:
        return torch_fp8.fp8_inputs(args, kwargs, widest_float)  # float32 figures where float64 is missing

    def is_scaled_fp8(self, t: Any) -> bool:
        return torch_fp8.is_training_fp8(t)

    def note_fp8_cast(self, args: tuple, kwargs: dict, out: Any) -> None:
        torch_fp8.note_cast(args, kwargs, out, widest_float)

    def fp8_reference(self, qualname: str, prefix: str = "Torch") -> Any:
        return _FP8_REFERENCES.get((prefix, qualname))

    def local_call(self, args: tuple, kwargs: dict) -> Any:
        return torch_dtensor.local_call(args, kwargs)

    def outside_transforms(self) -> Any:
        return torch_leaves.outside_transforms()

    def real_view(self, t: Any) -> Any:
        return torch.view_as_real(t.detach().resolve_conj()) if t.is_complex() else t

    def host_callable(self, prefix: str, qualname: str, original: Any) -> Any:
        """torch_npu's operators have no CPU kernel: on the host they are their documented math
        (probes/backends/npu_references.py), or a reason to skip."""
        if prefix != "NPU":
            return original
        from probes.backends import npu_references

        found = npu_references.reference_for(qualname)
        return found if found is not None else npu_references.no_reference_reason(f"NPU.{qualname}")

    def lacks_float64(self, t: Any) -> bool:
        return t.device.type in NO_FLOAT64_DEVICES

    # the scaled rule's formula runs over torch's C functions, which user patches of the torch
    # module (torch.sum replaced by a test's seeded defect) leave alone; torch's max/min return
    # NaN when an element is NaN, so the fast pass can be trusted to notice one
    nan_propagating = True
    # the perturbations may edit the arrays they made themselves in place (clamp_, sub_, add_,
    # bitwise_xor_): fewer fresh buffers per perturbed input
    edits_in_place = True

    def scaled_namespace(self, t: Any) -> Any:
        return torch_xp

    def scaled_bound_figures(self, a: Any, b: Any) -> Any:
        """The scaled rule's bound figures: host numbers at once for small plain CPU tensors
        (as ratio_reductions), else device figures."""
        found = self.host_scaled_bound(a, b)
        return found if found is not None else super().scaled_bound_figures(a, b)

    def scaled_figures(self, a: Any, b: Any, eps: float, elementwise: bool = False, finite: bool = False) -> Any:
        """The scaled rule's figures: the fast pass's host numbers at once for small plain CPU
        tensors, else device figures (the robust pass, for outputs holding inf/NaN, always)."""
        found = self.host_scaled_figures(a, b, eps, elementwise) if finite else None
        return found if found is not None else super().scaled_figures(a, b, eps, elementwise, finite)

    def host_scaled_bound(self, a: Any, b: Any) -> list[float] | None:
        """scaled_bound_figures' host numbers for small plain CPU tensors in a's compute dtype (a float64
        reference of a float32 output rounded; larger one-dtype float32/64 pairs: torch_kernels), else None."""
        views = torch_host.host_pair(a, b, a)
        return torch_kernels.scaled_bound(a, b) if views is None else bound_figures(*views)

    def host_scaled_figures(self, a: Any, b: Any, eps: float, elementwise: bool = False) -> list[float] | None:
        """scaled_figures' fast pass as host numbers for small plain CPU tensors, else None."""
        views = torch_host.host_pair(a, b, a)
        return None if views is None else host_scaled_figures(*views, eps, tuple(b.shape), **scaled_options(elementwise))

    def ratio_reductions(self, a: Any, b: Any, tol: float) -> Any:
        """metrics.ratio_reductions for an original leaf `a` and a perturbed leaf `b`: host
        numbers at once for small plain CPU tensors (NumPy on their memory, torch_host.py), else
        device figures computed in place on two temporaries per chunk, each chunk cast to the
        compute dtype on its own: on the CPU a fresh output buffer costs as much as the
        arithmetic, and no full-size float32 copy of a bf16 output is ever made.
        tests/unit/core/test_metrics.py checks both against the core formula."""
        found = self.host_ratio_reductions(a, b, tol)
        return found if found is not None else self.device_ratio_reductions(a, b, tol)

    def host_ratio_reductions(self, a: Any, b: Any, tol: float) -> list[float] | None:
        """ratio_reductions' host numbers for plain CPU tensors (torch_kernels, or NumPy), else None."""
        found = torch_kernels.ratio_figures(a, b, tol)
        if found is not None:
            return found
        views = torch_host.host_pair(a, b, b)
        return None if views is None else ratio_figures(*views, tol)

    def device_ratio_reductions(self, a: Any, b: Any, tol: float) -> Any:
        """ratio_reductions computed by torch's kernels, on the tensors' device."""
        dtype = b.dtype if b.dtype in (torch.float32, torch.float64) else torch.float32
        a = a.detach()
        b = b.detach()
        parts = []
        for ca, cb in metrics.iter_chunks(self.namespace(b), a, b):
            ca = ca.to(device=b.device, dtype=dtype)
            cb = cb.to(dtype=dtype)
            # torch's C functions and methods, not torch.*: user code may have patched the module;
            # the two sides' abs and clamp in one call each
            r, s = _VF._foreach_abs([ca, cb])
            _VF._foreach_clamp_min_([r, s], tol)
            lo, hi = r.div_(s).aminmax()
            parts.append(_VF.stack([hi, lo, _VF.mul(ca, cb, out=s).amin()]))
        return metrics.combine_ratio_parts(self.namespace(b), parts)

    def to_compute(self, t: Any, like: Any) -> Any:
        """The dtype and device the ratio metric runs in: like's dtype, at least float32."""
        dtype = like.dtype if like.dtype in (torch.float32, torch.float64) else torch.float32
        return t.detach().to(device=like.device, dtype=dtype)

    def cast_like(self, t: Any, like: Any) -> Any:
        return t.detach().to(device=like.device, dtype=like.dtype)

    def clone(self, t: Any) -> Any:
        return t.detach().clone()

    def to_cpu_float(self, t: Any) -> Any:
        deq = torch_fp8.dequantised(t)  # an FP8 (torchao) tensor: the values it stands for
        if deq is not None:
            return deq.to("cpu")
        if isinstance(t, torch.Tensor):
            t = t.detach().to("cpu")
            return t.to(torch.float32) if t.dtype in _LOW_PRECISION else t
        return t

    def to_float64_cpu(self, t: Any) -> Any:
        return t.detach().to(device="cpu", dtype=torch.float64)

    def host_floats(self, arrays: list[Any]) -> list[list[float]]:
        """One host transfer per device for all the figures of a call."""
        if not arrays:
            return []
        sizes = [len(a) if type(a) is list else a.numel() for a in arrays]
        by_device: dict[Any, list[int]] = {}
        for i, a in enumerate(arrays):
            by_device.setdefault(None if type(a) is list else a.device, []).append(i)
        out: list[list[float]] = [[] for _ in arrays]
        for device, idx in by_device.items():
            if device is None:  # figures on the host already (any_differ's CPU answer)
                for i in idx:
                    out[i] = list(arrays[i])
                continue
            # figures are computed in float32 or wider, so a device without float64 loses nothing
            # by sending them as float32
            flat = torch.cat([arrays[i].reshape(-1).to(widest_float(device)) for i in idx]).tolist()
            pos = 0
            for i in idx:
                out[i] = flat[pos : pos + sizes[i]]
                pos += sizes[i]
        return out

    # True/False for plain CPU tensors, answered on the host at once; None: measure on the device
    host_equal = staticmethod(host_equal)

    band_edited = staticmethod(torch_kernels.band_edited)
    # the one-pass kernels on plain CPU pairs (compare.ratio_at_once and equal_at_once ask them first)
    kernel_ratio_figures = staticmethod(torch_kernels.ratio_figures)
    kernel_equal = staticmethod(torch_kernels.all_equal)
    first_float = staticmethod(torch_host.first_float)  # a flat call's first float input (perturbations.build_usual)

    def host_workspace(self, t: Any, moves_only: bool = False) -> tuple[Any, Any, Any] | None:
        """NumPy views for the perturbations of small plain CPU tensors (torch_host.workspace)."""
        return torch_host.workspace(t, moves_only)

    def host_max(self, t: Any) -> Any:
        """The largest element of a plain CPU tensor (read at no transfer's cost), else None."""
        return _max(t).item() if torch_host.plain_cpu(t) and t.numel() else None

    def any_differ(self, a: Any, b: Any) -> Any:
        """Device scalar: number of differing elements (integer/bool outputs are compared exactly,
        not by a float ratio that turns any index change into a huge error). Equal plain CPU
        tensors get [0.0], on the host already (torch_equality.py)."""
        if host_equal(a, b):
            return [0.0]
        b = b.to(device=a.device)
        if a.shape != b.shape:
            return torch.tensor([float(max(a.numel(), 1))], device=a.device)
        return (a != b).sum().reshape(1).to(widest_float(a.device))

    def no_grad(self) -> Any:
        return GradOff()

    replayed = staticmethod(replayed)  # replay.replay in one frame (torch_rerun)

    def rng_snapshot(self, args: Any) -> Any:
        """Generator states before the original call, so the re-run draws the same numbers and
        the user's random stream continues exactly as without the probe."""
        return rng_state()

    def rng_restore(self, snapshot: Any) -> None:
        set_rng_state(snapshot)

    def rank(self) -> int:
        """Global rank: the process group's; before ``init_process_group``, the ``RANK`` that
        torchrun (or torch.distributed.launch) gave the worker, so a probe started first still
        names its files by the global rank instead of writing rank0 on every rank; else 0.
        No exception path (msprobe caught only RuntimeError, but torch raises ValueError without a
        process group, so single-process runs wrote no rows)."""
        dist = torch.distributed
        if dist.is_available() and dist.is_initialized():
            return dist.get_rank()
        return _env_int("RANK", 0)

    def is_distributed(self) -> bool:
        """An initialised process group, or a worker of a multi-process launch (WORLD_SIZE > 1)
        that has not initialised it yet: its files must not collide with its peers'."""
        dist = torch.distributed
        return bool(dist.is_available() and dist.is_initialized()) or _env_int("WORLD_SIZE", 1) > 1

    def replace_data(self, target: Any, source: Any) -> None:
        # `.data` keeps the user's tensor object and its autograd graph (fix changes forward values only)
        target.data = source.detach().to(device=target.device, dtype=target.dtype)


BACKEND = TorchBackend()
TorchBackend.autodiff = torch_autodiff  # the backward stage's hooks and VJPs (probes.backends.base.Autodiff)


def _env_int(name: str, default: int) -> int:
    """A non-negative integer environment variable set by the launcher, else ``default``."""
    text = os.environ.get(name, "").strip()
    return int(text) if text.isdigit() else default
