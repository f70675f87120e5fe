"""grad_probe: per-parameter gradient statistics every optimizer step, and run-vs-run direction
similarity (the 0.97 / 0.03 rule).

The statistics and the comparison are framework-free; the PyTorch and MindSpore monitors only
collect gradients and hand them over.
"""

from typing import Any

__all__ = ["GradComparator", "GradComparison", "assert_grad_directions_close", "apply_rule"]


def __getattr__(name: str) -> Any:  # lazy: numpy and matplotlib load on first use
    if name in ("GradComparator", "GradComparison"):
        from probes.grad_probe import comparator

        return getattr(comparator, name)
    if name == "assert_grad_directions_close":
        from probes.grad_probe import assertion

        return assertion.assert_grad_directions_close
    if name == "apply_rule":
        from probes.grad_probe import direction_rule

        return direction_rule.apply_rule
    raise AttributeError(f"module 'probes.grad_probe' has no attribute {name!r}")
