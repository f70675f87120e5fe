"""online_dispatch: every aten op run inside the context re-run on the CPU and compared.

The public entry point is `probes.pytorch.online_dispatch.PtdbgDispatch` (msprobe-compatible);
`OnlineDispatchMode` is the dispatch mode it is built on.
"""

from probes.online_dispatch.mode import OnlineDispatchMode
from probes.online_dispatch.options import DUMP_MODES, DispatchOptions, validate

__all__ = ["DUMP_MODES", "DispatchOptions", "OnlineDispatchMode", "validate"]
