"""An array-API-style namespace over MindSpore, so the core's formulas run on MindSpore tensors.

Only the functions the core uses (probes/core/metrics.py, probes/grad_probe/stats.py,
probes/free_benchmark/perturbations.py) are provided, with array-API names and semantics.
Imported only by MindSpore-facing code.
"""

from __future__ import annotations

from typing import Any

import mindspore as ms
import mindspore.common.dtype as mstype
from mindspore import Tensor, ops


class _Bound:
    """mindspore.ops functions as they were when this module was imported: user code (and the
    tests' seeded defects) may replace ``mindspore.ops.sum`` later, and a probe's own figures
    must not go through that replacement."""

    def __init__(self) -> None:
        for name in ("abs", "amax", "amin", "bitwise_xor", "cat", "clamp", "full_like", "isfinite", "isnan", "maximum",
                     "mean", "ones_like", "reshape", "sqrt", "sum", "where", "zeros", "zeros_like"):
            setattr(self, name, getattr(ops, name))


_ops = _Bound()


float16 = mstype.float16
bfloat16 = mstype.bfloat16
float32 = mstype.float32
float64 = mstype.float64
int16 = mstype.int16
int32 = mstype.int32
int64 = mstype.int64
bool = mstype.bool_  # noqa: A001 - array-API name


def _t(x: Any, like: Any = None) -> Any:
    if isinstance(x, Tensor):
        return x
    dtype = like.dtype if isinstance(like, Tensor) else None
    return Tensor(x, dtype=dtype)


def abs(x: Any) -> Any:  # noqa: A001
    return _ops.abs(x)


def maximum(x: Any, y: Any) -> Any:
    return _ops.maximum(x, _t(y, x))


def where(cond: Any, x: Any, y: Any) -> Any:
    return _ops.where(cond, _t(x, y if isinstance(y, Tensor) else None), _t(y, x if isinstance(x, Tensor) else None))


def isfinite(x: Any) -> Any:
    return _ops.isfinite(x)


def isnan(x: Any) -> Any:
    return _ops.isnan(x)


def max(x: Any, axis: Any = None) -> Any:  # noqa: A001
    return _ops.amax(x) if axis is None else _ops.amax(x, axis)


def min(x: Any, axis: Any = None) -> Any:  # noqa: A001
    return _ops.amin(x) if axis is None else _ops.amin(x, axis)


def sum(x: Any, axis: Any = None, dtype: Any = None) -> Any:  # noqa: A001
    if dtype is not None:
        x = x.astype(dtype)
    return _ops.sum(x) if axis is None else _ops.sum(x, axis)


def mean(x: Any) -> Any:
    return _ops.mean(x)


def sqrt(x: Any) -> Any:
    return _ops.sqrt(x)


def stack(xs: Any, axis: int = 0) -> Any:
    # ops.cat of reshaped inputs: MindSpore 2.10's ops.stack costs ~0.8 ms per call on the CPU,
    # 30x the concatenation, and the probes stack a few scalars per checked call
    parts = [_t(x) for x in xs]
    return _ops.cat([p.reshape(p.shape[:axis] + (1,) + p.shape[axis:]) for p in parts], axis)


def concat(xs: Any, axis: int = 0) -> Any:
    return _ops.cat([_t(x) for x in xs], axis)


def reshape(x: Any, shape: Any) -> Any:
    return _ops.reshape(x, shape)


def astype(x: Any, dtype: Any, copy: bool = True) -> Any:  # noqa: FBT001
    return x.astype(dtype)


def asarray(x: Any, dtype: Any = None, device: Any = None) -> Any:
    return Tensor(x, dtype=dtype) if not isinstance(x, Tensor) else (x if dtype is None else x.astype(dtype))


def zeros(shape: Any, dtype: Any = None, device: Any = None) -> Any:
    return _ops.zeros(shape, dtype or float32)


def zeros_like(x: Any) -> Any:
    return _ops.zeros_like(x)


def ones_like(x: Any) -> Any:
    return _ops.ones_like(x)


def full_like(x: Any, value: float) -> Any:
    return _ops.full_like(x, value)


def count_nonzero(x: Any, axis: Any = None) -> Any:
    return _ops.sum(x.astype(int64)) if axis is None else _ops.sum(x.astype(int64), axis)


def bitwise_xor(x: Any, y: Any) -> Any:
    return _ops.bitwise_xor(x, y)


def clip(x: Any, min: Any = None, max: Any = None) -> Any:  # noqa: A002
    return _ops.clamp(x, min, max)


def compiled_namespace() -> Any:
    """This namespace for code compiled into a graph (``mindspore.jit``, GRAPH_MODE): the same
    functions, but :func:`stack` is ``ops.stack``. The concatenation that makes it fast in PyNative
    parses into a reshape per part, and a graph of many stacked figures compiles about twice as
    slowly with it."""
    global _compiled
    if _compiled is None:
        import types

        _compiled = types.SimpleNamespace(**{k: v for k, v in globals().items() if not k.startswith("_")})
        _compiled.stack = ops.stack
    return _compiled


_compiled: Any = None
_warmed = False


def warm_up() -> None:
    """MindSpore 2.x built against NumPy 1 fails the first operator of a process once under NumPy 2
    ('A module that was compiled using NumPy 1.x cannot be run in NumPy 2...', printed with a
    traceback by the extension itself, straight to file descriptor 2); every later operator works.
    Run one throw-away operator with that descriptor pointed at /dev/null, so neither the failure nor
    its print reaches the user. Installing NumPy < 2 with MindSpore (the `mindspore` extra does)
    avoids it altogether."""
    global _warmed
    if _warmed:
        return
    _warmed = True
    if not _numpy_2():
        return
    import os
    import sys

    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except Exception:  # a closed or replaced stream: nothing buffered to lose
            pass
    import contextlib
    import io

    saved = os.dup(2)
    try:
        with open(os.devnull, "w") as null, contextlib.redirect_stderr(io.StringIO()):
            os.dup2(null.fileno(), 2)
            try:
                _ = Tensor([1.0], dtype=float32) > 0
            except Exception:  # the expected one-time failure
                pass
    finally:
        os.dup2(saved, 2)
        os.close(saved)


def _numpy_2() -> bool:
    import numpy

    return int(numpy.__version__.split(".")[0]) >= 2


_ = ms  # the namespace keeps mindspore imported for callers that only hold this module
