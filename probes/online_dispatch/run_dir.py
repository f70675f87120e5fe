"""The run directory ``msprobe[_{tag}]_rank{R}_{timestamp}`` with its ``cpu/`` and ``npu/`` folders.

The timestamp is ``YYYYmmddHHMMSS`` plus three millisecond digits (the reference meant that but
produced a 13-digit truncation: ``time.strftime`` has no ``%f``). Directories are claimed with an exclusive ``mkdir``; when
the name is taken (two contexts in the same millisecond, or another process), the next
millisecond is tried, so every context gets its own directory and file names without sleeping.
"""

from __future__ import annotations

import os
import time
from pathlib import Path

from probes.core.file_names import dispatch_run_dir_name

DIR_MODE = 0o750


def timestamp(seconds: float) -> str:
    ms = int(round(seconds * 1000))
    return time.strftime("%Y%m%d%H%M%S", time.localtime(ms // 1000)) + f"{ms % 1000:03d}"


def create_run_dir(root: Path, rank: int, tag: str | None, now: float | None = None) -> tuple[Path, str]:
    """Claim a fresh run directory under `root`; returns it and its timestamp."""
    t = time.time() if now is None else now
    for _ in range(100000):
        ts = timestamp(t)
        path = root / dispatch_run_dir_name(tag, rank, ts)
        try:
            path.mkdir(mode=DIR_MODE)
        except FileExistsError:
            t += 0.001
            continue
        for sub in ("cpu", "npu"):
            (path / sub).mkdir(mode=DIR_MODE, exist_ok=True)
        try:
            os.chmod(path, DIR_MODE)
        except OSError:
            pass
        return path, ts
    raise FileExistsError(f"no free run directory name under {root}")
