"""free_benchmark on PyTorch: the generic probe wired to torch's API catalog and wrappers."""

from __future__ import annotations

import logging

from probes.backends import api_exclusions
from probes.backends.torch_apis import TorchApiPatcher, build_catalog, call_exclusion
from probes.backends.torch_backend import BACKEND
from probes.core.config import ProbeConfig
from probes.core.errors import ConfigError
from probes.core.hints import did_you_mean
from probes.free_benchmark.graphs import GRAPH_PREFIX, FreeBenchmarkGraphs
from probes.free_benchmark.lifecycle import FreeBenchmarkRun
from probes.free_benchmark.service import FreeBenchmarkProbe

log = logging.getLogger("probes.free_benchmark")


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
        keys = [m.key for m in self.catalog]
        # "Graph..." entries select torch.compile graphs (probes/free_benchmark/graphs.py), named when compiled
        bad = [e for e in self.probe.selection.unmatched(keys) if not e.startswith(GRAPH_PREFIX)]
        if bad:
            key = "free_benchmark.scope" if self.config.free_benchmark.scope else "free_benchmark.list"
            hint = did_you_mean(bad[0].split(".forward")[0], keys, cutoff=0.5,
                                otherwise="entries are substrings of names like Functional.softmax or Torch.matmul")
            raise ConfigError(key, bad[0], "it selects no PyTorch API that free_benchmark can hook", hint)
        selected_excluded = [
            m for m in self.catalog
            if m.exclusion and self.config.free_benchmark.api_list and self.probe.selection.static(m.key)
        ]
        for m in selected_excluded[:20]:
            log.info("free_benchmark: %s matches the list but is never re-run: %s", m.key, m.exclusion)
