"""The three kinds of golden: what each stores, how it is read back and how a run is judged.

Files are text (CSV: LF line ends, UTF-8 without BOM, a header, one item per line, sorted by key,
floats as Python ``repr`` so they round-trip exactly; an empty cell is "no figure") or an npz
written with fixed zip timestamps, so equal data always gives equal bytes.

* free_benchmark -> ``apis.csv``: ``api,worst_max_rel,dtypes,threshold,checked,flagged``.
* grad_run -> ``grad_stats.csv`` (``unit,step,param,max,min,norm,shape,md5``; unit is ``rank{R}``
  or ``optimizer{k}/rank{R}``) and ``grad_directions.npz`` (``bits/{unit}/step{N}/{param}``: the
  ``g > 0`` array flattened and ``np.packbits``-ed; ``shape/{unit}/step{N}/{param}``: its shape;
  parameter names percent-encoded as in the dump's file names).
* online_dispatch -> ``failing_ops.csv``: ``op,calls,cosine,max_abs_err`` (worst figures per op).

The margins a run's figures are allowed against a golden's (FB_MARGIN, GRAD_RTOL, ...) are defined
here: they are the goldens' own. The gradient-direction rule's limits are grad_probe's
(probes/core/thresholds.py), applied to the golden run as to any other.
"""

from __future__ import annotations

import csv
import io
import math
import os
import re
import zipfile
from collections.abc import Mapping
from dataclasses import dataclass, field
from enum import IntEnum
from pathlib import Path
from typing import Any, Callable, Union

import numpy as np

from probes.core.errors import ConfigError
from probes.core.number_format import short_number
from probes.core.thresholds import DIRECTION_FIRST_STEP_MIN as FIRST_STEP_MIN
from probes.core.thresholds import DIRECTION_MAX_DROP as MAX_DROP
from probes.core.writers import read_csv_rows
from probes.grad_probe.comparator import is_dump_root, rank_dirs, step_csvs, step_dirs
from probes.grad_probe.csv_format import file_name_for_param, param_from_file_name
from probes.grad_probe.direction_rule import apply_rule

# free_benchmark margin: a figure regresses when it exceeds golden + max(FB_MARGIN * |golden|, FB_MARGIN_ABS)
FB_MARGIN = 0.10
FB_MARGIN_ABS = 1e-4
# grad_run statistics: |now - golden| <= GRAD_ATOL + GRAD_RTOL * |golden|
GRAD_RTOL = 1e-2
GRAD_ATOL = 1e-6


class Category(IntEnum):
    """What a failure is about, in the order failures are listed (highest first): a run of another
    shape makes its figures moot, and a verdict that changed says more than a figure that grew."""

    FIGURE = 0  # a figure beyond its bound
    DIRECTION = 1  # a gradient-direction flag
    VERDICT = 2  # a verdict word that appeared or changed (symbol_flipping, nan_mismatch, ...)
    STRUCTURE = 3  # ranks, steps, parameters or shapes that differ from the golden's


@dataclass
class Failure:
    """One offending item: ``text`` is its message line. Failures are listed by category, then by
    ``severity`` (how far out: bounds exceeded, or how far a similarity fell), largest first."""

    item: str
    reason: str
    text: str
    category: Category
    severity: float = 0.0
    golden: Any = None
    now: Any = None
    allowed: Any = None

    @property
    def rank(self) -> tuple[int, float]:
        """The sort key of the listing, worst largest."""
        return (int(self.category), self.severity)

    def to_dict(self) -> dict[str, Any]:
        return {"item": self.item, "reason": self.reason, "text": self.text, "golden": _jsonable(self.golden),
                "now": _jsonable(self.now), "allowed": _jsonable(self.allowed)}


@dataclass
class Comparison:
    failures: list[Failure]
    headline: str  # the count summary: "3 of 41 APIs regressed"
    rule: str = ""  # the bounds applied, in words
    info: list[str] = field(default_factory=list)  # changes that are not failures
    counts: dict[str, int] = field(default_factory=dict)
    data: dict[str, Any] = field(default_factory=dict)  # per-item figures for reports (JSON-able)


@dataclass(frozen=True)
class Kind:
    name: str
    render: Callable[[Any], dict[str, bytes]]
    load: Callable[[Path], Any]


# ---------------------------------------------------------------------------------------------
# cells and files

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


def _jsonable(value: Any) -> Any:
    if isinstance(value, float) and not math.isfinite(value):
        return repr(value)
    if isinstance(value, (list, tuple)):
        return [_jsonable(v) for v in value]
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


# ---------------------------------------------------------------------------------------------
# free_benchmark


@dataclass(frozen=True)
class FbEntry:
    worst_max_rel: Figure  # None: no inconsistent call recorded a figure
    dtypes: str
    threshold: float | None
    checked: int
    flagged: int


FB_FILE = "apis.csv"
FB_HEADER = ["api", "worst_max_rel", "dtypes", "threshold", "checked", "flagged"]


def fb_snapshot(apis: Any) -> dict[str, FbEntry]:
    """From the free_benchmark per-test result's ``apis`` (api -> {"checked", "flagged",
    "worst_max_rel", "threshold", "dtypes" or "dtype", ...})."""
    if not isinstance(apis, Mapping):
        raise ConfigError("apis", apis, "a dict api name -> {'checked', 'flagged', 'worst_max_rel', 'threshold', ...}")
    out: dict[str, FbEntry] = {}
    for api, s in apis.items():
        if not isinstance(api, str) or not isinstance(s, Mapping):
            raise ConfigError(f"apis[{api!r}]", s, "a dict with 'checked', 'flagged', 'worst_max_rel', 'threshold'")
        dtypes = s.get("dtypes", s.get("dtype", ""))
        if isinstance(dtypes, (list, tuple, set)):
            dtypes = "|".join(sorted(str(d) for d in dtypes))
        threshold = parse_figure(s.get("threshold"))
        out[api] = FbEntry(parse_figure(s.get("worst_max_rel")), str(dtypes or ""),
                           threshold if isinstance(threshold, float) else None,
                           int(s.get("checked") or 0), int(s.get("flagged") or 0))
    return out


def fb_render(snapshot: dict[str, FbEntry]) -> dict[str, bytes]:
    rows = [[api, e.worst_max_rel, e.dtypes, e.threshold, e.checked, e.flagged] for api, e in sorted(snapshot.items())]
    return {FB_FILE: csv_bytes(FB_HEADER, rows)}


def fb_load(folder: Path) -> dict[str, FbEntry]:
    out: dict[str, FbEntry] = {}
    for row in read_table(folder / FB_FILE, FB_HEADER):
        threshold = parse_figure(row["threshold"])
        out[row["api"]] = FbEntry(parse_figure(row["worst_max_rel"]), row["dtypes"],
                                  threshold if isinstance(threshold, float) else None,
                                  int(row["checked"] or 0), int(row["flagged"] or 0))
    return out


def fb_bound(golden: float, margin: float = FB_MARGIN, margin_abs: float = FB_MARGIN_ABS) -> float:
    """THE margin rule: the largest max_rel still accepted against a golden figure."""
    return golden + max(margin * abs(golden), margin_abs)


def _verdict(figure: Figure) -> str | None:
    """The string verdict of a figure (a NaN max_rel counts as the verdict "nan"), else None."""
    if isinstance(figure, str):
        return figure
    if isinstance(figure, float) and math.isnan(figure):
        return "nan"
    return None


def fb_compare(golden: dict[str, FbEntry], now: dict[str, FbEntry], margin: float = FB_MARGIN,
               margin_abs: float = FB_MARGIN_ABS) -> Comparison:
    failures: list[Failure] = []
    improved: list[str] = []
    unseen: list[str] = []
    new_clean: list[str] = []
    retyped: list[str] = []
    data: dict[str, Any] = {}
    rule = f"golden + max({margin:g} x golden, {margin_abs:g})"
    for api in sorted(set(golden) | set(now)):
        g, c = golden.get(api), now.get(api)
        data[api] = {"golden": _jsonable(g.worst_max_rel) if g else None,
                     "now": _jsonable(c.worst_max_rel) if c else None, "allowed": None}
        if c is None or (c.checked == 0 and c.flagged == 0 and g is not None and g.checked > 0):
            unseen.append(api)
            continue
        if g is not None and g.dtypes and c.dtypes and g.dtypes != c.dtypes:
            retyped.append(f"{api} {g.dtypes} -> {c.dtypes}")
        g_flagged = g is not None and g.flagged > 0  # a figure of a clean golden API does not license growth
        if c.flagged == 0:
            if g is None:
                new_clean.append(api)
            elif g_flagged:
                improved.append(f"{api} {shown(g.worst_max_rel)} -> clean")
            continue
        fig = c.worst_max_rel
        if not g_flagged:
            thr = c.threshold
            if _verdict(fig) or fig is None:
                category, sev = Category.VERDICT, 0.0
            else:
                category, sev = Category.FIGURE, fig / thr if thr else fig
            where = "not in the golden" if g is None else f"checked clean in the golden ({g.checked} calls)"
            bound = f"threshold {shown(thr)}" if thr is not None else "no inconsistent call"
            figure = "no max_rel figure" if fig is None else f"max_rel {shown(fig)}"
            failures.append(Failure(api, "newly_flagged", f"{api}: newly flagged, {figure} (allowed: "
                                    f"{bound}; {where}; {c.flagged} of {c.checked} calls inconsistent)", category,
                                    sev, None, fig, thr))
            continue
        gf = g.worst_max_rel
        gv, cv = _verdict(gf), _verdict(fig)
        if fig is None or gf is None:
            continue  # flagged in both without a figure (to_cpu): nothing to measure
        if gv is not None:
            if cv is None:
                improved.append(f"{api} {gv} -> max_rel {shown(fig)}")
            elif cv != gv:
                failures.append(Failure(api, "verdict_changed", f"{api}: verdict {cv} where the golden had {gv}",
                                        Category.VERDICT, 0.0, gv, cv, gv))
            continue
        bound_v = fb_bound(gf, margin, margin_abs)
        data[api]["allowed"] = _jsonable(bound_v)
        if cv is not None:
            failures.append(Failure(api, "verdict", f"{api}: {cv} where the golden had max_rel {shown(gf)} "
                                    f"(allowed <= {shown(bound_v)})", Category.VERDICT, 0.0, gf, cv, bound_v))
        elif fig > bound_v:
            failures.append(Failure(api, "max_rel_grew", f"{api}: max_rel {shown(fig)} > allowed {shown(bound_v)} "
                                    f"(golden {shown(gf)}, +{(fig - gf) / gf * 100 if gf else math.inf:.0f}%; "
                                    f"{c.flagged} of {c.checked} calls inconsistent)", Category.FIGURE,
                                    fig / bound_v if bound_v else math.inf, gf, fig, bound_v))
        elif fig < gf - max(margin * abs(gf), margin_abs):
            improved.append(f"{api} max_rel {shown(gf)} -> {shown(fig)}")
    info = []
    if improved:
        info.append(f"{len(improved)} API(s) improved: " + ", ".join(improved[:5]) + (" ..." if len(improved) > 5 else ""))
    if unseen:
        info.append(f"{len(unseen)} API(s) of the golden not checked in this run: " + ", ".join(unseen[:5])
                    + (" ..." if len(unseen) > 5 else ""))
    if new_clean:
        info.append(f"{len(new_clean)} API(s) new and clean: " + ", ".join(new_clean[:5])
                    + (" ..." if len(new_clean) > 5 else ""))
    if retyped:
        info.append(f"{len(retyped)} API(s) ran in other dtypes than in the golden: " + ", ".join(retyped[:5])
                    + (" ..." if len(retyped) > 5 else ""))
    total = len(set(golden) | set(now))
    counts = {"apis": total, "regressed": len(failures), "improved": len(improved), "not_checked": len(unseen),
              "new_clean": len(new_clean)}
    headline = (f"{len(failures)} of {total} APIs regressed" if failures else
                f"{total} APIs within the golden's margin")
    rule = (f"a flagged API's max_rel may grow to {rule}; an API clean in the golden must stay clean; a string "
            "verdict must stay the same")
    return Comparison(failures, headline, rule, info, counts, {"apis": data})


FREE_BENCHMARK = Kind("free_benchmark", fb_render, fb_load)


# ---------------------------------------------------------------------------------------------
# online_dispatch


@dataclass(frozen=True)
class OdEntry:
    calls: int
    cosine: Figure  # the lowest over the op's failing calls (NaN counts as lowest)
    max_abs_err: Figure  # the highest


OD_FILE = "failing_ops.csv"
OD_HEADER = ["op", "calls", "cosine", "max_abs_err"]


def _worse(a: Figure, b: Figure, higher_is_worse: bool) -> Figure:
    if a is None or b is None:
        return b if a is None else a
    if isinstance(a, str) or isinstance(b, str):
        return a if isinstance(a, str) else b
    if math.isnan(a) or math.isnan(b):
        return math.nan
    return max(a, b) if higher_is_worse else min(a, b)


def od_snapshot(failing_ops: Any) -> dict[str, OdEntry]:
    if not isinstance(failing_ops, (list, tuple)):
        raise ConfigError("failing_ops", failing_ops, "a list of dicts with 'op', 'cosine' and 'max_abs_err'")
    out: dict[str, OdEntry] = {}
    for i, item in enumerate(failing_ops):
        if not isinstance(item, Mapping) or not isinstance(item.get("op"), str) or not item["op"]:
            raise ConfigError(f"failing_ops[{i}]", item, "a dict with a non-empty str 'op', 'cosine' and 'max_abs_err'")
        op = item["op"]
        cos, err = parse_figure(item.get("cosine")), parse_figure(item.get("max_abs_err"))
        old = out.get(op)
        if old is not None:
            cos, err = _worse(old.cosine, cos, False), _worse(old.max_abs_err, err, True)
        out[op] = OdEntry((old.calls if old else 0) + 1, cos, err)
    return out


def od_render(snapshot: dict[str, OdEntry]) -> dict[str, bytes]:
    rows = [[op, e.calls, e.cosine, e.max_abs_err] for op, e in sorted(snapshot.items())]
    return {OD_FILE: csv_bytes(OD_HEADER, rows)}


def od_load(folder: Path) -> dict[str, OdEntry]:
    return {row["op"]: OdEntry(int(row["calls"] or 0), parse_figure(row["cosine"]), parse_figure(row["max_abs_err"]))
            for row in read_table(folder / OD_FILE, OD_HEADER)}


def od_compare(golden: dict[str, OdEntry], now: dict[str, OdEntry]) -> Comparison:
    failures = []
    for op in sorted(set(now) - set(golden)):
        e = now[op]
        cos = e.cosine
        sev = 2.0 if not isinstance(cos, float) or math.isnan(cos) else 1.0 - cos
        failures.append(Failure(op, "new_failing_op", f"{op}: fails now (cosine {shown(cos)}, max_abs_err "
                                f"{shown(e.max_abs_err)}, {e.calls} call(s)); the golden does not list it as failing "
                                "(allowed: not failing)", Category.FIGURE, sev, None, {"cosine": _jsonable(cos),
                                "max_abs_err": _jsonable(e.max_abs_err)}, None))
    fixed = sorted(set(golden) - set(now))
    info = []
    if fixed:
        info.append(f"{len(fixed)} op(s) of the golden no longer fail: " + ", ".join(fixed[:5])
                    + (" ..." if len(fixed) > 5 else ""))
    counts = {"failing_now": len(now), "failing_golden": len(golden), "new": len(failures), "fixed": len(fixed)}
    headline = (f"{len(failures)} of {len(now)} failing ops are new (not failing in the golden)" if failures else
                f"no new failing op ({len(now)} failing, all listed in the golden's {len(golden)})")
    data = {"ops": {op: {"golden": op in golden, "now": op in now} for op in sorted(set(golden) | set(now))}}
    return Comparison(failures, headline, "every failing op must be listed in the golden", info, counts, data)


ONLINE_DISPATCH = Kind("online_dispatch", od_render, od_load)


# ---------------------------------------------------------------------------------------------
# grad_run

GRAD_STATS_FILE = "grad_stats.csv"
GRAD_DIRECTIONS_FILE = "grad_directions.npz"
GRAD_HEADER = ["unit", "step", "param", "max", "min", "norm", "shape", "md5"]
STAT_FIGURES = ("max", "min", "norm")
_OPTIMIZER_RE = re.compile(r"^optimizer\d+$")
_RANK_RE = re.compile(r"^rank\d+$")
_PARAM_COLUMNS = ("param_name", "Param_name")

Key = tuple[str, int, str]  # (unit, step, param)


@dataclass(frozen=True)
class GradStats:
    max: float | None
    min: float | None
    norm: float | None
    shape: str
    md5: str


@dataclass
class GradRun:
    """Every (unit, step, param) of a grad_probe dump: its statistics and packed directions."""

    stats: dict[Key, GradStats] = field(default_factory=dict)
    bits: dict[Key, tuple[np.ndarray, tuple[int, ...]]] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)

    def keys(self) -> set[Key]:
        return set(self.stats) | set(self.bits)


def _units(path: Path) -> dict[str, Path]:
    """``rank{R}`` (and ``optimizer{k}/rank{R}`` of the plugin's watch) -> rank folder."""
    if is_dump_root(path):
        units = {f"rank{r}": d for r, d in rank_dirs(path).items()}
        for sub in sorted(p for p in path.iterdir() if p.is_dir() and _OPTIMIZER_RE.match(p.name)):
            units.update({f"{sub.name}/rank{r}": d for r, d in rank_dirs(sub).items()})
        return units
    if step_csvs(path) or step_dirs(path):
        return {path.name if _RANK_RE.match(path.name) else "rank0": path}
    return {}


def _num(cell: str | None) -> float | None:
    fig = parse_figure(cell)
    return fig if isinstance(fig, float) else None


def grad_snapshot(dump_dir: Any) -> GradRun:
    path = Path(dump_dir) if isinstance(dump_dir, (str, os.PathLike)) else None
    allowed = "a grad_probe dump root (rank{R} folders) or one rank folder (grad_summary_{N}.csv, step{N}/)"
    if path is None or not path.is_dir():
        raise ConfigError("dump_dir", dump_dir, allowed)
    units = _units(path)
    if not units:
        raise ConfigError("dump_dir", str(dump_dir), allowed, hint="this folder holds neither")
    run = GradRun()
    for unit, folder in units.items():
        for step, csv_path in step_csvs(folder).items():
            rows = read_csv_rows(csv_path)
            pcol = next((c for c in _PARAM_COLUMNS if rows and c in rows[0]), None)
            if rows and pcol is None:
                run.notes.append(f"{csv_path}: no param_name column; ignored")
                continue
            for row in rows:
                run.stats[(unit, step, row[pcol])] = GradStats(_num(row.get("max")), _num(row.get("min")),
                                                               _num(row.get("norm")), (row.get("shape") or "").strip(),
                                                               (row.get("MD5") or "").strip().lower())
        for step, step_dir in step_dirs(folder).items():
            for npy in sorted(step_dir.glob("*.npy")):
                try:
                    param = param_from_file_name(npy.name[:-4])
                except UnicodeDecodeError:
                    param = npy.name[:-4]
                try:
                    arr = np.load(npy, allow_pickle=False)
                except (OSError, ValueError, EOFError) as exc:
                    run.notes.append(f"{npy}: unreadable ({exc})")
                    continue
                if not isinstance(arr, np.ndarray) or arr.dtype != np.bool_:
                    run.notes.append(f"{npy}: not a boolean direction array; ignored")
                    continue
                run.bits[(unit, step, param)] = (np.packbits(arr.reshape(-1)), tuple(int(d) for d in arr.shape))
    return run


def _npz_key(prefix: str, key: Key) -> str:
    unit, step, param = key
    return f"{prefix}/{unit}/step{step}/{file_name_for_param(param)}"


def grad_render(run: GradRun) -> dict[str, bytes]:
    rows = []
    for key in sorted(run.keys()):
        s = run.stats.get(key)
        unit, step, param = key
        rows.append([unit, step, param, *((s.max, s.min, s.norm, s.shape, s.md5) if s else (None,) * 3 + ("", ""))])
    arrays: dict[str, np.ndarray] = {}
    for key, (packed, shape) in run.bits.items():
        arrays[_npz_key("bits", key)] = packed
        arrays[_npz_key("shape", key)] = np.asarray(shape, dtype=np.int64)
    return {GRAD_STATS_FILE: csv_bytes(GRAD_HEADER, rows), GRAD_DIRECTIONS_FILE: npz_bytes(arrays)}


def grad_load(folder: Path) -> GradRun:
    run = GradRun()
    for row in read_table(folder / GRAD_STATS_FILE, GRAD_HEADER):
        figs = [_num(row[f]) for f in STAT_FIGURES]
        if any(f is not None for f in figs) or row["shape"] or row["md5"]:  # else: known by its direction only
            run.stats[(row["unit"], int(row["step"]), row["param"])] = GradStats(*figs, row["shape"], row["md5"])
    arrays = read_npz(folder / GRAD_DIRECTIONS_FILE)
    for name, packed in arrays.items():
        if not name.startswith("bits/"):
            continue
        unit_part, step_part, enc = name[len("bits/"):].rsplit("/", 2)
        key = (unit_part, int(step_part[len("step"):]), param_from_file_name(enc))
        run.bits[key] = (packed, tuple(int(d) for d in arrays["shape/" + name[len("bits/"):]]))
    return run


def _agree(a: tuple[np.ndarray, tuple[int, ...]], b: tuple[np.ndarray, tuple[int, ...]]) -> tuple[int, int]:
    """(elements with the same sign, elements): padding bits are zero in both, so they agree."""
    total = int(np.prod(a[1], dtype=np.int64)) if a[1] else 1
    differ = int(np.unpackbits(np.bitwise_xor(a[0], b[0])).sum())
    return total - differ, total


def _steps_text(steps: list[int]) -> str:
    return ", ".join(map(str, steps[:8])) + (" ..." if len(steps) > 8 else "")


def grad_compare(golden: GradRun, now: GradRun, first_step_min: float = FIRST_STEP_MIN, max_drop: float = MAX_DROP,
                 rtol: float = GRAD_RTOL, atol: float = GRAD_ATOL) -> Comparison:
    failures: list[Failure] = []
    gk, ck = golden.keys(), now.keys()
    g_by_unit: dict[str, set[Key]] = {}
    c_by_unit: dict[str, set[Key]] = {}
    for keys, by_unit in ((gk, g_by_unit), (ck, c_by_unit)):
        for k in keys:
            by_unit.setdefault(k[0], set()).add(k)
    g_units, c_units = set(g_by_unit), set(c_by_unit)
    for unit in sorted(g_units - c_units):
        failures.append(Failure(unit, "missing_unit", f"{unit}: in the golden, not in this run", Category.STRUCTURE))
    for unit in sorted(c_units - g_units):
        failures.append(Failure(unit, "extra_unit", f"{unit}: in this run, not in the golden", Category.STRUCTURE))
    similarity_data: dict[str, Any] = {}
    cells = regressed_direction = 0
    stat_failures: list[Failure] = []
    bad_cells: set[Key] = set()
    for unit in sorted(g_units & c_units):
        g_steps = sorted({k[1] for k in g_by_unit[unit]})
        c_steps = sorted({k[1] for k in c_by_unit[unit]})
        only_g, only_c = sorted(set(g_steps) - set(c_steps)), sorted(set(c_steps) - set(g_steps))
        if only_g:
            failures.append(Failure(unit, "missing_steps", f"{unit}: steps in the golden only: {_steps_text(only_g)}",
                                    Category.STRUCTURE, 0.0, only_g, None))
        if only_c:
            failures.append(Failure(unit, "extra_steps", f"{unit}: steps in this run only: {_steps_text(only_c)}",
                                    Category.STRUCTURE, 0.0, None, only_c))
        steps = sorted(set(g_steps) & set(c_steps))
        step_set = set(steps)
        g_params: dict[str, list[int]] = {}
        c_params: dict[str, list[int]] = {}
        for k in g_by_unit[unit]:
            if k[1] in step_set:
                g_params.setdefault(k[2], []).append(k[1])
        for k in c_by_unit[unit]:
            if k[1] in step_set:
                c_params.setdefault(k[2], []).append(k[1])
        for label, mine, other in (("golden", g_params, c_params), ("run", c_params, g_params)):
            gone = {p: sorted(set(s) - set(other.get(p, []))) for p, s in mine.items()}
            gone = {p: s for p, s in gone.items() if s}
            if gone:
                where = "in the golden, not in this run" if label == "golden" else "in this run, not in the golden"
                names = ", ".join(f"{p} (steps {_steps_text(s)})" for p, s in sorted(gone.items())[:5])
                failures.append(Failure(unit, f"{'missing' if label == 'golden' else 'extra'}_params",
                                        f"{unit}: {len(gone)} parameter(s) {where}: {names}"
                                        + (" ..." if len(gone) > 5 else ""), Category.STRUCTURE, 0.0,
                                        sorted(gone)))
        params = sorted(set(g_params) & set(c_params))
        sim: dict[str, dict[int, float | None]] = {p: {} for p in params}
        agree: dict[tuple[str, int], tuple[int, int]] = {}
        summary: dict[int, list[int]] = {s: [0, 0] for s in steps}
        for step in steps:
            for p in params:
                key = (unit, step, p)
                if key not in gk or key not in ck:
                    continue
                cells += 1
                gb, cb = golden.bits.get(key), now.bits.get(key)
                gs, cs = golden.stats.get(key), now.stats.get(key)
                value: float | None = None
                if gb is not None and cb is not None:
                    if gb[1] != cb[1]:
                        failures.append(Failure(f"{unit} {p}", "shape_changed", f"{unit} step {step} {p}: gradient "
                                                f"shape {list(cb[1])}, golden {list(gb[1])}", Category.STRUCTURE,
                                                0.0, list(gb[1]), list(cb[1])))
                        bad_cells.add(key)
                    else:
                        same, total = _agree(gb, cb)
                        if total:
                            value = same / total
                            agree[(p, step)] = (same, total)
                            summary[step][0] += same
                            summary[step][1] += total
                elif gb is not None or cb is not None:
                    side = "the golden" if gb is not None else "this run"
                    failures.append(Failure(f"{unit} {p}", "direction_missing", f"{unit} step {step} {p}: direction "
                                            f"data only in {side}", Category.STRUCTURE))
                    bad_cells.add(key)
                elif gs is not None and cs is not None and gs.md5 and cs.md5:
                    value = 1.0 if gs.md5 == cs.md5 else 0.0
                sim[p][step] = value
                if gs is not None and cs is not None:
                    for fig in STAT_FIGURES:
                        f = _stat_failure(unit, step, p, fig, getattr(gs, fig), getattr(cs, fig), rtol, atol)
                        if f is not None:
                            stat_failures.append(f)
                            bad_cells.add(key)
        flags = apply_rule(sim, steps, None, first_step_min, max_drop)
        for flag in flags:
            same_total = agree.get((flag.param, flag.step))
            counted = f" [{same_total[0]}/{same_total[1]} elements agree with the golden]" if same_total else ""
            failures.append(Failure(f"{unit} {flag.param}", f"direction_{flag.reason}",
                                    f"{unit} {flag.param}: {flag.describe(first_step_min, max_drop)}{counted}",
                                    Category.DIRECTION, 1.0 - flag.similarity, flag.previous, flag.similarity,
                                    first_step_min if flag.previous is None else flag.previous - max_drop))
            bad_cells.add((unit, flag.step, flag.param))
            regressed_direction += 1
        lowest = [min((v for p in params if (v := sim[p].get(s)) is not None), default=None) for s in steps]
        similarity_data[unit] = {"steps": steps,
                                 "summary": [(a / t if t else None) for a, t in (summary[s] for s in steps)],
                                 "lowest": lowest}
    failures.extend(stat_failures)
    structure = sum(1 for f in failures if f.category == Category.STRUCTURE)
    counts = {"cells": cells, "regressed_cells": len(bad_cells), "direction_flags": regressed_direction,
              "statistics": len(stat_failures), "structure": structure}
    rule = (f"direction similarity to the golden >= {first_step_min} at the first step and no drop > {max_drop} "
            f"between steps; max/min/norm within {atol:g} + {rtol:g} x |golden|; same ranks, steps, parameters")
    if failures:
        headline = (f"{len(bad_cells)} of {cells} (rank, step, parameter) cells regressed: {regressed_direction} "
                    f"direction flag(s), {len(stat_failures)} statistic(s) out of tolerance, {structure} structure "
                    "difference(s)")
    else:
        lows = [v for d in similarity_data.values() for v in d["lowest"] if v is not None]
        low = f"; lowest direction similarity {shown(min(lows))}" if lows else ""
        headline = f"{cells} (rank, step, parameter) cells match the golden{low}"
    info = [f"notes: {'; '.join(now.notes[:3])}"] if now.notes else []
    return Comparison(failures, headline, rule, info, counts, {"similarity": similarity_data})


def _stat_failure(unit: str, step: int, param: str, fig: str, g: float | None, c: float | None, rtol: float,
                  atol: float) -> Failure | None:
    if g is None or c is None:
        return None
    if (math.isnan(g) and math.isnan(c)) or g == c:
        return None
    allowed = atol + rtol * abs(g) if math.isfinite(g) else 0.0
    diff = abs(c - g) if math.isfinite(g) and math.isfinite(c) else math.inf
    if diff <= allowed:
        return None
    return Failure(f"{unit} {param}", f"{fig}_out_of_tolerance", f"{unit} step {step} {param} {fig}: golden {shown(g)}, now "
                   f"{shown(c)}, allowed ±{short_number(allowed, 3)} (|diff| {shown(diff)})", Category.FIGURE,
                   diff / allowed if allowed else math.inf, g, c, allowed)


GRAD_RUN = Kind("grad_run", grad_render, grad_load)
