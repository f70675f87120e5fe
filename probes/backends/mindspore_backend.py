"""MindSpore adapter (PyNative): dtypes, casts, bit views, RNG, rank. Imported only by
MindSpore-facing code; the rest of the project runs without MindSpore installed.

The array formulas of the core (probes.core.metrics, probes.free_benchmark.perturbations) run on
MindSpore tensors through probes.backends.mindspore_xp. MindSpore's CPU target lacks some kernels
for bfloat16 (Abs, Greater, ...): the namespace handed to the core computes magnitudes of bf16
tensors in float32, which gives the same gates (every bf16 value is exact in float32).
"""

from __future__ import annotations

import types
from contextlib import nullcontext
from typing import Any

import mindspore as ms
import mindspore.common.dtype as mstype
from mindspore import Tensor

from probes.backends import mindspore_autodiff, mindspore_xp
from probes.backends.base import BackendDefaults

mindspore_xp.warm_up()  # NumPy 2: the first operator of a process fails once

_DTYPE_NAMES = {
    mstype.float16: "float16",
    mstype.bfloat16: "bfloat16",
    mstype.float32: "float32",
    mstype.float64: "float64",
}
_INT_VIEW = {"float16": mstype.int16, "bfloat16": mstype.int16, "float32": mstype.int32, "float64": mstype.int64}
_LOW_PRECISION = {mstype.float16, mstype.bfloat16}
_FLOATS = set(_DTYPE_NAMES)
_COMPUTE = (mstype.float32, mstype.float64)


def _abs(x: Any) -> Any:
    if isinstance(x, Tensor) and x.dtype == mstype.bfloat16:  # no bf16 Abs kernel on the CPU target
        return mindspore_xp.abs(x.astype(mstype.float32))
    return mindspore_xp.abs(x)


# mindspore_xp with the bf16-safe abs; every other name is mindspore_xp's own function.
XP = types.SimpleNamespace(**{k: v for k, v in vars(mindspore_xp).items() if not k.startswith("__")})
XP.abs = _abs


class MindSporeBackend(BackendDefaults):
    name = "mindspore"
    Tensor = Tensor

    def is_tensor(self, x: Any) -> bool:
        return isinstance(x, Tensor)

    def is_float(self, t: Any) -> bool:
        return t.dtype in _FLOATS

    def dtype_name(self, t: Any) -> str:
        return _DTYPE_NAMES.get(t.dtype, str(t.dtype).lower())

    def dtype_repr(self, t: Any) -> str:
        return str(t.dtype)  # Float16 (spec §6.1)

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

    def bit_view(self, t: Any) -> Any:
        return t.view(_INT_VIEW[self.dtype_name(t)])

    def from_bit_view(self, bits: Any, like: Any) -> Any:
        return bits.view(like.dtype)

    def host_floats(self, arrays: list[Any]) -> list[list[float]]:
        return [a.astype(mstype.float64).asnumpy().reshape(-1).tolist() for a in arrays]

    def any_differ(self, a: Any, b: Any) -> Any:
        if tuple(a.shape) != tuple(b.shape):
            return Tensor([float(max(int(a.size), 1))], mstype.float64)
        return (a != b).astype(mstype.float64).sum().reshape(1)

    def no_grad(self) -> Any:
        no_grad = getattr(ms, "_no_grad", None)
        return no_grad() if no_grad is not None else nullcontext()

    def rng_snapshot(self, args: Any) -> Any:
        try:
            return ms.get_rng_state()
        except Exception:  # older MindSpore: no global generator state
            return None

    def rng_restore(self, snapshot: Any) -> None:
        if snapshot is not None:
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
