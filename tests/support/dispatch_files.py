"""Reading what an online_dispatch run wrote: its CSV rows and its summary.json."""

from __future__ import annotations

import csv
import json
from pathlib import Path


def read_rows(run_dir: Path) -> list[dict[str, str]]:
    (path,) = run_dir.glob("compare_result_rank*.csv")
    with open(path, encoding="utf-8-sig", newline="") as fh:
        return list(csv.DictReader(fh))


def summary(run_dir: Path) -> dict:
    return json.loads((run_dir / "summary.json").read_text())
