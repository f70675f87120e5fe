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

    def add(self, values: Sequence[Any]) -> None:
        self._pending.append(list(values))
        if len(self._pending) >= FLUSH_ROWS:
            self.flush()

    def flush(self) -> None:
        if not self._pending:
            return
        self.path.parent.mkdir(parents=True, exist_ok=True)
        new = not self.path.exists()
        with open(self.path, "a", encoding=self.encoding, newline="") as fh:
            writer = csv.writer(fh, lineterminator=self.newline)
            if new:
                writer.writerow(self.header)
            writer.writerows(self._pending)
        if new:
            try:
                os.chmod(self.path, FILE_MODE)
            except OSError:
                pass
        self._pending.clear()

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
    """JSON (non-finite floats as strings) written atomically."""
    return write_text_atomic(path, json.dumps(_json_safe(data), indent=2) + "\n")


def read_csv_rows(path: str | os.PathLike) -> list[dict[str, str]]:
    with open(path, encoding="utf-8-sig", newline="") as fh:
        return list(csv.DictReader(fh))


def iter_files(root: str | os.PathLike, name: str) -> Iterable[Path]:
    return sorted(Path(root).rglob(name))
