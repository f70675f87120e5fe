"""One op's device result and reference result, paired leaf by leaf before anything is measured.

`collect_outputs` walks both results in parallel (tensors, tuples, lists, None, Python scalars;
msprobe raised into the user's code on tuple, list and None outputs)
and pairs every output leaf with its reference; for an op that returns nothing but writes into
its arguments (``_foreach_add_``) the written arguments are the outputs. A reference leaf may say
that its device leaf is not a value to compare (`reference.NotCompared`: attention's RNG state
and bookkeeping; a row says why) or that only part of it is defined (`reference.PerQuery`:
attention's logsumexp, compared on the queries that attend to something). A leaf that cannot be
measured (shapes or types differ, empty) gets its row here, so that the measuring
(probes.online_dispatch.verdict) sees only pairs of tensors it can reduce.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, NamedTuple

import torch

from probes.backends.torch_backend import BACKEND
from probes.core import dispatch_metrics as dm
from probes.core.thresholds import HAS_INFINITY, LARGEST_FINITE, overflow_boundary
from probes.core.writers import needs_quotes
from probes.online_dispatch.reference import CPU, NotCompared, PerQuery
from probes.online_dispatch.results import NO_STATS, Row, input_line, input_row, special_row


@dataclass
class OutputLeaf:
    name: str
    dev_dtype: str  # str(dtype) of the device leaf, as the CSV shows it
    ref_dtype: str
    dtype_name: str  # "float32", "int64", … of the device leaf: picks the thresholds
    shape: str  # as the CSV shows it (str of the list)
    index: int = -1  # position in the figure list, -1 when not measured
    special: Row | None = None
    tensor: bool = True  # False for Python scalars: the scaled rule applies to tensors only
    numel: int = 1  # elements of a measured leaf (at least 1: a 0-d tensor or a scalar is one)


class InputLeaf(NamedTuple):
    """What the rows of a failing op need about one input leaf (its statistics and the noise
    floor's scale); a tuple, as every compared op makes one per input and most never read it."""

    is_float: bool
    numel: int
    tensor: bool = True
    index: int = -1  # position in the stats list, -1 for Python scalars
    value: float = 0.0


class OpComparison:
    """The leaves of one op call and the tensors the figures are computed from (a plain class:
    one is made for every compared op)."""

    __slots__ = ("prefix", "plain_names", "outputs", "inputs", "input_cells", "pairs", "stat_tensors", "chained",
                 "rounded_once_terms")

    def __init__(self, prefix: str, chained: bool = False, rounded_once_terms: int = 0) -> None:
        self.prefix = prefix
        # the leaves' names (the prefix, then "_input.0", "_output.1", an argument's name) are
        # written in the CSV as they are: their rows may be rendered as lines (results.input_line)
        self.plain_names = not needs_quotes(prefix)
        self.outputs: list[OutputLeaf] = []
        self.inputs: list[tuple] = []  # InputLeaf's fields (input_leaves)
        # each input leaf's CSV row, made when the leaf is listed, with the statistics a passing op
        # shows (a tensor's none: verdict.rows fills them in for an op that failed): its line
        # (results.input_line), or its cells where a name needs quoting
        self.input_cells: list[list[Any] | str] = []
        self.pairs: list[tuple[torch.Tensor, torch.Tensor]] = []
        self.stat_tensors: list[torch.Tensor] = []
        self.chained = chained  # a fused backward that rounds intermediates: the wider limit (thresholds)
        # the FP8 matmul: its reference is exact, a correct kernel rounds once (dm.rounded_once_floor);
        # the number of products summed per output element, 0 for every other op
        self.rounded_once_terms = rounded_once_terms


def input_leaves(cmp: OpComparison) -> list[InputLeaf]:
    """The op's input leaves as InputLeaf (kept as plain tuples: a NamedTuple is made by a Python
    frame, and most ops never read them)."""
    return [InputLeaf(*t) for t in cmp.inputs]


# dtype -> the name that picks its thresholds (complex ones by their real parts); looked up for
# every output leaf of every op
_DTYPE_NAMES: dict[torch.dtype, str] = {}


def _tensor_dtype_name(t: torch.Tensor) -> str:
    name = _DTYPE_NAMES.get(t.dtype)
    if name is None:
        if t.dtype.is_complex:
            name = "float32" if t.dtype == torch.complex64 else "float64"
        else:
            name = BACKEND.dtype_name(t)
        name = _DTYPE_NAMES[t.dtype] = name
    return name


def _dtype_name(x: Any) -> str:
    if isinstance(x, torch.Tensor):
        return _tensor_dtype_name(x)
    if isinstance(x, bool):
        return "bool"
    if isinstance(x, int):
        return "int64"
    return "float64"


def _type_str(x: Any) -> str:
    return str(x.dtype) if isinstance(x, torch.Tensor) else str(type(x))


def _shape(x: Any) -> list[int]:
    return list(x.shape) if isinstance(x, torch.Tensor) else []


# torch.Size -> its CSV text, str(list(shape)): every compared op writes one per leaf, and the
# model's shapes repeat (a few hundred ns a leaf otherwise); bounded for programs whose shapes don't
_SHAPE_TEXTS: dict[torch.Size, str] = {}
_SHAPE_TEXTS_KEPT = 4096


def shape_text(shape: torch.Size) -> str:
    """str(list(shape)), remembered per shape."""
    text = _SHAPE_TEXTS.get(shape)
    if text is None:
        if len(_SHAPE_TEXTS) >= _SHAPE_TEXTS_KEPT:
            _SHAPE_TEXTS.clear()
        text = _SHAPE_TEXTS[shape] = str(list(shape))
    return text


# dtype -> (str(dtype), floating point or complex, complex): read for every input leaf of every op
_DTYPE_FACTS: dict[torch.dtype, tuple[str, bool, bool]] = {}


def _dtype_facts(dtype: torch.dtype) -> tuple[str, bool, bool]:
    facts = _DTYPE_FACTS[dtype] = (str(dtype), dtype.is_floating_point or dtype.is_complex, dtype.is_complex)
    return facts


def dtype_text(dtype: torch.dtype) -> str:
    """str(dtype), remembered (the CSV's dtype columns)."""
    return (_DTYPE_FACTS.get(dtype) or _dtype_facts(dtype))[0]


def _real(t: torch.Tensor) -> torch.Tensor:
    return torch.view_as_real(t) if t.dtype.is_complex else t


def _plain(t: torch.Tensor) -> torch.Tensor:
    """`t` without autograd history, as a real tensor: the device leaves the dispatch mode sees and
    the references of no_grad re-runs have none, so most are taken as they are (a detach makes a
    new tensor, about half a microsecond)."""
    return _real(t.detach() if t.requires_grad else t)


_SCALARS = (bool, int, float)
_TYPE_TEXTS = {t: str(t) for t in _SCALARS}


def _not_compared(cmp: OpComparison, name: str, dev: Any, ref: Any, message: str) -> None:
    """A row for a device leaf the reference does not reproduce (accuracy Nan: not a failure)."""
    ref_shape = str(_shape(ref)) if isinstance(ref, torch.Tensor) else ""
    ref_type = _type_str(ref) if isinstance(ref, torch.Tensor) else ""
    cmp.outputs.append(OutputLeaf(name, _type_str(dev), ref_type, _dtype_name(dev), str(_shape(dev)), special=special_row(
        name, _type_str(dev), ref_type, str(_shape(dev)), ref_shape, dm.NAN, message, figure="unsupported")))


def overflowed_as(ref: torch.Tensor, dev: torch.Tensor) -> torch.Tensor:
    """The reference with the values that round beyond the device dtype's range as what the dtype
    holds there: a float32 product of 1e30 and 1e30 is inf, correctly rounded, where the float64
    reference holds 1e60; without this the two would be reported as an inf/nan mismatch. A value
    rounds beyond the range from half an ulp above the largest value on (65520 in float16, not
    65505). What the dtype holds there is its infinity, or, for an FP8 format without one, what
    PyTorch's CPU cast gives (e4m3fn saturates at 448, the fnuz formats give NaN), or NaN: the
    FP8 formats' two conversion modes (saturating, and non-saturating, where a value beyond the
    range is NaN) are both correct, and CPU kernels differ in which they use (PyTorch's CPU
    `_scaled_mm` gives NaN for some samples on a CPU with AVX-512 FP16 and AMX, and saturates on an
    AVX2 one); the device's cast is held to one of them, element by element."""
    if not (dev.is_floating_point() and ref.is_floating_point()) or dev.dtype == ref.dtype:
        return ref
    beyond = ref.abs() >= _boundary(dev.dtype)
    if not bool(beyond.any()):
        return ref
    if BACKEND.dtype_name(dev) in HAS_INFINITY:
        return torch.where(beyond, ref.sign() * float("inf"), ref)
    held = ref.to(dev.dtype).to(ref.dtype)  # the saturating cast (the fnuz formats: NaN)
    if dev.shape == ref.shape:
        held = torch.where(dev.to(ref.dtype).isnan(), float("nan"), held)  # or the non-saturating one
    return torch.where(beyond, held, ref)


_BOUNDARIES: dict[torch.dtype, float] = {}


def _boundary(dtype: torch.dtype) -> float:
    bound = _BOUNDARIES.get(dtype)
    if bound is None:
        name = BACKEND.dtype_name(torch.empty((), dtype=dtype))
        bound = _BOUNDARIES[dtype] = overflow_boundary(name) if name in LARGEST_FINITE else torch.finfo(dtype).max
    return bound


def may_overflow(dev: torch.Tensor, ref: torch.Tensor, ref_sq: float) -> bool:
    """Whether a reference value of the pair may lie beyond the device dtype's range, from the
    reference's sum of squares, which the figures measure anyway: the exact test (`overflowed_as`)
    reads every element in three more passes, and this runs for every output of every op. A sum
    below half the boundary's square proves every value below the boundary (a computed sum of n
    squares is at least (1 - n eps) of the largest); NaN and inf answer True. Leaves of the narrow
    formats (float16, FP8) with large values or many elements take the exact test, as all did before."""
    if not (dev.is_floating_point() and ref.is_floating_point()) or dev.dtype == ref.dtype:
        return False
    bound = _BOUNDARIES.get(dev.dtype) or _boundary(dev.dtype)
    return not ref_sq < 0.5 * bound * bound


def _add_pair(cmp: OpComparison, name: str, dev: Any, ref: Any) -> None:
    if isinstance(dev, torch.Tensor) and isinstance(ref, torch.Tensor):  # the usual leaf: its checks in a row
        shape = dev.shape
        if shape == ref.shape and (numel := dev.numel()):
            # _tensor_dtype_name, shape_text and _plain of both sides, their usual answers looked up
            # here (five frames a compared op otherwise)
            dtype = dev.dtype
            pairs = cmp.pairs
            cmp.outputs.append(OutputLeaf(
                name, dtype_text(dtype), dtype_text(ref.dtype), _DTYPE_NAMES.get(dtype) or _tensor_dtype_name(dev),
                _SHAPE_TEXTS.get(shape) or shape_text(shape), len(pairs), numel=numel))
            if dev.requires_grad:
                dev = dev.detach()
            if dtype.is_complex:
                dev = torch.view_as_real(dev)
            if ref.requires_grad or ref.dtype.is_complex:
                ref = _plain(ref)
            # the reference as measured: values beyond the device dtype's range are mapped when the
            # figures show some may be there (verdict.figures: may_overflow, overflowed_as)
            pairs.append((dev if dev.is_cpu else dev.to(CPU), ref))
            return
    if dev is None and (ref is None or isinstance(ref, NotCompared)):
        return
    if isinstance(ref, NotCompared):
        _not_compared(cmp, name, dev, None, f"not compared: {ref.reason}")
        return
    if isinstance(ref, PerQuery):
        aligned = ref.align(dev.detach().to(CPU)) if isinstance(dev, torch.Tensor) else None
        if aligned is None:
            _not_compared(cmp, name, dev, ref.value,
                          "not compared: per-query values not computed, or in a layout not known here")
            return
        dev, ref = aligned
    leaf = OutputLeaf(name, _type_str(dev), _type_str(ref), _dtype_name(dev), str(_shape(dev)))
    cmp.outputs.append(leaf)
    if isinstance(dev, torch.Tensor) and isinstance(ref, torch.Tensor):
        if dev.shape != ref.shape:
            leaf.special = special_row(name, leaf.dev_dtype, leaf.ref_dtype, str(list(dev.shape)), str(list(ref.shape)),
                                       dm.UNMATCHED, "shapes do not match", figure="shape unmatched")
            return
        if dev.numel() == 0:
            leaf.special = special_row(name, leaf.dev_dtype, leaf.ref_dtype, str(list(dev.shape)), str(list(ref.shape)),
                                       dm.NAN, "empty data, can not compare", figure="unsupported")
            return
        leaf.index, leaf.numel = len(cmp.pairs), dev.numel()
        cmp.pairs.append((_real(dev.detach()).to(CPU), _real(ref.detach())))
        return
    if isinstance(dev, _SCALARS) and isinstance(ref, _SCALARS):
        leaf.tensor = False
        leaf.index = len(cmp.pairs)
        cmp.pairs.append((torch.tensor(float(dev), dtype=torch.float64), torch.tensor(float(ref), dtype=torch.float64)))
        return
    if isinstance(dev, torch.Tensor) != isinstance(ref, torch.Tensor) or type(dev) is not type(ref):
        leaf.special = special_row(name, leaf.dev_dtype, leaf.ref_dtype, str(_shape(dev)), str(_shape(ref)),
                                   dm.UNMATCHED, "device and reference results differ in type")
        return
    ok = dev == ref
    leaf.special = special_row(name, leaf.dev_dtype, leaf.ref_dtype, "[]", "[]", dm.YES if ok else dm.NO,
                               "compared by equality", figure="unsupported")


def _walk_outputs(cmp: OpComparison, name: str, dev: Any, ref: Any) -> None:
    if isinstance(dev, (list, tuple)) and isinstance(ref, (list, tuple)):
        if len(dev) != len(ref):
            cmp.outputs.append(OutputLeaf(name, "", "", "", "[]", special=special_row(
                name, type(dev).__name__, type(ref).__name__, f"[{len(dev)}]", f"[{len(ref)}]", dm.UNMATCHED,
                "device and reference results differ in structure", figure="shape unmatched")))
            return
        for i, (d, r) in enumerate(zip(dev, ref)):
            _walk_outputs(cmp, f"{name}.{i}", d, r)
        return
    _add_pair(cmp, name, dev, ref)


def collect_outputs(cmp: OpComparison, dev_out: Any, ref_out: Any, written: list[tuple[Any, Any]] | None) -> None:
    """Pair the op's output leaves (for a void op that writes its arguments: those arguments)."""
    prefix = cmp.prefix
    if (dev_out is None or (isinstance(dev_out, tuple) and not dev_out)) and written:
        for i, (d, r) in enumerate(written):
            _walk_outputs(cmp, f"{prefix}_output.{i}", d, r)
    elif isinstance(dev_out, (list, tuple)):
        _walk_outputs(cmp, f"{prefix}_output", dev_out, ref_out)
    else:
        _add_pair(cmp, f"{prefix}_output", dev_out, ref_out)


def collect_inputs(cmp: OpComparison, dev_args: tuple, dev_kwargs: dict, ref_args: tuple, ref_kwargs: dict) -> None:
    """List the op's input leaves; statistics come from the reference copies taken before any run."""
    prefix = cmp.prefix
    for i, (d, r) in enumerate(zip(dev_args, ref_args)):
        _walk_inputs(cmp, f"{prefix}_input.{i}", d, r)
    for k, r in ref_kwargs.items():
        if needs_quotes(k):
            cmp.plain_names = False
        _walk_inputs(cmp, f"{prefix}_input_{k}", dev_kwargs.get(k), r)


def _walk_inputs(cmp: OpComparison, name: str, dev: Any, ref: Any) -> None:
    if isinstance(ref, torch.Tensor) and isinstance(dev, torch.Tensor):
        numel = ref.numel()
        dtype = ref.dtype
        text, is_float, is_complex = _DTYPE_FACTS.get(dtype) or _dtype_facts(dtype)
        index = -1
        if numel:
            index = len(cmp.stat_tensors)
            cmp.stat_tensors.append(torch.view_as_real(ref) if is_complex else ref)
        # a plain tuple, InputLeaf's fields in order (made one only for a failing op: input_leaves)
        cmp.inputs.append((is_float, numel, True, index))
        shape = ref.shape
        dev_dtype = dev.dtype
        dev_text = text if dev_dtype is dtype else dtype_text(dev_dtype)
        shape = _SHAPE_TEXTS.get(shape) or shape_text(shape)
        cmp.input_cells.append(input_line(name, dev_text, text, shape) if cmp.plain_names
                               else input_row(name, dev_text, text, shape, NO_STATS))
    elif isinstance(ref, (list, tuple)) and isinstance(dev, (list, tuple)):
        for i, (d, r) in enumerate(zip(dev, ref)):
            _walk_inputs(cmp, f"{name}.{i}", d, r)
    elif isinstance(ref, _SCALARS) and isinstance(dev, _SCALARS):
        value = float(ref)
        cmp.inputs.append((isinstance(ref, float), 1, False, -1, value))
        dev_type, ref_type = _TYPE_TEXTS.get(dev.__class__) or str(type(dev)), _TYPE_TEXTS.get(ref.__class__) or str(type(ref))
        cmp.input_cells.append(input_line(name, dev_type, ref_type, "[]", value) if cmp.plain_names
                               else input_row(name, dev_type, ref_type, "[]", (value, value, value)))
