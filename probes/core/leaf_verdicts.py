"""An output judged against its reference leaf by leaf: the pairing of the two structures, the
verdict of one leaf, and the generator protocol every rule's comparison follows.

Every leaf of the output structure counts (tuples, lists, dicts, named tuples): tensors as the
tensors a backend measures of them, Python numbers by value. The rules (the ratio rule and the
single benchmark in probes/free_benchmark/compare.py, the scaled rule in
probes/core/scaled_comparison.py) share this, so a structure is paired the same way whichever
judges it and a leaf's verdict reads the same in every report.

A comparison is a generator (`Comparison`): it computes its device figures, yields them, and
receives them back as host floats; a later pass yields again; its return value is the verdicts.
`drive` runs one to its end with a host transfer per pass; a caller that holds many drives them
together instead, so a step costs a transfer or two whatever the number of checked calls. A later
pass reads the output leaves again: `Intact` lets it refuse with OutputModified when the user's
code changed an output in place meanwhile.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Generator, Iterator
from dataclasses import dataclass
from typing import Any


class StructureMismatch(Exception):
    """The perturbed call returned a differently shaped structure."""


class OutputModified(Exception):
    """An output leaf a later pass must read again was modified in place after the call."""


#: yields device figures (a list of arrays), receives their host floats, returns the verdicts
Comparison = Generator[list[Any], list[list[float]], list["LeafVerdict"]]


def drive(backend: Any, comparison: Comparison) -> list[LeafVerdict]:
    """Run a comparison to its verdicts now: one host transfer per pass."""
    try:
        request = next(comparison)
        while True:
            request = comparison.send(backend.host_floats(request))
    except StopIteration as done:
        return done.value


class Intact:
    """Whether the output leaves are as they were when the comparison started (version counters)."""

    def __init__(self, version: Callable[[Any], int | None] | None, pairs: list) -> None:
        self.version = version
        self.seen = {id(a): version(a) for _p, a, _b in pairs if version is not None and _is_tensor_like(a)}

    def check(self, *leaves: Any) -> None:
        if self.version is None:
            return
        for a in leaves:
            before = self.seen.get(id(a))
            if before is not None and self.version(a) != before:
                raise OutputModified("an output was modified in place before its deferred measure could read it "
                                     "again; its check is skipped")

    def ok(self, *leaves: Any) -> bool:
        try:
            self.check(*leaves)
        except OutputModified:
            return False
        return True


def _is_tensor_like(x: Any) -> bool:
    return hasattr(x, "shape") and hasattr(x, "dtype")


@dataclass
class LeafVerdict:
    path: tuple[Any, ...]
    leaf: Any  # the original output leaf
    consistent: bool
    max_rel: float | str | None
    threshold: float  # T - 1 of the rule applied
    figure: float  # sortable error magnitude
    dtype_repr: str
    shape_repr: str
    detail: dict[str, Any]


def pair_leaves(backend: Any, a: Any, b: Any, path: tuple = ()) -> Iterator[tuple[tuple, Any, Any]]:
    """(path, original leaf, reference leaf) of every leaf of the two structures; StructureMismatch
    where they differ."""
    if backend.is_tensor(a) or backend.is_tensor(b):
        if not (backend.is_tensor(a) and backend.is_tensor(b)):
            raise StructureMismatch(f"at {path or 'output'}: {type(a).__name__} vs {type(b).__name__}")
        # what is measured of each: the tensor itself, or the plain tensors below a transform's
        # wrapper or inside a nested / masked / sparse tensor (NotMeasurable: none)
        parts_a, parts_b = backend.measured_leaves(a), backend.measured_leaves(b)
        if [p for p, _x in parts_a] != [p for p, _y in parts_b]:
            raise StructureMismatch(f"at {path or 'output'}: {type(a).__name__} vs {type(b).__name__}")
        for (sub, x), (_sub, y) in zip(parts_a, parts_b):
            where = path + sub
            if backend.shape(x) != backend.shape(y):
                raise StructureMismatch(f"at {where or 'output'}: shape {backend.shape(x)} vs {backend.shape(y)}")
            # complex outputs (an fft of a float32 input re-run in float64) are compared as their
            # real and imaginary parts; they would otherwise be compared exactly, complex64 against complex128
            yield where, backend.real_view(x), backend.real_view(y)
    elif isinstance(a, dict):
        if not isinstance(b, dict) or set(a) != set(b):
            raise StructureMismatch(f"at {path or 'output'}: dict keys differ")
        for k in a:
            yield from pair_leaves(backend, a[k], b[k], path + (k,))
    elif isinstance(a, (list, tuple)):
        if not isinstance(b, (list, tuple)) or len(a) != len(b):
            raise StructureMismatch(f"at {path or 'output'}: {type(a).__name__} of {len(a)} vs {type(b).__name__}")
        for i, (x, y) in enumerate(zip(a, b)):
            yield from pair_leaves(backend, x, y, path + (i,))
    else:
        yield path, a, b


def leaf_kinds(backend: Any, pairs: list) -> Iterator[tuple[str, tuple, Any, Any]]:
    """(kind, path, a, b) of every leaf pair either rule judges: "float" (two float tensors),
    "exact" (other tensors, compared exactly), "scalar" (a Python float), "differs" (a Python
    int/bool that changed); empty tensors and equal ints are left out."""
    for path, a, b in pairs:
        if backend.is_tensor(a):
            if backend.numel(a) == 0:
                continue
            yield ("float" if backend.is_float(a) and backend.is_float(b) else "exact"), path, a, b
        elif isinstance(a, float) and isinstance(b, (int, float)) and not isinstance(b, bool):
            yield "scalar", path, a, b
        elif isinstance(a, (bool, int)) and a != b:
            yield "differs", path, a, b


def in_output_order(pairs: list, verdicts: list[LeafVerdict]) -> list[LeafVerdict]:
    """Verdicts in the order of the output's leaves (tensor figures arrive after one transfer,
    Python numbers at once)."""
    order = {path: i for i, (path, _a, _b) in enumerate(pairs)}
    return sorted(verdicts, key=lambda v: order.get(v.path, len(order)))


def exact_verdict(path: tuple, a: Any, differing: float, dtype_repr: str, shape_repr: str, pert_mode: str) -> LeafVerdict:
    """A leaf compared exactly (an integer tensor, a changed Python int): consistent only unchanged."""
    ok = differing == 0
    return LeafVerdict(path, a, ok, None if ok else "value_mismatch", 0.0, 0.0 if ok else math.inf,
                       dtype_repr, shape_repr, {"differing_elements": int(differing)})
