"""The catalogue's golden files: where they lie, what a row holds, reading and writing them.

A golden is one reviewed file per machine identity (probes.backends.hardware: the CPU's vendor,
kernel path and BLAS; the GPU model; the NPU SoC):
``golden/catalogue/<device>/<identity>/catalogue.csv``, one row per API x dtype (samples, max and
p99 ulp, the largest accumulation test ratio, free_benchmark's verdict), with ``meta.json``
recording the identity, the versions that made it (torch / mindspore, python, numpy, probes;
CUDA or CANN) and the date. An accepted upgrade is one diff to read. ``known.csv`` beside the
identities' folders lists accumulation errors accepted on every machine of the device kind.

A golden folder of the previous layout (``golden/catalogue/<device>/catalogue.csv``, no identity)
is read as the golden of an unrecorded machine: it serves the machine-independent limits only.

Apart from the gate's judging (pytest_msprobe.catalogue.gate) because every test of a session
reads the same files: each is read once per process, and the session's end writes them.
"""

from __future__ import annotations

import json
import threading
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from probes.core.catalogue_status import REGENERATED
from pytest_msprobe.golden import kinds as gk

DEVICE_FOLDER = "catalogue/{device}"
GOLDEN_NAME = DEVICE_FOLDER + "/{identity}"
UNRECORDED = "unrecorded"  # the identity of a golden of the previous layout
GOLDEN_FILE = "catalogue.csv"
KNOWN_FILE = "known.csv"  # beside the identities' folders: accepted on every machine of the device kind
KNOWN_HEADER = ["api", "dtype", "ratio", "reason"]
GOLDEN_HEADER = ["api", "dtype", "source", "samples", "max_ulp", "p99_ulp", "ratio", "free_benchmark"]
_PREVIOUS_HEADER = ["api", "dtype", "source", "samples", "max_ulp", "p99_ulp", "free_benchmark"]


@dataclass(frozen=True)
class GoldenRow:
    source: str
    samples: int
    max_ulp: float
    p99_ulp: float
    free_benchmark: str
    ratio: float | None = None  # the largest accumulation test ratio (accumulating APIs)


@dataclass(frozen=True)
class KnownError:
    """A row of ``known.csv``: an accumulation error accepted on every machine of the device kind
    (a kernel property of some machines, reviewed), up to the cross-machine bound of `ratio`."""

    ratio: float
    reason: str


@dataclass(frozen=True)
class Goldens:
    """The goldens a run on one machine is judged against: its own identity's, and the others of
    its device kind (identity -> rows)."""

    device: str
    identity: str
    own: dict[tuple[str, str], GoldenRow] | None
    others: dict[str, dict[tuple[str, str], GoldenRow]] = field(default_factory=dict)
    known: dict[tuple[str, str], KnownError] = field(default_factory=dict)

    @property
    def own_name(self) -> str:
        return golden_name(self.device, self.identity)


def golden_name(device: str, identity: str) -> str:
    return GOLDEN_NAME.format(device=device, identity=identity)


def render(rows: dict[tuple[str, str], GoldenRow]) -> dict[str, bytes]:
    body = [[api, dtype, r.source, r.samples, r.max_ulp, r.p99_ulp, r.ratio, r.free_benchmark]
            for (api, dtype), r in sorted(rows.items())]
    return {GOLDEN_FILE: gk.csv_bytes(GOLDEN_HEADER, body)}


def load(folder: Path) -> dict[tuple[str, str], GoldenRow]:
    path = folder / GOLDEN_FILE
    try:
        table = gk.read_table(path, GOLDEN_HEADER)
    except ValueError:
        table = gk.read_table(path, _PREVIOUS_HEADER)  # raises the first error's kind when neither fits
    out = {}
    for row in table:
        ratio = row.get("ratio", "")
        out[(row["api"], row["dtype"])] = GoldenRow(row["source"], int(row["samples"] or 0), float(row["max_ulp"]),
                                                    float(row["p99_ulp"]), row["free_benchmark"],
                                                    float(ratio) if ratio else None)
    return out


CATALOGUE = gk.Kind("catalogue", render, load)

_cache: dict[Path, Any] = {}
_cache_lock = threading.Lock()


def forget() -> None:
    """Drop every file read so far: a test that rewrites a golden folder in place reads it anew."""
    with _cache_lock:
        _cache.clear()


def _rows(folder: Path) -> dict[tuple[str, str], GoldenRow] | None:
    with _cache_lock:
        if folder not in _cache:
            _cache[folder] = load(folder) if (folder / GOLDEN_FILE).is_file() else None
        return _cache[folder]


def stored(root: Path, device: str) -> dict[str, Path]:
    """identity -> folder of every golden of `device` under `root`. The identity is the one its
    meta.json records (the folder is named after it when written; a copied or edited folder
    keeps what it was measured on); UNRECORDED for a golden of the previous layout."""
    folder = root / DEVICE_FOLDER.format(device=device)
    out: dict[str, Path] = {}
    if not folder.is_dir():
        return out
    for sub in sorted(p for p in folder.iterdir() if p.is_dir() and (p / GOLDEN_FILE).is_file()):
        identity = _recorded_identity(sub) or sub.name
        if identity not in out or sub.name == identity:
            out[identity] = sub
    if (folder / GOLDEN_FILE).is_file():
        out.setdefault(UNRECORDED, folder)
    return out


def _recorded_identity(folder: Path) -> str | None:
    try:
        meta = json.loads((folder / "meta.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    key = meta.get("hardware", {}).get("key") if isinstance(meta.get("hardware"), dict) else None
    return str(key) if key else None


def identities(root: Path, device: str) -> list[str]:
    """The identities with a golden of `device` under `root`."""
    return list(stored(root, device))


def goldens(root: Path, device: str, identity: str) -> Goldens:
    """This machine's golden and the other identities' (each file read once per process)."""
    folders = stored(root, device)
    others = {other: rows for other, folder in folders.items() if other != identity
              for rows in [_rows(folder)] if rows is not None}
    own = _rows(folders[identity]) if identity in folders else None
    known = _known(root / DEVICE_FOLDER.format(device=device) / KNOWN_FILE)
    return Goldens(device, identity, own, others, known)


def _known(path: Path) -> dict[tuple[str, str], KnownError]:
    with _cache_lock:
        if path not in _cache:
            table = gk.read_table(path, KNOWN_HEADER) if path.is_file() else []
            _cache[path] = {(r["api"], r["dtype"]): KnownError(float(r["ratio"]), r["reason"]) for r in table}
        return _cache[path]


def write_golden(store: Any, device: str, identity: str, results: list[dict[str, Any]]) -> bool:
    """Merge this session's measured rows into this machine's golden (rows of APIs not run are
    kept) and write it; False when nothing changed."""
    name = golden_name(device, identity)
    folder = store.folder(name)
    rows = load(folder) if (folder / GOLDEN_FILE).is_file() else {}
    for r in results:
        if r.get("status") != REGENERATED:
            continue
        ratio = r.get("ratio")
        rows[(r["api"], r["dtype"])] = GoldenRow(r["source"], int(r["samples"]), float(r["max_ulp"]),
                                                 float(r["p99_ulp"]), r["verdict"],
                                                 float(ratio) if isinstance(ratio, (int, float)) else None)
    changed = store.write(name, CATALOGUE, rows)
    with _cache_lock:
        _cache.pop(folder, None)
    return changed
