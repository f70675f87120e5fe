"""pytest-msprobe: precision probes as pytest tests.

The plugin module (`pytest_msprobe.plugin`) is registered through the pytest11 entry point and
imports no deep-learning framework until a test that uses one runs under a probe.
"""

__version__ = "0.1.0"
