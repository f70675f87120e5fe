"""start()/stop()/step() of a free_benchmark run, the same for every framework.

Wrappers are installed at start() and the original attributes put back at stop(); if the user's
code raises between the two, `with` or stop() in a finally restores them, and an atexit handler
restores and flushes whatever is still installed when the process ends.
"""

from __future__ import annotations

import atexit
import logging
import weakref
from typing import Any

log = logging.getLogger("probes.free_benchmark")
_LIVE: weakref.WeakSet[FreeBenchmarkRun] = weakref.WeakSet()


class FreeBenchmarkRun:
    """Subclasses set `self.config`, `self.probe` (a FreeBenchmarkProbe) and `self.patcher` (an
    ApiPatcher over their framework's catalog), optionally `self.graphs` (the checker of compiled
    graphs, installed and removed with the wrappers), then call `_register()`."""

    config: Any
    probe: Any
    patcher: Any
    graphs: Any = None

    def _register(self) -> None:
        _LIVE.add(self)

    def _install(self) -> None:
        self.patcher.install(self.probe.on_call)
        if self.graphs is not None:
            self.graphs.install()

    def _uninstall(self) -> None:
        try:
            if self.graphs is not None:
                self.graphs.uninstall()
        finally:
            self.patcher.uninstall()

    def start(self) -> None:
        probe = self.probe
        probe.running = True
        probe.refresh()
        if probe.finished:
            log.info("free_benchmark: the last configured step has passed; the probe has finished")
            self._uninstall()
            return
        if probe.active and not self.patcher.installed:
            probe.dump_path.mkdir(parents=True, exist_ok=True)
            self._install()

    def stop(self) -> None:
        self.probe.running = False
        self.probe.refresh()
        self._uninstall()
        self.probe.flush()

    def step(self) -> None:
        self.probe.next_step()
        if self.patcher.installed and not self.probe.active:
            self._uninstall()
        elif self.probe.running and self.probe.active and not self.patcher.installed:
            self._install()

    def close(self) -> None:
        """Restore everything and write what is pending (used at exit)."""
        self._uninstall()
        self.probe.running = False
        self.probe._dirty = True  # steps_seen, which steps alone do not write
        try:
            self.probe.flush()
        except OSError:
            pass


@atexit.register
def _restore_at_exit() -> None:
    for run in list(_LIVE):
        run.close()
