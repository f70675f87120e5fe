"""PyTorch facade: `from probes.pytorch import PrecisionDebugger` (msprobe-compatible)."""

from probes.pytorch.debugger import PrecisionDebugger

__all__ = ["PrecisionDebugger"]
