"""A probe's dump folder as comparable text: every file by its relative path, the dump path itself
replaced and summary.json's config (which holds it) left out, so two runs' files compare equal
exactly when they wrote the same rows and summaries."""

from __future__ import annotations

import json
from pathlib import Path


def dump_files(dump: Path) -> dict[str, str]:
    out = {}
    for path in sorted(dump.rglob("*")):
        if path.is_file():
            text = path.read_text().replace(str(dump), "<dump>")
            if path.suffix == ".json":
                data = json.loads(text)
                data.pop("config", None)  # holds the dump path
                text = json.dumps(data, sort_keys=True)
            out[str(path.relative_to(dump))] = text
    return out
