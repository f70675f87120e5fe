"""pytest-msprobe: precision probes as pytest tests.

The plugin module (`pytest_msprobe.plugin`) is registered through the pytest11 entry point and
imports no deep-learning framework until a test that uses one runs under a probe.
`assert_grad_directions_close(dir_a, dir_b)` is the gradient-direction assertion for tests.
"""

from typing import Any

__version__ = "0.1.0"
__all__ = ["assert_grad_directions_close"]


def __getattr__(name: str) -> Any:
    if name == "assert_grad_directions_close":
        from probes.grad_probe import assert_grad_directions_close

        return assert_grad_directions_close
    raise AttributeError(f"module 'pytest_msprobe' has no attribute {name!r}")
