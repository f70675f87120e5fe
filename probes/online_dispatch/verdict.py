"""From one op's device result and reference result to CSV rows, with one host transfer.

`collect` walks both results in parallel (tensors, tuples, lists, None, Python scalars;
msprobe raised into the user's code on tuple, list and None outputs)
and pairs every output leaf with its reference; for an op that returns nothing but writes into
its arguments (``_foreach_add_``) the written arguments are the outputs. A reference leaf may say
that its device leaf is not a value to compare (`reference.NotCompared`: attention's RNG state
and bookkeeping; a row says why) or that only part of it is defined (`reference.PerQuery`:
attention's logsumexp, compared on the queries that attend to something). `figures` runs the
core formulas (probes.core.dispatch_metrics: the documented rule's figures and the scaled
error) on the reference's side for every leaf, then copies all of them to the host at once.
`rows` judges each leaf by the documented rule, the scaled rule or both (`rule`).
`figures` is a pure function of tensors, so worker processes (process_num > 0) run exactly it.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch

from probes.backends.torch_backend import BACKEND
from probes.core import dispatch_metrics as dm
from probes.core import rules
from probes.core.metrics import finish_single_benchmark
from probes.core.thresholds import (
    FLOAT_DTYPES,
    HAS_INFINITY,
    LARGEST_FINITE,
    MACHINE_EPS,
    dispatch_scaled_threshold,
    overflow_boundary,
    single_benchmark_threshold,
)
from probes.online_dispatch.reference import CPU, NotCompared, PerQuery
from probes.online_dispatch.results import Row, input_row, output_row, special_row


@dataclass
class OutputLeaf:
    name: str
    dev_dtype: str  # str(dtype) of the device leaf, as the CSV shows it
    ref_dtype: str
    dtype_name: str  # "float32", "int64", … of the device leaf: picks the thresholds
    shape: list[int]
    index: int = -1  # position in the figure list, -1 when not measured
    special: Row | None = None
    tensor: bool = True  # False for Python scalars: the scaled rule applies to tensors only


@dataclass
class InputLeaf:
    name: str
    dev_dtype: str
    ref_dtype: str
    shape: list[int]
    is_float: bool
    numel: int
    tensor: bool = True
    index: int = -1  # position in the stats list, -1 for Python scalars
    value: float = 0.0


@dataclass
class OpComparison:
    """The leaves of one op call and the tensors the figures are computed from."""

    prefix: str
    outputs: list[OutputLeaf] = field(default_factory=list)
    inputs: list[InputLeaf] = field(default_factory=list)
    pairs: list[tuple[torch.Tensor, torch.Tensor]] = field(default_factory=list)
    stat_tensors: list[torch.Tensor] = field(default_factory=list)
    chained: bool = False  # a fused backward that rounds intermediates: the wider limit (thresholds)
    # the FP8 matmul: its reference is exact, a correct kernel rounds once (dm.rounded_once_floor);
    # the number of products summed per output element, 0 for every other op
    rounded_once_terms: int = 0


def _dtype_name(x: Any) -> str:
    if isinstance(x, torch.Tensor):
        if x.dtype.is_complex:
            return "float32" if x.dtype == torch.complex64 else "float64"
        return BACKEND.dtype_name(x)
    if isinstance(x, bool):
        return "bool"
    if isinstance(x, int):
        return "int64"
    return "float64"


def _type_str(x: Any) -> str:
    return str(x.dtype) if isinstance(x, torch.Tensor) else str(type(x))


def _shape(x: Any) -> list[int]:
    return list(x.shape) if isinstance(x, torch.Tensor) else []


def _real(t: torch.Tensor) -> torch.Tensor:
    return torch.view_as_real(t) if t.dtype.is_complex else t


_SCALARS = (bool, int, float)


def _not_compared(cmp: OpComparison, name: str, dev: Any, ref: Any, message: str) -> None:
    """A row for a device leaf the reference does not reproduce (accuracy Nan: not a failure)."""
    ref_shape = str(_shape(ref)) if isinstance(ref, torch.Tensor) else ""
    ref_type = _type_str(ref) if isinstance(ref, torch.Tensor) else ""
    cmp.outputs.append(OutputLeaf(name, _type_str(dev), ref_type, _dtype_name(dev), _shape(dev), special=special_row(
        name, _type_str(dev), ref_type, str(_shape(dev)), ref_shape, dm.NAN, message, figure="unsupported")))


def _overflowed_as(ref: torch.Tensor, dev: torch.Tensor) -> torch.Tensor:
    """The reference with the values that round beyond the device dtype's range as what the dtype
    holds there: a float32 product of 1e30 and 1e30 is inf, correctly rounded, where the float64
    reference holds 1e60; without this the two would be reported as an inf/nan mismatch. A value
    rounds beyond the range from half an ulp above the largest value on (65520 in float16, not
    65505). What the dtype holds there is its infinity, or, for an FP8 format without one, what
    PyTorch's CPU cast gives (e4m3fn saturates at 448, the fnuz formats give NaN): a convention of
    the framework, which the device's cast is held to."""
    if not (dev.is_floating_point() and ref.is_floating_point()) or dev.dtype == ref.dtype:
        return ref
    name = BACKEND.dtype_name(dev)
    boundary = overflow_boundary(name) if name in LARGEST_FINITE else torch.finfo(dev.dtype).max
    beyond = ref.abs() >= boundary
    if not bool(beyond.any()):
        return ref
    if name in HAS_INFINITY:
        return torch.where(beyond, ref.sign() * float("inf"), ref)
    return torch.where(beyond, ref.to(dev.dtype).to(ref.dtype), ref)


def _add_pair(cmp: OpComparison, name: str, dev: Any, ref: Any) -> None:
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
    leaf = OutputLeaf(name, _type_str(dev), _type_str(ref), _dtype_name(dev), _shape(dev))
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
        leaf.index = len(cmp.pairs)
        cmp.pairs.append((_real(dev.detach()).to(CPU), _overflowed_as(_real(ref.detach()), dev)))
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
            cmp.outputs.append(OutputLeaf(name, "", "", "", [], special=special_row(
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
        _walk_inputs(cmp, f"{prefix}_input_{k}", dev_kwargs.get(k), r)


def _walk_inputs(cmp: OpComparison, name: str, dev: Any, ref: Any) -> None:
    if isinstance(ref, (list, tuple)) and isinstance(dev, (list, tuple)):
        for i, (d, r) in enumerate(zip(dev, ref)):
            _walk_inputs(cmp, f"{name}.{i}", d, r)
        return
    if isinstance(ref, torch.Tensor) and isinstance(dev, torch.Tensor):
        numel = ref.numel()
        leaf = InputLeaf(name, str(dev.dtype), str(ref.dtype), list(ref.shape),
                         ref.is_floating_point() or ref.is_complex(), numel)
        if numel:
            leaf.index = len(cmp.stat_tensors)
            cmp.stat_tensors.append(_real(ref))
        cmp.inputs.append(leaf)
    elif isinstance(ref, _SCALARS) and isinstance(dev, _SCALARS):
        cmp.inputs.append(InputLeaf(name, str(type(dev)), str(type(ref)), [], isinstance(ref, float), 1,
                                    tensor=False, value=float(ref)))


def _eps(t: torch.Tensor) -> float | None:
    """The dtype's machine epsilon from the core's table where it has the dtype (torch.finfo says
    0.125 for float8_e5m2fnuz, whose spacing at 1 is 0.25)."""
    if not t.is_floating_point():
        return None
    return MACHINE_EPS.get(BACKEND.dtype_name(t), torch.finfo(t.dtype).eps)


def figures(pairs: list[tuple[torch.Tensor, torch.Tensor]], scaled: bool = True,
            exact: bool = False) -> list[list[float]]:
    """Host figures of every output pair (dm.LEAF_FIGURE_COUNT each: the documented rule's and the
    scaled error, dm.NOT_MEASURED without `scaled`).

    One transfer for the documented rule's figures (two when a leaf holds inf/NaN and must be
    re-measured with masks). The scaled error reads each element in several more passes, so it
    is first bounded from figures already there (MaxAbsErr over the floor scale, see
    `scaled.error_bound`): a leaf whose bound is within its threshold keeps the bound as its
    figure, and only the others (or every float leaf with `exact`, debug=True) are measured, in
    one more transfer. A clean op pays one division."""
    if not pairs:
        return []
    xp = BACKEND.namespace(None)
    n = dm.FIGURE_COUNT
    with torch.no_grad():
        parts: list[torch.Tensor] = []
        for d, r in pairs:
            parts += dm.leaf_figure_parts(xp, d.reshape(-1), r.reshape(-1))
        flat = torch.stack(parts).tolist()
        out, at = [], 0
        for d, _r in pairs:
            numel = d.numel()
            count = dm.part_count(numel)
            out.append(dm.figures_from_parts(flat[at : at + count], numel))
            at += count
        redo = [i for i, f in enumerate(out) if dm.needs_masked_pass(f)]
        if redo:
            vals = torch.cat([dm.masked_leaf_figures(xp, *pairs[i]) for i in redo]).tolist()
            for j, i in enumerate(redo):
                out[i] = vals[j * n : (j + 1) * n]
        measure = []
        for i, (d, _r) in enumerate(pairs):
            eps = _eps(d)
            if not scaled or eps is None:
                out[i].append(dm.NOT_MEASURED if not scaled else 0.0)
                continue
            rms = dm.reference_rms(out[i])
            bound = dm.scaled_bound(out[i], eps)
            limit = dispatch_scaled_threshold(BACKEND.dtype_name(d))
            if not exact and limit is not None and bound <= limit:
                out[i].append(bound)
            else:
                out[i].append(0.0)
                measure.append((i, eps, rms))
        if measure:
            redo_set = set(redo)
            vals = torch.cat([dm.scaled_figure(xp, *pairs[i], eps, masked=i in redo_set, tensor_rms=rms)
                              for i, eps, rms in measure]).tolist()
            for (i, _eps_i, _rms), v in zip(measure, vals):
                out[i][dm.SCALED] = v
    return out


def input_statistics(stat_tensors: list[torch.Tensor]) -> list[list[float]]:
    """[max, min, sum, finite count] of every input tensor, one transfer (two with inf/NaN)."""
    if not stat_tensors:
        return []
    xp = BACKEND.namespace(None)
    n = dm.STAT_COUNT
    with torch.no_grad():
        flat = torch.cat([dm.input_stats(xp, t) for t in stat_tensors]).tolist()
        stats = [flat[i * n : (i + 1) * n] for i in range(len(stat_tensors))]
        redo = [i for i, st in enumerate(stats) if dm.needs_masked_pass(st)]
        if redo:
            vals = torch.cat([dm.masked_input_stats(xp, stat_tensors[i]) for i in redo]).tolist()
            for j, i in enumerate(redo):
                stats[i] = vals[j * n : (j + 1) * n]
    return stats


def rows(cmp: OpComparison, out_figs: list[list[float]], all_details: bool = False,
         rule: str = rules.BOTH) -> tuple[list[Row], list[Row]]:
    """(input rows, output rows) of one op, outputs judged by `rule` (the documented rule, the
    scaled rule, or both: a leaf fails when either fails) + noise floor.

    A leaf is first judged without the floor; only a leaf that fails needs the noise floor,
    so only then are the magnitudes measured (its own two sides and the op's inputs: the floor's
    scale). The same evidence pass fills MaxRelativeErr, max / min / mean and the
    single-benchmark columns (msprobe 8.3.3's actual figures) of those leaves (of every leaf when `all_details`, i.e. debug=True)
    and the statistics of the input rows: a clean op pays for none of it.
    """
    biggest = max([leaf.numel for leaf in cmp.inputs if leaf.is_float and leaf.tensor] + [1])
    judged: list[tuple[OutputLeaf, Any]] = []
    for leaf in cmp.outputs:
        if leaf.special is None:
            f = out_figs[leaf.index]
            judged.append((leaf, dm.judge(f, max(1, _numel(leaf.shape)), leaf.dtype_name, 0.0, rule, leaf.tensor,
                                           cmp.chained)))
    suspects = [(leaf, v) for leaf, v in judged if v.failed or all_details]
    in_stats: list[list[float]] | None = None
    evidence: dict[int, list[float]] = {}
    if suspects:
        in_stats = input_statistics(cmp.stat_tensors)
        evidence = _evidence(cmp, [leaf for leaf, _ in suspects])
    in_scale = 0.0
    for leaf in cmp.inputs:
        if leaf.is_float and leaf.index >= 0 and in_stats is not None:
            in_scale = max(in_scale, dm.finite_abs_max(in_stats[leaf.index][0], in_stats[leaf.index][1]))
        elif leaf.is_float and not leaf.tensor:
            in_scale = max(in_scale, abs(leaf.value))
    verdicts = {id(leaf): v for leaf, v in judged}
    out_rows: list[Row] = []
    for leaf in cmp.outputs:
        if leaf.special is not None:
            if leaf.special.failed:
                leaf.special.failed_rule = dm.rule_label(rule != rules.SCALED, rule != rules.REFERENCE)
            out_rows.append(leaf.special)
            continue
        verdict = verdicts[id(leaf)]
        ev = evidence.get(leaf.index)
        if ev is not None:
            numel = max(1, _numel(leaf.shape))
            out_scale = max(dm.finite_abs_max(ev[0], ev[1]), dm.finite_abs_max(ev[dm.STAT_COUNT], ev[dm.STAT_COUNT + 1]))
            if cmp.rounded_once_terms:
                floor = dm.rounded_once_floor(leaf.dtype_name, out_scale, cmp.rounded_once_terms)
            else:
                floor = dm.noise_floor(leaf.dtype_name, max(in_scale, out_scale), biggest / numel)
            verdict = dm.judge(out_figs[leaf.index], numel, leaf.dtype_name, floor, rule, leaf.tensor, cmp.chained)
        row = output_row(leaf.name, leaf.dev_dtype, leaf.ref_dtype, str(leaf.shape), verdict)
        if ev is not None:
            _fill_row(row, leaf, ev, verdict.floor)
        out_rows.append(row)
    in_rows: list[Row] = []
    for leaf in cmp.inputs:
        stats: tuple[Any, Any, Any] = ("", "", "")
        if not leaf.tensor:
            stats = (leaf.value, leaf.value, leaf.value)
        elif leaf.index >= 0 and in_stats is not None:
            stats = _mean_stats(in_stats[leaf.index])
        in_rows.append(input_row(leaf.name, leaf.dev_dtype, leaf.ref_dtype, str(leaf.shape), stats))
    return in_rows, out_rows


def _mean_stats(st: list[float]) -> tuple[float, float, float]:
    mx, mn, total, count = st
    return mx, mn, total / count if count else float("nan")


_EVIDENCE_WIDTH = 2 * dm.STAT_COUNT + 1 + dm.SB_COUNT


def _evidence(cmp: OpComparison, leaves: list[OutputLeaf]) -> dict[int, list[float]]:
    """Per leaf: device stats, reference stats, MaxRelativeErr, single-benchmark figures; one host transfer."""
    xp = BACKEND.namespace(None)
    with torch.no_grad():
        arrays = []
        for leaf in leaves:
            dev, ref = cmp.pairs[leaf.index]
            dev, ref = dev.reshape(-1), ref.reshape(-1)
            parts = [dm.masked_input_stats(xp, dev), dm.masked_input_stats(xp, ref),
                     dm.max_relative_error(xp, dev, ref).reshape(1)]
            if leaf.dtype_name in FLOAT_DTYPES:
                small = single_benchmark_threshold(leaf.dtype_name).small_value
                parts.append(dm.single_benchmark_figures(xp, dev, ref, small))
            else:
                parts.append(torch.full((dm.SB_COUNT,), float("nan"), dtype=torch.float64))
            arrays.append(torch.cat([p_.to(torch.float64) for p_ in parts]))
        flat = torch.cat(arrays).tolist()
    return {leaf.index: flat[i * _EVIDENCE_WIDTH : (i + 1) * _EVIDENCE_WIDTH] for i, leaf in enumerate(leaves)}


def _fill_row(row: Row, leaf: OutputLeaf, ev: list[float], floor: float) -> None:
    row.npu_stats = _mean_stats(ev[: dm.STAT_COUNT])
    row.bench_stats = _mean_stats(ev[dm.STAT_COUNT : 2 * dm.STAT_COUNT])
    row.max_rel_err = ev[2 * dm.STAT_COUNT]
    if leaf.dtype_name in FLOAT_DTYPES:
        thd = single_benchmark_threshold(leaf.dtype_name)
        sb = finish_single_benchmark(ev[2 * dm.STAT_COUNT + 1 :], thd.rtol, thd.small_value_atol, thd.error_balance)
        row.extra = (sb.error_balance, sb.abs_err, sb.rel_err, "pass" if sb.consistent else "fail", floor)
    else:
        row.extra = ("", "", "", "", floor)


def _numel(shape: list[int]) -> int:
    n = 1
    for s in shape:
        n *= s
    return n
