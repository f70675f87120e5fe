"""online_dispatch's per-leaf comparison: the documented Cosine / MaxAbsErr rule, written once.

The figures the rule reads are measured on the device in probes.core.dispatch_figures, apart so
that the per-op measuring can be tuned without touching the rule; they are re-exported here, so a
caller reads the rule and its figures from one module. The verdict (`judge`) is plain Python over
the host copy of those figures.

The rule (the one msprobe's online_dispatch docs describe) fails a leaf when
``Cosine < COS_THRESHOLD and MaxAbsErr > MAX_ABS_ERR_THRESHOLD``, or ``Cosine < COS_MAX_THRESHOLD``,
or ``MaxAbsErr > MAX_ABS_ERR_MAX_THRESHOLD``. The literal rule is blind to scale: a value that is
zero in exact arithmetic comes out as rounding noise on both sides, and two noise vectors have
an arbitrary cosine. So a leaf the literal rule fails still passes when its MaxAbsErr is within
the *noise floor*

    floor = NOISE_FLOOR_ULPS * eps(device dtype) * scale * sqrt(max(1, reduction))

passes, where ``scale`` is the largest finite magnitude among the op's floating inputs and both
outputs of the leaf, and ``reduction`` = numel(largest input) / numel(leaf), the number of input
elements that meet in one output element (a sum over N terms accumulates about sqrt(N)
roundings). Integer and boolean leaves have no floor: they must match exactly.

A second rule, the *scaled* rule, reads the figure `scaled_figure` appends: the largest error
of the leaf at its own scale (probes/core/scaled.py: per-row RMS-floored relative error), which
fails when above ``DISPATCH_SCALED_THRESHOLD`` of the device dtype (probes/core/thresholds.py).
The documented rule is blind to a relative error whose absolute size stays small (an fp32 kernel
computing in TF32: relative error 1e-3, Cosine 0.999999, MaxAbsErr 1e-3); the scaled rule is not.
``judge(rule=...)`` applies either or both ("both", the default: a leaf fails when either fails);
the noise floor passes a leaf under both.

The documented rule's limits and the noise floor's width are defined here, once (they belong to
this comparison alone); the scaled rule's limit is with the other per-dtype limits in
probes/core/thresholds.py, and the rule names in probes/core/rules.py.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from probes.core import rules
from probes.core.dispatch_figures import (
    CHUNK_ELEMENTS,
    DEV_SQ,
    DOT,
    FIGURE_COUNT,
    FINITE_COUNT,
    FLOAT64_EPS,
    LEAF_FIGURE_COUNT,
    MAX_ABS,
    NONFINITE_MISMATCH,
    NOT_MEASURED,
    RAW_COUNT,
    REF_SQ,
    SB_ABS,
    SB_COUNT,
    SB_EB,
    SB_MISMATCH,
    SB_REL,
    SCALED,
    STAT_COUNT,
    figures_from_parts,
    finite_abs_max,
    input_stats,
    leaf_figure_parts,
    leaf_figures,
    masked_input_stats,
    masked_leaf_figures,
    max_abs_err,
    max_relative_error,
    needs_masked_pass,
    part_count,
    reference_rms,
    scaled_bound,
    scaled_figure,
    single_benchmark_figures,
)
from probes.core.thresholds import (
    FLOAT8_DTYPES,
    MACHINE_EPS,
    SCALE_DTYPES,
    SIGNIFICAND_BITS,
    dispatch_scaled_threshold,
)

# the rule's own names and, re-exported, the figures it reads (module docstring)
__all__ = [
    "COSINE_ONE_ABOVE", "COS_MAX_THRESHOLD", "COS_THRESHOLD", "FAILING", "LeafVerdict",
    "MAX_ABS_ERR_MAX_THRESHOLD", "MAX_ABS_ERR_THRESHOLD", "NAN", "NO", "NOISE_FLOOR_ULPS",
    "NOISE_FLOOR_ULPS_FP8", "UNMATCHED", "YES", "cosine_of", "format_figure", "judge", "noise_floor",
    "rounded_once_floor", "rule_fails", "rule_label", "scaled_ulps",
    "CHUNK_ELEMENTS", "DEV_SQ", "DOT", "FIGURE_COUNT", "FINITE_COUNT", "FLOAT64_EPS", "LEAF_FIGURE_COUNT",
    "MAX_ABS", "NONFINITE_MISMATCH", "NOT_MEASURED", "RAW_COUNT", "REF_SQ", "SB_ABS", "SB_COUNT", "SB_EB",
    "SB_MISMATCH", "SB_REL", "SCALED", "STAT_COUNT", "figures_from_parts", "finite_abs_max", "input_stats",
    "leaf_figure_parts", "leaf_figures", "masked_input_stats", "masked_leaf_figures", "max_abs_err",
    "max_relative_error", "needs_masked_pass", "part_count", "reference_rms", "scaled_bound",
    "scaled_figure", "single_benchmark_figures",
]

# The documented rule, by name.
COS_THRESHOLD = 0.99
MAX_ABS_ERR_THRESHOLD = 0.001
COS_MAX_THRESHOLD = 0.9
MAX_ABS_ERR_MAX_THRESHOLD = 1.0
# Cosines above this are reported as 1.0; norms at or below FLOAT64_EPS count as all-zero data.
COSINE_ONE_ABOVE = 0.99999

# The noise floor: a difference within this many units of the device dtype's machine epsilon,
# scaled by the op's magnitudes (see the module docstring), is rounding, not a defect.
NOISE_FLOOR_ULPS = 8.0
# An FP8 result's: half an ulp, one rounding. 8 ulps of e4m3 would be the op's whole magnitude, so
# every FP8 result (a cast) would pass the floor whatever its error.
NOISE_FLOOR_ULPS_FP8 = 0.5

# Values of the "Accuracy Reached or Not" column.
YES, NO, UNMATCHED, NAN = "Yes", "No", "Unmatched", "Nan"
FAILING = (NO, UNMATCHED)


def noise_floor(dtype_name: str, scale: float, reduction: float) -> float:
    """The absolute difference below which a leaf of this device dtype passes (module docstring)."""
    eps = MACHINE_EPS.get(dtype_name)
    if eps is None or not math.isfinite(scale):
        return 0.0
    ulps = NOISE_FLOOR_ULPS_FP8 if dtype_name in FLOAT8_DTYPES + SCALE_DTYPES else NOISE_FLOOR_ULPS
    return ulps * eps * scale * math.sqrt(max(1.0, reduction))


def rounded_once_floor(dtype_name: str, scale: float, terms: int) -> float:
    """The noise floor of an op whose reference starts from its own exact operands and which a
    correct kernel rounds once to its output dtype after a float32 sum of `terms` products (the
    FP8 matmul): half an ulp of the output's scale, plus NOISE_FLOOR_ULPS float32 ulps per
    sqrt(term) for the sum. `scale` is the output's: the FP8 operands' values are in scaled
    units. The general floor (8 output ulps, sqrt of the reduction, the inputs' magnitudes) would
    let a kernel that accumulates in bfloat16 pass (12 bf16 ulps of the row's scale at K = 512)."""
    eps = MACHINE_EPS.get(dtype_name)
    if eps is None or not math.isfinite(scale):
        return 0.0
    return (0.5 * eps + NOISE_FLOOR_ULPS * MACHINE_EPS["float32"] * math.sqrt(max(1, terms))) * scale


@dataclass
class LeafVerdict:
    """Figures and verdict of one output leaf, ready to be written as a CSV row. Not frozen: one is
    made for every output of every compared op, and a frozen dataclass's __init__ sets each field
    through object.__setattr__ (four times the cost)."""

    cosine: float | str
    max_abs_err: float | str
    max_rel_err: float | str
    accuracy: str
    message: str
    floor: float
    failed_rule: str = ""  # "reference", "scaled", "both" or "" (the CSV's FailedRule)
    scaled_ulps: float | str = ""  # the scaled figure in ulps of the device dtype ("" when not measured)

    @property
    def failed(self) -> bool:
        return self.accuracy in FAILING


def cosine_of(figures: list[float]) -> tuple[float | None, str]:
    """The documented cosine with its edge cases: (value or None, message)."""
    dev_norm = math.sqrt(max(figures[DEV_SQ], 0.0))
    ref_norm = math.sqrt(max(figures[REF_SQ], 0.0))
    if dev_norm <= FLOAT64_EPS and ref_norm <= FLOAT64_EPS:
        return 1.0, ""
    if dev_norm <= FLOAT64_EPS:
        return None, "device data all zero"
    if ref_norm <= FLOAT64_EPS:
        return None, "bench data all zero"
    cos = figures[DOT] / (dev_norm * ref_norm)
    if math.isnan(cos):
        return None, "data has NaN"
    return (1.0 if cos > COSINE_ONE_ABOVE else cos), ""


def rule_fails(cosine: float, max_abs_err: float) -> bool:
    """The documented rule, literally."""
    return (
        (cosine < COS_THRESHOLD and max_abs_err > MAX_ABS_ERR_THRESHOLD)
        or cosine < COS_MAX_THRESHOLD
        or max_abs_err > MAX_ABS_ERR_MAX_THRESHOLD
    )


def rule_label(reference_failed: bool, scaled_failed: bool) -> str:
    """The FailedRule value: which rule(s) failed a leaf."""
    if reference_failed and scaled_failed:
        return rules.BOTH
    return rules.REFERENCE if reference_failed else (rules.SCALED if scaled_failed else "")


def scaled_ulps(figure: float, dtype_name: str) -> float | str:
    """The scaled figure in ulps (units of the dtype's machine epsilon); "" for non-float dtypes."""
    eps = MACHINE_EPS.get(dtype_name)
    return "" if eps is None else figure / eps


def judge(figures: list[float], numel: int, dtype_name: str, floor: float, rule: str = rules.BOTH,
          scaled_applies: bool = True, chained: bool = False) -> LeafVerdict:
    """Verdict of one leaf from the host copy of its figures.

    Order: non-finite values that disagree fail (under either rule); integer / bool values must
    match exactly; a MaxAbsErr within the noise floor passes; otherwise the leaf fails when the
    documented rule fails it (rule "reference" or "both") or its scaled figure is above the
    dtype's DISPATCH_SCALED_THRESHOLD (rule "scaled" or "both"; only for float tensor leaves with
    a scaled figure: `scaled_applies` is False for Python scalars, and figure vectors of
    FIGURE_COUNT entries have none). For the documented rule a one-element leaf has no cosine
    (msprobe: "tensor is scalar") and is judged as if its cosine were the sign agreement (+1 / -1),
    and a side that is all zero while the other is not (cosine undefined) fails. `chained`: the
    op is a fused backward whose limit is wider (thresholds.dispatch_scaled_threshold).
    """
    count = figures[FINITE_COUNT]
    max_abs = figures[MAX_ABS] if count > 0 else 0.0  # max_abs_err
    max_rel: float | str = ""  # evidence, measured for failing leaves by the caller
    use_reference = rule in (rules.REFERENCE, rules.BOTH)
    use_scaled = rule in (rules.SCALED, rules.BOTH)
    exact = dtype_name not in SIGNIFICAND_BITS  # the FP8 formats are judged in their ulps too
    figure = figures[SCALED] if len(figures) > SCALED and scaled_applies and not exact else None
    if figure is not None and figure < 0.0:  # NOT_MEASURED
        figure = None
    ulps = scaled_ulps(figure, dtype_name) if figure is not None else ""
    messages = []
    if numel == 1:
        cosine: float | str = "unsupported"
        messages.append("tensor is scalar")
        sign = figures[DOT]
        effective: float | None = 1.0 if sign > 0 else (-1.0 if sign < 0 else (1.0 if max_abs == 0 else None))
    else:
        value, msg = cosine_of(figures)
        cosine = value if value is not None else NAN
        effective = value
        if msg:
            messages.append(msg)
    if figures[NONFINITE_MISMATCH] > 0:
        messages.append(f"inf/nan differ at {int(figures[NONFINITE_MISMATCH])} positions")
        return LeafVerdict(cosine, max_abs, max_rel, NO, "; ".join(messages), floor,
                           rule_label(use_reference, use_scaled), ulps)
    if count == 0:
        messages.append("no finite values; inf/nan positions agree")
        return LeafVerdict(cosine, 0.0, 0.0, YES, "; ".join(messages), floor, "", ulps)
    if exact:
        accuracy = YES if max_abs == 0 else NO
        if accuracy == NO:
            messages.append("integer/bool values differ")
        return LeafVerdict(cosine, max_abs, max_rel, accuracy, "; ".join(messages), floor,
                           rule_label(use_reference, use_scaled) if accuracy == NO else "", ulps)
    literal_fail = use_reference and (effective is None or rule_fails(effective, max_abs))
    threshold = dispatch_scaled_threshold(dtype_name, chained)
    scaled_fail = use_scaled and figure is not None and threshold is not None and figure > threshold
    if scaled_fail:
        messages.append(f"scaled error {ulps:.4g} ulp > {threshold / MACHINE_EPS[dtype_name]:.4g} ulp")
    if max_abs <= floor:
        if literal_fail or scaled_fail:
            messages.append(f"within the rounding-noise floor {floor:.3e}")
        return LeafVerdict(cosine, max_abs, max_rel, YES, "; ".join(messages), floor, "", ulps)
    failed = rule_label(literal_fail, scaled_fail)
    return LeafVerdict(cosine, max_abs, max_rel, NO if failed else YES, "; ".join(messages),
                       floor, failed, ulps)


def format_figure(value: float | str) -> str:
    """A figure as the CSV holds it: 12 decimals, the format msprobe's online_dispatch documents and
    its readers parse, so not the short rendering of reports (probes.core.number_format); words
    verbatim."""
    if isinstance(value, str):
        return value
    if math.isnan(value):
        return NAN
    if value == 1.0:
        return "1.0"
    return f"{value:.12f}"
