"""free_benchmark on a corpus nobody here wrote: PyTorch's OpInfo sample inputs (issue 13 part 4).

For every op of ``torch.testing._internal.common_methods_invocations.op_db`` that has a public
name in a namespace free_benchmark hooks (torch, torch.linalg/fft/special/masked,
torch.nn.functional, Tensor methods), on the CPU, the first N sample inputs per dtype are

* run plainly (no probe; twice with the same seed: a difference marks the op nondeterministic),
* run under the probe, through the public name resolved at call time (so the hooks see it), one
  ``debugger.step()`` per sample, one probe per (mode, rule): improve_precision for bf16/fp16,
  no_change for fp32 (the determinism control: it must flag nothing),
* judged by a float64 oracle: the plain low-precision output against the same op on the inputs
  upcast to float64, by msprobe's ratio rule (probes.core.metrics, the dtype's ratio threshold)
  and by the scale-aware measure (probes.core.scaled.scaled_error).

Per (mode, dtype, rule) it reports samples run and checked, oracle- and probe-flagged samples,
recall (probe flags among the oracle's), false flags, calls the probe broke (raised only under the
probe, or a result not bit-identical to the plain run), the probe's errors and every miss with
its reason (not hooked, not checked and why, judged consistent).

    python benchmarks/opinfo_corpus.py                       # full corpus, bf16 + fp32, ~2.5 min on 2 cores
    python benchmarks/opinfo_corpus.py --dtypes bfloat16,float16,float32 --json /tmp/opinfo.json
    python benchmarks/opinfo_corpus.py --ops nn.functional.gelu,softmax,linalg.norm --samples 5
    python benchmarks/opinfo_corpus.py --limit 50 --rule reference

Needs expecttest (OpInfo's module imports it). Random ops (dropout, rand*, bernoulli, ...; or two
calls with one seed that differ) and uninitialised ones (empty*, new_empty*) stay out of the
oracle and of the bit-for-bit comparison, but still run under the probe (a crash there counts).
"""

from __future__ import annotations

import argparse
import csv
import itertools
import json
import logging
import math
import sys
import tempfile
import time
import warnings
import zlib
from collections import Counter
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

import torch  # noqa: E402

from probes.backends.base import scaled_options  # noqa: E402
from probes.backends.torch_apis import build_catalog  # noqa: E402
from probes.core import metrics, scaled  # noqa: E402
from probes.core import thresholds as th  # noqa: E402
from probes.core.config import load_config  # noqa: E402
from probes.core.errors import ConfigError  # noqa: E402
from probes.core.trees import iter_leaves, tree_map  # noqa: E402
from probes.pytorch import PrecisionDebugger  # noqa: E402
from pytest_msprobe.catalogue.opinfo_ops import (  # noqa: E402,F401  (re-exported for the tests)
    SEED,
    Entry,
    build_corpus,
    is_random_name,
)
from pytest_msprobe.catalogue.opinfo_ops import call_sample as _call  # noqa: E402
from pytest_msprobe.catalogue.opinfo_ops import copy_tree as _copy  # noqa: E402
from pytest_msprobe.catalogue.opinfo_ops import upcast as _upcast  # noqa: E402,F401

try:
    import array_api_compat.torch as XP
except ImportError:  # pragma: no cover - a declared dependency of the probe
    XP = None

DTYPES = {"bfloat16": torch.bfloat16, "float16": torch.float16, "float32": torch.float32}
# the probe mode run on each dtype: improve_precision needs a low-precision input; on fp32 the
# run is the determinism control
DEFAULT_MODE = {"bfloat16": "improve_precision", "float16": "improve_precision", "float32": "no_change"}
# spec'd fallback while probes.core.thresholds has no scaled_threshold (max scaled error per dtype)
SCALED_FALLBACK = {"bfloat16": 2.0**-6, "float16": 2.0**-8, "float32": 2e-4}


def identical(a: Any, b: Any) -> bool:
    """Bit-for-bit equality of two results (NaN equal to NaN, -0.0 distinct from 0.0)."""
    la, lb = list(iter_leaves(a)), list(iter_leaves(b))
    if len(la) != len(lb) or type(a) is not type(b):
        return False
    for (pa, x), (pb, y) in zip(la, lb):
        if pa != pb:
            return False
        if isinstance(x, torch.Tensor) or isinstance(y, torch.Tensor):
            if not (isinstance(x, torch.Tensor) and isinstance(y, torch.Tensor)):
                return False
            if x.dtype != y.dtype or x.shape != y.shape or x.layout != y.layout:
                return False
            if x.layout != torch.strided:
                x, y = x.to_dense(), y.to_dense()
            x, y = x.detach().resolve_conj().resolve_neg(), y.detach().resolve_conj().resolve_neg()
            if x.is_complex():
                x, y = torch.view_as_real(x), torch.view_as_real(y)
            if x.is_floating_point():
                if x.dtype.itemsize in (1, 2, 4, 8) and x.numel():
                    ints = {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}[x.dtype.itemsize]
                    xb, yb = x.contiguous().view(ints), y.contiguous().view(ints)
                    same = xb == yb
                    # any NaN payload counts as the same NaN
                    if not bool((same | (torch.isnan(x) & torch.isnan(y))).all()):
                        return False
                continue
            if not torch.equal(x, y):
                return False
        elif isinstance(x, float) and isinstance(y, float):
            if not (x == y or (math.isnan(x) and math.isnan(y))):
                return False
        else:
            try:
                if x != y:
                    return False
            except Exception:
                if repr(x) != repr(y):
                    return False
    return True


def scaled_threshold(dtype_name: str, pert_mode: str = "improve_precision") -> tuple[float, str]:
    """The scale-aware threshold and where it came from."""
    fn = getattr(th, "scaled_threshold", None)
    if fn is not None:
        return float(fn(dtype_name, pert_mode)), "probes.core.thresholds.scaled_threshold"
    return SCALED_FALLBACK.get(dtype_name, SCALED_FALLBACK["float32"]), "fallback table (thresholds has no scaled_threshold)"


@dataclass
class LeafFigures:
    path: str
    dtype: str
    ratio: float
    ratio_note: str  # "" or symbol_flipping / nan_mismatch / inf_mismatch
    ratio_flag: bool
    scaled: float
    scaled_flag: bool


def judge(low: Any, high: Any, skipped: Counter | None = None, pointwise: bool = False) -> list[LeafFigures]:
    """Both rules on every floating leaf of `low` (a bf16/fp16/fp32 result) against `high`;
    `skipped` counts the floating leaves that cannot be judged, by reason. `pointwise`: the API
    carries aten's pointwise tag, so the scaled measure judges each element at its own magnitude,
    as the probe does."""
    if XP is None:
        raise ImportError("array-api-compat is required")
    skipped = Counter() if skipped is None else skipped
    highs = dict(iter_leaves(high))
    out = []
    for path, a in iter_leaves(low):
        b = highs.get(path)
        if not (isinstance(a, torch.Tensor) and a.is_floating_point()):
            continue
        why = ("float64 result has no such leaf" if not isinstance(b, torch.Tensor) or not b.is_floating_point()
               else "shape differs from the float64 result" if a.shape != b.shape
               else "empty output" if a.numel() == 0
               else "sparse output" if a.layout != torch.strided or b.layout != torch.strided else None)
        if why is not None:
            skipped[why] += 1
            continue
        name = str(a.dtype).replace("torch.", "")
        a64, b64 = a.detach().to(torch.float64), b.detach().to(torch.float64)
        tol = th.forward_tolerance(name)
        red = metrics.ratio_reductions(XP, a64, b64, tol).tolist()
        if metrics.needs_nonfinite_pass(red):
            red = metrics.nonfinite_ratio_reductions(XP, a64, b64, tol).tolist()
        rv = metrics.finish_ratio(red, tol)
        t_ratio = th.ratio_threshold(name, "improve_precision")
        eps = torch.finfo(a.dtype).eps
        extra = scaled_options(pointwise)
        err, nan_mm, inf_mm = scaled.finish(scaled.scaled_error(XP, a64, b64, eps, tuple(a.shape), **extra).tolist())
        t_scaled, _src = scaled_threshold(name)
        note = "nan_mismatch" if rv.nan_mismatch else "inf_mismatch" if rv.inf_mismatch else (
            "symbol_flipping" if rv.symbol_flipping else "")
        out.append(LeafFigures(".".join(map(str, path)) or "-", name, rv.ratio, note, not rv.consistent(t_ratio),
                               err, bool(nan_mm or inf_mm or err > t_scaled)))
    return out


# one probe run per (mode, dtype, rule) ---------------------------------------------------------
@dataclass
class ProbeRun:
    mode: str
    dtype: str
    rule: str | None
    dbg: Any = field(repr=False)
    dump: Path

    @property
    def label(self) -> str:
        return f"{self.dtype}/{self.mode}" + (f"/{self.rule}" if self.rule else "")


def rule_accepted(rule: str) -> bool:
    with tempfile.TemporaryDirectory() as tmp:
        try:
            load_config({"task": "free_benchmark", "dump_path": tmp, "free_benchmark": {"rule": rule}})
        except (ConfigError, TypeError, ValueError):
            return False
    return True


def _snapshot(summary: dict[str, Any]) -> dict[str, Any]:
    return {
        "calls": {k: v["calls"] for k, v in summary["apis"].items()},
        "checked": {k: v["checked"] for k, v in summary["apis"].items()},
        "flagged": {k: v["flagged"] for k, v in summary["apis"].items()},
        "skipped": {(reason, k): n for reason, apis in summary["not_checked"].items() for k, n in apis.items()},
        "errors": {(e["api"], e["error"].split(":")[0]): (e["count"], e["error"]) for e in summary["errors"]},
    }


def _delta(before: dict[str, Any], after: dict[str, Any]) -> dict[str, Any]:
    def diff(kind: str) -> dict[Any, int]:
        return {k: v - before[kind].get(k, 0) for k, v in after[kind].items() if v != before[kind].get(k, 0)}

    errors = [after["errors"][k][1] for k, (n, _m) in after["errors"].items() if n != before["errors"].get(k, (0,))[0]]
    return {"calls": diff("calls"), "checked": diff("checked"), "flagged": diff("flagged"),
            "skipped": diff("skipped"), "errors": errors}


def _read_rows(dump: Path) -> dict[int, list[dict[str, str]]]:
    rows: dict[int, list[dict[str, str]]] = {}
    for path in dump.glob("step*/rank*/free_benchmark.csv"):
        with open(path, newline="") as fh:
            for row in csv.DictReader(fh):
                rows.setdefault(int(row["step"]), []).append(row)
    return rows


# the run -------------------------------------------------------------------------------------
def run_corpus(
    entries: list[Entry],
    dtypes: list[str],
    samples: int = 3,
    rules: list[str | None] | None = None,
    modes: dict[str, str] | None = None,
    dump_root: Path | None = None,
    progress: Callable[[str], None] | None = None,
) -> dict[str, Any]:
    """Run the corpus; returns {"configs": [...], "samples": [...]} (see module docstring)."""
    rules = rules or [None]
    modes = modes or DEFAULT_MODE
    own_tmp = None
    if dump_root is None:
        own_tmp = tempfile.TemporaryDirectory(prefix="opinfo_corpus_")
        dump_root = Path(own_tmp.name)
    logging.getLogger("probes").setLevel(logging.ERROR)
    records: list[dict[str, Any]] = []
    configs: list[dict[str, Any]] = []
    try:
        for dname in dtypes:
            dtype = DTYPES[dname]
            mode = modes[dname]
            runs = []
            for rule in rules:
                section: dict[str, Any] = {"pert_mode": mode}
                if rule is not None:
                    section["rule"] = rule
                dump = dump_root / f"{dname}_{mode}_{rule or 'default'}"
                cfg = {"task": "free_benchmark", "dump_path": str(dump), "free_benchmark": section}
                runs.append(ProbeRun(mode, dname, rule, PrecisionDebugger(config=cfg), dump))
            t0 = time.perf_counter()
            step = 0
            dtype_records: list[dict[str, Any]] = []
            for n_op, entry in enumerate(entries):
                op = entry.opinfo
                if not op.supports_dtype(dtype, "cpu"):
                    continue
                torch.manual_seed(zlib.crc32(entry.name.encode()))
                try:
                    with warnings.catch_warnings():
                        warnings.simplefilter("ignore")
                        batch = list(itertools.islice(op.sample_inputs("cpu", dtype, requires_grad=False), samples))
                except Exception as exc:
                    dtype_records.append({"op": entry.name, "dtype": dname, "sample": None,
                                          "status": f"sample_inputs failed: {type(exc).__name__}: {exc}"[:300]})
                    continue
                prepared = []
                for i, s in enumerate(batch):
                    rec: dict[str, Any] = {"op": entry.name, "dtype": dname, "sample": i, "how": entry.how,
                                           "key": entry.key, "step": step, "random": entry.random,
                                           "uninitialised": entry.uninitialised, "exclusion": entry.exclusion}
                    step += 1
                    inp, args, kwargs = s.input, tuple(s.args), dict(s.kwargs)
                    plain, err = _call(entry, *_copy((inp, args, kwargs)))
                    rec["plain_error"] = err
                    if err is None:
                        again, _ = _call(entry, *_copy((inp, args, kwargs)))
                        if not identical(plain, again):
                            rec["random"] = True
                            rec["nondeterministic"] = True
                    rec["comparable"] = err is None and not rec.get("nondeterministic") and not entry.uninitialised
                    rec["oracle"] = _oracle(entry, rec, plain, inp, args, kwargs)
                    prepared.append((rec, plain, [_copy((inp, args, kwargs)) for _ in runs]))
                for k, run in enumerate(runs):
                    dbg = run.dbg
                    dbg.start()
                    try:
                        for rec, plain, copies in prepared:
                            before = _snapshot(dbg.summary())
                            out, perr = _call(entry, *copies[k])
                            d = _delta(before, _snapshot(dbg.summary()))
                            dbg.step()
                            broken = None
                            if perr is not None and rec["plain_error"] is None:
                                broken = f"raises under the probe only: {perr}"
                            elif perr is None and rec["comparable"] and not identical(plain, out):
                                broken = "result differs from the plain run"
                            rec.setdefault("probe", {})[run.label] = {
                                "calls": d["calls"], "checked": sum(d["checked"].values()),
                                "flagged_calls": sum(d["flagged"].values()),
                                "not_checked": sorted({r for (r, _k) in d["skipped"]}),
                                "errors": d["errors"], "broken": broken, "rows": [],
                            }
                    finally:
                        dbg.stop()
                for rec, _plain, _c in prepared:
                    dtype_records.append(rec)
                if progress and (n_op + 1) % 100 == 0:
                    progress(f"{dname}: {n_op + 1}/{len(entries)} ops, {time.perf_counter() - t0:.0f} s")
            elapsed = time.perf_counter() - t0
            for run in runs:
                rows = _read_rows(run.dump)
                for rec in dtype_records:
                    p = rec.get("probe", {}).get(run.label)
                    if p is not None:
                        p["rows"] = [{"api_name": r["api_name"], "max_rel": r["max_rel"], "dtype": r["dtype"],
                                      "output_index": r["output_index"]} for r in rows.get(rec["step"], [])]
                configs.append(summarise(run, dtype_records, elapsed / max(len(runs), 1)))
            records += dtype_records
    finally:
        if own_tmp is not None:
            own_tmp.cleanup()
    return {"configs": configs, "samples": records}


def _oracle(entry: Entry, rec: dict[str, Any], plain: Any, inp: Any, args: tuple, kwargs: dict) -> dict[str, Any]:
    if rec["plain_error"] is not None:
        return {"status": "plain call fails"}
    if entry.uninitialised:
        return {"status": "uninitialised"}
    if rec["random"]:
        return {"status": "random" if not rec.get("nondeterministic") else "nondeterministic"}
    if not any(isinstance(x, torch.Tensor) and x.is_floating_point() for _p, x in iter_leaves(plain)):
        return {"status": "output not floating"}
    hi_in = tree_map(_upcast, _copy((inp, args, kwargs)))
    high, err = _call(entry, *hi_in)
    if err is not None:
        return {"status": f"float64 call fails: {err}"}
    skipped: Counter = Counter()
    leaves = judge(plain, high, skipped, pointwise=_pointwise(rec["key"]))
    if not leaves:
        return {"status": "not judged: " + ", ".join(sorted(skipped)) if skipped else "no floating output"}
    worst_r = max(leaves, key=lambda v: (bool(v.ratio_note), v.ratio))
    worst_s = max(leaves, key=lambda v: v.scaled)
    return {"status": "judged", "ratio_flag": any(v.ratio_flag for v in leaves),
            "scaled_flag": any(v.scaled_flag for v in leaves),
            "ratio": worst_r.ratio_note or worst_r.ratio, "scaled": worst_s.scaled,
            "leaves": [asdict(v) for v in leaves[:8]]}


_POINTWISE: dict[str, bool] = {}


def _pointwise(key: str | None) -> bool:
    """Whether the probe judges this hooked API element by element (probes.backends.torch_apis)."""
    if not _POINTWISE:
        _POINTWISE.update((m.key, m.pointwise) for m in build_catalog())
    return bool(key) and _POINTWISE.get(key, False)


def _probe_flagged(p: dict[str, Any]) -> bool:
    return bool(p["rows"]) or p["flagged_calls"] > 0


def _miss_reason(rec: dict[str, Any], p: dict[str, Any]) -> str:
    if p["errors"]:
        return "probe error: " + "; ".join(p["errors"])
    if p["checked"]:
        return "judged consistent"
    if p["not_checked"]:
        return "not checked: " + "; ".join(p["not_checked"])
    if not p["calls"]:
        return "not hooked" + (" (OpInfo adapter calls no hooked public name)" if rec["how"] == "wrapper" else "")
    return "not checked (no reason recorded)"


def _status_kind(status: str) -> str:
    return status if status.startswith("not judged") else status.split(":")[0]


def summarise(run: ProbeRun, records: list[dict[str, Any]], seconds: float) -> dict[str, Any]:
    """The figures of one (mode, dtype, rule) run."""
    ran = [r for r in records if r.get("probe", {}).get(run.label) is not None]
    judged = [r for r in ran if r["oracle"].get("status") == "judged"]
    probe_flagged = [r for r in ran if _probe_flagged(r["probe"][run.label])]
    oracle_rule = "scaled" if run.rule == "scaled" else "ratio"
    out: dict[str, Any] = {
        "label": run.label, "mode": run.mode, "dtype": run.dtype, "rule": run.rule or "default",
        "seconds": round(seconds, 1),
        "ops": len({r["op"] for r in ran}),
        "samples_run": len(ran),
        "samples_checked": sum(1 for r in ran if r["probe"][run.label]["checked"]),
        "checks": sum(r["probe"][run.label]["checked"] for r in ran),
        "plain_call_fails": sum(1 for r in ran if r["plain_error"] is not None),
        "oracle_judged": len(judged),
        "oracle_excluded": dict(Counter(_status_kind(r["oracle"]["status"]) for r in ran
                                        if r["oracle"].get("status") != "judged")),
        "probe_flagged": len(probe_flagged),
        "probe_rows": sum(len(r["probe"][run.label]["rows"]) for r in ran),
        "oracle_rule_compared": oracle_rule,
        "scaled_threshold_source": scaled_threshold(run.dtype)[1],
    }
    for rule in ("ratio", "scaled"):
        flagged = [r for r in judged if r["oracle"][f"{rule}_flag"]]
        hit = [r for r in flagged if _probe_flagged(r["probe"][run.label])]
        false = [r for r in probe_flagged if not r["oracle"].get(f"{rule}_flag")]
        out[f"oracle_flagged_{rule}"] = len(flagged)
        # no_change re-runs the same inputs: it tests determinism, not precision, so its recall
        # against the float64 oracle is not a figure of merit (its rows must simply be 0)
        out[f"recall_{rule}"] = round(len(hit) / len(flagged), 4) if flagged and run.mode != "no_change" else None
        out[f"false_flags_{rule}"] = len(false)
        out[f"false_flag_rate_{rule}"] = round(len(false) / len(ran), 4) if ran else None
    misses = []
    for r in judged:
        p = r["probe"][run.label]
        if r["oracle"][f"{oracle_rule}_flag"] and not _probe_flagged(p):
            misses.append({"op": r["op"], "sample": r["sample"], "step": r["step"], "how": r["how"],
                           "reason": _miss_reason(r, p), "oracle_ratio": r["oracle"]["ratio"],
                           "oracle_scaled": r["oracle"]["scaled"]})
    out["misses"] = misses
    out["miss_reasons"] = dict(Counter(m["reason"].split(":")[0] for m in misses))
    out["broken"] = [{"op": r["op"], "sample": r["sample"], "why": r["probe"][run.label]["broken"]}
                     for r in ran if r["probe"][run.label]["broken"]]
    errors: dict[str, dict[str, Any]] = {}
    for r in ran:
        for e in r["probe"][run.label]["errors"]:
            errors.setdefault(e, {"error": e, "ops": []})["ops"].append(f"{r['op']}#{r['sample']}")
    out["probe_errors"] = list(errors.values())
    out["false_flag_samples"] = [
        {"op": r["op"], "sample": r["sample"], "rows": r["probe"][run.label]["rows"][:3],
         "oracle": r["oracle"].get("status"), "oracle_ratio": r["oracle"].get("ratio"),
         "oracle_scaled": r["oracle"].get("scaled")}
        for r in probe_flagged if not r["oracle"].get(f"{oracle_rule}_flag")
    ]
    return out


# reporting ------------------------------------------------------------------------------------
def _fmt(v: Any) -> str:
    if v is None:
        return "n/a"
    if isinstance(v, float):
        return f"{v:.3f}"
    return str(v)


def table(configs: list[dict[str, Any]]) -> str:
    head = ("| config | ops | samples run | checked | oracle-flagged ratio / scaled | probe-flagged | "
            "recall ratio / scaled | false flags ratio / scaled | broken | probe errors | misses | time |")
    lines = [head, "|" + "---|" * 12]
    for c in configs:
        lines.append(
            f"| {c['label']} | {c['ops']} | {c['samples_run']} | {c['samples_checked']} | "
            f"{c['oracle_flagged_ratio']} / {c['oracle_flagged_scaled']} | {c['probe_flagged']} | "
            f"{_fmt(c['recall_ratio'])} / {_fmt(c['recall_scaled'])} | "
            f"{c['false_flags_ratio']} / {c['false_flags_scaled']} | {len(c['broken'])} | "
            f"{sum(len(e['ops']) for e in c['probe_errors'])} | {len(c['misses'])} | {c['seconds']} s |"
        )
    return "\n".join(lines)


def details(configs: list[dict[str, Any]]) -> str:
    lines = []
    for c in configs:
        lines.append(f"\n## {c['label']}  (oracle rule compared: {c['oracle_rule_compared']}; "
                     f"scaled threshold: {c['scaled_threshold_source']})")
        lines.append(f"oracle not judged: {c['oracle_excluded']}; plain call fails: {c['plain_call_fails']}")
        lines.append(f"miss reasons: {c['miss_reasons']}")
        for m in c["misses"]:
            ratio = m["oracle_ratio"]
            ratio = f"{ratio:.4g}" if isinstance(ratio, float) else ratio
            lines.append(f"  miss {m['op']}#{m['sample']} ({m['how']}): {m['reason']}; oracle ratio {ratio}, "
                         f"scaled {m['oracle_scaled']:.3g}")
        for b in c["broken"]:
            lines.append(f"  BROKEN {b['op']}#{b['sample']}: {b['why']}")
        for e in c["probe_errors"]:
            lines.append(f"  probe error ({len(e['ops'])}x: {', '.join(e['ops'][:6])}): {e['error']}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--ops", help="comma-separated OpInfo names (with or without .variant)")
    p.add_argument("--samples", type=int, default=3, help="sample inputs per op and dtype (default 3)")
    p.add_argument("--dtypes", default="bfloat16,float32", help="comma list of bfloat16,float16,float32")
    p.add_argument("--limit", type=int, help="only the first N ops of the corpus")
    p.add_argument("--rule", default="auto", choices=("auto", "reference", "scaled", "both"),
                   help="free_benchmark rule key; auto = both when the config accepts `rule`, else the default")
    p.add_argument("--json", help="write every figure and every sample's record here")
    p.add_argument("--threads", type=int, default=1, help="torch threads (default 1)")
    p.add_argument("--verbose", action="store_true", help="list every miss, breakage and probe error")
    p.add_argument("--fp32-mode", default="no_change", choices=("no_change", "improve_precision"),
                   help="float32's mode: the determinism control (default) or improve_precision, which the "
                        "scaled rule re-runs in float64 (the reference rule skips float32, as msprobe)")
    a = p.parse_args(argv)
    torch.set_num_threads(a.threads)
    accepted = rule_accepted("scaled")
    if a.rule == "auto":
        rules: list[str | None] = ["reference", "scaled"] if accepted else [None]
    elif not accepted:
        print(f"note: the free_benchmark config does not accept `rule`; running the default rule, not {a.rule}")
        rules = [None]
    else:
        rules = ["reference", "scaled"] if a.rule == "both" else [a.rule]
    t0 = time.perf_counter()
    entries, outside = build_corpus(a.ops.split(",") if a.ops else None, a.limit)
    print(f"corpus: {len(entries)} OpInfo entries reachable through hooked names "
          f"({Counter(e.how for e in entries)}), {len(outside)} outside; {time.perf_counter() - t0:.1f} s")
    modes = dict(DEFAULT_MODE, float32=a.fp32_mode)
    result = run_corpus(entries, a.dtypes.split(","), a.samples, rules, modes=modes, progress=print)
    total = time.perf_counter() - t0
    print(table(result["configs"]))
    if a.verbose:
        print(details(result["configs"]))
    else:
        for c in result["configs"]:
            print(f"{c['label']}: miss reasons {c['miss_reasons']}; broken {len(c['broken'])}; "
                  f"probe errors {[e['error'][:80] for e in c['probe_errors']]}")
    print(f"total {total:.0f} s (torch threads {a.threads})")
    if a.json:
        payload = {"total_seconds": round(total, 1), "threads": a.threads, "samples_per_op": a.samples,
                   "rules": rules, "rule_accepted": accepted, "torch": torch.__version__,
                   "corpus": [{"op": e.name, "how": e.how, "key": e.key, "exclusion": e.exclusion} for e in entries],
                   "outside": outside, **result}
        Path(a.json).write_text(json.dumps(payload, indent=1, default=str))
        print(f"wrote {a.json}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
