"""The on-disk formats of grad_probe, byte-compatible with msprobe 8.3.3 (spec §3.1–§3.5).

* ``rank{R}/grad_summary_{N}.csv``: UTF-8 with BOM, CRLF line ends, ``csv.writer``'s minimal
  quoting, cells rendered with ``str()`` (Python float repr: ``0.0``, ``nan``, ``inf``; shapes as
  ``[3, 4]`` / ``[]``). An existing file of the same name is replaced (atomically).
* ``rank{R}/step{N}/{param}.npy``: boolean ``g > 0`` in the gradient's shape, ``np.save``.

Parameter names go into file names verbatim except characters outside ``[A-Za-z0-9_.-]``, which
are percent-encoded (UTF-8 bytes, ``%XX`` upper-case): ``blocks/0 w`` -> ``blocks%2F0%20w.npy``.
The reference instead rejects such paths; names made of the allowed characters (the usual
``named_parameters()`` names) give the reference's file names. :func:`param_from_file_name`
reverses the encoding.

This module imports no deep-learning framework (numpy only when a direction file is written).
"""

from __future__ import annotations

import csv
import functools
import io
import os
import re
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any
from urllib.parse import unquote

from probes.core.writers import write_text_atomic
from probes.grad_probe.stats import Bound, GradStats

FILE_MODE = 0o640
DIR_MODE = 0o750
ENCODING = "utf-8-sig"
LINE_END = "\r\n"

_SAFE = re.compile(r"[A-Za-z0-9_.\-]")


def interval_headers(bounds: Sequence[Bound]) -> list[str]:
    """``(-inf, b0]``, ``(b0, b1]``, …, ``(b(n-1), inf)`` with ``str()`` of each bound as given."""
    if not bounds:
        raise ValueError("bounds must not be empty (B-G1)")
    text = [str(b) for b in bounds]
    heads = [f"(-inf, {text[0]}]"]
    heads += [f"({lo}, {hi}]" for lo, hi in zip(text, text[1:])]
    heads.append(f"({text[-1]}, inf)")
    return heads


def header(level: str, bounds: Sequence[Bound]) -> list[str]:
    """The header row of grad_summary_{N}.csv for ``level`` (spec §3.1)."""
    if level == "L0":
        return ["param_name", "MD5", "max", "min", "norm", "shape"]
    if level == "L1":
        return ["param_name", "max", "min", "norm", "shape"]
    if level == "L2":
        return ["param_name", *interval_headers(bounds), "=0", "max", "min", "norm", "shape"]
    raise ValueError(f"unknown grad_level {level!r}: expected L0, L1 or L2")


def row_cells(level: str, stats: GradStats) -> list[Any]:
    """The cells of one CSV row, in the header's order (csv.writer renders them with str())."""
    tail = [stats.max, stats.min, stats.norm, str(list(stats.shape))]
    if level == "L0":
        return [stats.name, stats.md5 if stats.md5 is not None else "", *tail]
    if level == "L1":
        return [stats.name, *tail]
    if level == "L2":
        return [stats.name, *stats.fractions, stats.zero_fraction, *tail]
    raise ValueError(f"unknown grad_level {level!r}: expected L0, L1 or L2")


def render_csv(rows: Iterable[Sequence[Any]]) -> str:
    """The text of a CSV (without the BOM, which the encoding adds)."""
    buf = io.StringIO()
    writer = csv.writer(buf, lineterminator=LINE_END)
    writer.writerows(rows)
    return buf.getvalue()


# the names of a dump's rank folders and step summaries (readers match them: comparator, probes.results)
RANK_DIR_RE = re.compile(r"^rank(\d+)$")
SUMMARY_CSV_RE = re.compile(r"^grad_summary_(\d+)\.csv$")


def summary_csv_path(root: str | os.PathLike[str], rank: int, step: int) -> Path:
    return Path(root) / f"rank{rank}" / f"grad_summary_{step}.csv"


def direction_path(root: str | os.PathLike[str], rank: int, step: int, name: str) -> Path:
    return Path(root) / f"rank{rank}" / f"step{step}" / (file_name_for_param(name) + ".npy")


def write_summary_csv(
    path: str | os.PathLike[str], level: str, bounds: Sequence[Bound], stats: Iterable[GradStats]
) -> Path:
    """Write (replace) one step's grad_summary CSV: header always, then one row per record."""
    rows = [header(level, bounds)] + [row_cells(level, s) for s in stats]
    return _write_text_atomic(Path(path), render_csv(rows))


def write_direction(path: str | os.PathLike[str], positive: Any) -> Path:
    """Save a boolean ``g > 0`` host array (original shape) as ``.npy``."""
    import numpy as np

    path = Path(path)
    make_dirs(path.parent)
    arr = np.asarray(positive, dtype=bool)
    with open(path, "wb") as fh:
        np.save(fh, arr, allow_pickle=False)
    _chmod(path, FILE_MODE)
    return path


@functools.lru_cache(maxsize=65536)  # the same names every step: encoded once
def file_name_for_param(name: str) -> str:
    """Percent-encode every character outside ``[A-Za-z0-9_.-]`` (UTF-8 bytes, ``%XX``)."""
    return "".join(c if _SAFE.fullmatch(c) else "".join(f"%{b:02X}" for b in c.encode("utf-8")) for c in name)


def param_from_file_name(stem: str) -> str:
    """Inverse of :func:`file_name_for_param` (the file name without ``.npy``)."""
    return unquote(stem, encoding="utf-8", errors="strict")


def make_dirs(path: Path) -> None:
    """Create ``path`` and its missing parents with mode 0750 (as the reference)."""
    missing = []
    p = path
    while not p.exists():
        missing.append(p)
        if p.parent == p:
            break
        p = p.parent
    path.mkdir(parents=True, exist_ok=True)
    for p in missing:
        _chmod(p, DIR_MODE)


def _write_text_atomic(path: Path, text: str) -> Path:
    make_dirs(path.parent)
    return write_text_atomic(path, text, encoding=ENCODING, mode=FILE_MODE)


def _chmod(path: Path, mode: int) -> None:
    try:
        os.chmod(path, mode)
    except OSError:
        pass
