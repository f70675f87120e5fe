"""The six perturbation modes, written once over the backend interface.

Each mode turns (args, kwargs) into the inputs of the second call, or says why it cannot. Inputs
are never modified: a perturbed tensor is always a new tensor, and containers on the path to it
are rebuilt (their types kept; the reference's MindSpore add_noise turned tuples into lists).
Only host-known facts (dtype, shape) decide whether a mode applies: value-dependent gates are
applied element-wise on the device, so no mode forces a device-to-host copy.

FP8 data (a plain FP8 tensor, or the ``_data`` of a scaled FP8 tensor, which the backend's
`value_parts` hands over and rebuilds around the same scale) is perturbed in its format's own
grid, on the integer view of its bytes: the format has no room for sub-ulp noise (msprobe's
x + v rounds back to x), and FP8 tensors have no arithmetic of their own. add_noise moves every
finite normal element one ulp away from zero under either style, bit_noise flips its lowest
mantissa bit (+-1 ulp), change_value swaps two bytes; the move is reported in the input's own
ulps (its format's epsilon), so the scaled rule's noise floor is one FP8 ulp, not one of the
output's dtype.

A backend may offer `host_workspace(t)`: (operations, array, back) when the tensor's values are
in host memory anyway and the mode's few element-wise operations are cheaper on a host array
than dispatched one by one as framework operators (a small plain CPU tensor in torch, whose
integer operators with a scalar cost 7-14 us each at 32K elements against NumPy's 4; MindSpore
PyNative on the CPU target: a view, no copy; reading it waits for the operators queued before
it). The mode then runs the same code on the array with those operations and `back` makes the
result a tensor. Otherwise (another device, a large tensor, a subclass) it computes on the
tensor itself, with the same bits as a result (tests/unit/free_benchmark/test_perturbations.py
compares the two paths on every 16-bit pattern).
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from probes.core import thresholds as th
from probes.core.trees import iter_leaves, replace_at, tree_map
from probes.free_benchmark.float_bits import (
    band_edit,
    compared_gate,
    finfo_max,
    fp8_codes,
    identity,
    magnitude_code,
    workspace,
)

PERT_MODES = ("improve_precision", "add_noise", "bit_noise", "change_value", "no_change", "to_cpu")


@dataclass
class PerturbedCall:
    args: tuple[Any, ...]
    kwargs: dict[str, Any]
    on_cpu: bool = False
    # (original, perturbed) input leaf of the single-leaf modes: the scaled rule measures how far
    # the input moved, to judge the output's move against it, unless the mode knows the bound
    moved: tuple[Any, Any] | None = None
    move: float | None = None  # the input's move at its scale, when known without measuring


@dataclass
class Cancelled:
    """The mode cannot perturb this call; nothing is re-run (msprobe's PyTorch side re-ran it anyway)."""

    reason: str


def _no_inplace(kwargs: dict[str, Any]) -> dict[str, Any]:
    if kwargs.get("inplace"):
        kwargs = dict(kwargs)
        kwargs["inplace"] = False
    return kwargs


def _float_leaves(backend: Any, args: tuple, kwargs: dict) -> Iterator[tuple[str, tuple, Any]]:
    """(where, path, tensor) for every floating (or complex: its real and imaginary parts) tensor,
    positional args first, then kwargs (msprobe searched positional args only). A call's
    arguments are mostly flat: only containers among them are walked."""
    for where, items in (("args", enumerate(args)), ("kwargs", kwargs.items())):
        for key, x in items:
            if isinstance(x, (list, tuple, dict)):
                for path, leaf in iter_leaves(x, (key,)):
                    if backend.is_tensor(leaf) and (backend.is_float(leaf) or backend.is_complex(leaf)):
                        yield where, path, leaf
            elif backend.is_tensor(x) and (backend.is_float(x) or backend.is_complex(x)):
                yield where, (key,), x


def _replace(args: tuple, kwargs: dict, where: str, path: tuple, value: Any) -> tuple[tuple, dict]:
    if where == "args":
        return replace_at(args, path, value), kwargs
    return args, replace_at(kwargs, path, value)


class Perturbation:
    """Base: perturb the first floating tensor that the mode accepts."""

    mode = ""
    needs_float_target = True
    edits_elements = True  # the mode changes elements (a nested / masked / sparse input: through its values)
    raise_float32 = False  # improve_precision only (see ImprovePrecision)
    fp8_grid = False  # the mode also perturbs FP8 data, in its format's grid (module docstring)

    def __init__(self, backend: Any, add_noise_style: str = "ulp") -> None:
        self.backend = backend
        self.add_noise_style = add_noise_style
        self._bands: dict[str, tuple[int, int] | None] = {}  # dtype name -> band(), worked out once
        self._usual: dict[str, tuple[int, int, float | None] | None] = {}  # (build_usual's)

    def band(self, name: str) -> tuple[int, int] | None:
        """(above, below): the magnitude codes between which the mode edits the bit patterns of
        a float of dtype `name` by `band_op` (band_edit); None where it computes otherwise."""
        return None

    band_op = ""

    def _band_of(self, name: str) -> tuple[int, int] | None:
        found = self._bands.get(name, False)
        if found is False:
            found = self._bands[name] = self.band(name)
        return found  # type: ignore[return-value]

    def build_usual(self, args: tuple, kwargs: dict) -> PerturbedCall | Cancelled:
        """build() for the usual call (plain tensors and scalar-like values, no container:
        usual_call.py), as it would find it: the backend's `first_float` hands over the first
        floating input at once, and a band mode edits it with its dtype's band worked out once.
        Anything else (no such input, an empty one, a dtype or kind the band does not cover) takes
        build()."""
        first = getattr(self.backend, "first_float", None) if self.band_op else None
        found = None if first is None else first(args, kwargs)
        if found is None:
            return self.build(args, kwargs)
        b, (where, key, leaf) = self.backend, found
        name = b.dtype_name(leaf)
        facts = self._usual.get(name, False)  # (above, below, move_bound) of the dtype, or None
        if facts is False:
            band = self._band_of(name) if name in th.FLOAT_DTYPES else None
            facts = self._usual[name] = None if band is None else (*band, self.move_bound(name))
        if facts is None or b.numel(leaf) == 0 or b.value_parts(leaf) is not None:
            return self.build(args, kwargs)
        new = band_edit(b, leaf, name, facts[0], facts[1], self.band_op)
        if where == "args":
            new_args, new_kwargs = (*args[:key], new, *args[key + 1:]), kwargs
        else:
            new_args, new_kwargs = args, dict(kwargs)
            new_kwargs[key] = new
        return PerturbedCall(new_args, _no_inplace(new_kwargs) if new_kwargs else new_kwargs, moved=(leaf, new),
                             move=facts[2])

    def accepts(self, t: Any) -> str | None:
        """None when this tensor can be perturbed, else why not."""
        if self.backend.numel(t) == 0:
            return "tensor is empty"
        name = self.backend.dtype_name(t)
        if name not in th.FLOAT_DTYPES and not (self.fp8_grid and name in th.FLOAT8_DTYPES):
            return f"dtype {self.backend.dtype_repr(t)} is not supported"
        return None

    def perturb(self, t: Any) -> Any:
        raise NotImplementedError

    def move_bound(self, dtype_name: str) -> float | None:
        """How far the perturbation moves its input at the input's scale (probes/core/scaled.py),
        when that is known without measuring; None: measure it."""
        return None

    def build(self, args: tuple, kwargs: dict) -> PerturbedCall | Cancelled:
        reason = "no floating-point tensor among the inputs"
        for where, path, leaf in _float_leaves(self.backend, args, kwargs):
            # a nested, masked or sparse tensor is edited through its values buffer, then rebuilt
            parts = self.backend.value_parts(leaf) if self.edits_elements else None
            if isinstance(parts, str):
                reason = parts
                continue
            values, rebuild = parts if parts is not None else (leaf, identity)
            why = self.accepts(values)
            if why is None:
                new = self.perturb(values)
                # no_change hands the leaf back as it is: the call's own arguments, nothing rebuilt
                new_args, new_kwargs = ((args, kwargs) if new is leaf
                                        else _replace(args, kwargs, where, path, rebuild(new)))
                return PerturbedCall(new_args, _no_inplace(new_kwargs), moved=(values, new),
                                     move=self.move_bound(self.backend.dtype_name(values)))
            reason = why
        return Cancelled(reason)


class ImprovePrecision(Perturbation):
    """The same call one precision step up, as the reference to judge the original by.

    - An FP8 tensor with its scale (torchao's training tensors): dequantised, and every float
      input with it, in float64 (the backend's raise_precision "fp8").
    - Any fp16/bf16/fp8 input: every such tensor (and `dtype=` argument) raised to float32,
      float32 inputs left as they are (msprobe's improve_precision).
    - Otherwise, with `raise_float32` (the scaled rule): float32 tensors and dtype arguments
      raised to float64, so an fp32 kernel that computes in a reduced precision (TF32, HF32,
      bf16 math) is judged against float64. On a device without float64 (NPU, MPS) the call is
      re-run on the CPU with every tensor copied there. Under the reference rule float32 calls
      are not re-run, as in msprobe: its element-wise ratio flags honest fp32 kernels wherever
      outputs cancel (a linear layer's max ratio - 1 reaches 1e-3 against the 2e-4 threshold).
    """

    mode = "improve_precision"

    def build(self, args: tuple, kwargs: dict) -> PerturbedCall | Cancelled:
        b = self.backend
        leaves = [leaf for _where, _path, leaf in _float_leaves(b, args, kwargs)]
        if not leaves:
            return Cancelled("no floating-point tensor among the inputs")
        if any(b.is_scaled_fp8(t) for t in leaves):
            # FP8 data and its scale (torchao): the product of the dequantised values in float64,
            # the reference of the very FP8 operands the kernel multiplied (torch_fp8)
            new_args, new_kwargs = (tree_map(lambda x: b.raise_precision(x, "fp8"), t) for t in (args, kwargs))
            return PerturbedCall(tuple(new_args), _no_inplace(dict(new_kwargs)))
        if any(b.is_low_precision(t) for t in leaves):
            source = "half"
        elif self.raise_float32 and any(b.dtype_name(b.real_view(t)) == "float32" for t in leaves):
            source = "float32"
        else:
            return Cancelled("inputs are already float64" if self.raise_float32
                             else "inputs are already float32/float64")
        on_cpu = source == "float32" and any(b.lacks_float64(t) for t in leaves)
        if on_cpu and not getattr(b, "reruns_on_cpu", True):
            return Cancelled("the device has no float64 and this framework cannot re-run the call on the CPU")

        def up(x: Any) -> Any:
            raised = b.raise_precision(x, source, on_cpu)
            return x if raised is None else raised

        new_args, new_kwargs = tree_map(up, args), tree_map(up, kwargs)
        return PerturbedCall(tuple(new_args), _no_inplace(dict(new_kwargs)), on_cpu=on_cpu)


class AddNoise(Perturbation):
    """ulp style (default): every finite element with |x| > sqrt(v) moves one unit in
    the last place away from zero, in its own dtype, so the perturbation is real for every
    magnitude (the reference's x + v rounds away for most values). On the signed-integer view
    of a float, +1 is exactly "one ulp larger in magnitude", for either sign.
    reference style: msprobe 8.3.3's x + v where |x| > sqrt(v).
    FP8 data: every finite normal element one ulp away from zero, under either style (v has no
    FP8 value to land on); the gate is the format's smallest normal number, as sqrt(v), an
    absolute size, means nothing in the scaled values FP8 holds."""

    mode = "add_noise"
    fp8_grid = True

    def move_bound(self, dtype_name: str) -> float | None:
        # one ulp of an element is at most eps of its magnitude (exactly eps just above a power
        # of two), and at most that of the row's scale for the smaller ones
        if self.add_noise_style == "ulp" or dtype_name in th.FLOAT8_DTYPES:
            return th.MACHINE_EPS.get(dtype_name)
        return None

    def perturb(self, t: Any) -> Any:
        name = self.backend.dtype_name(t)
        if name in th.FLOAT8_DTYPES or self.add_noise_style == "reference":
            b, t, back = workspace(self.backend, t)
            xp = b.namespace(t)
            if name in th.FLOAT8_DTYPES:
                bits, magnitude, normal, top = fp8_codes(b, t, name)
                return back(b.from_bit_view(xp.where((magnitude >= normal) & (magnitude < top), bits + 1, bits), t))
            v = th.NOISE_VALUE[name]
            return back(xp.where(xp.abs(t) > v**0.5, t + v, t))
        above, below = self._band_of(name)  # type: ignore[misc]
        return band_edit(self.backend, t, name, above, below, "add")

    band_op = "add"

    def band(self, name: str) -> tuple[int, int] | None:
        if name in th.FLOAT8_DTYPES or self.add_noise_style == "reference":
            return None
        gate = th.NOISE_VALUE[name] ** 0.5
        # |x| > gate (compared in float32 for the half types: sqrt(v) rounds up in half precision)
        # and below the largest finite value, which has no finite neighbour further out; inf and
        # NaN stay as they are
        return magnitude_code(name, compared_gate(name, gate)), magnitude_code(name, finfo_max(name))


class BitNoise(Perturbation):
    """Flip the lowest mantissa bit of every finite normal element (±1 ulp). Infinities stay
    infinite (the reference turned them into NaN). FP8 data likewise, but for a largest value
    whose flip would be a NaN (e4m3fn's 448: all-ones is its NaN), which moves one ulp down."""

    mode = "bit_noise"
    fp8_grid = True

    def move_bound(self, dtype_name: str) -> float | None:
        return th.MACHINE_EPS.get(dtype_name)  # +-1 ulp of normal elements, as add_noise

    def perturb(self, t: Any) -> Any:
        name = self.backend.dtype_name(t)
        if name in th.FLOAT8_DTYPES:
            b, t, back = workspace(self.backend, t)
            xp = b.namespace(t)
            bits, magnitude, normal, top = fp8_codes(b, t, name)
            one = xp.ones_like(bits)
            flipped = xp.where(xp.bitwise_xor(magnitude, one) > top, bits - 1, xp.bitwise_xor(bits, one))
            return back(b.from_bit_view(xp.where((magnitude >= normal) & (magnitude <= top), flipped, bits), t))
        above, below = self._band_of(name)  # type: ignore[misc]
        return band_edit(self.backend, t, name, above, below, "bitwise_xor")

    band_op = "bitwise_xor"

    def band(self, name: str) -> tuple[int, int] | None:
        # the finite elements above the smallest normal one (NaN lies above infinity)
        return None if name in th.FLOAT8_DTYPES else (magnitude_code(name, th.SMALLEST_NORMAL[name]),
                                                        magnitude_code(name, math.inf))


class ChangeValue(Perturbation):
    """Swap the first and last entries ([0]/[-1] in 1-D, [0][0]/[-1][-1] from 2-D up); FP8 data
    too (its scale, shared by every element, stays)."""

    mode = "change_value"
    fp8_grid = True

    def accepts(self, t: Any) -> str | None:
        why = super().accepts(t)
        if why:
            return why
        shape = self.backend.shape(t)
        if len(shape) == 0:
            return "a 0-d tensor has nothing to swap"
        if len(shape) == 1 and shape[0] < 2:
            return "a 1-D tensor needs at least 2 elements"
        if len(shape) >= 2 and (shape[0] == 0 or shape[1] == 0 or (shape[0] < 2 and shape[1] < 2)):
            return f"shape {shape} has no two distinct entries at [0][0] and [-1][-1]"
        return None

    def perturb(self, t: Any) -> Any:
        b, t, back = workspace(self.backend, t, moves_only=True)
        x = b.clone(t)
        first, last = ((0,), (-1,)) if len(b.shape(t)) == 1 else ((0, 0), (-1, -1))
        a, z = b.clone(t[first]), b.clone(t[last])
        x[first] = z
        x[last] = a
        return back(x)


class NoChange(Perturbation):
    """The same inputs again: a determinism test (threshold 1.0)."""

    mode = "no_change"
    edits_elements = False

    def accepts(self, t: Any) -> str | None:
        return "tensor is empty" if self.backend.numel(t) == 0 else None  # any dtype runs again as it is

    def perturb(self, t: Any) -> Any:
        return t

    def build_usual(self, args: tuple, kwargs: dict) -> PerturbedCall | Cancelled:
        first = getattr(self.backend, "first_float", None)  # (the base's: the first float input at once)
        found = None if first is None else first(args, kwargs)
        if found is None or self.backend.numel(found[2]) == 0:
            return self.build(args, kwargs)
        return PerturbedCall(args, _no_inplace(kwargs) if kwargs else kwargs)

    def build(self, args: tuple, kwargs: dict) -> PerturbedCall | Cancelled:
        # the call's own arguments, once a float input is not empty (the base's search, without
        # the rebuilding and the input's move, which no_change has no use for)
        reason = "no floating-point tensor among the inputs"
        for _where, _path, leaf in _float_leaves(self.backend, args, kwargs):
            reason = self.accepts(leaf)
            if reason is None:
                return PerturbedCall(args, _no_inplace(kwargs))
        return Cancelled(reason)


class ToCpu(Perturbation):
    """Every tensor input copied to the CPU (low-precision floats as float32): the result is
    judged by the single-benchmark rule, not the ratio."""

    mode = "to_cpu"

    def build(self, args: tuple, kwargs: dict) -> PerturbedCall | Cancelled:
        b = self.backend
        if not any(True for _ in _float_leaves(b, args, kwargs)):
            return Cancelled("no floating-point tensor among the inputs")
        move = b.to_cpu_float
        return PerturbedCall(tuple(tree_map(move, args)), _no_inplace(dict(tree_map(move, kwargs))), on_cpu=True)


_MODES = {cls.mode: cls for cls in (ImprovePrecision, AddNoise, BitNoise, ChangeValue, NoChange, ToCpu)}


def make_perturbation(mode: str, backend: Any, add_noise_style: str = "ulp", rule: str = "reference") -> Perturbation:
    """The mode's perturbation; under the scaled rule improve_precision also raises float32."""
    try:
        cls = _MODES[mode]
    except KeyError:
        raise ValueError(f"unknown pert_mode {mode!r}; allowed: {', '.join(PERT_MODES)}") from None
    pert = cls(backend, add_noise_style)
    pert.raise_float32 = rule == "scaled"
    return pert
