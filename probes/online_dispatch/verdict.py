"""From one op's paired leaves (probes.online_dispatch.leaf_pairs) to CSV rows.

`figures` runs the core formulas (probes.core.dispatch_figures: the documented rule's figures and
the scaled error) on the reference's side, the CPU, for every leaf, and reads them as Python
floats. `rows` judges each leaf by the documented rule, the scaled rule or both (`rule`,
probes.core.dispatch_metrics). `figures` is a pure function of tensors, so worker processes
(process_num > 0) run exactly it.
"""

from __future__ import annotations

import math
from typing import Any

import torch

from probes.backends.torch_backend import BACKEND
from probes.core import dispatch_figures as df
from probes.core import dispatch_metrics as dm
from probes.core import rules
from probes.core.metrics import finish_single_benchmark
from probes.core.scaled import error_bound, row_floor, scaled_threshold_for_eps
from probes.core.thresholds import (
    FLOAT_DTYPES,
    MACHINE_EPS,
    dispatch_scaled_threshold,
    single_benchmark_threshold,
)
from probes.online_dispatch import figure_parts
from probes.online_dispatch.leaf_pairs import (
    OpComparison,
    OutputLeaf,
    input_leaves,
    may_overflow,
    overflowed_as,
)
from probes.online_dispatch.results import Row, output_row, passing_output_line, with_input_stats


def _eps(t: torch.Tensor) -> float | None:
    """The dtype's machine epsilon from the core's table where it has the dtype (torch.finfo says
    0.125 for float8_e5m2fnuz, whose spacing at 1 is 0.25)."""
    if not t.is_floating_point():
        return None
    return MACHINE_EPS.get(BACKEND.dtype_name(t), torch.finfo(t.dtype).eps)


# device dtype -> (machine epsilon, scaled limit, row floor) for the scaled bound; looked up for
# every output leaf, so worked out once per dtype
_BOUND_TERMS: dict[torch.dtype, tuple[float | None, float | None, float]] = {}


def _bound_terms(t: torch.Tensor) -> tuple[float | None, float | None, float]:
    terms = _BOUND_TERMS.get(t.dtype)
    if terms is None:
        eps = _eps(t)
        limit = dispatch_scaled_threshold(BACKEND.dtype_name(t))
        floor = row_floor(eps, scaled_threshold_for_eps(eps)) if eps is not None else 0.0
        terms = _BOUND_TERMS[t.dtype] = (eps, limit, floor)
    return terms


def _finite(f: list[float]) -> bool:
    """Every figure finite (df.needs_masked_pass's test), by their sum first: one call where
    the usual leaf is finite; a sum that overflows is checked figure by figure."""
    return math.isfinite(sum(f)) or all(map(math.isfinite, f))


def figures(pairs: list[tuple[torch.Tensor, torch.Tensor]], scaled: bool = True,
            exact: bool = False, known: dict[int, tuple[torch.Tensor, Any]] | None = None) -> list[list[float]]:
    """Host figures of every output pair (df.LEAF_FIGURE_COUNT each: the documented rule's and the
    scaled error, df.NOT_MEASURED without `scaled`).

    One pass of reductions for the documented rule's figures (another when a leaf holds inf/NaN
    and must be re-measured with masks). The scaled error reads each element in several more
    passes, so it is first bounded from figures already there (MaxAbsErr over the floor scale,
    see `scaled.error_bound`): a leaf whose bound is within its threshold keeps the bound as its
    figure, and only the others (or every float leaf with `exact`, debug=True) are measured. A
    clean op pays one division. The pairs hold no autograd history (detached copies and results
    of no_grad re-runs), so no grad mode is set here."""
    if not pairs:
        return []
    n = df.FIGURE_COUNT
    out = figure_parts.leaf_figures(pairs, known)
    redo = []
    for i, (d, r) in enumerate(pairs):
        f = out[i]
        if may_overflow(d, r, f[df.REF_SQ]):
            mapped = overflowed_as(r, d)
            if mapped is not r:  # the rows and dumps show the reference as measured
                pairs[i] = (d, mapped)
                f = out[i] = figure_parts.leaf_figures([(d, mapped)])[0]
        if not _finite(f):
            redo.append(i)
    if redo:
        xp = BACKEND.namespace(None)
        vals = torch.cat([df.masked_leaf_figures(xp, *pairs[i]) for i in redo]).tolist()
        for j, i in enumerate(redo):
            out[i] = vals[j * n : (j + 1) * n]
    measure = []
    for i, (d, _r) in enumerate(pairs):
        f = out[i]
        eps, limit, floor = _BOUND_TERMS.get(d.dtype) or _bound_terms(d)
        if not scaled or eps is None:
            f.append(df.NOT_MEASURED if not scaled else 0.0)
            continue
        rms = df.reference_rms(f)
        bound = error_bound(df.max_abs_err(f), rms, eps, floor) if _finite(f) else math.inf
        if not exact and limit is not None and bound <= limit:
            f.append(bound)
        else:
            f.append(0.0)
            measure.append((i, eps, rms))
    if measure:
        xp = BACKEND.namespace(None)
        redo_set = set(redo)
        vals = torch.cat([df.scaled_figure(xp, *pairs[i], eps, masked=i in redo_set, tensor_rms=rms)
                          for i, eps, rms in measure]).tolist()
        for (i, _eps_i, _rms), v in zip(measure, vals):
            out[i][df.SCALED] = v
    return out


def input_statistics(stat_tensors: list[torch.Tensor]) -> list[list[float]]:
    """[max, min, sum, finite count] of every input tensor, one transfer (two with inf/NaN)."""
    if not stat_tensors:
        return []
    xp = BACKEND.namespace(None)
    n = df.STAT_COUNT
    with torch.no_grad():
        flat = torch.cat([df.input_stats(xp, t) for t in stat_tensors]).tolist()
        stats = [flat[i * n : (i + 1) * n] for i in range(len(stat_tensors))]
        redo = [i for i, st in enumerate(stats) if df.needs_masked_pass(st)]
        if redo:
            vals = torch.cat([df.masked_input_stats(xp, stat_tensors[i]) for i in redo]).tolist()
            for j, i in enumerate(redo):
                stats[i] = vals[j * n : (j + 1) * n]
    return stats


def rows(cmp: OpComparison, out_figs: list[list[float]], all_details: bool = False,
         rule: str = rules.BOTH) -> tuple[list[list[Any] | str], list[Row | str]]:
    """(input rows' cells, output rows) of one op, outputs judged by `rule` (the documented rule, the
    scaled rule, or both: a leaf fails when either fails) + noise floor. An output leaf that
    passes without evidence is given as its CSV line (results.passing_output_line), every other as a Row.

    A leaf is first judged without the floor; only a leaf that fails needs the noise floor,
    so only then are the magnitudes measured (its own two sides and the op's inputs: the floor's
    scale). The same evidence pass fills MaxRelativeErr, max / min / mean and the
    single-benchmark columns (msprobe 8.3.3's actual figures) of those leaves (of every leaf when `all_details`, i.e. debug=True)
    and the statistics of the input rows: a clean op pays for none of it.
    """
    judged: list[tuple[OutputLeaf, Any]] = []
    suspects = False
    for leaf in cmp.outputs:
        if leaf.special is None:
            v = dm.judge(out_figs[leaf.index], leaf.numel, leaf.dtype_name, 0.0, rule, leaf.tensor, cmp.chained)
            judged.append((leaf, v))
            if all_details or v.failed:
                suspects = True
    if not suspects:  # the usual op: no statistics, every judged leaf's verdict stands
        verdicts = iter(judged)
        out_rows: list[Row | str] = []
        for leaf in cmp.outputs:
            if leaf.special is not None:
                _append_special(out_rows, leaf.special, rule)
            else:
                v = next(verdicts)[1]
                if v.accuracy == dm.YES and not v.failed_rule and cmp.plain_names:
                    out_rows.append(passing_output_line(leaf.name, leaf.dev_dtype, leaf.ref_dtype, leaf.shape, v))
                else:
                    out_rows.append(output_row(leaf.name, leaf.dev_dtype, leaf.ref_dtype, leaf.shape, v))
        return cmp.input_cells, out_rows
    return _rows_with_evidence(cmp, out_figs, all_details, rule, judged)


def _rows_with_evidence(cmp: OpComparison, out_figs: list[list[float]], all_details: bool, rule: str,
                        judged: list[tuple[OutputLeaf, Any]]) -> tuple[list[list[Any] | str], list[Row | str]]:
    """`rows` of an op with a leaf that failed without the floor (or of every op, `all_details`)."""
    suspects = [leaf for leaf, v in judged if all_details or v.failed]
    in_stats = input_statistics(cmp.stat_tensors)
    evidence = _evidence(cmp, suspects)
    in_scale, biggest = 0.0, 1
    inputs = input_leaves(cmp)
    biggest = max([leaf.numel for leaf in inputs if leaf.is_float and leaf.tensor] + [1])
    for leaf in inputs:
        if leaf.is_float and leaf.index >= 0:
            in_scale = max(in_scale, df.finite_abs_max(in_stats[leaf.index][0], in_stats[leaf.index][1]))
        elif leaf.is_float and not leaf.tensor:
            in_scale = max(in_scale, abs(leaf.value))
    verdicts = {id(leaf): v for leaf, v in judged}
    out_rows: list[Row | str] = []
    for leaf in cmp.outputs:
        if leaf.special is not None:
            _append_special(out_rows, leaf.special, rule)
            continue
        verdict = verdicts[id(leaf)]
        ev = evidence.get(leaf.index)
        if ev is not None:
            numel = leaf.numel
            out_scale = max(df.finite_abs_max(ev[0], ev[1]), df.finite_abs_max(ev[df.STAT_COUNT], ev[df.STAT_COUNT + 1]))
            if cmp.rounded_once_terms:
                floor = dm.rounded_once_floor(leaf.dtype_name, out_scale, cmp.rounded_once_terms)
            else:
                floor = dm.noise_floor(leaf.dtype_name, max(in_scale, out_scale), biggest / numel)
            verdict = dm.judge(out_figs[leaf.index], numel, leaf.dtype_name, floor, rule, leaf.tensor, cmp.chained)
        row = output_row(leaf.name, leaf.dev_dtype, leaf.ref_dtype, leaf.shape, verdict)
        if ev is not None:
            _fill_row(row, leaf, ev, verdict.floor)
        out_rows.append(row)
    in_rows: list[list[Any] | str] = []
    for leaf, row in zip(inputs, cmp.input_cells):
        if leaf.index >= 0:  # a tensor's row: results.input_line, or its cells
            stats = _mean_stats(in_stats[leaf.index])
            row = with_input_stats(row, stats) if row.__class__ is str else [*row[:6], *stats, *stats, *row[12:]]
        in_rows.append(row)
    return in_rows, out_rows


def _append_special(out_rows: list[Row | str], special: Row, rule: str) -> None:
    if special.failed:
        special.failed_rule = dm.rule_label(rule != rules.SCALED, rule != rules.REFERENCE)
    out_rows.append(special)


def _mean_stats(st: list[float]) -> tuple[float, float, float]:
    mx, mn, total, count = st
    return mx, mn, total / count if count else float("nan")


_EVIDENCE_WIDTH = 2 * df.STAT_COUNT + 1 + df.SB_COUNT


def _evidence(cmp: OpComparison, leaves: list[OutputLeaf]) -> dict[int, list[float]]:
    """Per leaf: device stats, reference stats, MaxRelativeErr, single-benchmark figures; one host transfer."""
    xp = BACKEND.namespace(None)
    with torch.no_grad():
        arrays = []
        for leaf in leaves:
            dev, ref = cmp.pairs[leaf.index]
            dev, ref = dev.reshape(-1), ref.reshape(-1)
            parts = [df.masked_input_stats(xp, dev), df.masked_input_stats(xp, ref),
                     df.max_relative_error(xp, dev, ref).reshape(1)]
            if leaf.dtype_name in FLOAT_DTYPES:
                small = single_benchmark_threshold(leaf.dtype_name).small_value
                parts.append(df.single_benchmark_figures(xp, dev, ref, small))
            else:
                parts.append(torch.full((df.SB_COUNT,), float("nan"), dtype=torch.float64))
            arrays.append(torch.cat([p_.to(torch.float64) for p_ in parts]))
        flat = torch.cat(arrays).tolist()
    return {leaf.index: flat[i * _EVIDENCE_WIDTH : (i + 1) * _EVIDENCE_WIDTH] for i, leaf in enumerate(leaves)}


def _fill_row(row: Row, leaf: OutputLeaf, ev: list[float], floor: float) -> None:
    row.npu_stats = _mean_stats(ev[: df.STAT_COUNT])
    row.bench_stats = _mean_stats(ev[df.STAT_COUNT : 2 * df.STAT_COUNT])
    row.max_rel_err = ev[2 * df.STAT_COUNT]
    if leaf.dtype_name in FLOAT_DTYPES:
        thd = single_benchmark_threshold(leaf.dtype_name)
        sb = finish_single_benchmark(ev[2 * df.STAT_COUNT + 1 :], thd.rtol, thd.small_value_atol, thd.error_balance)
        row.extra = (sb.error_balance, sb.abs_err, sb.rel_err, "pass" if sb.consistent else "fail", floor)
    else:
        row.extra = ("", "", "", "", floor)
