"""Test helpers shipped with pytest-msprobe.

See :mod:`pytest_msprobe.testing.simulated_npu` for running "NPU" code paths on a CPU-only machine.
"""

from pytest_msprobe.testing.simulated_npu import SimulatedNPU, SimulatedNPUError, prepare, simulated_npu

__all__ = ["SimulatedNPU", "SimulatedNPUError", "prepare", "simulated_npu"]
