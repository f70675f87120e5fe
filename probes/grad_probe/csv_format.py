"""The on-disk formats of grad_probe, byte-compatible with msprobe 8.3.3.

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
import math
import os
import re
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any
from urllib.parse import unquote

from probes.core.file_names import GRAD_RANK_DIR, GRAD_SUMMARY_CSV
from probes.core.writers import UMASK, write_text_atomic
from probes.grad_probe.stats import FP8_HEALTH_FIGURES, Bound, GradStats

FILE_MODE = 0o640
DIR_MODE = 0o750
ENCODING = "utf-8-sig"
LINE_END = "\r\n"

_SAFE = re.compile(r"[A-Za-z0-9_.\-]")


def interval_headers(bounds: Sequence[Bound]) -> list[str]:
    """``(-inf, b0]``, ``(b0, b1]``, …, ``(b(n-1), inf)`` with ``str()`` of each bound as given."""
    if not bounds:
        raise ValueError("bounds must not be empty")
    text = [str(b) for b in bounds]
    heads = [f"(-inf, {text[0]}]"]
    heads += [f"({lo}, {hi}]" for lo, hi in zip(text, text[1:])]
    heads.append(f"({text[-1]}, inf)")
    return heads


def fp8_headers(formats: Sequence[str]) -> list[str]:
    """``{format} underflow``, ``{format} saturated`` per format of grad_probe.fp8_health: after
    msprobe's columns, so a reader that knows only those finds them where it expects."""
    return [f"{f} {figure}" for f in formats for figure in FP8_HEALTH_FIGURES]


def header(level: str, bounds: Sequence[Bound], fp8: Sequence[str] = ()) -> list[str]:
    """The header row of grad_summary_{N}.csv for ``level`` (msprobe's: MD5 only at L0), then
    the FP8 health columns of the formats ``fp8`` (none by default: msprobe's file)."""
    if level == "L0":
        heads = ["param_name", "MD5", "max", "min", "norm", "shape"]
    elif level == "L1":
        heads = ["param_name", "max", "min", "norm", "shape"]
    elif level == "L2":
        heads = ["param_name", *interval_headers(bounds), "=0", "max", "min", "norm", "shape"]
    else:
        raise ValueError(f"unknown grad_level {level!r}: expected L0, L1 or L2")
    return heads + fp8_headers(fp8)


def row_cells(level: str, stats: GradStats, fp8_width: int = 0) -> list[Any]:
    """The cells of one CSV row, in the header's order (csv.writer renders them with str());
    ``fp8_width`` FP8 health cells at the end, empty where the record has none measured."""
    tail = [stats.max, stats.min, stats.norm, str(list(stats.shape))]
    if fp8_width:
        tail += list(stats.fp8) if stats.fp8 else [""] * fp8_width
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
RANK_DIR_RE = GRAD_RANK_DIR  # the names every reader finds them by (probes.core.file_names)
SUMMARY_CSV_RE = GRAD_SUMMARY_CSV


def summary_csv_path(root: str | os.PathLike[str], rank: int, step: int) -> Path:
    return Path(root) / f"rank{rank}" / f"grad_summary_{step}.csv"


def direction_path(root: str | os.PathLike[str], rank: int, step: int, name: str) -> Path:
    return Path(direction_file(os.fspath(root), rank, step, name))


def direction_file(root: str, rank: int, step: int, name: str) -> str:
    """direction_path as a string (a monitor builds one per parameter and step: no Path objects)."""
    return f"{root}{os.sep}rank{rank}{os.sep}step{step}{os.sep}{file_name_for_param(name)}.npy"


def write_summary_csv(
    path: str | os.PathLike[str], level: str, bounds: Sequence[Bound], stats: Iterable[GradStats],
    fp8: Sequence[str] = (),
) -> Path:
    """Write (replace) one step's grad_summary CSV: header always, then one row per record."""
    width = len(FP8_HEALTH_FIGURES) * len(fp8)
    rows = [row_cells(level, s, width) for s in stats]
    return _write_text_atomic(path, _header_text(level, tuple(bounds), tuple(fp8)) + render_csv(rows))


@functools.lru_cache(maxsize=64)
def _header_text(level: str, bounds: tuple, fp8: tuple = ()) -> str:
    return render_csv([header(level, bounds, fp8)])


def write_direction(path: str | os.PathLike[str], positive: Any) -> str:
    """Save a boolean ``g > 0`` host array (original shape) as ``.npy``: the bytes ``np.save``
    writes (its header for the shape, made once per shape, then the data), in one system call."""
    import numpy as np

    path = os.fspath(path)
    arr = np.asarray(positive, dtype=bool)
    if not arr.flags.c_contiguous:  # (np.ascontiguousarray would make a 0-d array 1-d)
        arr = np.array(arr, order="C")
    try:
        fd, created = _open_new(path)
    except FileNotFoundError:  # the step's folder is new
        make_dirs(os.path.dirname(path))
        fd, created = _open_new(path)
    try:
        header = _npy_header(arr.shape)
        done = os.writev(fd, [header, arr]) if arr.size else os.write(fd, header)
        if done < len(header) + arr.nbytes:  # a short write (rare): the rest, byte by byte offset
            rest = memoryview(header + arr.tobytes())[done:]
            while rest:
                rest = rest[os.write(fd, rest):]
        if not created or UMASK & FILE_MODE:  # an existing file, or a umask narrower than the mode
            os.fchmod(fd, FILE_MODE)
    finally:
        os.close(fd)
    return path


#: per step and rank, where each sharded parameter's direction file sits in the full parameter
SLICES_JSON = "shards.json"


def slices_path(root: str | os.PathLike[str], rank: int, step: int) -> Path:
    return Path(root) / f"rank{rank}" / f"step{step}" / SLICES_JSON


def slice_entry(shape: Sequence[int], index: Sequence[Any] | range) -> dict[str, Any]:
    """One parameter's entry of ``shards.json``: the full shape and either, per dimension, the
    global indices this rank's direction file holds (``"index"``: ``[start, stop]`` for a
    contiguous run, a ``range``, or ``{"take": [i, j, …]}`` for explicit indices, a strided shard),
    or, for an engine that partitions the flattened parameter (a ``range``), the positions held in
    it (``"flat": [start, stop]``; the file is then 1-D)."""
    if isinstance(index, range):
        return {"shape": [int(s) for s in shape], "flat": [index.start, index.stop]}
    dims = [[d.start, d.stop] if isinstance(d, range) else {"take": [int(i) for i in d]} for d in index]
    return {"shape": [int(s) for s in shape], "index": dims}


def slice_indices(entry: dict[str, Any]) -> tuple[list[int] | range, ...] | range:
    """The per-dimension global indices of a ``shards.json`` entry, or the ``range`` of a flat
    one (inverse of :func:`slice_entry`); ValueError for an entry that is not one."""
    shape, dims = entry.get("shape"), entry.get("index")
    flat = entry.get("flat")
    if flat is not None and isinstance(shape, list):
        if not (isinstance(flat, list) and len(flat) == 2 and 0 <= int(flat[0]) <= int(flat[1])
                <= math.prod(int(s) for s in shape)):
            raise ValueError(f"not a shards.json flat range: {flat!r} of shape {shape!r}")
        return range(int(flat[0]), int(flat[1]))
    if not isinstance(shape, list) or not isinstance(dims, list) or len(shape) != len(dims):
        raise ValueError(f"not a shards.json entry: {entry!r}")
    out: list[list[int] | range] = []
    for n, d in zip(shape, dims):
        if isinstance(d, dict) and isinstance(d.get("take"), list):
            values = [int(i) for i in d["take"]]
        elif isinstance(d, list) and len(d) == 2:
            values = range(int(d[0]), int(d[1]))
        else:
            raise ValueError(f"not a shards.json dimension: {d!r}")
        inside = (0 <= values.start and values.stop <= int(n)) if isinstance(values, range) else all(
            0 <= i < int(n) for i in values)
        if not inside:
            raise ValueError(f"indices {d!r} outside a dimension of {n}")
        out.append(values)
    return tuple(out)


def write_slices(root: str | os.PathLike[str], rank: int, step: int, slices: dict[str, Any]) -> Path:
    """Write ``rank{R}/step{N}/shards.json``: ``{"format": 1, "params": {name: slice_entry}}`` for
    the sharded parameters whose direction file in that folder holds this rank's slice only."""
    import json

    path = slices_path(root, rank, step)
    return _write_text_atomic(path, json.dumps({"format": 1, "params": slices}, separators=(",", ":")), "utf-8")


def _open_new(path: str) -> tuple[int, bool]:
    """(descriptor, whether the file was created) of `path` opened for writing from its start."""
    try:
        return os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, FILE_MODE), True
    except FileExistsError:
        return os.open(path, os.O_WRONLY | os.O_TRUNC), False




@functools.lru_cache(maxsize=4096)
def _npy_header(shape: tuple[int, ...]) -> bytes:
    import numpy as np

    buf = io.BytesIO()
    np.lib.format.write_array_header_1_0(buf, {"descr": np.dtype(bool).str, "fortran_order": False,
                                               "shape": tuple(shape)})
    return buf.getvalue()


@functools.lru_cache(maxsize=65536)  # the same names every step: encoded once
def file_name_for_param(name: str) -> str:
    """Percent-encode every character outside ``[A-Za-z0-9_.-]`` (UTF-8 bytes, ``%XX``)."""
    return "".join(c if _SAFE.fullmatch(c) else "".join(f"%{b:02X}" for b in c.encode("utf-8")) for c in name)


def param_from_file_name(stem: str) -> str:
    """Inverse of :func:`file_name_for_param` (the file name without ``.npy``)."""
    return unquote(stem, encoding="utf-8", errors="strict")


_MADE: set[str] = set()  # folders this process created or found: no further system call for them
_MADE_MAX = 4096  # a long run makes a step folder per step: the cache is emptied when it gets this big


def make_dirs(path: str | os.PathLike[str]) -> None:
    """Create ``path`` and its missing parents with mode 0750 (as the reference)."""
    key = os.fspath(path)
    if key in _MADE and os.path.isdir(key):
        return
    missing = []
    p = key
    while p and not os.path.exists(p):
        missing.append(p)
        parent = os.path.dirname(p)
        if parent == p:
            break
        p = parent
    os.makedirs(key, exist_ok=True)
    for p in missing:
        _chmod(p, DIR_MODE)
    if len(_MADE) >= _MADE_MAX:
        _MADE.clear()
    _MADE.add(key)


def make_step_dir(path: str) -> None:
    """`make_dirs` of a step's folder, new at every step: one ``mkdir`` when its parent exists (a
    monitor makes one per step, so the existence checks of the general case are saved)."""
    try:
        os.mkdir(path, DIR_MODE)
    except FileExistsError:
        return
    except FileNotFoundError:  # the rank's folder is new too
        make_dirs(path)
        return
    if UMASK & DIR_MODE:  # a umask narrower than the mode
        _chmod(path, DIR_MODE)


def _write_text_atomic(path: str | os.PathLike[str], text: str, encoding: str = ENCODING) -> Path:
    return write_text_atomic(path, text, encoding=encoding, mode=FILE_MODE, make_dir=make_dirs)


def _chmod(path: str | os.PathLike[str], mode: int) -> None:
    try:
        os.chmod(path, mode)
    except OSError:
        pass
