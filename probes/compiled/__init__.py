"""Compiled PyTorch programs (torch.compile), judged as they run.

A probe never changes what the compiler sees: free_benchmark's API wrappers step aside while
Dynamo traces (probes.backends.patching), and online_dispatch's dispatch mode lets compilation
happen (``ignore_compile_internals``). Instead, each graph Dynamo hands to the user's backend is
one unit of checking (capture.py): the backend compiles it as it would have, and on sampled calls
the compiled outputs are judged against the same graph re-run eagerly in float64 (check.py), the
backward through autograd hooks (backward.py); a failing graph is localised to the node that
loses the precision by compiling prefixes of it with the same backend (localize.py), and a
standalone reproduction is written (repro.py).
"""

from probes.compiled.check import CompiledCheck, check_compiled

__all__ = ["CompiledCheck", "check_compiled"]
