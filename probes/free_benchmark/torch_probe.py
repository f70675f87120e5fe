"""free_benchmark on PyTorch: the generic probe wired to torch's API catalog and wrappers."""

from __future__ import annotations

from probes.backends import api_exclusions
from probes.backends.torch_apis import TorchApiPatcher, build_catalog, call_exclusion
from probes.backends.torch_backend import BACKEND
from probes.core.config import ProbeConfig
from probes.free_benchmark.graphs import GRAPH_PREFIX, FreeBenchmarkGraphs
from probes.free_benchmark.lifecycle import FreeBenchmarkRun
from probes.free_benchmark.selection import note_never_rerun, reject_unmatched
from probes.free_benchmark.service import FreeBenchmarkProbe


class TorchFreeBenchmark(FreeBenchmarkRun):
    """start()/stop()/step() of free_benchmark for PyTorch.

    Wrappers are installed at start() and the original attributes put back at stop(); if the
    user's code raises between the two, `with` or stop() in a finally restores them, and an atexit
    handler restores and flushes whatever is still installed when the process ends.
    """

    def __init__(self, config: ProbeConfig) -> None:
        self.config = config
        self.catalog = build_catalog()
        self.probe = FreeBenchmarkProbe(config, BACKEND, call_exclusion, "pytorch")
        if config.free_benchmark.if_preheat:  # PyTorch only, as the reference (MindSpore warns and ignores it)
            self.probe.enable_preheat()
        self._check_selection()
        self.patcher = TorchApiPatcher(tuple(m for m in self.catalog if m.exclusion != api_exclusions.ACCESSOR),
                                       self.probe.selection.static, window=self.probe)
        self.graphs = FreeBenchmarkGraphs(self.probe)
        self._register()

    def _check_selection(self) -> None:
        fb = self.config.free_benchmark
        keys = [m.key for m in self.catalog]
        # "Graph..." entries select torch.compile graphs (probes/free_benchmark/graphs.py), named when compiled
        bad = [e for e in self.probe.selection.unmatched(keys) if not e.startswith(GRAPH_PREFIX)]
        reject_unmatched("free_benchmark.scope" if fb.scope else "free_benchmark.list", bad, keys,
                         "it selects no PyTorch API that free_benchmark can hook",
                         "entries are substrings of names like Functional.softmax or Torch.matmul", cutoff=0.5)
        if fb.api_list:
            note_never_rerun((m.key, m.exclusion) for m in self.catalog
                             if m.exclusion and self.probe.selection.static(m.key))
