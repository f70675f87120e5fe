"""The framework-free half of the grad_probe monitors (PyTorch: torch_monitor, MindSpore:
mindspore_monitor): config fields, ``param_list`` validation, error records, ``summary.json``,
the stop/close life cycle and the flush at interpreter exit.

A subclass provides ``framework`` (the ``summary.json`` value), ``_resolve_rank()``, ``remove()``
(drop its hooks), ``running`` and ``selected`` (the monitored ``(name, parameter)`` pairs), and may
extend :meth:`MonitorBase.summary`. This module imports no deep-learning framework.
"""

from __future__ import annotations

import atexit
import logging
import os
import time
import weakref
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from probes.core.config import GradProbeConfig, ProbeConfig
from probes.core.errors import ConfigError, ProbeError
from probes.core.hints import did_you_mean
from probes.core.writers import BackgroundWriter, close_writers, write_json_atomic
from probes.grad_probe import csv_format
from probes.grad_probe.stats import GradStats

__all__ = ["MAX_ERRORS", "SUMMARY_INTERVAL_S", "WRITE_HANDOFF_S", "MonitorBase", "check_param_list"]

log = logging.getLogger("probes.grad_probe")

#: summary.json is rewritten after a dumped step at most this often (and always at stop()).
SUMMARY_INTERVAL_S = 5.0
#: At most this many error records are kept (the rest are counted).
MAX_ERRORS = 1000
#: a step's files waiting longer than this for the disk on the training thread go to the writer
#: thread: about what a hand-off costs the training thread (the submission, and the writer's many
#: short turns at the interpreter lock while it creates a file per parameter)
WRITE_HANDOFF_S = 0.5e-3

_ACTIVE: weakref.WeakSet[MonitorBase] = weakref.WeakSet()


def check_param_list(param_list: Sequence[str], names: Sequence[str], source: str = "model.named_parameters()") -> None:
    """Raise ConfigError (with close matches) for the first ``param_list`` entry naming no parameter."""
    if not param_list:
        return
    present = set(names)
    for i, wanted in enumerate(param_list):
        if wanted not in present:
            hint = did_you_mean(wanted, names, otherwise="parameter names look like "
                                + ", ".join(f'"{n}"' for n in names[:3]))
            raise ConfigError(
                f"grad_probe.param_list[{i}]",
                wanted,
                f"the exact name of a monitored parameter ({source}); {len(names)} parameters are known",
                hint=hint,
            )


class MonitorBase:
    """Shared state and results of a gradient monitor (see the module docstring)."""

    framework = "unknown"

    def _init_common(self, config: ProbeConfig) -> None:
        self.config = config
        self.gp: GradProbeConfig = config.grad_probe or GradProbeConfig()
        self.level = self.gp.grad_level
        self.bounds = self.gp.bounds
        self.histogram = self.level == "L2"
        self.fp8_formats = self.gp.fp8_health
        self.dump_path = Path(config.dump_path)
        self.root = os.fspath(self.dump_path)  # the per-step file names are built as strings (no Path per file)
        self.rank: int | None = None
        self.current_step: int | None = None  # the last optimizer step index seen
        self._closed = False
        self.steps_written: list[int] = []
        self.params_without_grad: dict[int, list[str]] = {}
        self.errors: list[dict[str, Any]] = []
        self.errors_dropped = 0
        self.compute_dtypes: set[str] = set()
        self._last_summary = 0.0
        self._dirty = False
        # the step files are written on the training thread unless a slow disk keeps it waiting,
        # else off it with one step in flight (see BackgroundWriter); summary.json is written by
        # the same writer, after the files it lists
        self._writer = BackgroundWriter("grad_probe", handoff_s=WRITE_HANDOFF_S, max_tasks=1)

    # ------------------------------------------------------------------ subclass interface
    def _resolve_rank(self) -> int:  # pragma: no cover - abstract
        raise NotImplementedError

    def remove(self) -> None:  # pragma: no cover - abstract
        raise NotImplementedError

    @property
    def selected(self) -> list[tuple[str, Any]]:  # pragma: no cover - abstract
        raise NotImplementedError

    # ------------------------------------------------------------------ shared
    def _activate(self) -> None:
        _ACTIVE.add(self)

    def write_step(self, step: int, rank: int, missing: list[str], records: list[GradStats],
                    directions: list[tuple[Path, Any]], slices: dict[str, Any] | None = None) -> None:
        """Hand a step's files (its grad_summary CSV from `records`, the `(path, host bools)`
        direction files, and for sharded parameters the ``shards.json`` saying where each
        direction file's slice sits in the full parameter) to the writer (written at once when
        small and not kept waiting by the disk, else by its thread) and do the book-keeping;
        summary.json follows the files in the same task when it is due."""
        if missing:
            self.params_without_grad[step] = missing
        self.steps_written.append(step)
        self._dirty = True
        summary = None
        if time.monotonic() - self._last_summary >= SUMMARY_INTERVAL_S and self._summary_selected():
            self._last_summary = time.monotonic()
            self._dirty = False
            summary = (self.summary_path, self.summary())

        level, bounds, fp8, path = self.level, self.bounds, self.fp8_formats, f"{self.root}{os.sep}rank{rank}{os.sep}grad_summary_{step}.csv"

        def task() -> None:
            if directions:  # every direction file of the step sits in the step's folder
                csv_format.make_step_dir(os.path.dirname(directions[0][0]))
            for where, positive in directions:
                csv_format.write_direction(where, positive)
            if slices:
                csv_format.write_slices(self.root, rank, step, slices)
            csv_format.write_summary_csv(path, level, bounds, records, fp8)
            if summary is not None:
                write_json_atomic(*summary)

        size = sum(getattr(positive, "nbytes", 0) for _where, positive in directions) + 64 * len(records)
        self._writer_errors(self._writer.submit(task, size=size), step)

    def _writer_errors(self, errors: list[BaseException], step: int | None) -> None:
        """Errors of earlier writes, reported on the training thread (raised in strict mode)."""
        for exc in errors:
            self.record_error(step, None, exc)
        if errors and self.config.strict:
            raise ProbeError(f"grad_probe could not write its files: {errors[0]!r}") from errors[0]

    def flush(self) -> None:
        """Wait until every completed step is on disk."""
        self._writer_errors(self._writer.flush(), self.current_step)

    def record_error(self, step: int | None, param: str | None, exc: BaseException) -> None:
        """Keep an error for summary.json instead of raising it: a monitor must not stop training."""
        log.warning("grad_probe: error at step %s%s: %r", step, f" ({param})" if param else "", exc)
        self._dirty = True
        if len(self.errors) >= MAX_ERRORS:
            self.errors_dropped += 1
            return
        self.errors.append({"step": step, "param": param, "error": f"{type(exc).__name__}: {exc}"})

    def _strict_failure(self, step: int, exc: BaseException) -> ProbeError:
        return ProbeError(f"grad_probe failed at step {step}: {exc}")

    @property
    def summary_path(self) -> Path:
        return self.dump_path / f"rank{self.rank or 0}" / "summary.json"

    def summary(self) -> dict[str, Any]:
        names = [n for n, _ in self.selected]
        return {
            "tool": "grad_probe",
            "framework": self.framework,
            "rank": self.rank or 0,
            "level": self.level,
            "bounds": list(self.bounds),
            "compute_dtype": "/".join(sorted(self.compute_dtypes)) or "float64",
            "params": names,
            "file_names": {n: csv_format.file_name_for_param(n) for n in names
                           if csv_format.file_name_for_param(n) != n},
            "steps_written": list(self.steps_written),
            "optimizer_steps": 0 if self.current_step is None else self.current_step + 1,
            "params_without_grad": {str(k): v for k, v in self.params_without_grad.items()},
            "errors": list(self.errors),
            "errors_dropped": self.errors_dropped,
            "config": self.config.to_dict(),
        }

    def _summary_selected(self) -> bool:
        if self.rank is None:
            try:
                self.rank = int(self._resolve_rank())
            except Exception:  # pragma: no cover - the backends have no failing path today
                return False
        return self.config.selects_rank(self.rank)

    def write_summary(self) -> Path | None:
        """Write ``rank{R}/summary.json`` (atomically) if the config selects this rank."""
        if not self._summary_selected():
            return None
        self._last_summary = time.monotonic()
        self._dirty = False
        return write_json_atomic(self.summary_path, self.summary())

    def stop(self) -> None:
        """Remove the hooks and write summary.json. The monitor records nothing afterwards."""
        if self._closed:
            return
        self.remove()
        self._closed = True
        _ACTIVE.discard(self)
        try:
            self.flush()
            self.write_summary()
        except Exception as exc:
            if self.config.strict:
                raise
            log.warning("grad_probe: could not write summary.json: %r", exc)
        finally:
            self._writer.close()  # no thread of the monitor outlives it

    def close(self) -> None:
        self.stop()

    def __enter__(self) -> Any:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.stop()


@atexit.register
def _flush_at_exit() -> None:
    """A monitor never stopped: its completed steps and summary on disk, and its writer thread
    ended, before the interpreter and the frameworks' runtimes tear down."""
    for m in list(_ACTIVE):
        try:
            m._writer.flush()
            if m._dirty:
                m.write_summary()
        except Exception:  # pragma: no cover - best effort at interpreter exit
            pass
    close_writers()
