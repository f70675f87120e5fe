"""Editing a float's elements through the integer view of their bits (add_noise and bit_noise
of probes/free_benchmark/perturbations.py): magnitude codes, which order a format's values as
integers, and the band tests on them.

The magnitude's code (sign bit cleared) orders a format's values, so "above a value and below
another" is two integer comparisons. Written as clips of differences (or, on host arrays, as the
sign bits of differences), they cost a few integer kernels and no bool temporaries: a comparison
and a where are the slowest kernels of a CPU build without AVX-512, about 5x an addition.
"""

from __future__ import annotations

import functools
import math
import operator
import struct
from typing import Any

from probes.core import thresholds as th


def fp8_codes(b: Any, t: Any, name: str) -> tuple[Any, Any, int, int]:
    """(bytes, magnitude bytes, smallest normal, largest finite) of FP8 data `t`: an FP8 byte is
    sign-magnitude, so the magnitude's byte (sign bit cleared) orders the values and +1 on it is
    one ulp further from zero; the two limits are the formats' magnitude bytes, from their
    significand bits, smallest exponent and largest value (NaN and infinity lie above the
    largest; the fnuz NaN, the bare sign bit, has magnitude 0)."""
    mantissa = th.SIGNIFICAND_BITS[name] - 1
    top = th.LARGEST_FINITE[name]
    exponent = math.frexp(top)[1] - 1
    fraction = round((top / 2.0**exponent - 1.0) * 2**mantissa)
    top_code = ((exponent - th.MIN_EXPONENT[name] + 1) << mantissa) + fraction
    bits = b.bit_view(t)
    return bits, bits & 0x7F, 1 << mantissa, top_code


_FINFO_MAX = {"float16": 65504.0, "bfloat16": 3.3895313892515355e38, "float32": 3.4028234663852886e38,
              "float64": 1.7976931348623157e308}


def finfo_max(name: str) -> float:
    return _FINFO_MAX[name]


_WIDTH = {"float64": 64, "float32": 32, "float16": 16, "bfloat16": 16}
BIT_NAMES = frozenset({"int16", "int32", "int64"})  # a workspace that hands over bits already


def in_band(b: Any, xp: Any, bits: Any, name: str, above: int, below: int) -> Any:
    """1 where `above` < the element's magnitude code < `below`, else 0 (in `bits`' dtype): two
    fresh arrays, the rest in place on them where the backend edits its arrays in place (a fresh
    output buffer costs a CPU about as much as the arithmetic)."""
    host_band = getattr(b, "in_band", None)  # host arrays: their own, fastest formulation
    if host_band is not None:
        return host_band(bits, _WIDTH[name], above, below)
    magnitude = bits & ((1 << (_WIDTH[name] - 1)) - 1)
    if not getattr(b, "edits_in_place", False):
        return xp.clip(magnitude - above, 0, 1) - xp.clip(magnitude - (below - 1), 0, 1)
    # where reading a maximum costs no transfer (the CPU), no element above the band spares the
    # upper test: two passes of the seven
    host_max = getattr(b, "host_max", None)
    top = host_max(magnitude) if host_max is not None else None
    step = (magnitude - above).clamp_(0, 1)
    if top is not None and top < below:
        return step
    return step.sub_(magnitude.sub_(below - 1).clamp_(0, 1))


_OPERATORS = {"add": operator.add, "bitwise_xor": operator.xor}


def edited_in_band(b: Any, bits: Any, name: str, above: int, below: int, op: str) -> Any:
    """combined(b, op, in_band(...), bits): `bits` op 1 where `above` < the element's magnitude
    code < `below`, in one pass where the backend has one (the host arrays' C kernel)."""
    one_pass = getattr(b, "edited_in_band", None)
    edited = one_pass(op, bits, _WIDTH[name], above, below) if one_pass is not None else None
    if edited is None and one_pass is not None:
        # bits that do not cover their memory densely (a slice of a transposed tensor), which the
        # one pass cannot walk: walked in a dense copy of their layout instead (asarray keeps the
        # order of their strides, so the result's layout is the one in_band's fresh array has);
        # one pass and a copy against seven strided passes
        edited = one_pass(op, b.namespace(bits).asarray(bits, copy=True), _WIDTH[name], above, below)
    if edited is not None:
        return edited
    return combined(b, op, in_band(b, b.namespace(bits), bits, name, above, below), bits)


def combined(b: Any, op: str, band: Any, bits: Any) -> Any:
    """`bits` op `band`, written into `band` (the perturbation's own fresh array) where the
    backend can."""
    host_op = getattr(b, "combined", None)  # host arrays: an ufunc with out=
    if host_op is not None:
        return host_op(op, band, bits)
    if getattr(b, "edits_in_place", False):
        return getattr(band, op + "_")(bits)
    return _OPERATORS[op](bits, band)


@functools.cache
def magnitude_code(name: str, value: float) -> int:
    """The magnitude code of the largest value of format `name` that is <= `value` (>= 0), so
    that code > it means value > `value` exactly."""
    if name == "bfloat16":  # a bfloat16 is the top half of a float32; cutting the rest rounds down
        return magnitude_code("float32", value) >> 16
    fmt, unsigned = {"float64": ("<d", "<Q"), "float32": ("<f", "<I"), "float16": ("<e", "<H")}[name]
    try:
        rounded = struct.pack(fmt, value)
    except OverflowError:  # above the format's range: its largest finite value
        return magnitude_code(name, math.inf) - 1
    code = struct.unpack(unsigned, rounded)[0]
    return code - 1 if struct.unpack(fmt, rounded)[0] > value else code


def compared_gate(name: str, gate: float) -> float:
    """The gate as the comparison sees it: in the tensor's dtype, float32 for the half types."""
    return gate if name == "float64" else struct.unpack("<f", struct.pack("<f", gate))[0]


def identity(x: Any) -> Any:
    return x


def workspace(backend: Any, t: Any, moves_only: bool = False) -> tuple[Any, Any, Any]:
    """(operations, values, back): where a mode computes on `t` (perturbations.py's docstring says why).
    `moves_only`: the mode only copies and moves elements, so the backend may hand over their
    bit patterns (a dtype the host arrays lack, such as bfloat16)."""
    host = getattr(backend, "host_workspace", None)
    found = host(t, moves_only=moves_only) if host is not None else None
    return found if found is not None else (backend, t, identity)


def bit_workspace(backend: Any, t: Any) -> tuple[Any, Any, Any]:
    """(operations, bits, back) for a mode that edits a float's bits only: the integer view of
    `t`'s elements (the host hands a bfloat16 tensor over as such already) and `back`, which turns
    edited bits into a tensor of `t`'s dtype."""
    b, values, back = workspace(backend, t, moves_only=True)
    if b.dtype_name(values) in BIT_NAMES:
        return b, values, back
    return b, b.bit_view(values), lambda bits: back(b.from_bit_view(bits, values))


def band_edit(backend: Any, t: Any, name: str, above: int, below: int, op: str) -> Any:
    """A new tensor like `t` whose bit patterns are t's `op` 1 where above < the magnitude code <
    below: in one pass on t's memory where the backend can (torch's C kernel, by address), else
    on t's bit workspace."""
    one_pass = getattr(backend, "band_edited", None)
    edited = one_pass(t, op, above, below) if one_pass is not None else None
    if edited is not None:
        return edited
    b, bits, back = bit_workspace(backend, t)
    return back(edited_in_band(b, bits, name, above, below, op))
