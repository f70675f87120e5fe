"""improve_precision's raise, once for every framework: which dtype an input is re-run in.

Written over dtype names so the torch and MindSpore backends share the decision and differ only
in how they cast. A tensor narrower than float32 (fp16, bf16, the FP8 formats) is re-run in
float32 (source "half"); a float32 call is re-run in float64 (source "float32"), its narrower
`dtype=` arguments with it, so that calls like vector_norm(x, dtype=torch.bfloat16) stay
checkable. An explicit table, not msprobe's "fp16/bf16 only", which left FP8 inputs as they were
or not by argument order.
"""

from __future__ import annotations

from probes.core.thresholds import FLOAT8_DTYPES

LOW_PRECISION = frozenset({"float16", "bfloat16", *FLOAT8_DTYPES})
SOURCES = ("half", "float32")


def raised_dtype(source: str, name: str, argument: bool = False) -> str | None:
    """The dtype name a floating input `name` is raised to under `source`, or None when it stays
    (`argument`: a `dtype=` argument of the call rather than a tensor's dtype)."""
    if source == "half":
        return "float32" if name in LOW_PRECISION else None
    if name == "float32" or (argument and name in LOW_PRECISION):
        return "float64"
    return None
