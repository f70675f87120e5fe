"""The names of the verdict rules, defined once for the config files, the command-line options
and the tools.

- ``reference``: msprobe's rule, kept so its verdicts stay reproducible (free_benchmark: the
  element-wise ratio rule; online_dispatch: its cosine / max-error thresholds).
- ``scaled``: each output judged at its own scale, in ulps of its dtype, against a float64 re-run.
- ``both`` (online_dispatch only): an op fails when either rule fails, and the CSV says which.
"""

from __future__ import annotations

__all__ = ["BOTH", "FREE_BENCHMARK_RULES", "ONLINE_DISPATCH_RULES", "REFERENCE", "SCALED"]

REFERENCE = "reference"
SCALED = "scaled"
BOTH = "both"

#: free_benchmark's verdicts (config key free_benchmark.rule, --msprobe-rule)
FREE_BENCHMARK_RULES = (REFERENCE, SCALED)
#: online_dispatch's verdicts (its `rule` argument)
ONLINE_DISPATCH_RULES = (BOTH, REFERENCE, SCALED)
