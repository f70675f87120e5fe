"""The numbers users read in the docs, each defined once, by name: the limits of the probes'
verdict rules, and the facts of the floating dtypes they are expressed in.

Keys are framework-neutral dtype names ("float16", "bfloat16", "float32", "float64", and the 8-bit
formats "float8_e4m3fn", "float8_e5m2", ...); the backends translate their own dtypes to these names.

A limit that means something only with one measure is defined with that measure, whose docstring
says so: online_dispatch's documented Cosine / MaxAbsErr rule and its noise floor
(probes/core/dispatch_metrics.py), the accumulation test ratio's limit (probes/core/accumulation.py),
the scaled error's row floor (probes/core/scaled.py), the goldens' margins
(pytest_msprobe/golden/kinds/) and the API catalogue's gate (pytest_msprobe/catalogue/gate.py).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

HALF_DTYPES = ("float16", "bfloat16")
# the dtypes a tool computes in, perturbs and draws API inputs in
FLOAT_DTYPES = ("float16", "bfloat16", "float32", "float64")
# The 8-bit element formats of FP8 training: they are storage for scaled values (a matmul's
# operands, a cast's result), never a dtype a tool computes in; an FP8 result is judged in its own
# ulps. "fn": finite only (no infinity, one NaN pattern); "fnuz": also no negative zero, and an
# exponent bias one larger, so emin is one lower.
FLOAT8_DTYPES = ("float8_e4m3fn", "float8_e5m2", "float8_e4m3fnuz", "float8_e5m2fnuz")
# The scale format of block-scaled FP8 (MX): an unsigned power of two, no zero, no subnormals
# (p = 1: the spacing at 2^e is 2^e).
SCALE_DTYPES = ("float8_e8m0fnu",)

# Each float dtype's format: significand bits p (with the implicit one) and smallest normal
# exponent emin. Everything else about the dtypes follows from these two, but the largest value.
SIGNIFICAND_BITS = {"float16": 11, "bfloat16": 8, "float32": 24, "float64": 53,
                    "float8_e4m3fn": 4, "float8_e5m2": 3, "float8_e4m3fnuz": 4, "float8_e5m2fnuz": 3,
                    "float8_e8m0fnu": 1}
MIN_EXPONENT = {"float16": -14, "bfloat16": -126, "float32": -126, "float64": -1022,
                "float8_e4m3fn": -6, "float8_e5m2": -14, "float8_e4m3fnuz": -7, "float8_e5m2fnuz": -15,
                "float8_e8m0fnu": -127}
# Machine epsilon 2^(1-p), the spacing of the dtype at 1: the unit of every figure in ulps.
# (torch.finfo(float8_e5m2fnuz).eps says 0.125; the format's spacing at 1 is 0.25, as e5m2's.)
MACHINE_EPS = {name: 2.0 ** (1 - p) for name, p in SIGNIFICAND_BITS.items()}
# The largest finite value: e4m3fn gives its top exponent to numbers (only all-ones is NaN), so
# it reaches 448 where an IEEE-like e4m3 would stop at 240 (e4m3fnuz, whose bias is one larger).
LARGEST_FINITE = {"float16": 65504.0, "bfloat16": (2.0 - 2.0**-7) * 2.0**127,
                  "float32": (2.0 - 2.0**-23) * 2.0**127, "float64": (2.0 - 2.0**-52) * 2.0**1023,
                  "float8_e4m3fn": 448.0, "float8_e5m2": 57344.0, "float8_e4m3fnuz": 240.0,
                  "float8_e5m2fnuz": 57344.0, "float8_e8m0fnu": 2.0**127}
# The formats with an infinity: a value beyond the others' range has no value of the format (a
# cast then saturates or gives NaN, the framework's choice).
HAS_INFINITY = ("float16", "bfloat16", "float32", "float64", "float8_e5m2")


def overflow_boundary(dtype_name: str) -> float:
    """The largest value plus half its ulp: what rounds beyond the dtype's range starts here
    (65520 in float16, 464 in e4m3fn), what lies below it rounds to a value of the dtype."""
    top = LARGEST_FINITE[dtype_name]
    return top + 0.5 * 2.0 ** (math.frexp(top)[1] - 1) * MACHINE_EPS[dtype_name]

# free_benchmark: the noise value v per dtype (msprobe's). It is also the minimum-magnitude gate of
# add_noise/bit_noise and, as sqrt(v), the clamp floor of the ratio metric in the forward stage.
NOISE_VALUE = {"bfloat16": 1e-4, "float16": 1e-6, "float32": 1e-8, "float64": 1e-16}
NOISE_VALUE_DEFAULT = 1e-8

# Smallest positive normal number 2^emin per dtype: bit_noise leaves zeros and subnormals alone.
SMALLEST_NORMAL = {name: 2.0**emin for name, emin in MIN_EXPONENT.items()}

# msprobe's ratio rule: an output is consistent when 1/T <= ratio <= T.
# The documented "relative error thresholds" are T - 1: bf16 0.004, fp16 0.002, fp32/fp64 0.0002.
RATIO_THRESHOLD = {"bfloat16": 1.004, "float16": 1.002, "float32": 1.0002, "float64": 1.0002}
RATIO_THRESHOLD_DEFAULT = 1.0002
NO_CHANGE_THRESHOLD = 1.0  # no_change tests determinism: any difference is reported

# Clamp floor of the backward stage (every dtype).
BACKWARD_TOLERANCE = 1e-3


def ratio_threshold(dtype_name: str, pert_mode: str) -> float:
    """T for an original output of this dtype under this perturbation mode."""
    if pert_mode == "no_change":
        return NO_CHANGE_THRESHOLD
    return RATIO_THRESHOLD.get(dtype_name, RATIO_THRESHOLD_DEFAULT)


def forward_tolerance(dtype_name: str) -> float:
    """Clamp floor of the ratio metric: values below it count as equal to it."""
    return NOISE_VALUE.get(dtype_name, NOISE_VALUE_DEFAULT) ** 0.5


@dataclass(frozen=True)
class SingleBenchmarkThreshold:
    """The to_cpu ("single benchmark") rule's limits for one dtype (msprobe's)."""

    rtol: float
    small_value: float
    small_value_atol: float
    error_balance: float


SINGLE_BENCHMARK = {
    "float32": SingleBenchmarkThreshold(2.0**-14, 1.0, 2.0**-14, 1e-4),
    "float16": SingleBenchmarkThreshold(2.0**-11, 1.0, 2.0**-11, 1e-4),
    "bfloat16": SingleBenchmarkThreshold(2.0**-8, 1.0, 2.0**-8, 1e-4),
}


def single_benchmark_threshold(dtype_name: str) -> SingleBenchmarkThreshold:
    return SINGLE_BENCHMARK.get(dtype_name, SINGLE_BENCHMARK["float32"])


# online_dispatch's scaled rule (probes/core/scaled.py; rule="scaled" or "both"): the most an op's
# output may differ from the CPU reference at its own scale, relative, per device output dtype.
# Calibrated on PyTorch's CPU kernels, forward and backward, against float64
# (benchmarks/online_dispatch_calibration.py; ~1500 output leaves of transformers, a Llama, conv /
# norm / pool layers, 1e5-long reductions, elementwise math):
# - float32 2e-4 (1,678 ulps): clean kernels p99 13 ulps, max 840 over outputs above the noise
#   floor (log_softmax backward of a uniform gradient over 1e5 terms); a matmul of inputs rounded
#   to 10 mantissa bits (TF32 / HF32) scores >= 9,100 ulps, to 7 (bf16 math) >= 74,000.
# - bfloat16 / float16 4 ulps: clean max 2.2 / 2.0 ulps (correctly rounded: <= 0.5); a bf16 matmul
#   accumulating in bf16 over 64 terms scores 6.4 ulps, fp8-rounded inputs 17-19.
# - float64 1e-10 (~450,000 ulps): not measurable on a CPU (its own reference); catches fp32 math
#   behind a float64 API (~1e-7) and leaves room for another summation order.
# - the FP8 formats 1 ulp: an FP8 result is one rounding of a wider value (a cast, a scaled matmul
#   with an FP8 output), correctly rounded at 0.5 ulp; an ulp of e4m3 is already 12.5 %.
DISPATCH_SCALED_THRESHOLD = {"float32": 2e-4, "bfloat16": 4 * MACHINE_EPS["bfloat16"],
                             "float16": 4 * MACHINE_EPS["float16"], "float64": 1e-10,
                             **{name: MACHINE_EPS[name] for name in FLOAT8_DTYPES + SCALE_DTYPES}}


def dispatch_scaled_threshold(dtype_name: str, chained: bool = False) -> float | None:
    """The scaled rule's limit for an output of this dtype; None for integer / bool outputs.
    `chained`: a fused backward kernel that rounds several intermediates to the dtype on the way
    (attention's P, dP, dS), whose clean half-precision outputs go past 4 ulps on long sequences
    (4.6 ulps at 4,096 keys in bf16): the backward stage's limit, SCALED_BACKWARD_THRESHOLD."""
    if chained and dtype_name in HALF_DTYPES:
        return SCALED_BACKWARD_THRESHOLD[dtype_name]
    return DISPATCH_SCALED_THRESHOLD.get(dtype_name)


# grad_probe's direction rule (msprobe docs): a gradient-direction similarity below 0.97 at the
# first compared step, or a drop of more than 0.03 between compared steps, marks a problem.
DIRECTION_FIRST_STEP_MIN = 0.97
DIRECTION_MAX_DROP = 0.03


# The scale-aware rule (probes/core/scaled.py; free_benchmark `"rule": "scaled"`): an output's
# error at its own scale, relative, so a correctly rounded result scores at most MACHINE_EPS/2.
# improve_precision / to_cpu / change_value: the most an output may differ at its scale.
# - float32 and float64: msprobe's 0.0002 (about 1,700 fp32 ulps). An fp32 kernel computing in a
#   reduced precision (TF32/HF32: 10-bit mantissas, 2^-11; bf16 math: 2^-8) is off by 5e-4 or more;
#   an honest fp32 accumulation over 10^6 terms stays near 1e-6.
# - float16 / bfloat16: 4 ulps. A correctly rounded result scores 0.5; the clean kernels of a
#   Llama training step in bf16 score at most 0.97 (attention), forward; the calibration is in
#   README "The scaled rule".
# - the FP8 formats: 1 ulp, as online_dispatch's (an FP8 result is one rounding of a wider value).
_FP8_ONE_ULP = {name: MACHINE_EPS[name] for name in FLOAT8_DTYPES + SCALE_DTYPES}
SCALED_THRESHOLD = {"bfloat16": 4.0 * MACHINE_EPS["bfloat16"], "float16": 4.0 * MACHINE_EPS["float16"], "float32": 2e-4,
                    "float64": 2e-4, **_FP8_ONE_ULP}
SCALED_THRESHOLD_DEFAULT = 2e-4
# The backward stage's gradients chain several roundings of the dtype (attention's dP, dS, dQ):
# 16 ulps for half dtypes (measured: 6.8 ulps in a bf16 Llama's attention gradients), the same
# relative threshold for float32/float64 (their clean gradients score under 20 fp32 ulps).
SCALED_BACKWARD_THRESHOLD = {"bfloat16": 16.0 * MACHINE_EPS["bfloat16"], "float16": 16.0 * MACHINE_EPS["float16"],
                             "float32": 2e-4, "float64": 2e-4, **_FP8_ONE_ULP}
# add_noise / bit_noise: a well-conditioned API moves its outputs by about as much as its inputs
# moved (both at their scales). The allowance is SCALED_THRESHOLD + NOISE_AMPLIFICATION x the
# input's move, so an API is flagged when it amplifies a one-ulp input move more than this.
NOISE_AMPLIFICATION = 16.0


def machine_eps(dtype_name: str) -> float:
    return MACHINE_EPS.get(dtype_name, MACHINE_EPS["float32"])


def scaled_threshold(dtype_name: str, pert_mode: str, input_move: float = 0.0, stage: str = "forward") -> float:
    """The scaled rule's limit for an output of this dtype under this mode and stage;
    `input_move` is the perturbed input's move at its scale (add_noise / bit_noise only)."""
    if pert_mode == "no_change":
        return 0.0  # determinism: any difference is reported
    table = SCALED_BACKWARD_THRESHOLD if stage == "backward" else SCALED_THRESHOLD
    base = table.get(dtype_name, SCALED_THRESHOLD_DEFAULT)
    if pert_mode in ("add_noise", "bit_noise"):
        return base + NOISE_AMPLIFICATION * input_move
    return base
