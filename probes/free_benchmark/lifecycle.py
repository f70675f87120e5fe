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

from probes.core.errors import ProbeError
from probes.free_benchmark.usual_call import usual_handler

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
        self.patcher.install(usual_handler(self.probe))  # the usual call's own path where the config allows
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
        try:
            self.probe.refresh()
        finally:
            self._uninstall()
        self._guarded("stop()", self.probe.flush)

    def step(self) -> None:
        self._guarded("step()", self.probe.next_step)
        if self.patcher.installed and not self.probe.active:
            self._uninstall()
        elif self.probe.running and self.probe.active and not self.patcher.installed:
            self._install()

    def _guarded(self, where: str, work: Any) -> None:
        """Run the probe's end-of-step work so that a failure inside it never reaches the user's
        training loop (unless strict): it is recorded as an error of the probe, and the files are
        written once more, so the step's results and the error itself are on disk."""
        try:
            work()
        except Exception as exc:
            if self.config.strict:
                raise ProbeError(f"free_benchmark failed in {where}: {exc}") from exc
            self.probe.ledger.error("free_benchmark", f"{where} at step {self.probe.current_step}", exc)
            try:
                self.probe.flush()
            except Exception as again:  # the files cannot be written: said in the log, never raised
                log.warning("free_benchmark: could not write its results in %s (%s: %s)", where,
                            type(again).__name__, again)

    def close(self) -> None:
        """Restore everything and write what is pending (used at exit)."""
        self._uninstall()
        self.probe.running = False
        self.probe.ledger.dirty = True  # steps_seen, which steps alone do not write
        try:
            self.probe.flush()
        except OSError:
            pass


@atexit.register
def _restore_at_exit() -> None:
    for run in list(_LIVE):
        run.close()
