"""The numbers users read in the docs, each defined once, by name.

Keys are framework-neutral dtype names ("float16", "bfloat16", "float32", "float64"); the
backends translate their own dtypes to these names.
"""

from __future__ import annotations

from dataclasses import dataclass

HALF_DTYPES = ("float16", "bfloat16")
FLOAT_DTYPES = ("float16", "bfloat16", "float32", "float64")

# free_benchmark: the noise value v per dtype (spec §3). It is also the minimum-magnitude gate of
# add_noise/bit_noise and, as sqrt(v), the clamp floor of the ratio metric in the forward stage.
NOISE_VALUE = {"bfloat16": 1e-4, "float16": 1e-6, "float32": 1e-8, "float64": 1e-16}
NOISE_VALUE_DEFAULT = 1e-8

# Smallest positive normal number per dtype: bit_noise leaves zeros and subnormals alone.
SMALLEST_NORMAL = {
    "bfloat16": 1.1754943508222875e-38,
    "float16": 6.103515625e-05,
    "float32": 1.1754943508222875e-38,
    "float64": 2.2250738585072014e-308,
}

# Width of the signed integer that shares a dtype's bits (for bit views).
BIT_VIEW_INT = {"bfloat16": "int16", "float16": "int16", "float32": "int32", "float64": "int64"}

# The ratio rule (spec §4.1): an output is consistent when 1/T <= ratio <= T.
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
    """The to_cpu ("single benchmark") rule's limits for one dtype (spec §4.2)."""

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


# grad_probe's direction rule (msprobe docs): a gradient-direction similarity below 0.97 at the
# first compared step, or a drop of more than 0.03 between compared steps, marks a problem.
DIRECTION_FIRST_STEP_MIN = 0.97
DIRECTION_MAX_DROP = 0.03
