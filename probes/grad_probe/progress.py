"""Progress of a long comparison: tqdm when installed, else a counter on stderr; shown only for
long runs on a terminal (or when asked), so logs and CI output stay clean."""

from __future__ import annotations

import sys
import time
from collections.abc import Iterable, Iterator
from typing import Any

PROGRESS_MIN_ITEMS = 200


def with_progress(iterable: Iterable, total: int, desc: str, enabled: bool | None = None) -> Iterable:
    """`iterable`, wrapped in a progress display when enabled (None: when `total` is large and
    stderr is a terminal)."""
    if enabled is None:
        enabled = total >= PROGRESS_MIN_ITEMS and sys.stderr.isatty()
    if not enabled:
        return iterable
    try:
        from tqdm import tqdm
    except ImportError:
        return _counter(iterable, total, desc)
    return tqdm(iterable, total=total, desc=desc)


def _counter(iterable: Iterable, total: int, desc: str) -> Iterator[Any]:
    last = 0.0
    i = 0
    for i, item in enumerate(iterable, 1):
        yield item
        now = time.monotonic()
        if now - last > 0.5 and i < total:
            sys.stderr.write(f"\r{desc}: {i}/{total}")
            sys.stderr.flush()
            last = now
    sys.stderr.write(f"\r{desc}: {i}/{total}\n")
