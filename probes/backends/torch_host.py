"""NumPy views of plain CPU tensors: where the probes compute on host memory without torch's
dispatcher (probes/backends/host_arrays.py says why, and what is computed there).

Only a tensor that is exactly what it looks like qualifies: a torch.Tensor (or Parameter) of the
strided layout on the CPU, not a conjugate or negative view, not a torch.func transform's wrapper
(whose values are not these). Anything else (another device, a subclass, a nested, sparse or
masked tensor, a DTensor) gets None and takes the torch path.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

from probes.backends.host_arrays import COMPUTE_DTYPES, HOST_ARRAYS, bfloat16_as_float32

#: Tensors up to this many elements are compared with NumPy: below it its single-threaded
#: passes beat torch's kernels, whose dispatch costs a few microseconds per operator (the ratio
#: figures, measured on one AVX2 core: 9 against 72 us at 256 elements, 68 against 122 us at 32K;
#: at 128K NumPy is slower, and in a training step already at 64K).
HOST_MAX_ELEMENTS = 1 << 15

_STRIDED = torch.strided
_TENSOR, _PARAMETER = torch.Tensor, torch.nn.Parameter
_IS_WRAPPED = getattr(torch._C._functorch, "is_functorch_wrapped_tensor", None)
NUMPY_DTYPES = frozenset({torch.float16, torch.float32, torch.float64, torch.bool, torch.int8, torch.uint8,
                           torch.int16, torch.int32, torch.int64})


def plain_cpu(t: Any) -> bool:
    """Whether `t` is a plain strided CPU tensor whose memory holds its values as they read."""
    kind = type(t)
    if kind is not torch.Tensor and kind is not torch.nn.Parameter:
        return False
    if not t.is_cpu or t.layout is not _STRIDED or t.is_conj() or t.is_neg():
        return False
    return _IS_WRAPPED is None or not _IS_WRAPPED(t)


def plain_cpu_pair(a: Any, b: Any) -> bool:
    """plain_cpu(a) and plain_cpu(b), in one frame: every checked call's output pair asks."""
    kind, other = type(a), type(b)
    if (kind is not _TENSOR and kind is not _PARAMETER) or (other is not _TENSOR and other is not _PARAMETER):
        return False
    if not (a.is_cpu and b.is_cpu) or a.layout is not _STRIDED or b.layout is not _STRIDED:
        return False
    if a.is_conj() or a.is_neg() or b.is_conj() or b.is_neg():
        return False
    return _IS_WRAPPED is None or not (_IS_WRAPPED(a) or _IS_WRAPPED(b))


def shape_repr(t: Any) -> str:
    """str(t.shape), each shape's text made once (every checked call's verdict shows its output's
    shape; a training step's calls have a few dozen shapes). A shape that cannot be a key (a
    symbolic size) is written out each time."""
    shape = t.shape
    try:
        text = _SHAPE_REPRS.get(shape)
    except TypeError:
        return str(shape)
    if text is None:
        if len(_SHAPE_REPRS) >= _SHAPES_KEPT:
            _SHAPE_REPRS.clear()
        text = _SHAPE_REPRS[shape] = str(shape)
    return text


_SHAPE_REPRS: dict[Any, str] = {}
_SHAPES_KEPT = 4096


def first_float(args: tuple, kwargs: dict) -> tuple[str, Any, torch.Tensor] | None:
    """("args", position, tensor) or ("kwargs", name, tensor): the first floating or complex
    tensor of a flat call (plain tensors and scalar-like values, no container: torch_flat), as
    free_benchmark's perturbations search a call's inputs (positional ones first); None when
    there is none. One loop in place of their general walk, which every checked call took."""
    for i, x in enumerate(args):
        kind = type(x)
        if (kind is _TENSOR or kind is _PARAMETER) and (x.is_floating_point() or x.is_complex()) and not x.is_meta:
            return "args", i, x
    if kwargs:
        for name, x in kwargs.items():
            kind = type(x)
            if (kind is _TENSOR or kind is _PARAMETER) and (x.is_floating_point() or x.is_complex()) and not x.is_meta:
                return "kwargs", name, x
    return None


def host_view(t: Any, limit: int = HOST_MAX_ELEMENTS) -> np.ndarray | None:
    """A read-only NumPy view of `t` (no copy) when it is a plain CPU tensor of a dtype NumPy has
    and of at most `limit` elements, else None."""
    if not plain_cpu(t) or t.dtype not in NUMPY_DTYPES or t.numel() > limit:
        return None
    try:
        view = as_numpy(t)
    except (RuntimeError, TypeError):  # a tensor NumPy cannot view
        return None
    view.flags.writeable = False  # it shares the user's memory: never write through it
    return view


def as_numpy(t: torch.Tensor) -> np.ndarray:
    """`t`'s memory as a NumPy array (a plain CPU tensor's; TensorBase's own methods: while a
    probe runs, torch.Tensor's are its pass-through wrappers)."""
    return _numpy(_detach(t))


def compute_view(t: Any, like: Any) -> np.ndarray | None:
    """`t`'s values on the host in the compute dtype of the ratio rule for `like` (like's dtype,
    at least float32): a view for float32/float64, an exact widened copy for float16 / bfloat16;
    None where host_view gives none (bfloat16 is read through its bits)."""
    dtype = np.float64 if like.dtype == torch.float64 else np.float32
    if t.dtype == torch.bfloat16:
        bits = host_view(_view(t, torch.int16)) if plain_cpu(t) else None
        return None if bits is None else bfloat16_as_float32(bits).astype(dtype, copy=False)
    view = host_view(t)
    if view is None or view.dtype.kind != "f":
        return None
    return view if view.dtype in COMPUTE_DTYPES and view.dtype == dtype else view.astype(dtype)


def host_pair(a: Any, b: Any, like: Any) -> tuple[np.ndarray, np.ndarray] | None:
    """NumPy views of small plain CPU tensors `a` and `b` of one shape, in like's compute dtype
    (compute_view), or None."""
    if a.numel() <= HOST_MAX_ELEMENTS:
        ha = compute_view(a, like)
        hb = None if ha is None else compute_view(b, like)
        if hb is not None and ha.shape == hb.shape:
            return ha, hb
    return None


def workspace(t: Any, moves_only: bool = False) -> tuple[Any, np.ndarray, Any] | None:
    """(operations, array, back) for free_benchmark's perturbations that only move elements or
    edit their bits (`moves_only`; their `host_workspace`): a read-only NumPy view of a small
    plain CPU float tensor, a bfloat16 one's as its int16 bit patterns, on which a mode's few
    element-wise operations cost ~4 us each against torch's 7-14 (its integer operators with a
    scalar are the slowest), and `back`, which makes their result (a fresh array) a tensor
    without a copy. Float arithmetic (add_noise's reference style) stays on torch's kernels,
    which raise no floating-point warnings."""
    if not moves_only:
        return None
    if t.dtype == torch.bfloat16:
        bits = host_view(_view(t, torch.int16)) if plain_cpu(t) else None
        return None if bits is None else (HOST_ARRAYS, bits, _bfloat16_from_bits)
    view = host_view(t)
    return None if view is None or view.dtype.kind != "f" else (HOST_ARRAYS, view, _from_numpy)


def _bfloat16_from_bits(bits: np.ndarray) -> torch.Tensor:
    return _view(_from_numpy(bits), torch.bfloat16)


# torch's C methods and functions: while a probe runs, the Python-level names are its pass-through wrappers
_detach = torch._C.TensorBase.detach
_numpy = torch._C.TensorBase.numpy
_view = torch._C.TensorBase.view
_from_numpy = torch._C._VariableFunctions.from_numpy
