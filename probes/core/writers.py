"""Files on disk: buffered CSV writers and atomic JSON summaries.

Rows are buffered in memory and appended on flush (the reference opened and closed the file for
every row, B32); the tools flush at least once per step so a crash loses at most one step.
"""

from __future__ import annotations

import csv
import json
import math
import os
import tempfile
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

FILE_MODE = 0o640
FLUSH_ROWS = 4096


class CsvAppender:
    """Append-only CSV with a header written when the file is created."""

    def __init__(self, path: str | os.PathLike, header: Sequence[str], encoding: str = "utf-8", newline: str = "\n") -> None:
        self.path = Path(path)
        self.header = list(header)
        self.encoding = encoding
        self.newline = newline
        self._pending: list[list[Any]] = []
        self.written = False  # some rows reached the file

    def add(self, values: Sequence[Any]) -> None:
        self._pending.append(list(values))
        if len(self._pending) >= FLUSH_ROWS:
            self.flush()

    def flush(self) -> None:
        """Append the pending rows (the header first when the file is new)."""
        rows, self._pending = self._pending, []
        if not rows:
            return
        self.written = True
        self.path.parent.mkdir(parents=True, exist_ok=True)
        new = not self.path.exists()
        with open(self.path, "a", encoding=self.encoding, newline="") as fh:
            writer = csv.writer(fh, lineterminator=self.newline)
            if new:
                writer.writerow(self.header)
            writer.writerows(rows)
        if new:
            try:
                os.chmod(self.path, FILE_MODE)
            except OSError:
                pass

    @property
    def pending(self) -> int:
        return len(self._pending)


def _json_safe(value: Any) -> Any:
    if isinstance(value, float) and not math.isfinite(value):
        return "nan" if math.isnan(value) else ("inf" if value > 0 else "-inf")
    if isinstance(value, dict):
        return {str(k): _json_safe(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_json_safe(v) for v in value]
    return value


def write_text_atomic(path: str | os.PathLike, text: str, encoding: str = "utf-8", mode: int | None = None) -> Path:
    """Write a file through a temporary file and a rename, so a reader never sees half a file."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=path.name, suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "w", encoding=encoding, newline="") as fh:
            fh.write(text)
        if mode is not None:
            try:
                os.chmod(tmp, mode)
            except OSError:
                pass
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise
    return path


def write_json_atomic(path: str | os.PathLike, data: Any) -> Path:
    """JSON (non-finite floats as strings) written atomically. A dict is written a top-level
    key per line with each value on one line: json's C encoder does that (an indented dump
    runs its pure-Python encoder, 10x slower, which a per-step summary pays on the training
    thread); the file stays easy to scan and is still plain JSON."""
    safe = _json_safe(data)
    if isinstance(safe, dict) and safe:
        body = ",\n".join(f"  {json.dumps(k)}: {json.dumps(v)}" for k, v in safe.items())
        return write_text_atomic(path, "{\n" + body + "\n}\n")
    return write_text_atomic(path, json.dumps(safe, indent=2) + "\n")


def read_csv_rows(path: str | os.PathLike) -> list[dict[str, str]]:
    with open(path, encoding="utf-8-sig", newline="") as fh:
        return list(csv.DictReader(fh))


def iter_files(root: str | os.PathLike, name: str) -> Iterable[Path]:
    return sorted(Path(root).rglob(name))


class BackgroundWriter:
    """File writes off the training thread, in submission order, one step in flight at most.

    A probe hands each step's writes over as one task; a daemon thread runs them. `submit` first
    waits for the previous task, so a hard kill loses at most the step being written, and host
    memory holds at most one step's data waiting; when writing takes less than a step (the usual
    case) the wait costs nothing. `flush` waits for the task in flight; probes call it at stop()
    and at interpreter exit (daemon threads still run then), so everything of a completed step is
    on disk even when the training loop raised. A task's exception is kept
    and handed back by `flush`/`submit` (`errors`), never raised on the writer thread.
    """

    def __init__(self, name: str) -> None:
        import queue
        import threading

        self.name = name
        self._queue: Any = queue.Queue(maxsize=1)
        self._lock = threading.Lock()
        self._thread: Any = None
        self.errors: list[BaseException] = []

    def _start(self) -> None:
        import threading

        with self._lock:
            if self._thread is None or not self._thread.is_alive():
                self._thread = threading.Thread(target=self._run, name=f"msprobe-{self.name}-writer", daemon=True)
                self._thread.start()

    def _run(self) -> None:
        while True:
            fn, args = self._queue.get()
            try:
                fn(*args)
            except BaseException as exc:  # kept for the training thread, which decides what to do
                self.errors.append(exc)
            finally:
                self._queue.task_done()

    def submit(self, fn: Any, *args: Any) -> list[BaseException]:
        """Queue `fn(*args)` after waiting for the previous task; returns (and clears) the errors
        of tasks that finished since the last call."""
        self._start()
        self._queue.join()
        self._queue.put((fn, args))
        return self._take_errors()

    def flush(self) -> list[BaseException]:
        """Wait until everything submitted is written; returns (and clears) the tasks' errors."""
        if self._thread is not None:
            self._queue.join()
        return self._take_errors()

    def _take_errors(self) -> list[BaseException]:
        errors, self.errors = self.errors, []
        return errors

