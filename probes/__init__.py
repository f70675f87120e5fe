"""pytest-msprobe's probe library: free_benchmark, grad_probe and online_dispatch.

Importing this package imports no deep-learning framework; the framework facades
(`probes.pytorch`, `probes.mindspore`) import theirs when they are imported.
"""

from probes.core.errors import ConfigError, ProbeError

__all__ = ["ConfigError", "ProbeError"]
__version__ = "0.1.0"
