"""Judging a perturbed output against the original, leaf by leaf.

Every leaf of the output structure counts (tuples, lists, dicts, named tuples; msprobe skipped
dicts and nested containers): floating
tensors by the ratio rule (or the single-benchmark rule for to_cpu), integer and bool tensors
exactly (a float ratio on indices turns any change into a huge error), Python numbers by the tensor
rule on their values (msprobe's isclose could give a negative max_rel). The figures of all leaves
are gathered on the device and copied to the host in one transfer.

A comparison is a generator (`comparison`): it computes its device figures, yields them, and
receives them back as host floats; a later pass (a leaf whose bound does not settle it, one that
holds inf/NaN, the reference figure of a flagged leaf) yields again; its return value is the
verdicts. `compare_outputs` drives one at once (a transfer per pass); the free_benchmark service
keeps many pending and drives them together at step()/stop() (probes/free_benchmark/deferred.py),
so a step costs a transfer or two whatever the number of checked calls. A later pass reads the
output leaves again: `version` (the tensors' in-place version counter, when given) lets it refuse
with OutputModified when the user's code changed an output in place meanwhile.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Generator, Iterator
from dataclasses import dataclass
from typing import Any

from probes.core import metrics, scaled
from probes.core import thresholds as th


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


class _Intact:
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


def _pair_leaves(backend: Any, a: Any, b: Any, path: tuple = ()) -> Iterator[tuple[tuple, Any, Any]]:
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
            yield from _pair_leaves(backend, a[k], b[k], path + (k,))
    elif isinstance(a, (list, tuple)):
        if not isinstance(b, (list, tuple)) or len(a) != len(b):
            raise StructureMismatch(f"at {path or 'output'}: {type(a).__name__} of {len(a)} vs {type(b).__name__}")
        for i, (x, y) in enumerate(zip(a, b)):
            yield from _pair_leaves(backend, x, y, path + (i,))
    else:
        yield path, a, b


def compare_outputs(
    backend: Any, original: Any, perturbed: Any, *, pert_mode: str, tolerance: float | None = None,
    rule: str = "reference", input_move: Any = None, stage: str = "forward", pointwise: bool = False,
    exact: bool = False,
) -> list[LeafVerdict]:
    """Verdicts for every comparable leaf, now (see `comparison`)."""
    return drive(backend, comparison(backend, original, perturbed, pert_mode=pert_mode, tolerance=tolerance,
                                     rule=rule, input_move=input_move, stage=stage, pointwise=pointwise, exact=exact))


def comparison(
    backend: Any, original: Any, perturbed: Any, *, pert_mode: str, tolerance: float | None = None,
    rule: str = "reference", input_move: Any = None, stage: str = "forward", pointwise: bool = False,
    version: Callable[[Any], int | None] | None = None, exact: bool = False,
) -> Comparison:
    """The comparison of every comparable leaf, as a generator (module docstring). The leaves
    are paired at once, so a StructureMismatch is raised by the first next(). `tolerance` overrides the forward clamp floor
    (the backward stage uses 1e-3 for every dtype). `rule`: "reference" (msprobe's ratio rule,
    or the single-benchmark rule for to_cpu) or "scaled" (probes/core/scaled.py); `input_move`:
    the perturbed input's move at its scale (scaled rule, add_noise / bit_noise): a number the
    mode knows, or device figures to measure it;
    `pointwise`: the API is element-by-element (aten's pointwise tag), so under improve_precision
    and to_cpu, which re-run it on the same input values, the scaled rule judges every element at
    its own magnitude (there is no cancellation across elements to forgive); `exact`: the scaled
    rule measures every leaf, where it would settle a float32 leaf by an upper bound (figures that
    are shown, not only judged)."""
    pairs = list(_pair_leaves(backend, original, perturbed))
    return _comparison(backend, pairs, pert_mode, tolerance, rule, input_move, stage, pointwise,
                       _Intact(version, pairs), exact)


def _comparison(backend: Any, pairs: list, pert_mode: str, tolerance: float | None, rule: str, input_move: Any,
                stage: str, pointwise: bool, intact: _Intact, exact: bool = False) -> Comparison:
    if rule == "scaled":
        elementwise = pointwise and stage == "forward" and pert_mode in ("improve_precision", "to_cpu")
        verdicts = yield from _scaled(backend, pairs, pert_mode, tolerance, input_move, stage, elementwise, intact,
                                      exact)
        return _in_output_order(pairs, verdicts)
    if pert_mode == "to_cpu":
        verdicts = yield from _single_benchmark(backend, pairs, intact)
        return _in_output_order(pairs, verdicts)
    device_figures: list[Any] = []
    plans: list[tuple[str, tuple, Any, Any, float]] = []
    verdicts: list[LeafVerdict] = []
    for kind, path, a, b in _kinds(backend, pairs):
        if kind == "float":
            tol = tolerance if tolerance is not None else th.forward_tolerance(backend.dtype_name(b))
            if pert_mode == "no_change":  # equal outputs (the usual case) need no ratio: count first
                device_figures.append(backend.any_differ(a, b))
                plans.append(("equal", path, a, b, tol))
            else:
                device_figures.append(backend.ratio_reductions(a, b, tol))
                plans.append(("ratio", path, a, b, tol))
        elif kind == "exact":
            device_figures.append(backend.any_differ(a, b))
            plans.append(("exact", path, a, b, 0.0))
        elif kind == "scalar":
            verdicts.append(_scalar_verdict(path, a, float(b), pert_mode, tolerance))
        else:
            verdicts.append(_exact_verdict(path, a, 1.0, type(a).__name__, "", pert_mode))
    host = yield device_figures
    differ = [i for i, (plan, h) in enumerate(zip(plans, host)) if plan[0] == "equal" and h[0] > 0]
    for i, plan in enumerate(plans):
        if plan[0] == "equal":
            plans[i] = ("ratio",) + plan[1:]
            host[i] = [1.0, 1.0, 0.0]  # equal leaves: what the ratio reductions give them
    if differ:  # nondeterminism found: the ratio figures of the leaves that changed
        request = []
        for i in differ:
            _kind, _path, a, b, tol = plans[i]
            intact.check(a)
            request.append(backend.ratio_reductions(a, b, tol))
        for i, h in zip(differ, (yield request)):
            host[i] = h
    again = [i for i, (plan, h) in enumerate(zip(plans, host)) if plan[0] == "ratio" and metrics.needs_nonfinite_pass(h)]
    if again:
        redo = []
        for i in again:  # rare: some element is non-finite
            _kind, _path, a, b, tol = plans[i]
            intact.check(a)
            ca, cb = backend.to_compute(a, b), backend.to_compute(b, b)
            redo.append(metrics.nonfinite_ratio_reductions(backend.namespace(cb), ca, cb, tol))
        for i, h in zip(again, (yield redo)):
            host[i] = h
    for (kind, path, a, _extra, tol), h in zip(plans, host):
        if kind == "exact":
            verdicts.append(_exact_verdict(path, a, h[0], backend.dtype_repr(a), backend.shape_repr(a), pert_mode))
            continue
        rv = metrics.finish_ratio(h, tol)
        threshold = th.ratio_threshold(backend.dtype_name(a), pert_mode)
        verdicts.append(
            LeafVerdict(path, a, rv.consistent(threshold), rv.max_rel, round(threshold - 1.0, 12), rv.figure,
                        backend.dtype_repr(a), backend.shape_repr(a),
                        {"ratio": rv.ratio, "symbol_flipping": rv.symbol_flipping,
                         "nan_mismatch": rv.nan_mismatch, "inf_mismatch": rv.inf_mismatch, "tolerance": tol})
        )
    return _in_output_order(pairs, verdicts)


def _kinds(backend: Any, pairs: list) -> Iterator[tuple[str, tuple, Any, Any]]:
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


def _in_output_order(pairs: list, verdicts: list[LeafVerdict]) -> list[LeafVerdict]:
    """Verdicts in the order of the output's leaves (tensor figures arrive after one transfer,
    Python numbers at once)."""
    order = {path: i for i, (path, _a, _b) in enumerate(pairs)}
    return sorted(verdicts, key=lambda v: order.get(v.path, len(order)))


def _exact_verdict(path: tuple, a: Any, differing: float, dtype_repr: str, shape_repr: str, pert_mode: str) -> LeafVerdict:
    ok = differing == 0
    return LeafVerdict(path, a, ok, None if ok else "value_mismatch", 0.0, 0.0 if ok else math.inf,
                       dtype_repr, shape_repr, {"differing_elements": int(differing)})


def _scalar_verdict(path: tuple, a: float, b: float, pert_mode: str, tolerance: float | None) -> LeafVerdict:
    tol = tolerance if tolerance is not None else th.forward_tolerance("float64")
    if not (math.isfinite(a) and math.isfinite(b)):
        same = (a == b) or (math.isnan(a) and math.isnan(b))
        rv = metrics.RatioVerdict(1.0, nan_mismatch=not same and (math.isnan(a) or math.isnan(b)),
                                  inf_mismatch=not same and not (math.isnan(a) or math.isnan(b)))
    else:
        r = max(abs(a), tol) / max(abs(b), tol)
        rv = metrics.finish_ratio([r, r, a * b], tol)
    threshold = th.ratio_threshold("float64", pert_mode)
    return LeafVerdict(path, a, rv.consistent(threshold), rv.max_rel, round(threshold - 1.0, 12), rv.figure, "float", "()",
                       {"ratio": rv.ratio})


def _python_leaf_single(path: tuple, a: Any, b: Any) -> list[LeafVerdict]:
    """Python numbers returned next to tensors: floats within the fp32 single-benchmark rtol,
    anything else by equality."""
    if isinstance(a, float) and isinstance(b, (int, float)) and not isinstance(b, bool):
        limits = th.single_benchmark_threshold("float32")
        same = (math.isnan(a) and math.isnan(b)) or math.isclose(a, b, rel_tol=limits.rtol, abs_tol=limits.small_value_atol)
        err = abs(a - b) if math.isfinite(a) and math.isfinite(b) else math.inf
        return [LeafVerdict(path, a, same, None, limits.rtol, 0.0 if same else math.inf, "float", "()", {"abs_err": err})]
    if isinstance(a, (bool, int, float)) and a != b:
        return [_exact_verdict(path, a, 1.0, type(a).__name__, "", "to_cpu")]
    return []


# to_cpu's figures hold about seven float64 temporaries of a chunk at once, on the host: 2^16
# elements keeps that near 4 MiB (with the default chunk it was 16 MiB, 4x a small model's step).
SINGLE_BENCHMARK_CHUNK = 1 << 16


def _single_benchmark(backend: Any, pairs: list, intact: _Intact) -> Comparison:
    """to_cpu: each float leaf in float64 on the CPU, chunk by chunk (bounded memory)."""
    figures, plans, verdicts = [], [], []
    for path, a, b in pairs:
        if not backend.is_tensor(a):
            verdicts.extend(_python_leaf_single(path, a, b))
            continue
        if backend.numel(a) == 0:
            continue
        if backend.is_float(a) and backend.is_float(b):
            limits = th.single_benchmark_threshold(backend.dtype_name(a))
            chunks = []
            for ca, cb in metrics.iter_chunks(backend.namespace(a), a, b, SINGLE_BENCHMARK_CHUNK):
                act, gold = backend.to_float64_cpu(ca), backend.to_float64_cpu(cb)
                chunks.append(metrics.single_benchmark_chunk(backend.namespace(act), act, gold, limits.small_value))
            figures.extend(chunks)
            plans.append(("single", path, a, b, limits, len(chunks)))
        else:
            figures.append(backend.any_differ(a, b))
            plans.append(("exact", path, a, b, None, 1))
    host = yield figures
    pos = 0
    for kind, path, a, b, limits, n in plans:
        h, pos = host[pos : pos + n], pos + n
        if kind == "exact":
            verdicts.append(_exact_verdict(path, a, h[0][0], backend.dtype_repr(a), backend.shape_repr(a), "to_cpu"))
            continue
        figs = metrics.combine_single_chunks(h, backend.numel(a))
        if metrics.needs_nonfinite_single(figs):  # rare: recompute with the mask-aware formula
            intact.check(a)
            act, gold = backend.to_float64_cpu(a), backend.to_float64_cpu(b)
            figs = (yield [metrics.single_benchmark_reductions(backend.namespace(act), act, gold,
                                                               limits.small_value)])[0]
        verdicts.append(_single_verdict(backend, path, a, figs, limits))
    return verdicts


def _single_verdict(backend: Any, path: tuple, a: Any, h: list[float], limits: Any) -> LeafVerdict:
    sv = metrics.finish_single_benchmark(h, limits.rtol, limits.small_value_atol, limits.error_balance)
    figure = math.inf if sv.nonfinite_mismatch else max(sv.abs_err / limits.small_value_atol,
                                                        sv.rel_err / limits.rtol,
                                                        abs(sv.error_balance) / limits.error_balance)
    return LeafVerdict(path, a, sv.consistent, None, limits.rtol, figure, backend.dtype_repr(a),
                       backend.shape_repr(a),
                       {"abs_err": sv.abs_err, "rel_err": sv.rel_err, "error_balance": sv.error_balance,
                        "nonfinite_mismatch": sv.nonfinite_mismatch})


# dtypes whose leaves are first bounded (probes/core/scaled.py error_bound): their threshold is
# far above their rounding, so MaxAbsErr over lam * RMS settles almost every clean leaf in a few
# operators; half dtypes (4 ulps) and element-wise judging go straight to the full measure
_BOUNDED_DTYPES = ("float32", "float64")


def _scaled(backend: Any, pairs: list, pert_mode: str, tolerance: float | None, input_move: Any,
            stage: str, elementwise: bool, intact: _Intact, exact: bool = False) -> Comparison:
    """The scaled rule for every leaf. One host transfer for every leaf's first figures (and
    the input's move, when it is measured); a second for the leaves these did not settle (a
    bound above the threshold: the exact measure; inf/NaN: the masked one) and for msprobe's
    figure of the flagged ones; a third only when inf/NaN shows in an exact measure whose bound
    was finite (rare)."""
    figures: list[Any] = []
    plans: list[tuple[str, tuple, Any, Any]] = []
    verdicts: list[LeafVerdict] = []
    for kind, path, a, b in _kinds(backend, pairs):
        if kind == "float":
            name = backend.dtype_name(a)
            if pert_mode == "no_change":  # equal outputs (the usual case) need no measure: count first
                figures.append(backend.any_differ(a, b))
                plans.append(("equal", path, a, b))
            elif not elementwise and not exact and name in _BOUNDED_DTYPES:
                figures.append(backend.scaled_bound_figures(a, b))
                plans.append(("bound", path, a, b))
            else:
                figures.append(backend.scaled_figures(a, b, th.machine_eps(name), elementwise, finite=True))
                plans.append(("scaled", path, a, b))
        elif kind == "exact":
            figures.append(backend.any_differ(a, b))
            plans.append(("exact", path, a, b))
        elif kind == "scalar":
            verdicts.append(_scalar_scaled(path, a, float(b), pert_mode))
        else:
            verdicts.append(_exact_verdict(path, a, 1.0, type(a).__name__, "", pert_mode))
    measured_move = input_move is not None and not isinstance(input_move, (int, float))
    if measured_move:
        figures.append(input_move)
    host = yield figures
    move = 0.0
    if measured_move:
        move = scaled.finish(host.pop())[0]
        move = move if math.isfinite(move) else 0.0
    elif input_move is not None:
        move = float(input_move)
    bounded: set[int] = set()
    limits = {}
    measure: list[tuple[int, bool]] = []  # (leaf, fast pass?) to measure exactly
    for i, ((kind, _path, a, _b), h) in enumerate(zip(plans, host)):
        if kind == "exact":
            continue
        name = backend.dtype_name(a)
        limits[i] = th.scaled_threshold(name, pert_mode, move, stage)
        if kind == "bound":
            bound = scaled.finish_bound(h, th.machine_eps(name))
            if bound <= limits[i]:
                host[i] = [bound, 0.0, 0.0]
                bounded.add(i)
            else:  # a non-finite bound means inf/NaN in the leaf: straight to the masked measure
                measure.append((i, math.isfinite(bound)))
        elif kind == "equal":
            if h[0] > 0:
                measure.append((i, True))
            host[i] = [0.0, 0.0, 0.0]  # equal leaves: no error, no mismatch
        elif not math.isfinite(h[0]):
            measure.append((i, False))
    # msprobe's figure, shown next to the scaled one for a flagged leaf, is measured in the next
    # pass for the leaves the first one flagged and for every leaf measured again (a few): a step
    # then costs two transfers, whatever turns out flagged
    remeasured = {i for i, _f in measure}
    want_reference = [i for i, (kind, *_rest) in enumerate(plans)
                      if kind == "scaled" and i not in remeasured and host[i][0] > limits[i]] + sorted(remeasured)
    reference: dict[int, list[float]] = {}
    while measure or want_reference:
        request, owners = [], []
        for i, fast in measure:
            _kind, _path, a, b = plans[i]
            intact.check(a)
            request.append(backend.scaled_figures(a, b, th.machine_eps(backend.dtype_name(a)), elementwise,
                                                  finite=fast))
            owners.append((i, fast))
        for i in want_reference:
            _kind, _path, a, b = plans[i]
            if intact.ok(a):  # informative only: left out for an output changed meanwhile
                request.append(backend.ratio_reductions(a, b, _tolerance(backend, b, tolerance)))
                owners.append((i, None))
        measure, want_reference = [], []
        for (i, fast), h in zip(owners, (yield request)):
            if fast is None:
                reference[i] = h
                continue
            host[i] = h
            if fast and not math.isfinite(h[0]):  # rare: inf/NaN the bound did not show
                measure.append((i, False))
    for i, ((kind, path, a, b), h) in enumerate(zip(plans, host)):
        if kind == "exact":
            verdicts.append(_exact_verdict(path, a, h[0], backend.dtype_repr(a), backend.shape_repr(a), pert_mode))
            continue
        name = backend.dtype_name(a)
        err, nan_mm, inf_mm = scaled.finish(h)
        limit = limits[i]
        ok = not (nan_mm or inf_mm) and err <= limit
        max_rel: float | str = "nan_mismatch" if nan_mm else "inf_mismatch" if inf_mm else err
        detail = {"rule": "scaled", "scaled_error": err, "ulps": err / th.machine_eps(name),
                  "scale": "element" if elementwise else "row",
                  "nan_mismatch": nan_mm, "inf_mismatch": inf_mm}
        if i in bounded:
            detail["bound"] = True  # an upper bound that already settled the leaf
        if input_move is not None:
            detail["input_move"] = move
        v = LeafVerdict(path, a, ok, max_rel, round(limit, 12), math.inf if (nan_mm or inf_mm) else 1.0 + err,
                        backend.dtype_repr(a), backend.shape_repr(a), detail)
        verdicts.append(v)
        if not ok and i in reference:
            _reference_detail(backend, v, b, reference[i], pert_mode, tolerance)
    return verdicts


def _tolerance(backend: Any, b: Any, tolerance: float | None) -> float:
    return tolerance if tolerance is not None else th.forward_tolerance(backend.dtype_name(b))


def _reference_detail(backend: Any, v: LeafVerdict, b: Any, h: list[float], pert_mode: str,
                      tolerance: float | None) -> None:
    """msprobe's figure for a flagged leaf (its ratio rule's max_rel), so a report can show both
    rules' view of the same call."""
    if metrics.needs_nonfinite_pass(h):
        v.detail["reference_max_rel"] = "non-finite"
        return
    tol = _tolerance(backend, b, tolerance)
    rv = metrics.finish_ratio(h, tol)
    ref_t = th.ratio_threshold(backend.dtype_name(v.leaf), pert_mode)
    v.detail["reference_max_rel"] = rv.max_rel
    v.detail["reference_threshold"] = round(ref_t - 1.0, 12)
    v.detail["reference_consistent"] = rv.consistent(ref_t)


def _scalar_scaled(path: tuple, a: float, b: float, pert_mode: str) -> LeafVerdict:
    """A Python float output: its relative error against the perturbed value (its own scale)."""
    if not (math.isfinite(a) and math.isfinite(b)):
        same = (a == b) or (math.isnan(a) and math.isnan(b))
        err = 0.0 if same else math.inf
    else:
        err = abs(a - b) / abs(b) if b != 0 else (0.0 if a == 0 else math.inf)
    limit = th.scaled_threshold("float64", pert_mode)
    return LeafVerdict(path, a, err <= limit, err, round(limit, 12), 1.0 + err, "float", "()",
                       {"rule": "scaled", "scaled_error": err})
