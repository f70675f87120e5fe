"""Every probe's results as pandas DataFrames: ``from probes.results import load``.

People analyse dumps in notebooks; this reads any dump directory (a training script's dump_path,
a multi-rank dump, a pytest session's ``.msprobe/``, or anything holding them) into tidy tables,
one row per observation, with the step / rank / test a row came from as columns:

    res = load("./dump")
    res.free_benchmark        # every free_benchmark.csv: api, call, rank, pert_mode, stage, step, api_name, max_rel, ...
    res.grad_stats            # grad_probe statistics, long: test, rank, step, param, shape, md5, stat, value
    res.grad_similarities     # grad-compare's similarities.csv, long: test, rank, param, step, similarity
    res.online_dispatch       # every compare_result_rank*.csv: test, rank, run, api, call, the CSV's columns
                              # (as written) and Cosine_value / MaxAbsErr_value / MaxRelativeErr_value
    res.catalogue             # the API precision catalogue's catalogue.csv
    res.apis, res.ops, res.params   # the latest pytest session's per-API / per-op / per-parameter
                              # tables (summary.json), or a training dump's tools' summaries merged
    res.summaries             # the summary JSON files, by path relative to the root

``api`` names the API or op (``Functional.gelu``, ``addmm``) and ``call`` which call
of it a row is (``Functional.gelu.48.forward`` is call 48), so ``res.free_benchmark.groupby("api")``
gives one group per API. The ``test`` column is the pytest node id of the test whose folder a file is in (the plugin keeps
one folder per test under ``tests/``), empty outside a pytest session; the ``session`` column says
whether a file is the latest session's or an earlier one's (a test the latest session did not run
keeps its folder; one that ran starts with an empty folder). A table a dump does not
hold is an empty DataFrame with its columns, so code written for one dump runs on another.
Numbers come back as floats (CSV cells such as "nan", "inf" or verdict words like
"nan_mismatch" in free_benchmark's max_rel stay readable: non-numeric cells become NaN in the
numeric column and are kept as text in ``max_rel_text``).

The file finding here is also what the multi-rank report (pytest_msprobe.reports.ranks) and the
command line (``python -m probes summary DIR``) use. pandas is imported on the first load.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any

from probes.core.file_names import (
    CATALOGUE_COLUMNS,
    CATALOGUE_CSV,
    DISPATCH_CSV,
    FREE_BENCHMARK_CSV,
    GRAD_RANK_DIR,
    GRAD_SUMMARY_CSV,
    SIMILARITIES_CSV,
)
from probes.core.session_tables import (
    ApiRow,
    OpRow,
    ParamRow,
    api_table,
    op_rows,
    op_table,
    read_table,
    write_table,
)
from probes.core.tool_keys import TOOL_KEYS
from probes.core.writers import read_csv_rows

# free_benchmark's api_name is "{api}.{call}.{forward|backward}"; online_dispatch's row names are
# "{api}_{call}_{input|output}[.{index}...]"
_FB_CALL = re.compile(r"^(?P<api>.+)\.(?P<call>\d+)\.(?:forward|backward)$")
_OD_CALL = re.compile(r"^(?P<api>.+?)_(?P<call>\d+)_(?:input|output)(?:\..*)?$")

GRAD_STATS_COLUMNS = ["test", "rank", "step", "param", "shape", "md5", "stat", "value"]
SIMILARITY_COLUMNS = ["test", "rank", "param", "step", "similarity"]


def folder_of_test(nodeid: str) -> str:
    """The folder the pytest plugin gives a test under ``{root}/tests/``: the node id made safe
    for a file name (long ones shortened with a hash, so xdist workers never share a folder)."""
    safe = re.sub(r"[^A-Za-z0-9_.-]+", "_", nodeid).strip("_")
    if len(safe) > 120:
        safe = safe[:100] + "_" + hashlib.sha1(nodeid.encode()).hexdigest()[:10]
    return safe


# finding files ------------------------------------------------------------------------------------
def rank_summary_files(root: str | os.PathLike[str]) -> dict[str, dict[int, list[Path]]]:
    """Per tool, the per-rank summary files directly under a dump root (rank -> files, sorted):
    free_benchmark ``summary_rank{R}.json`` (``summary.json`` of a one-process run: rank 0),
    grad_probe ``rank{R}/summary.json``, online_dispatch ``msprobe[_tag]_rank{R}_{ts}/summary.json``."""
    root = Path(root)
    found: dict[str, dict[int, list[Path]]] = {t: {} for t in TOOL_KEYS}
    if not root.is_dir():
        return found
    for p in sorted(root.iterdir()):
        for tool, keys in TOOL_KEYS.items():
            hit = keys.rank_summary(p)
            if hit is not None:
                found[tool].setdefault(hit[0], []).append(hit[1])
    return found


def _rank_from_parts(parts: tuple[str, ...]) -> int | None:
    for part in reversed(parts):
        m = GRAD_RANK_DIR.match(part)
        if m:
            return int(m.group(1))
    return None


def _float(cell: Any) -> float:
    try:
        return float(cell)
    except (TypeError, ValueError):
        return float("nan")


# the tables ---------------------------------------------------------------------------------------
#: the "session" column: a row of the latest pytest session's tests, of an earlier session's (a test
#: the latest session did not run left its folder), or of no session (a training script's dump)
LATEST, EARLIER = "latest", "earlier"
#: the latest session's per-API / per-op / per-parameter tables (summary.json), by their key column
SESSION_TABLES = {"apis": "api", "ops": "op", "params": "param"}


@dataclass
class Results:
    """The DataFrames of one dump root (module docstring)."""

    root: Path
    free_benchmark: Any
    grad_stats: Any
    grad_similarities: Any
    online_dispatch: Any
    catalogue: Any
    apis: Any  # the latest session's per-API table: api, calls, checked, flagged, worst_score, ...
    ops: Any  # its per-op table: op, compared, failed, worst_cosine, ...
    params: Any  # its non-finite parameters: param, nonfinite_steps, first, tests
    summaries: dict[str, dict[str, Any]] = field(default_factory=dict)

    def tables(self) -> dict[str, Any]:
        return {"free_benchmark": self.free_benchmark, "grad_stats": self.grad_stats,
                "grad_similarities": self.grad_similarities, "online_dispatch": self.online_dispatch,
                "catalogue": self.catalogue, "apis": self.apis, "ops": self.ops, "params": self.params}

    def __repr__(self) -> str:
        """A table of contents: each table's size and columns (print a table itself to see it)."""
        lines = [f"Results of {os.fspath(self.root)}:"]
        for name, frame in self.tables().items():
            columns = list(frame.columns)
            shown = ", ".join(map(str, columns[:8])) + (f", \u2026 (+{len(columns) - 8})" if len(columns) > 8 else "")
            lines.append(f"  .{name:<18} {len(frame):>7} rows  [{shown}]")
        lines.append(f"  .summaries          {len(self.summaries):>7} files")
        return "\n".join(lines)


def latest_session(summaries: dict[str, Any]) -> tuple[str, dict[str, Any]] | None:
    """The latest pytest session's summary.json among `summaries` (by path): the newest, when
    per-rank sessions (torchrun) wrote several."""
    sessions = [(path, data) for path, data in summaries.items()
                if Path(path).name == "summary.json" and isinstance(data, dict) and "session" in data]
    return max(sessions, key=lambda pd: str(pd[1].get("date", ""))) if sessions else None


def session_tests(data: dict[str, Any]) -> dict[str, set[str]]:
    """The latest session's tests by what they did: "folders" (every test whose folder holds this
    session's files: the plugin empties a test's folder when the test starts), "probed" (run
    under the session's probe), "api_checks" (per-API checks: their folders hold a search's
    examples) and "catalogue" (the catalogue's measurements)."""
    tests = data.get("tests")
    probed = {str(t) for t in tests} if isinstance(tests, dict) else set()
    api = {str(r.get("test")) for r in data.get("api_checks") or [] if isinstance(r, dict) and r.get("test")}
    catalogue = {str(r.get("test")) for r in data.get("catalogue") or [] if isinstance(r, dict) and r.get("test")}
    folders = data.get("test_folders")
    return {"folders": set(map(str, folders)) if isinstance(folders, list) else probed | api | catalogue,
            "probed": probed, "api_checks": api, "catalogue": catalogue}


class _Tests:
    """Maps a file to the pytest test whose folder holds it, and to the session it is from (via
    the latest session's summary.json)."""

    def __init__(self, root: Path, summaries: dict[str, Any]) -> None:
        self.root = root
        self.names: dict[str, str] = {}
        self.latest = latest_session(summaries)
        for data in [summaries.get("api_checks.json")] + ([self.latest[1]] if self.latest else []):
            if not isinstance(data, dict):
                continue
            tests = data.get("tests")  # summary.json: a dict by node id; api_checks.json: a list of checks
            ids = list(tests) if isinstance(tests, dict) else [t.get("test") for t in tests or [] if isinstance(t, dict)]
            ids += [t.get("test") for key in ("api_checks", "catalogue") for t in data.get(key) or []
                    if isinstance(t, dict)]
            ids += data.get("test_folders") or []
            self.names.update({folder_of_test(str(n)): str(n) for n in ids if n})
        self.folders = ({folder_of_test(n) for n in session_tests(self.latest[1])["folders"]}
                        if self.latest else set())

    def _folder(self, path: Path) -> str | None:
        parts = path.relative_to(self.root).parts
        for i, part in enumerate(parts[:-1]):
            if part == "tests" and i + 1 < len(parts) - 1:
                return parts[i + 1]
        return None

    def of(self, path: Path) -> str:
        folder = self._folder(path)
        return "" if folder is None else self.names.get(folder, folder)

    def session(self, path: Path) -> str:
        """LATEST, EARLIER, or "" for a file no pytest session wrote."""
        if self.latest is None:
            return ""
        folder = self._folder(path)
        if folder is not None:
            return LATEST if folder in self.folders else EARLIER
        if path.name == CATALOGUE_CSV:  # the catalogue's own file, of the session that ran it
            return LATEST if self.latest[1].get("catalogue") else EARLIER
        return ""


def load(path: str | os.PathLike[str]) -> Results:
    """Read every probe result under `path` into DataFrames (module docstring)."""
    import pandas as pd

    root = Path(path)
    if not root.is_dir():
        from probes.core.errors import ConfigError

        raise ConfigError("path", str(path), "a directory holding probe results (a dump_path, or .msprobe/ of a "
                          "pytest session)")
    files = [p for p in sorted(root.rglob("*")) if p.is_file()]
    summaries = {}
    for p in files:
        name = p.name
        if name.endswith(".json") and (name.startswith("summary") or name == "api_checks.json"):
            try:
                summaries[p.relative_to(root).as_posix()] = json.loads(p.read_text(encoding="utf-8"))
            except (OSError, ValueError):
                continue
    tests = _Tests(root, summaries)
    fb, grad, sims, od, cat = [], [], [], [], []
    for p in files:
        name = p.name
        parts = p.relative_to(root).parts
        if name == FREE_BENCHMARK_CSV:
            frame = _free_benchmark_frame(pd, p, tests.of(p))
            fb.append(frame)
        elif grad_step := GRAD_SUMMARY_CSV.match(name):
            frame = _grad_frame(pd, p, tests.of(p), _rank_from_parts(parts[:-1]), int(grad_step.group(1)))
            grad.append(frame)
        elif name == SIMILARITIES_CSV:
            frame = _similarity_frame(pd, p, tests.of(p), _rank_from_parts(parts[:-1]))
            sims.append(frame)
        elif od_rank := DISPATCH_CSV.match(name):
            frame = _online_dispatch_frame(pd, p, tests.of(p), int(od_rank.group(1)))
            od.append(frame)
        elif name == CATALOGUE_CSV:
            frame = pd.read_csv(p, keep_default_na=False)
            if "max_ulp" not in frame.columns:
                continue
            for column in ("max_ulp", "p99_ulp", "ratio", "golden_max_ulp", "golden_p99_ulp"):
                if column in frame.columns:  # "ratio": catalogues written since goldens know their hardware
                    frame[column] = frame[column].map(_float)
            cat.append(frame)
        else:
            continue
        frame["session"] = tests.session(p)
    from probes.core.records import FREE_BENCHMARK_COLUMNS

    return Results(
        root=root,
        free_benchmark=_concat(pd, fb, ["test", "api", "call", *FREE_BENCHMARK_COLUMNS, "max_rel_text", "session"]),
        grad_stats=_concat(pd, grad, [*GRAD_STATS_COLUMNS, "session"]),
        grad_similarities=_concat(pd, sims, [*SIMILARITY_COLUMNS, "session"]),
        online_dispatch=_concat(pd, od, ["test", "rank", "run", "api", "call", "session"]),
        catalogue=_concat(pd, cat, [*CATALOGUE_COLUMNS, "session"]),
        **_session_frames(pd, root, tests.latest),
        summaries=summaries,
    )


def _session_frames(pd: Any, root: Path, latest: tuple[str, dict[str, Any]] | None) -> dict[str, Any]:
    """The per-API / per-op / per-parameter tables: the latest session's (summary.json), else the
    tools' own summaries of a training script's dump (one row per API or op over its ranks)."""
    kinds = {cls.TABLE: cls for cls in (ApiRow, OpRow, ParamRow)}
    if latest is not None:
        tables = {key: read_table(cls, latest[1].get(key)) for key, cls in kinds.items()}
    else:
        found = rank_summary_files(root)
        loaded = {tool: [(f"rank{rank}", json.loads(p.read_text(encoding="utf-8")))
                         for rank, paths in sorted(ranks.items()) for p in paths] for tool, ranks in found.items()}
        tables = {"apis": api_table((rank, s.get("apis", {})) for rank, s in loaded["free_benchmark"]),
                  "ops": op_table((rank, write_table(op_rows(s))) for rank, s in loaded["online_dispatch"]),
                  "params": {}}
    frames = {}
    for key, cls in kinds.items():
        column = SESSION_TABLES[key]
        names = [column] + [f.name for f in fields(cls)]
        records = [{column: name, **row.to_dict()} for name, row in tables[key].items()]
        frames[key] = pd.DataFrame.from_records(records, columns=names)
    return frames


def _concat(pd: Any, frames: list[Any], columns: list[str]) -> Any:
    frames = [f for f in frames if len(f)]
    if not frames:
        return pd.DataFrame(columns=columns)
    return pd.concat(frames, ignore_index=True)


def _free_benchmark_frame(pd: Any, path: Path, test: str) -> Any:
    frame = pd.read_csv(path, dtype=str, keep_default_na=False, encoding="utf-8-sig")
    _insert_api_and_call(pd, frame, frame.get("api_name"), _FB_CALL)
    frame.insert(0, "test", test)
    frame["max_rel_text"] = frame.get("max_rel", "")
    for column in ("rank", "step", "output_index"):
        if column in frame.columns:
            frame[column] = pd.to_numeric(frame[column], errors="coerce").astype("Int64")
    if "max_rel" in frame.columns:
        frame["max_rel"] = frame["max_rel"].map(_float)
    return frame


def _insert_api_and_call(pd: Any, frame: Any, names: Any, pattern: re.Pattern[str]) -> None:
    """``api`` and ``call`` columns at the front, parsed from each row's name (a name that does
    not follow the pattern is its own api, with no call number)."""
    names = names if names is not None else pd.Series([""] * len(frame), dtype=str)
    parts = names.str.extract(pattern)
    frame.insert(0, "call", pd.to_numeric(parts["call"], errors="coerce").astype("Int64"))
    frame.insert(0, "api", parts["api"].fillna(names))


def _grad_frame(pd: Any, path: Path, test: str, rank: int | None, step: int) -> Any:
    rows = read_csv_rows(path)
    stats = [c for c in (rows[0] if rows else {}) if c not in ("param_name", "MD5", "shape")]
    records = [(test, rank, step, row.get("param_name", ""), row.get("shape", ""), row.get("MD5", ""), stat,
                _float(row.get(stat))) for row in rows for stat in stats]
    frame = pd.DataFrame.from_records(records, columns=GRAD_STATS_COLUMNS)
    frame["rank"] = frame["rank"].astype("Int64")
    return frame


def _similarity_frame(pd: Any, path: Path, test: str, rank: int | None) -> Any:
    """similarities.csv: a "step" column naming the parameter (its header row lists the steps)."""
    rows = read_csv_rows(path)
    records = [(test, rank, row["step"], int(step), _float(cell)) for row in rows
               for step, cell in row.items() if step != "step"]
    frame = pd.DataFrame.from_records(records, columns=SIMILARITY_COLUMNS)
    frame["rank"] = frame["rank"].astype("Int64")
    return frame


def _online_dispatch_frame(pd: Any, path: Path, test: str, rank: int) -> Any:
    frame = pd.read_csv(path, dtype=str, keep_default_na=False, encoding="utf-8-sig")
    _insert_api_and_call(pd, frame, frame.get("NPU Name"), _OD_CALL)
    frame.insert(0, "run", path.parent.name)
    frame.insert(0, "rank", rank)
    frame.insert(0, "test", test)
    for column in ("Cosine", "MaxAbsErr", "MaxRelativeErr"):  # words ("unsupported", "Nan") become NaN
        if column in frame.columns:
            frame[f"{column}_value"] = frame[column].map(_float)
    return frame
