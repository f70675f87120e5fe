"""The names of the files each tool writes, stated once for the writer and every reader.

The tools write them (free_benchmark's ledger, online_dispatch's run directory, grad_probe's
monitors, the catalogue's gate) and `probes.results`, the multi-rank report and the command line
find them again by these patterns: a name changed for a writer changes for its readers. Each
tool's rank summary finder is named in `probes.core.tool_keys` so readers need no per-tool code.
Framework-free: names and patterns only.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

__all__ = [
    "CATALOGUE_COLUMNS", "CATALOGUE_CSV", "DISPATCH_CSV", "DISPATCH_RUN_DIR", "FREE_BENCHMARK_CSV",
    "FREE_BENCHMARK_RANK_SUMMARY", "GRAD_RANK_DIR", "GRAD_SUMMARY_CSV", "SIMILARITIES_CSV", "SUMMARY_JSON", "dispatch_csv_name",
    "dispatch_rank_summary", "dispatch_run_dir_name", "free_benchmark_rank_summary", "free_benchmark_summary_name",
    "grad_rank_summary",
]

SUMMARY_JSON = "summary.json"

# free_benchmark: step{N}/rank{R}/free_benchmark.csv, and summary.json (summary_rank{R}.json when distributed)
FREE_BENCHMARK_CSV = "free_benchmark.csv"
FREE_BENCHMARK_RANK_SUMMARY = re.compile(r"^summary_rank(\d+)\.json$")

# grad_probe: rank{R}/grad_summary_{N}.csv and rank{R}/summary.json
GRAD_RANK_DIR = re.compile(r"^rank(\d+)$")
GRAD_SUMMARY_CSV = re.compile(r"^grad_summary_(\d+)\.csv$")

# grad_probe's run-vs-run comparison: similarities.csv in its output folder
SIMILARITIES_CSV = "similarities.csv"

# online_dispatch: msprobe[_{tag}]_rank{R}_{timestamp}/compare_result_rank{R}_{timestamp}.csv and summary.json
DISPATCH_RUN_DIR = re.compile(r"^msprobe(?:_.+)?_rank(\d+)_\d+$")
DISPATCH_CSV = re.compile(r"^compare_result_rank(\d+)_.*\.csv$")

# the API precision catalogue's results, one row per (api, dtype, device)
CATALOGUE_CSV = "catalogue.csv"
CATALOGUE_COLUMNS = ("api", "dtype", "device", "samples", "max_ulp", "p99_ulp", "ratio", "free_benchmark", "status",
                     "golden_max_ulp", "golden_p99_ulp", "golden", "hardware", "source", "elements", "message")


def free_benchmark_summary_name(rank: int | None, distributed: bool) -> str:
    return f"summary_rank{rank or 0}.json" if distributed else SUMMARY_JSON


def dispatch_run_dir_name(tag: str | None, rank: int, timestamp: str) -> str:
    return f"msprobe_{tag}_rank{rank}_{timestamp}" if tag else f"msprobe_rank{rank}_{timestamp}"


def dispatch_csv_name(rank: int, timestamp: str) -> str:
    return f"compare_result_rank{rank}_{timestamp}.csv"


# rank summary finders: an entry of a dump root -> (rank, its summary file), or None -----------------
def free_benchmark_rank_summary(entry: Path) -> tuple[int, Path] | None:
    m = FREE_BENCHMARK_RANK_SUMMARY.match(entry.name)
    if m and entry.is_file():
        return int(m.group(1)), entry
    if entry.name == SUMMARY_JSON and entry.is_file() and _tool_of(entry) == "free_benchmark":
        return 0, entry  # a one-process run
    return None


def grad_rank_summary(entry: Path) -> tuple[int, Path] | None:
    m = GRAD_RANK_DIR.match(entry.name)
    return (int(m.group(1)), entry / SUMMARY_JSON) if m and (entry / SUMMARY_JSON).is_file() else None


def dispatch_rank_summary(entry: Path) -> tuple[int, Path] | None:
    m = DISPATCH_RUN_DIR.match(entry.name)
    return (int(m.group(1)), entry / SUMMARY_JSON) if m and (entry / SUMMARY_JSON).is_file() else None


def _tool_of(path: Path) -> str | None:
    try:
        return json.loads(path.read_text(encoding="utf-8")).get("tool")
    except (OSError, ValueError, AttributeError):
        return None
