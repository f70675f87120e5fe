"""The scaled rule (probes/core/scaled.py) applied to an output structure, leaf by leaf.

Every tool that judges a run against its float64 re-run by the scaled rule judges it here:
free_benchmark's calls, and the graphs and prefixes of graphs the compiled checks bisect, so a
compiled graph's failing node is found by the same verdict that flagged the graph. Framework-free:
the figures are the backend's (probes/backends), the thresholds the core's.
"""

from __future__ import annotations

import math
from typing import Any

from probes.core import metrics, scaled
from probes.core import thresholds as th
from probes.core.leaf_verdicts import (
    Comparison,
    Intact,
    LeafVerdict,
    drive,
    exact_verdict,
    in_output_order,
    leaf_kinds,
    pair_leaves,
)

# dtypes whose leaves are first bounded (probes/core/scaled.py error_bound): their threshold is
# far above their rounding, so MaxAbsErr over lam * RMS settles almost every clean leaf in a few
# operators; half dtypes (4 ulps) and element-wise judging go straight to the full measure
BOUNDED_DTYPES = ("float32", "float64")


def compare_scaled(backend: Any, original: Any, reference: Any, *, pert_mode: str, stage: str = "forward",
                   tolerance: float | None = None, exact: bool = False) -> list[LeafVerdict]:
    """Verdicts for every comparable leaf by the scaled rule, now (one host transfer per pass), in
    the output's order; `exact`: every leaf measured, none settled by its bound (figures that are
    shown, not only judged)."""
    pairs = list(pair_leaves(backend, original, reference))
    verdicts = drive(backend, scaled_comparison(backend, pairs, pert_mode, tolerance, None, stage, False,
                                                Intact(None, pairs), exact))
    return in_output_order(pairs, verdicts)


def scaled_comparison(backend: Any, pairs: list, pert_mode: str, tolerance: float | None, input_move: Any,
                      stage: str, elementwise: bool, intact: Intact, exact: bool = False) -> Comparison:
    """The scaled rule for every leaf. One host transfer for every leaf's first figures (and
    the input's move, when it is measured); a second for the leaves these did not settle (a
    bound above the threshold: the exact measure; inf/NaN: the masked one) and for msprobe's
    figure of the flagged ones; a third only when inf/NaN shows in an exact measure whose bound
    was finite (rare)."""
    figures: list[Any] = []
    plans: list[tuple[str, tuple, Any, Any]] = []
    verdicts: list[LeafVerdict] = []
    for kind, path, a, b in leaf_kinds(backend, pairs):
        if kind == "float":
            name = backend.dtype_name(a)
            if pert_mode == "no_change":  # equal outputs (the usual case) need no measure: count first
                figures.append(backend.any_differ(a, b))
                plans.append(("equal", path, a, b))
            elif not elementwise and not exact and name in BOUNDED_DTYPES:
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
            verdicts.append(exact_verdict(path, a, 1.0, type(a).__name__, "", pert_mode))
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
            host[i] = list(EQUAL_SCALED)  # equal leaves: no error, no mismatch
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
            verdicts.append(exact_verdict(path, a, h[0], backend.dtype_repr(a), backend.shape_repr(a), pert_mode))
            continue
        v = scaled_verdict(backend, path, a, h, limits[i], elementwise=elementwise, bounded=i in bounded,
                           move=move if input_move is not None else None)
        verdicts.append(v)
        if not v.consistent and i in reference:
            _reference_detail(backend, v, b, reference[i], pert_mode, tolerance)
    return verdicts


def scaled_at_once(backend: Any, original: Any, reference: Any, *, pert_mode: str, stage: str = "forward",
                   input_move: Any = None, elementwise: bool = False) -> list[LeafVerdict] | None:
    """The verdict of the usual call by the scaled rule when it is known at once: one plain float
    output tensor each side, whose figures the backend takes on the host (`host_scaled_bound`,
    `host_scaled_figures`: small CPU tensors), settled within the threshold by its bound
    (float32/float64, judged by rows) or by its fast measure. It is `scaled_comparison`'s verdict
    for those outputs (a test compares the two), made without its generator, passes and queue.
    None (a leaf over the threshold, whose report also shows msprobe's figure; inf/NaN; an input
    move that is measured; every other output): run the comparison."""
    host_figures = getattr(backend, "host_scaled_figures", None)
    if host_figures is None or pert_mode in ("no_change", "to_cpu"):
        return None
    if input_move is not None and not isinstance(input_move, (int, float)):
        return None  # the move is measured on the device with the figures
    if not (backend.is_tensor(original) and backend.is_tensor(reference)) or backend.is_complex(original):
        return None
    if not (backend.is_float(original) and backend.is_float(reference)):
        return None
    if backend.numel(original) == 0:
        return None
    name = backend.dtype_name(original)
    eps = th.machine_eps(name)
    move = 0.0 if input_move is None else float(input_move)
    limit = th.scaled_threshold(name, pert_mode, move, stage)
    shown_move = move if input_move is not None else None
    if not elementwise and name in BOUNDED_DTYPES:  # the comparison's first figures: the bound
        figures = backend.host_scaled_bound(original, reference)
        if figures is None:
            return None
        bound = scaled.finish_bound(figures, eps)
        if bound <= limit:
            return [scaled_verdict(backend, (), original, [bound, 0.0, 0.0], limit, bounded=True, move=shown_move)]
        if not math.isfinite(bound):
            return None  # inf/NaN: the masked measure
    figures = host_figures(original, reference, eps, elementwise)
    if figures is None or not scaled.finish(figures)[0] <= limit:
        return None
    return [scaled_verdict(backend, (), original, figures, limit, elementwise=elementwise, move=shown_move)]


#: the scaled figures of two equal float leaves (no error, no mismatch)
EQUAL_SCALED = (0.0, 0.0, 0.0)


def scaled_verdict(backend: Any, path: tuple, a: Any, figures: Any, limit: float, *, elementwise: bool = False,
                   bounded: bool = False, move: float | None = None) -> LeafVerdict:
    """A float leaf's verdict by the scaled rule, from its host figures (scaled.finish's input)
    and its threshold; `bounded`: the figure is an upper bound that settled the leaf; `move`:
    the perturbed input's move, when the rule allowed for one."""
    name = backend.dtype_name(a)
    err, nan_mm, inf_mm = scaled.finish(figures)
    ok = not (nan_mm or inf_mm) and err <= limit
    max_rel: float | str = "nan_mismatch" if nan_mm else "inf_mismatch" if inf_mm else err
    detail = {"rule": "scaled", "scaled_error": err, "ulps": err / th.machine_eps(name),
              "scale": "element" if elementwise else "row",
              "nan_mismatch": nan_mm, "inf_mismatch": inf_mm}
    if bounded:
        detail["bound"] = True  # an upper bound that already settled the leaf
    if move is not None:
        detail["input_move"] = move
    return LeafVerdict(path, a, ok, max_rel, round(limit, 12), math.inf if (nan_mm or inf_mm) else 1.0 + err,
                       backend.dtype_repr(a), backend.shape_repr(a), detail)


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
