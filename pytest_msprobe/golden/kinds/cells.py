"""The cells and files of golden content: text a reviewer can diff and bytes that never change
for the same data.

CSV: LF line ends, UTF-8 without BOM, a header, one item per line, floats as Python ``repr`` so
they round-trip exactly, an empty cell for "no figure". npz: written with fixed zip timestamps and
attributes, since ``np.savez`` stamps the current time.
"""

from __future__ import annotations

import csv
import io
import math
import zipfile
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Union

import numpy as np

from probes.core.number_format import short_number

Figure = Union[float, str, None]


def fmt(value: Any) -> str:
    """A cell: floats as repr, not the short rendering of messages (probes.core.number_format),
    because a golden must read back the very figure it stored; None as empty."""
    if value is None:
        return ""
    if isinstance(value, float):
        return repr(value)
    return str(value)


def parse_figure(value: Any) -> Figure:
    """A number (str "nan"/"0.5" too: JSON round trips turn non-finite floats into strings), a
    verdict string ("nan_mismatch"), or None."""
    if value is None or isinstance(value, bool):
        return None
    if isinstance(value, (int, float, np.floating, np.integer)):
        return float(value)
    text = str(value).strip()
    if not text:
        return None
    try:
        return float(text)
    except ValueError:
        return text


def shown(value: Any) -> str:
    """A figure in a failure message: 6 digits, so a golden figure and the run's that differ in the
    5th digit still read differently."""
    return short_number(value, 6, missing="none")


def jsonable(value: Any) -> Any:
    """A figure for ``details`` (JSON has no NaN or infinity: they travel as their repr)."""
    if isinstance(value, float) and not math.isfinite(value):
        return repr(value)
    if isinstance(value, (list, tuple)):
        return [jsonable(v) for v in value]
    return value


def csv_bytes(header: list[str], rows: list[list[Any]]) -> bytes:
    buf = io.StringIO()
    writer = csv.writer(buf, lineterminator="\n")
    writer.writerow(header)
    writer.writerows([[fmt(c) for c in row] for row in rows])
    return buf.getvalue().encode("utf-8")


def read_table(path: Path, header: list[str]) -> list[dict[str, str]]:
    """The rows of a golden CSV; ValueError when its header is not ``header`` (a hand-edited or
    foreign file must not read as "nothing recorded")."""
    with open(path, encoding="utf-8", newline="") as fh:
        rows = list(csv.reader(fh))
    if not rows or rows[0] != header:
        raise ValueError(f"{path.name}: header {rows[0] if rows else None} is not {header}")
    bad = [i + 2 for i, r in enumerate(rows[1:]) if len(r) != len(header)]
    if bad:
        raise ValueError(f"{path.name}: line {bad[0]} has not {len(header)} cells")
    return [dict(zip(header, r)) for r in rows[1:]]


def npz_bytes(arrays: Mapping[str, np.ndarray]) -> bytes:
    """An npz that np.load reads, with fixed member timestamps and attributes (np.savez stamps
    the current time, so two writes of the same arrays would differ)."""
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w", compression=zipfile.ZIP_DEFLATED) as zf:
        for key in sorted(arrays):
            member = io.BytesIO()
            np.lib.format.write_array(member, np.ascontiguousarray(arrays[key]), allow_pickle=False)
            info = zipfile.ZipInfo(key + ".npy", date_time=(1980, 1, 1, 0, 0, 0))
            info.compress_type = zipfile.ZIP_DEFLATED
            info.create_system = 3
            info.external_attr = 0o644 << 16
            zf.writestr(info, member.getvalue())
    return buf.getvalue()


def read_npz(path: Path) -> dict[str, np.ndarray]:
    with np.load(path, allow_pickle=False) as data:
        return {k: data[k] for k in data.files}
