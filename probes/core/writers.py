"""Files on disk: buffered CSV writers and atomic JSON summaries.

Rows are buffered in memory and appended on flush (the reference opened and closed the file for
every row); the tools flush at least once per step so a crash loses at most one step.
"""

from __future__ import annotations

import csv
import itertools
import json
import math
import os
import re
import threading
import time
import weakref
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

FILE_MODE = 0o640
FLUSH_ROWS = 4096

# the characters for which csv.writer (minimal quoting, "," delimiter, CRLF lines) quotes a field
needs_quotes = re.compile(r'[,"\r\n]').search


def csv_field(text: str) -> str:
    """`text` as csv.writer writes it (minimal quoting): for rows a tool renders itself, where most
    of a line is known in advance (a tool writing a row per op pays ~2.5 us a row to csv.writer)."""
    return '"' + text.replace('"', '""') + '"' if needs_quotes(text) else text


def _is_line(row: list[Any] | str) -> bool:
    return row.__class__ is str


class CsvAppender:
    """Append-only CSV with a header written when the file is created. A row is a list of cells,
    or a line the caller rendered itself (a str without the line end, fields as `csv_field` gives
    them)."""

    def __init__(self, path: str | os.PathLike, header: Sequence[str], encoding: str = "utf-8", newline: str = "\n") -> None:
        self.path = Path(path)
        self.header = list(header)
        self.encoding = encoding
        self.newline = newline
        self._pending: list[list[Any] | str] = []
        self.written = False  # some rows reached the file

    def add(self, values: Sequence[Any]) -> None:
        self._pending.append(list(values))
        if len(self._pending) >= FLUSH_ROWS:
            self.flush()

    def add_all(self, rows: list[list[Any] | str]) -> None:
        """Several rows at once, taken as they are (the caller hands over lists it no longer
        changes): a tool that writes rows for every op of a model saves a copy of each."""
        self._pending += rows
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
            for rendered, run in itertools.groupby(rows, _is_line):  # runs of lines and of cell lists, in order
                if rendered:
                    fh.write(self.newline.join(run) + self.newline)
                else:
                    writer.writerows(run)
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


def process_umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


#: the process's umask, read once: a file created with mode & ~umask == mode needs no chmod
UMASK = process_umask()


def write_text_atomic(path: str | os.PathLike, text: str, encoding: str = "utf-8", mode: int | None = None,
                      make_dir: Callable[[str], object] | None = None) -> Path:
    """`write_bytes_atomic` of the encoded text."""
    return write_bytes_atomic(path, text.encode(encoding), mode, make_dir)


def write_bytes_atomic(path: str | os.PathLike, data: bytes, mode: int | None = None,
                       make_dir: Callable[[str], object] | None = None) -> Path:
    """Write a file through a temporary file and a rename, so a reader never sees half a file. A
    few system calls: probes write one per step (the temporary's name is this process's and
    thread's own, so concurrent writers never share one). A missing folder is made by `make_dir`
    (default: os.makedirs), only when the first open finds it missing: no check beforehand."""
    target = os.fspath(path)
    tmp = f"{target}.{os.getpid()}.{threading.get_ident()}.tmp"
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL
    perm = 0o666 if mode is None else mode
    try:
        fd = os.open(tmp, flags, perm)
    except FileNotFoundError:  # the folder does not exist yet
        folder = os.path.dirname(target) or "."
        if make_dir is None:
            os.makedirs(folder, exist_ok=True)
        else:
            make_dir(folder)
        fd = os.open(tmp, flags, perm)
    except FileExistsError:  # a temporary left by a killed writer of this pid and thread id
        os.unlink(tmp)
        fd = os.open(tmp, flags, perm)
    try:
        try:
            view = memoryview(data)
            while view:
                view = view[os.write(fd, view):]
            if mode is not None and UMASK & mode:
                try:
                    os.fchmod(fd, mode)  # the umask does not narrow it
                except OSError:
                    pass
        finally:
            os.close(fd)
        os.replace(tmp, target)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise
    return Path(target)


def write_json_atomic(path: str | os.PathLike, data: Any, encoded: dict[str, str] | None = None) -> Path:
    """JSON (non-finite floats as strings) written atomically. A dict is written a top-level
    key per line with each value on one line: json's C encoder does that (an indented dump
    runs its pure-Python encoder, 10x slower, which a per-step summary pays on the training
    thread); the file stays easy to scan and is still plain JSON. `encoded`: the JSON text of
    some of the dict's values, already made (json_value) by a caller that rewrites the same
    values step after step."""
    if isinstance(data, dict) and data:
        encoded = encoded or {}
        body = ",\n".join(f"  {json.dumps(str(k))}: {encoded[k] if k in encoded else _dumps(v)}"
                           for k, v in data.items())
        return write_text_atomic(path, "{\n" + body + "\n}\n")
    return write_text_atomic(path, json.dumps(_json_safe(data), indent=2) + "\n")


def json_value(value: Any) -> str:
    """`value` as write_json_atomic writes it (for its `encoded`)."""
    return _dumps(value)


def _dumps(value: Any) -> str:
    """One value as JSON: as it is when json's C encoder takes it (the usual summary value, with
    finite floats and str or int keys, converted the same way), else after `_json_safe`."""
    try:
        return json.dumps(value, allow_nan=False)
    except (ValueError, TypeError):  # a non-finite float, a key json does not take
        return json.dumps(_json_safe(value))


def read_csv_rows(path: str | os.PathLike) -> list[dict[str, str]]:
    with open(path, encoding="utf-8-sig", newline="") as fh:
        return list(csv.DictReader(fh))


class BackgroundWriter:
    """File writes off the training thread when they are worth it, in submission order.

    A probe hands each step's writes over as one task with its size in bytes. A small task with
    nothing in flight runs at once, on the caller's thread: for a tiny model's step (a few KiB) the
    hand-off to a thread costs more than the write, and on two cores a thread switch can cost
    Python's whole 5 ms switch interval. Anything else goes to a one-thread executor, which runs
    the tasks in order; the caller never waits for an earlier step's write unless the bytes queued
    exceed `max_pending` (the host memory a burst of large steps may hold). `flush` waits for
    everything queued (probes call it at stop() and at interpreter exit), `close` also ends the
    thread, so no thread of the probes outlives its run; a later task starts a new one. A task's
    exception is kept and handed back by `flush`/`submit`/`close` (`errors`), never raised on the
    writer thread.

    With `handoff_s`, small tasks go to the thread once two in a row spent longer than that inline
    waiting (their time less their CPU time): what a thread hides for sure is the waiting for a slow
    disk (a network file system, a journal busy with another process's files); CPU time it only
    moves to another core, which may be busy too, and adds the hand-off (measured on two busy
    cores: never less than the write itself). So the writer measures the wait instead of guessing it
    from the bytes; two in a row, because a first write (new folders) or a preempted one is slow
    once. While the writes wait, every `REMEASURE_EVERY`-th small task runs inline again to notice
    the disk got fast. `max_tasks` bounds the tasks queued or running (1: the caller
    never runs more than one task ahead of the disk, so a hard kill loses at most that task).
    """

    #: a task smaller than this runs on the caller's thread when nothing is queued (0: never)
    INLINE_BYTES = 1 << 20
    #: the bytes queued tasks may hold before `submit` waits for the writer
    MAX_PENDING = 256 << 20
    #: while small tasks wait inline, one in this many still runs inline (measured again)
    REMEASURE_EVERY = 16

    def __init__(self, name: str, inline_bytes: int | None = None, max_pending: int | None = None, *,
                 handoff_s: float | None = None, max_tasks: int | None = None) -> None:
        self.name = name
        self.inline_bytes = self.INLINE_BYTES if inline_bytes is None else inline_bytes
        self.max_pending = self.MAX_PENDING if max_pending is None else max_pending
        self.handoff_s = handoff_s
        self.max_tasks = max_tasks
        self.slow_inline = 0  # the tasks run inline in a row that waited longer than handoff_s
        self._handed = 0  # small tasks sent to the thread because the inline ones waited
        self._cond = threading.Condition()
        self._pending = 0  # bytes of queued and running tasks
        self._busy = 0  # tasks queued or running
        self._executor: ThreadPoolExecutor | None = None
        self.errors: list[BaseException] = []
        _WRITERS.add(self)

    def submit(self, fn: Callable[..., object], *args: Any, size: int = 0) -> list[BaseException]:
        """Run `fn(*args)` now (small, nothing queued) or after the tasks queued before it; returns
        (and clears) the errors of tasks that finished since the last call."""
        # _busy is read without the lock: a stale non-zero only sends a small task to the thread
        queue = bool(self._busy) or size >= self.inline_bytes
        if not queue and self.slow_inline >= 2:
            self._handed += 1
            queue = self._handed % self.REMEASURE_EVERY != 0
        if queue:
            with self._cond:
                while self._busy and (self._pending + size > self.max_pending
                                      or (self.max_tasks is not None and self._busy >= self.max_tasks)):
                    self._cond.wait()
                if self._executor is None:
                    self._executor = ThreadPoolExecutor(1, thread_name_prefix=f"msprobe-{self.name}-writer")
                try:
                    self._executor.submit(self._run, fn, args, size)
                except RuntimeError:  # the interpreter is exiting: run it here, after the others
                    while self._busy:
                        self._cond.wait()
                else:  # counted before _run (which needs the lock) counts it off
                    self._pending += size
                    self._busy += 1
                    return self._take_errors()
        start, cpu = time.perf_counter(), time.thread_time()
        try:
            fn(*args)
        except BaseException as exc:  # reported like a queued task's
            self.errors.append(exc)
        if self.handoff_s is not None:
            waited = (time.perf_counter() - start) - (time.thread_time() - cpu)
            self.slow_inline = self.slow_inline + 1 if waited > self.handoff_s else 0
        return self._take_errors()

    def _run(self, fn: Callable[..., object], args: tuple, size: int) -> None:
        error = None
        try:
            fn(*args)
        except BaseException as exc:  # kept for the training thread, which decides what to do
            error = exc
        with self._cond:
            if error is not None:
                self.errors.append(error)
            self._pending -= size
            self._busy -= 1
            self._cond.notify_all()

    def flush(self) -> list[BaseException]:
        """Wait until everything submitted is written; returns (and clears) the tasks' errors."""
        with self._cond:
            while self._busy:
                self._cond.wait()
        return self._take_errors()

    def close(self) -> list[BaseException]:
        """flush(), then end the thread (joined): nothing of the probes keeps running after it."""
        errors = self.flush()
        with self._cond:
            executor, self._executor = self._executor, None
        if executor is not None:
            executor.shutdown(wait=True)
        return errors + self._take_errors()

    def _take_errors(self) -> list[BaseException]:
        if not self.errors:  # the common case: no lock
            return []
        with self._cond:
            errors, self.errors = self.errors, []
        return errors


_WRITERS: weakref.WeakSet[BackgroundWriter] = weakref.WeakSet()


def close_writers() -> None:
    """Flush and end every writer thread (at interpreter exit, before the runtime tears down)."""
    for writer in list(_WRITERS):
        try:
            writer.close()
        except Exception:  # pragma: no cover - best effort at exit
            pass
