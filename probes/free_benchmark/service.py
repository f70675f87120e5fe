"""One free_benchmark run, written once for every framework: the per-call path (call_path.py)
with the run's steps, its rank and its files (the ledger, ledger.py).

Steps end at the user's step(): the step's pending checks are settled first (their rows belong to
it), then the backward stage releases what it still waits for and preheat learns its thresholds.
What the run found is read through the probe by the debugger and the plugin.
"""

from __future__ import annotations

import logging
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

from probes.backends.patching import suspended
from probes.core.config import ProbeConfig
from probes.free_benchmark.call_path import CallPath
from probes.free_benchmark.ledger import ApiStats, Ledger

log = logging.getLogger("probes.free_benchmark")


class FreeBenchmarkProbe(CallPath):
    """State of one free_benchmark run: step, rank, counters, rows, statistics."""

    def __init__(
        self,
        config: ProbeConfig,
        backend: Any,
        call_exclusion: Callable[[Any, tuple, dict], str | None],
        framework: str,
        before_error: Callable[[], object] | None = None,
    ) -> None:
        """`before_error` runs before an error is recorded (a framework whose failed operators
        stay queued drops them, so they do not fail later in the user's code)."""
        super().__init__(config, backend, call_exclusion, Ledger(config, framework, before_error))
        self.framework = framework
        self.dump_path = Path(config.dump_path)
        self.running = False
        self.finished = False
        self.graph_reports: dict[str, Any] = {}  # compiled graphs (probes/free_benchmark/graphs.py)

    # what the run found, as its readers (debugger, plugin, tests) know it ------------------------
    @property
    def stats(self) -> dict[str, ApiStats]:
        return self.ledger.stats

    @property
    def rows(self) -> list[Any]:
        return self.ledger.rows

    @property
    def skipped(self) -> Counter[tuple[str, str]]:
        return self.ledger.skipped

    @property
    def errors(self) -> dict[tuple[str, str], dict[str, Any]]:
        return self.ledger.errors

    @property
    def last_score(self) -> float:
        """The latest finished check's error / threshold (the per-API tests' search target)."""
        return self.ledger.last_score

    @last_score.setter
    def last_score(self, value: float) -> None:
        self.ledger.last_score = value

    @property
    def summary_path(self) -> Path:
        return self.ledger.summary_path

    # lifecycle -----------------------------------------------------------------------------
    def refresh(self) -> None:
        """Recompute whether calls are probed now (step and rank filters; a rank filter
        applies to rank 0 in a single process, where msprobe's PyTorch side disabled everything)."""
        ledger = self.ledger
        if ledger.rank is None or not ledger.distributed:  # a process group may start after the probe
            ledger.rank = self.backend.rank()
            ledger.distributed = self.backend.is_distributed()
        steps = self.config.step
        if steps and self.current_step > max(steps):
            self.finished = True
        self.active = (
            self.running
            and not self.finished
            and self.config.selects_step(self.current_step)
            and self.config.selects_rank(ledger.rank)
        )

    def next_step(self) -> None:
        try:
            self.flush()  # settles the step's pending checks first: their rows belong to it
        finally:  # the step ends even when its flush failed (the caller records why)
            self._advance()

    def _advance(self) -> None:
        self.current_step += 1
        # steps_seen alone does not rewrite summary.json: it is brought up to date with the next
        # change, and at close (a step that checked nothing costs no file write)
        self.counters.clear()
        if self.backward is not None:
            self.backward.end_step()
        if self.preheat is not None:
            for api in self.preheat.end_step():
                learned = {d: s["threshold"] for d, s in self.preheat.describe(api)["dtypes"].items()}
                log.info("free_benchmark: preheat of %s ended after step %s; thresholds %s", api,
                         self.current_step, learned)
        self.refresh()

    # the run's files -------------------------------------------------------------------------
    def settle(self) -> None:
        """Finish the pending checks (their rows and counts): one host transfer for all of them.
        Hooks pass straight through meanwhile (the measure's own operators are not API calls)."""
        if len(self.verdicts):
            with suspended(), self.backend.outside_transforms():
                self.verdicts.settle()

    def flush(self) -> None:
        """Settle the pending checks, append their rows and rewrite summary.json when something
        in it changed (called at stop, per step and at exit). On the training thread, on
        purpose: a step's files are on disk when stop() returns, which scripts and tests rely
        on; what it costs is kept small (rows are appended, summary.json only when changed)."""
        self.settle()
        self.ledger.write(self.summary)

    def summary(self) -> dict[str, Any]:
        self.settle()
        return self.ledger.summary(self.current_step + 1, self.preheat, self.preheat_note, self.graph_reports)
