"""Reading a grad_probe dump, read-only (numpy only): its rank and step folders, the step summary
CSVs (``grad_summary_{N}.csv``), the direction files (``step{N}/{param}.npy``) and whether a rank
holds slices of sharded parameters (``shards.json``).

The comparator and the golden files both read dumps through here, so that they agree on what a
dump holds. Nothing raises for one bad file: an unreadable folder reads as empty, an unreadable CSV
or ``.npy`` is logged and reads as None.
"""

from __future__ import annotations

import logging
import os
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Union

import numpy as np

from probes.core.writers import read_csv_rows
from probes.grad_probe.csv_format import RANK_DIR_RE, SLICES_JSON, SUMMARY_CSV_RE, param_from_file_name
from probes.grad_probe.sharded_directions import Assembled, ShardedRun

# the comparator's logger: what a user filters on when a comparison reports unreadable files
log = logging.getLogger("probes.grad_probe.comparator")

PathLike = Union[str, os.PathLike]
Signs = Union[Path, Assembled]  # a rank's direction file, or a sharded run's reassembled parameter

STEP_DIR_RE = re.compile(r"^step(\d+)$")
PARAM_COLUMNS = ("param_name", "Param_name")  # MindSpore graph mode spells it Param_name
SHAPE_COLUMNS = ("shape", "Shape")
MD5_COLUMN = "MD5"


def _entries(directory: Path) -> list[os.DirEntry]:
    """A folder's entries in name order; an unreadable folder reads as empty."""
    try:
        return sorted(os.scandir(directory), key=lambda e: e.name)
    except OSError:
        return []


def _numbered(directory: Path, pattern: re.Pattern, want_dir: bool, canonical: str) -> dict[int, Path]:
    """{n: path} for entries matching pattern; the canonical spelling (rank1) wins over rank01."""
    found: dict[int, Path] = {}
    for entry in _entries(directory):
        m = pattern.match(entry.name)
        if not m:
            continue
        try:
            is_dir = entry.is_dir()
        except OSError:
            continue
        if is_dir != want_dir:
            continue
        n = int(m.group(1))
        if n not in found or entry.name == canonical.format(n):
            found[n] = Path(entry.path)
    return found


def rank_dirs(p: Path) -> dict[int, Path]:
    return _numbered(p, RANK_DIR_RE, True, "rank{}")


def step_dirs(p: Path) -> dict[int, Path]:
    return _numbered(p, STEP_DIR_RE, True, "step{}")


def step_csvs(p: Path) -> dict[int, Path]:
    return _numbered(p, SUMMARY_CSV_RE, False, "grad_summary_{}.csv")


def is_dump_root(path: PathLike) -> bool:
    """True for a folder holding rank{R} folders and no grad_summary CSV / step folder of its own."""
    p = Path(path)
    if step_csvs(p) or step_dirs(p):
        return False
    return bool(rank_dirs(p))


def holds_slices(rank_dir: Path) -> bool:
    """Whether a rank folder's direction files are one rank's slices of sharded parameters, which
    only mean something once every rank's slices are put back together."""
    return any((d / SLICES_JSON).is_file() for d in step_dirs(rank_dir).values())


@dataclass
class StepCsv:
    """One step summary CSV: the parameters in file order, their L0 hashes (None without an MD5
    column) and their shape cells."""

    params: list[str]
    md5: dict[str, str] | None
    shape: dict[str, str]


def read_step_csv(path: Path | None) -> StepCsv | None:
    """The CSV's parameters; None when there is no file or it cannot be read as a summary."""
    if path is None:
        return None
    try:
        rows = read_csv_rows(path)
    except (OSError, UnicodeDecodeError, ValueError) as exc:
        log.warning("cannot read %s: %s", path, exc)
        return None
    if not rows:
        return StepCsv([], None, {})
    keys = rows[0].keys()
    pcol = next((c for c in PARAM_COLUMNS if c in keys), None)
    if pcol is None:
        log.warning("%s has no param_name column; ignored", path)
        return None
    scol = next((c for c in SHAPE_COLUMNS if c in keys), None)
    has_md5 = MD5_COLUMN in keys
    params: list[str] = []
    seen: set[str] = set()
    md5: dict[str, str] = {}
    shape: dict[str, str] = {}
    for row in rows:
        name = row.get(pcol)
        if name is None or name in seen:
            continue
        params.append(name)
        seen.add(name)
        if has_md5:
            md5[name] = (row.get(MD5_COLUMN) or "").strip().lower()
        shape[name] = (row.get(scol) or "").strip() if scol else ""
    return StepCsv(params, md5 if has_md5 else None, shape)


def decoded_name(stem: str) -> str:
    """The parameter a direction file's stem names (percent-decoded)."""
    try:
        return param_from_file_name(stem)
    except UnicodeDecodeError:  # not one of ours: keep the stem as the name
        return stem


def npy_files(step_dir: Path | None) -> dict[str, Path]:
    """{param name: .npy path}. Names are the file stems verbatim; a percent-encoded stem also
    answers to its decoded name when that does not clash. Other suffixes (``.pt``) are ignored."""
    if step_dir is None:
        return {}
    files: dict[str, Path] = {}
    decoded: dict[str, Path] = {}
    for entry in _entries(step_dir):
        if not entry.name.endswith(".npy") or not entry.is_file():
            continue
        stem = entry.name[:-4]
        files[stem] = Path(entry.path)
        if "%" in stem:
            decoded.setdefault(decoded_name(stem), Path(entry.path))
    for name, path in decoded.items():
        files.setdefault(name, path)
    return files


def step_signs(step_dir: Path | None, run: ShardedRun | None, step: int) -> dict[str, Signs]:
    """{param: signs} of one rank's step: its direction files, with the sharded parameters' slices
    replaced by the full parameters reassembled from every rank."""
    files: dict[str, Signs] = dict(npy_files(step_dir))
    if run is not None:
        for param in run.params(step):
            files[param] = run.assembled(step, param)
    return files


def load_npy(path: Path) -> np.ndarray | None:
    """A direction file's array (never unpickled); None, logged, when it cannot be read."""
    try:
        return np.load(path, allow_pickle=False)
    except (OSError, ValueError, EOFError) as exc:
        log.warning("cannot load %s: %s", path, exc)
        return None


def load_signs(source: Signs) -> tuple[Any, Any]:
    """(signs, the mask of elements held or None for all) of a direction file or a reassembled
    sharded parameter; (None, None) when unreadable."""
    if isinstance(source, Assembled):
        got = source.load()
        return (None, None) if got is None else got
    return load_npy(source), None
