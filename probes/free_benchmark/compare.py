"""Judging a perturbed output against the original, leaf by leaf: free_benchmark's rules.

Floating tensors by the ratio rule (or the single-benchmark rule for to_cpu) or the scaled rule
(probes/core/scaled_comparison.py, shared with the compiled checks), integer and bool tensors
exactly (a float ratio on indices turns any change into a huge error), Python numbers by the tensor
rule on their values (msprobe's isclose could give a negative max_rel); every leaf of the output
structure counts (probes/core/leaf_verdicts.py: msprobe skipped dicts and nested containers). The
figures of all leaves are gathered on the device and copied to the host in one transfer.

`compare_outputs` drives one comparison at once (a transfer per pass); the free_benchmark service
keeps many pending and drives them together at step()/stop() (probes/free_benchmark/deferred.py),
so a step costs a transfer or two whatever the number of checked calls.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

from probes.core import metrics
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
from probes.core.scaled_comparison import EQUAL_SCALED, scaled_at_once, scaled_comparison, scaled_verdict


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
    or the single-benchmark rule for to_cpu) or "scaled" (probes/core/scaled_comparison.py); `input_move`:
    the perturbed input's move at its scale (scaled rule, add_noise / bit_noise): a number the
    mode knows, or device figures to measure it;
    `pointwise`: the API is element-by-element (aten's pointwise tag), so under improve_precision
    and to_cpu, which re-run it on the same input values, the scaled rule judges every element at
    its own magnitude (there is no cancellation across elements to forgive); `exact`: the scaled
    rule measures every leaf, where it would settle a float32 leaf by an upper bound (figures that
    are shown, not only judged)."""
    pairs = list(pair_leaves(backend, original, perturbed))
    return _comparison(backend, pairs, pert_mode, tolerance, rule, input_move, stage, pointwise,
                       Intact(version, pairs), exact)


def _comparison(backend: Any, pairs: list, pert_mode: str, tolerance: float | None, rule: str, input_move: Any,
                stage: str, pointwise: bool, intact: Intact, exact: bool = False) -> Comparison:
    if rule == "scaled":
        elementwise = pointwise and stage == "forward" and pert_mode in ("improve_precision", "to_cpu")
        verdicts = yield from scaled_comparison(backend, pairs, pert_mode, tolerance, input_move, stage, elementwise,
                                                intact, exact)
        return in_output_order(pairs, verdicts)
    if pert_mode == "to_cpu":
        verdicts = yield from _single_benchmark(backend, pairs, intact)
        return in_output_order(pairs, verdicts)
    device_figures: list[Any] = []
    plans: list[tuple[str, tuple, Any, Any, float]] = []
    verdicts: list[LeafVerdict] = []
    for kind, path, a, b in leaf_kinds(backend, pairs):
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
            verdicts.append(exact_verdict(path, a, 1.0, type(a).__name__, "", pert_mode))
    host = yield device_figures
    differ = [i for i, (plan, h) in enumerate(zip(plans, host)) if plan[0] == "equal" and h[0] > 0]
    for i, plan in enumerate(plans):
        if plan[0] == "equal":
            plans[i] = ("ratio",) + plan[1:]
            host[i] = list(EQUAL_FIGURES)  # equal leaves: what the ratio reductions give them
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
            verdicts.append(exact_verdict(path, a, h[0], backend.dtype_repr(a), backend.shape_repr(a), pert_mode))
            continue
        verdicts.append(_ratio_verdict(backend, path, a, h, tol, pert_mode))
    return in_output_order(pairs, verdicts)


def _ratio_verdict(backend: Any, path: tuple, a: Any, figures: list[float], tol: float, pert_mode: str) -> LeafVerdict:
    """A float leaf's verdict by the ratio rule, from its host figures ([max r, min r, min a*b])."""
    rv = metrics.finish_ratio(figures, tol)
    threshold = th.ratio_threshold(backend.dtype_name(a), pert_mode)
    return LeafVerdict(path, a, rv.consistent(threshold), rv.max_rel, round(threshold - 1.0, 12), rv.figure,
                       backend.dtype_repr(a), backend.shape_repr(a),
                       {"ratio": rv.ratio, "symbol_flipping": rv.symbol_flipping,
                        "nan_mismatch": rv.nan_mismatch, "inf_mismatch": rv.inf_mismatch, "tolerance": tol})


#: the ratio figures of two equal float leaves, as the ratio reductions give them
EQUAL_FIGURES = (1.0, 1.0, 0.0)


def at_once(backend: Any, original: Any, perturbed: Any, *, pert_mode: str, rule: str, tolerance: float | None,
            stage: str, input_move: Any = None, pointwise: bool = False) -> list[LeafVerdict] | None:
    """The call's verdicts when they are known at the call (`comparison`'s, without its queue):
    no_change's equal outputs, or a small CPU output settled by its host figures under either
    rule; None: run the comparison."""
    if pert_mode == "no_change":
        return equal_at_once(backend, original, perturbed, pert_mode=pert_mode, rule=rule, tolerance=tolerance,
                             stage=stage)
    if rule == "scaled":
        elementwise = pointwise and stage == "forward" and pert_mode in ("improve_precision", "to_cpu")
        return scaled_at_once(backend, original, perturbed, pert_mode=pert_mode, stage=stage, input_move=input_move,
                              elementwise=elementwise)
    return ratio_at_once(backend, original, perturbed, pert_mode=pert_mode, tolerance=tolerance)


def equal_at_once(backend: Any, original: Any, perturbed: Any, *, pert_mode: str, rule: str = "reference",
                  tolerance: float | None = None, stage: str = "forward") -> list[LeafVerdict] | None:
    """The verdicts for the usual no_change call, when they are known at once: one plain output
    tensor each side, which the backend finds equal on the host (`host_equal`). They are
    `comparison`'s verdicts for those outputs (under either rule), made without its passes and
    queue (a test compares the two). None: run the comparison.

    A pair the backend's one-pass kernel takes (`kernel_equal`: plain CPU tensors of one real
    dtype and shape, not empty) answers the questions below at once, so it is asked first."""
    host_equal = getattr(backend, "host_equal", None)
    if host_equal is None or not (backend.is_tensor(original) and backend.is_tensor(perturbed)):
        return None
    kernel = getattr(backend, "kernel_equal", None)
    same = None if kernel is None else kernel(original, perturbed)
    if same is None:
        if backend.is_complex(original) or host_equal(original, perturbed) is not True:
            return None  # (complex leaves are compared as their real and imaginary parts)
        if backend.numel(original) == 0:
            return []
        floats = backend.is_float(original) and backend.is_float(perturbed)
        names = (backend.dtype_name(original), backend.dtype_name(perturbed)) if floats else ()
    elif not same:
        return None
    else:  # the kernel's pair: one dtype, both on the host, so either side answers for both
        floats = backend.is_float(original)
        names = (backend.dtype_name(original),) * 2 if floats else ()
    if not floats:
        return [exact_verdict((), original, 0.0, backend.dtype_repr(original), backend.shape_repr(original),
                              pert_mode)]
    name, perturbed_name = names
    key = (backend, name, perturbed_name, tolerance, pert_mode, rule, stage)
    parts = _EQUAL_PARTS.get(key)
    if parts is None:  # the same for every equal leaf of a dtype: worked out once
        tol = tolerance if tolerance is not None else th.forward_tolerance(perturbed_name)
        if rule == "scaled":
            v = scaled_verdict(backend, (), original, list(EQUAL_SCALED),
                               th.scaled_threshold(name, pert_mode, 0.0, stage))
        else:
            v = _ratio_verdict(backend, (), original, list(EQUAL_FIGURES), tol, pert_mode)
        parts = _EQUAL_PARTS[key] = (v.consistent, v.max_rel, v.threshold, v.figure, v.dtype_repr, v.detail)
    consistent, max_rel, threshold, figure, dtype_repr, detail = parts
    return [LeafVerdict((), original, consistent, max_rel, threshold, figure, dtype_repr,
                        backend.shape_repr(original), dict(detail))]


def ratio_at_once(backend: Any, original: Any, perturbed: Any, *, pert_mode: str,
                  tolerance: float | None = None) -> list[LeafVerdict] | None:
    """The verdict of the usual call under the ratio rule (add_noise, bit_noise, change_value,
    improve_precision), when it is known at once: one plain float output tensor each side, whose
    figures the backend takes on the host (`host_ratio_reductions`: small CPU tensors) and finds
    finite. It is `comparison`'s verdict for those outputs (a test compares the two), made
    without its generator, passes and queue. None: run the comparison.

    A pair the backend's one-pass kernel takes (`kernel_ratio_figures`: plain CPU float tensors of
    one dtype, shape and layout) answers every question below at once, so it is tried first; the
    facts of a dtype (clamp floor, threshold, its repr) are worked out once (`_ratio_facts`)."""
    host_ratio = getattr(backend, "host_ratio_reductions", None)
    if host_ratio is None or pert_mode in ("no_change", "to_cpu"):
        return None
    if not (backend.is_tensor(original) and backend.is_tensor(perturbed)):
        return None
    tol, threshold, shown, dtype_repr = _ratio_facts(backend, original, perturbed, pert_mode, tolerance)
    kernel = getattr(backend, "kernel_ratio_figures", None)
    figures = None if kernel is None else kernel(original, perturbed, tol)
    if figures is None:
        if backend.is_complex(original) or not (backend.is_float(original) and backend.is_float(perturbed)):
            return None
        if backend.numel(original) == 0 or backend.shape(original) != backend.shape(perturbed):
            return None
        figures = host_ratio(original, perturbed, tol)
        if figures is None:
            return None
    rmax, rmin = figures[0], figures[1]
    if not (rmin > 0.0 and math.isfinite(rmax) and math.isfinite(rmin)):  # metrics.needs_nonfinite_pass
        return None
    if len(figures) != 3:
        return [_ratio_verdict(backend, (), original, figures, tol, pert_mode)]
    # _ratio_verdict of finite figures: the rule's functions (metrics), without RatioVerdict's object
    ratio, flipped = metrics.ratio_and_flip(rmax, rmin, figures[2], tol)
    consistent = False if flipped else metrics.ratio_within(ratio, threshold)
    return [LeafVerdict((), original, consistent, "symbol_flipping" if flipped else ratio - 1.0, shown,
                        math.inf if flipped else ratio, dtype_repr, backend.shape_repr(original),
                        {"ratio": ratio, "symbol_flipping": flipped, "nan_mismatch": False, "inf_mismatch": False,
                         "tolerance": tol})]


def _ratio_facts(backend: Any, original: Any, perturbed: Any, pert_mode: str,
                 tolerance: float | None) -> tuple[float, float, float, str]:
    """(clamp floor, T, T - 1 as shown, original's dtype repr) of a ratio verdict: the same
    for every call of a pair of dtypes, so worked out once (ratio_at_once runs on every call)."""
    key = (backend, backend.dtype_name(original), backend.dtype_name(perturbed), pert_mode, tolerance)
    facts = _RATIO_FACTS.get(key)
    if facts is None:
        _backend, name, perturbed_name, _mode, _tol = key
        tol = tolerance if tolerance is not None else th.forward_tolerance(perturbed_name)
        threshold = th.ratio_threshold(name, pert_mode)
        facts = _RATIO_FACTS[key] = (tol, threshold, round(threshold - 1.0, 12), backend.dtype_repr(original))
    return facts


# (backend, original's dtype name, perturbed's, mode, tolerance) -> _ratio_facts
_RATIO_FACTS: dict[tuple[Any, str, str, str, float | None], tuple[float, float, float, str]] = {}


# (backend, original's dtype name, perturbed's, tolerance, mode, rule, stage) -> an equal float
# leaf's verdict but for its leaf and shape
_EQUAL_PARTS: dict[tuple[Any, ...], tuple[Any, ...]] = {}


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
        return [exact_verdict(path, a, 1.0, type(a).__name__, "", "to_cpu")]
    return []


# to_cpu's figures hold about seven float64 temporaries of a chunk at once, on the host: 2^16
# elements keeps that near 4 MiB (with the default chunk it was 16 MiB, 4x a small model's step).
SINGLE_BENCHMARK_CHUNK = 1 << 16


def _single_benchmark(backend: Any, pairs: list, intact: Intact) -> Comparison:
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
            verdicts.append(exact_verdict(path, a, h[0][0], backend.dtype_repr(a), backend.shape_repr(a), "to_cpu"))
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
