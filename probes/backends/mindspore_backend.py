"""MindSpore adapter (PyNative): dtypes, casts, bit views, RNG, rank. Imported only by
MindSpore-facing code; the rest of the project runs without MindSpore installed.

The array formulas of the core (probes.core.metrics, probes.free_benchmark.perturbations) run on
MindSpore tensors through probes.backends.mindspore_xp. MindSpore's CPU target lacks some kernels
for bfloat16 (Abs, Greater, ...): the namespace handed to the core computes magnitudes of bf16
tensors in float32, which gives the same gates (every bf16 value is exact in float32).

Host arrays on the CPU target. PyNative dispatches every operator on its own, ~0.05-0.5 ms each
however small the tensor, so a check made of a dozen tiny operators costs as much as a layer of
the model. On the CPU target a tensor's memory is host memory: ``asnumpy()`` is a view (no copy;
it only waits for the operators queued before it), and the same core formulas run on it through
NumPy's array-API namespace for a few microseconds each. So for float16/32/64 (NumPy has no
bfloat16) and integer tensors of up to HOST_MAX_ELEMENTS elements, the comparison figures
(ratio_reductions, any_differ) and the perturbations (host_workspace) are computed with NumPy and
give the same values: elementwise IEEE arithmetic and exact max/min reductions, the same in both.
bfloat16, which NumPy lacks, is cast to float32 by MindSpore before its ratio figures (one
operator) and handed to change_value, add_noise and bit_noise (which only move elements or edit
their bits) as int16 bit patterns. NumPy is single-threaded, so bigger tensors, where MindSpore's multi-threaded
kernels win and the dispatch cost no longer matters, and other device targets (where asnumpy is a
real copy) keep the MindSpore path.
"""

from __future__ import annotations

import types
from contextlib import nullcontext
from typing import Any

import mindspore as ms
import mindspore.common.dtype as mstype
import numpy as np
from mindspore import Tensor

from probes.backends import mindspore_autodiff, mindspore_xp
from probes.backends.base import BackendDefaults, bit_view_table, scaled_options
from probes.backends.host_arrays import COMPUTE_DTYPES, HOST_ARRAYS, bound_figures, ratio_figures
from probes.backends.host_arrays import scaled_figures as host_scaled_figures
from probes.backends.mindspore_rng import GeneratorWatch, LazyState
from probes.core.precision_raise import raised_dtype

mindspore_xp.warm_up()  # NumPy 2: the first operator of a process fails once

_DTYPE_NAMES = {
    mstype.float16: "float16",
    mstype.bfloat16: "bfloat16",
    mstype.float32: "float32",
    mstype.float64: "float64",
}
_LOW_PRECISION = {mstype.float16, mstype.bfloat16}
_FLOATS = set(_DTYPE_NAMES)
_COMPUTE = (mstype.float32, mstype.float64)
# dtypes whose tensors NumPy can view on the host (NumPy has no bfloat16)
_HOST_VIEWABLE = {mstype.float16, mstype.float32, mstype.float64, mstype.bool_, mstype.int8, mstype.uint8,
                  mstype.int16, mstype.int32, mstype.int64}
#: Tensors up to this many elements are compared and perturbed with NumPy on the CPU target
#: (see the module docstring): 4 Mi elements, 16 MiB of float32, where a NumPy pass takes a few
#: ms, as long as MindSpore's dispatch of the dozen operators it replaces.
HOST_MAX_ELEMENTS = 1 << 22


def _abs(x: Any) -> Any:
    if isinstance(x, Tensor) and x.dtype == mstype.bfloat16:  # no bf16 Abs kernel on the CPU target
        return mindspore_xp.abs(x.astype(mstype.float32))
    return mindspore_xp.abs(x)


# mindspore_xp with the bf16-safe abs; every other name is mindspore_xp's own function.
XP = types.SimpleNamespace(**{k: v for k, v in vars(mindspore_xp).items() if not k.startswith("__")})
XP.abs = _abs


def _from_host(a: Any) -> Any:
    """A MindSpore tensor holding the NumPy array `a`, which only the probe holds: shared, not copied."""
    return ms.from_numpy(np.ascontiguousarray(a))


_WATCH = GeneratorWatch.of_default_generator()  # None: this MindSpore's snapshots are eager


def _from_host_bits_bf16(bits: Any) -> Any:
    return _from_host(bits).view(mstype.bfloat16)


class MindSporeBackend(BackendDefaults):
    name = "mindspore"
    Tensor = Tensor
    # the floats this backend names (is_float): it edits no FP8 tensor bit by bit
    bit_dtypes = bit_view_table(lambda name: getattr(mstype, name, None), _DTYPE_NAMES.values())
    _cpu_target: bool | None = None

    def is_tensor(self, x: Any) -> bool:
        return isinstance(x, Tensor)

    def is_float(self, t: Any) -> bool:
        return t.dtype in _FLOATS

    def dtype_name(self, t: Any) -> str:
        return _DTYPE_NAMES.get(t.dtype, str(t.dtype).lower())

    def dtype_repr(self, t: Any) -> str:
        return str(t.dtype)  # Float16, as msprobe's MindSpore CSV writes it

    def shape_repr(self, t: Any) -> str:
        return str(tuple(t.shape))  # (4, 4)

    def numel(self, t: Any) -> int:
        return int(t.size)

    def shape(self, t: Any) -> tuple[int, ...]:
        return tuple(t.shape)

    def namespace(self, t: Any) -> Any:
        return XP

    def is_low_precision(self, t: Any) -> bool:
        return t.dtype in _LOW_PRECISION

    def upcast(self, t: Any) -> Any:
        if isinstance(t, Tensor) and t.dtype in _LOW_PRECISION:
            return t.astype(mstype.float32)
        return t

    # the device has no float64 (Ascend) and a PyNative call cannot be moved to the CPU here:
    # improve_precision then skips float32 calls with that reason (see lacks_float64)
    reruns_on_cpu = False
    _ascend: bool | None = None

    def lacks_float64(self, t: Any) -> bool:
        if self._ascend is None:  # the target is fixed once MindSpore has run an operator
            MindSporeBackend._ascend = ms.get_context("device_target") == "Ascend"
        return bool(self._ascend)

    def raise_precision(self, x: Any, source: str, on_cpu: bool = False) -> Any:
        """improve_precision's raise of one argument leaf (see the torch backend), or None.
        MindSpore's CPU and GPU targets run float64; `on_cpu` does not arise here."""
        if isinstance(x, Tensor):
            target = raised_dtype(source, self.dtype_name(x))
            return None if target is None else x.astype(getattr(mstype, target))
        if isinstance(x, mstype.Float):
            target = raised_dtype(source, _DTYPE_NAMES.get(x, str(x).lower()), argument=True)
            return None if target is None else getattr(mstype, target)
        return None

    def to_compute(self, t: Any, like: Any) -> Any:
        dtype = like.dtype if like.dtype in _COMPUTE else mstype.float32
        return t.astype(dtype)

    def cast_like(self, t: Any, like: Any) -> Any:
        return t.astype(like.dtype)

    def clone(self, t: Any) -> Any:
        return t.copy()  # Tensor.clone has no CPU kernel

    def to_cpu_float(self, t: Any) -> Any:
        return self.upcast(t)

    def to_float64_cpu(self, t: Any) -> Any:
        return t.astype(mstype.float64)

    def host_floats(self, arrays: list[Any]) -> list[list[float]]:
        """Figures as Python floats; the casts to float64 are NumPy's (exact, and a MindSpore
        Cast costs ~0.5 ms per call). Tensors come through asnumpy (the first waits for the
        queued operators), NumPy figures as they are."""
        out = []
        for a in arrays:
            if isinstance(a, Tensor):
                a = (a.astype(mstype.float32) if a.dtype == mstype.bfloat16 else a).asnumpy()
            out.append(np.asarray(a, dtype=np.float64).reshape(-1).tolist())
        return out

    def host_view(self, t: Any) -> np.ndarray | None:
        """A read-only NumPy view of a tensor on the CPU target (no copy), or None where NumPy
        should not compute on it (see HOST_MAX_ELEMENTS, the module docstring)."""
        if not self._on_host(t) or t.dtype not in _HOST_VIEWABLE:
            return None
        view = t.asnumpy().view()
        view.flags.writeable = False  # asnumpy shares the tensor's memory: never write through it
        return view

    def _on_host(self, t: Any) -> bool:
        """A tensor of the CPU target small enough for NumPy (any dtype)."""
        if not isinstance(t, Tensor) or t.size > HOST_MAX_ELEMENTS:
            return False
        if self._cpu_target is None:  # the target is fixed once MindSpore has run an operator
            MindSporeBackend._cpu_target = ms.get_context("device_target") == "CPU"
        return bool(self._cpu_target)

    def host_workspace(self, t: Any, moves_only: bool = False) -> tuple[Any, Any, Any] | None:
        """(operations, array, back) for the perturbations: they run on a NumPy view of `t`
        with HOST_ARRAYS, and `back` turns their result into a tensor. None: use the tensor.
        `moves_only` (the mode only moves elements or edits their bits): a bfloat16 tensor is
        handed over as its int16 bit patterns, which also avoids MindSpore's bfloat16 ``__setitem__``, missing on
        the CPU target."""
        if moves_only and isinstance(t, Tensor) and t.dtype == mstype.bfloat16 and self._on_host(t):
            bits = self.host_view(t.view(mstype.int16))
            if bits is not None:
                return HOST_ARRAYS, bits, _from_host_bits_bf16
        view = self.host_view(t)
        return None if view is None else (HOST_ARRAYS, view, _from_host)

    def scaled_figures(self, a: Any, b: Any, eps: float, elementwise: bool = False, finite: bool = False) -> Any:
        """The scaled rule's figures on NumPy views where host_view allows (NumPy's reductions
        return NaN for a NaN element, so the fast pass can be trusted; no operator dispatch),
        else with MindSpore operators and the masked pass (ReduceMax drops NaN)."""
        pair = self._host_pair(a, b, a)
        if pair is None:
            return super().scaled_figures(a, b, eps, elementwise, finite=False)
        return host_scaled_figures(*pair, eps, tuple(pair[1].shape), finite=finite, **scaled_options(elementwise))

    def host_scaled_figures(self, a: Any, b: Any, eps: float, elementwise: bool = False) -> list[float] | None:
        """scaled_figures' fast pass as host numbers where host_view allows, else None."""
        pair = self._host_pair(a, b, a)
        return None if pair is None else host_scaled_figures(*pair, eps, tuple(pair[1].shape),
                                                             **scaled_options(elementwise))

    def scaled_bound_figures(self, a: Any, b: Any) -> Any:
        found = self.host_scaled_bound(a, b)
        return found if found is not None else super().scaled_bound_figures(a, b)

    def host_scaled_bound(self, a: Any, b: Any) -> list[float] | None:
        """The scaled rule's bound figures (host_arrays.bound_figures) where host_view allows."""
        pair = self._host_pair(a, b, a)
        return None if pair is None else bound_figures(*pair)

    def ratio_reductions(self, a: Any, b: Any, tol: float) -> Any:
        """The ratio figures (host_arrays.ratio_figures) on NumPy views where host_view allows,
        in the dtype to_compute would give, else on MindSpore tensors (NaN-aware on the host,
        which MindSpore's Maximum and ReduceMax are not: they drop NaN, so a NaN mismatch would
        be reported as a large ratio)."""
        found = self.host_ratio_reductions(a, b, tol)
        return found if found is not None else super().ratio_reductions(a, b, tol)

    def host_ratio_reductions(self, a: Any, b: Any, tol: float) -> list[float] | None:
        pair = self._host_pair(a, b, b)
        return None if pair is None else ratio_figures(*pair, tol)

    def _host_pair(self, a: Any, b: Any, like: Any) -> tuple[np.ndarray, np.ndarray] | None:
        """NumPy views of `a` and `b` in like's compute dtype (at least float32), or None where
        host_view gives none. bfloat16 leaves are cast to float32 by MindSpore first (one
        operator each; NumPy has no bfloat16): cheaper than the formulas' dozen operators."""
        by_a = like is a
        if (a.dtype == mstype.bfloat16 or b.dtype == mstype.bfloat16) and self._on_host(a) and self._on_host(b):
            a, b = self.to_compute(a, like), self.to_compute(b, like)
        ha, hb = self.host_view(a), self.host_view(b)
        if ha is None or hb is None or hb.dtype.kind != "f" or ha.dtype.kind != "f":
            return None
        dtype = (ha if by_a else hb).dtype
        dtype = dtype if dtype in COMPUTE_DTYPES else np.float32
        return ha.astype(dtype, copy=False), hb.astype(dtype, copy=False)

    def host_equal(self, a: Any, b: Any) -> bool | None:
        """True/False for two tensors of one dtype and shape NumPy can view on the CPU target
        (the semantics of `a != b`: NaN differs, -0.0 equals 0.0), answered at once; else None."""
        if a.dtype != b.dtype or tuple(a.shape) != tuple(b.shape):
            return None
        ha, hb = self.host_view(a), self.host_view(b)
        return None if ha is None or hb is None else bool((ha == hb).all())

    def any_differ(self, a: Any, b: Any) -> Any:
        if tuple(a.shape) != tuple(b.shape):
            return Tensor([float(max(int(a.size), 1))], mstype.float64)
        ha, hb = self.host_view(a), self.host_view(b)
        if ha is not None and hb is not None:
            return np.array([np.count_nonzero(ha != hb)], dtype=np.float64)
        return (a != b).astype(mstype.float64).sum().reshape(1)

    def no_grad(self) -> Any:
        no_grad = getattr(ms, "_no_grad", None)
        return no_grad() if no_grad is not None else nullcontext()

    def rng_snapshot(self, args: Any) -> Any:
        """The default generator's state, read only if something changes it (mindspore_rng.GeneratorWatch)."""
        if _WATCH is not None:
            return _WATCH.arm()
        try:
            return ms.get_rng_state()
        except Exception:  # older MindSpore: no global generator state
            return None

    def rng_restore(self, snapshot: Any) -> None:
        if isinstance(snapshot, LazyState):
            _WATCH.restore(snapshot)
        elif snapshot is not None:
            ms.set_rng_state(snapshot)

    def rank(self) -> int:
        """Global rank; 0 when MindSpore's communication is not initialised."""
        if self.is_distributed():
            from mindspore.communication import get_rank

            return int(get_rank())
        return 0

    def is_distributed(self) -> bool:
        try:
            from mindspore.communication.management import GlobalComm
        except ImportError:  # pragma: no cover
            return False
        return bool(getattr(GlobalComm, "INITED", False))

    def drain_errors(self, limit: int = 50) -> int:
        """MindSpore runs operators asynchronously: a failed operator's error is raised at a later
        synchronisation, once per failed task. After a check failed, raise and drop the errors of
        the probe's own queued operators here, so none surfaces later in the user's code (a user
        tensor whose operator failed still raises when it is read). Returns how many were dropped."""
        dropped = clean = 0
        for _ in range(limit):
            try:
                ms.runtime.synchronize()
                (Tensor([1.0], mstype.float32) + 1).asnumpy()
            except Exception:
                dropped += 1
                clean = 0
                continue
            clean += 1
            if clean == 2:
                break
        return dropped

    def replace_data(self, target: Any, source: Any) -> None:
        """fix: write the values into the user's tensor in place, unrecorded, so its place in the
        autograd tape is kept (Tensor.assign_value would cut the gradient: training stops)."""
        with self.no_grad():
            target.copy_(source.astype(target.dtype))


BACKEND = MindSporeBackend()
MindSporeBackend.autodiff = mindspore_autodiff  # the backward stage's hooks and VJPs (probes.backends.base.Autodiff)
