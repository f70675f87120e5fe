"""pytest-msprobe's probe library: free_benchmark, grad_probe and online_dispatch.

Importing this package imports no deep-learning framework; the framework facades
(`probes.pytorch`, `probes.mindspore`) import theirs when they are imported, and
`GradComparator` (numpy, matplotlib) is loaded on first use.
"""

from typing import Any

from probes.core.errors import ConfigError, ProbeError

__all__ = ["ConfigError", "GradComparator", "ProbeError", "assert_grad_directions_close"]
__version__ = "0.1.0"


def __getattr__(name: str) -> Any:
    if name == "GradComparator":
        from probes.grad_probe.comparator import GradComparator

        return GradComparator
    if name == "assert_grad_directions_close":
        from probes.grad_probe import assert_grad_directions_close

        return assert_grad_directions_close
    raise AttributeError(f"module 'probes' has no attribute {name!r}")
