"""Compiled PyTorch programs (torch.compile), judged as they run.

A probe never changes what the compiler sees: free_benchmark's API wrappers step aside while
Dynamo traces (probes.backends.patching), and online_dispatch's dispatch mode lets compilation
happen (``ignore_compile_internals``). Instead, each graph Dynamo hands to the user's backend is
one unit of checking (capture.py): the backend compiles it as it would have, and on sampled calls
the compiled outputs are judged against the same graph re-run eagerly in float64 (by the tool
that installed the checker: probes/free_benchmark/graphs.py, online_dispatch's mode), the backward
through autograd hooks (probes/free_benchmark/backward.py); a failing graph is localised to the node that
loses the precision by compiling prefixes of it with the same backend (localize.py), and a
standalone reproduction is written (repro.py).
"""

from typing import Any

from probes.compiled.check import CompiledCheck

__all__ = ["CompiledCheck", "check_compiled"]


def __getattr__(name: str) -> Any:
    # check_compiled runs free_benchmark, a tool built on this package's graph machinery: loaded
    # when it is asked for, so importing the machinery (as the tools do) never loads a tool
    if name == "check_compiled":
        from probes.free_benchmark.compiled_check import check_compiled

        return check_compiled
    raise AttributeError(f"module 'probes.compiled' has no attribute {name!r}")
