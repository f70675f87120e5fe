"""MindSpore facade: `from probes.mindspore import PrecisionDebugger` (msprobe-compatible)."""

from probes.mindspore.debugger import PrecisionDebugger

__all__ = ["PrecisionDebugger"]
