"""The catalogue's gate: each API x dtype against the goldens of its device kind.

The goldens (one reviewed file per machine identity, and where they lie) are
pytest_msprobe.catalogue.golden_files; catalogue.csv and how its figures are shown are
pytest_msprobe.catalogue.results_table: this module judges, and names their public members too
(``__all__``), so what reads ``gate.X`` reads one module for the whole catalogue gate.

Two kinds of limit judge a run:

* **Machine-independent limits**, which every correct kernel meets on every machine, so they
  gate a run on any identity, with or without its golden:

  - **over limit** (accumulation): an accumulating API's test ratio (probes.core.accumulation:
    the error over what rounding may contribute given the number and magnitude of the terms)
    above its dtype's limit. TF32 / bfloat16-input float32 products and half-precision sums
    accumulating in the half type exceed it on every machine; any summation order in the
    accumulation dtype stays far below.
  - **over limit** (one rounding): an API whose correct answer is one rounding (the FP8 casts)
    with a max ulp above 0.5;
  - **over limit** (cross-machine): a max or p99 ulp figure more than ``CROSS_MACHINE_FACTOR``
    times (plus ``CROSS_MACHINE_ABS`` ulps) the figure of every other machine's golden for the
    API. Correct kernels of two machines differ by a few times (9 against 23 ulps for two float32
    GEMMs); a kernel that computes below its dtype is off by 2^13 (float32 in TF32) or more.
  - **flagged**: free_benchmark flags it, and no golden of the device kind had it flagged.

* **The ulp golden of this machine's identity**, the finer signal, for what an upgrade changes
  on the same hardware:

  - **regressed**: max ulp or p99 ulp above ``golden * (1 + ULP_MARGIN) + ULP_MARGIN_ABS`` (the
    same inputs on the same machine reproduce the golden exactly; the margin absorbs a new
    vector library or summation order after an upgrade, not a lost bit), or an accumulation
    ratio the golden had over the limit that grew beyond the same margin;
  - **newly flagged**: free_benchmark flags it now and did not in the golden;
  - **broken**: the golden measured it and now the device run raises on every sample.

Otherwise the row is **ok**; **accepted** when a known, recorded error (flagged by free_benchmark,
or over the accumulation limit, in this machine's golden or another's) holds its number; **new**
when this machine's golden lacks the row; **measured** when there is no golden for this machine
(gated by the machine-independent limits only: never "regressed" for the difference between two
correct kernels). With ``--msprobe-regen-golden`` every measured row is **regenerated**: the
session writes this machine's golden at its end (rows of APIs not run this time are kept), and
the tests pass; review the diff.

The gate's own limits (ULP_MARGIN, ULP_MARGIN_ABS, CROSS_MACHINE_FACTOR, CROSS_MACHINE_ABS) are
defined here; the accumulation test ratio's limit is the ratio's own (probes.core.accumulation).
"""

from __future__ import annotations

import math
from typing import Any

from probes.core.accumulation import ACCUMULATES_IN, RATIO_LIMIT
from probes.core.catalogue_status import (
    ACCEPTED,
    BROKEN,
    FAILING,
    FLAGGED,
    MEASURED,
    NEW,
    NEWLY_FLAGGED,
    OK,
    OVER_LIMIT,
    REGENERATED,
    REGRESSED,
    SKIPPED,
    STATUS_RANK,
    failing,
)
from pytest_msprobe.catalogue import fp8_ops
from pytest_msprobe.catalogue.golden_files import (
    CATALOGUE,
    DEVICE_FOLDER,
    GOLDEN_FILE,
    GOLDEN_HEADER,
    GOLDEN_NAME,
    KNOWN_FILE,
    KNOWN_HEADER,
    UNRECORDED,
    GoldenRow,
    Goldens,
    KnownError,
    golden_name,
    goldens,
    identities,
    load,
    render,
    stored,
    write_golden,
)
from pytest_msprobe.catalogue.results_table import (
    CSV_FILE,
    CSV_HEADER,
    ratio_text,
    ulp_sort_value,
    ulp_text,
    worst,
    write_csv,
)

# what the plugin, the report and the tests read as gate.X: the verdicts, the goldens, the table
__all__ = [
    "ACCEPTED", "BROKEN", "FAILING", "FLAGGED", "MEASURED", "NEW", "NEWLY_FLAGGED", "OK", "OVER_LIMIT",
    "REGENERATED", "REGRESSED", "SKIPPED", "STATUS_RANK", "failing",
    "CATALOGUE", "DEVICE_FOLDER", "GOLDEN_FILE", "GOLDEN_HEADER", "GOLDEN_NAME", "KNOWN_FILE", "KNOWN_HEADER",
    "UNRECORDED", "GoldenRow", "Goldens", "KnownError", "golden_name", "goldens", "identities", "load", "render",
    "stored", "write_golden",
    "CSV_FILE", "CSV_HEADER", "ratio_text", "ulp_sort_value", "ulp_text", "worst", "write_csv",
    "ULP_MARGIN", "ULP_MARGIN_ABS", "CROSS_MACHINE_FACTOR", "CROSS_MACHINE_ABS", "ONE_ROUNDING",
    "CORRECTLY_ROUNDED_ULP", "ulp_bound", "cross_machine_bound", "ratio_limit", "judge",
]

ULP_MARGIN = 0.5
ULP_MARGIN_ABS = 1.0
CROSS_MACHINE_FACTOR = 16.0
CROSS_MACHINE_ABS = 16.0

# APIs whose correct answer is one rounding of the exact value (the FP8 casts): on every machine at
# most half an ulp, so any figure above it is over the limit, golden or not
ONE_ROUNDING = frozenset(fp8_ops.CASTS)
CORRECTLY_ROUNDED_ULP = 0.5


def ulp_bound(golden: float) -> float:
    """THE margin rule on one machine: the largest figure still accepted against a golden figure."""
    return golden * (1.0 + ULP_MARGIN) + ULP_MARGIN_ABS


def cross_machine_bound(golden: float) -> float:
    """The largest figure accepted against another machine's golden figure."""
    return golden * CROSS_MACHINE_FACTOR + CROSS_MACHINE_ABS


def ratio_limit(dtype: str) -> float:
    return RATIO_LIMIT.get(dtype, RATIO_LIMIT["float32"])


def judge(result: dict[str, Any], golden: Goldens, regen: bool) -> dict[str, Any]:
    """Set the result's status, message and golden figures (module docstring); returns it."""
    key = (result["api"], result["dtype"])
    own = golden.own.get(key) if golden.own is not None else None
    elsewhere = {ident: rows[key] for ident, rows in golden.others.items() if key in rows}
    result["hardware"] = golden.identity
    shown = own or _most_lenient(elsewhere)
    if shown is not None:
        result["golden_max_ulp"], result["golden_p99_ulp"] = shown.max_ulp, shown.p99_ulp
        result["golden"] = golden.identity if own is not None else _identity_of(elsewhere, shown)
    what = f"{result['api']} ({result['dtype']}, {result['device']})"
    if regen:
        result["status"], result["message"] = REGENERATED, "measured for the golden written at the end of the session"
        return result
    if result.get("error"):
        if own is not None and own.samples > 0:
            result["status"] = BROKEN
            result["message"] = (f"{what}: this machine's golden measured {own.samples} samples; now the device run "
                                 f"raises: {result['error']}")
        else:
            result["status"], result["message"] = SKIPPED, f"the device run raises: {result['error']}"
        return result
    failures: list[tuple[str, str]] = []  # (status, text), worst status first once sorted
    known: list[str] = []
    _judge_ratio(result, own, elsewhere, golden.known.get(key), failures, known)
    if result["api"] in ONE_ROUNDING and (result["max_ulp"] or 0.0) > CORRECTLY_ROUNDED_ULP:
        failures.append((OVER_LIMIT, f"max ulp {ulp_text(result['max_ulp'])} > {CORRECTLY_ROUNDED_ULP:g}: one "
                                     f"rounding, correctly rounded on every machine"))
    if own is not None:
        for name, now, before in (("max", result["max_ulp"], own.max_ulp), ("p99", result["p99_ulp"], own.p99_ulp)):
            if not _within(now, before, ulp_bound):
                failures.append((REGRESSED, f"{name} ulp {ulp_text(now)} > allowed {ulp_text(ulp_bound(before))} "
                                            f"(golden {ulp_text(before)})"))
    elif elsewhere:
        for name in ("max", "p99"):
            now = result[f"{name}_ulp"]
            before = max(getattr(r, f"{name}_ulp") for r in elsewhere.values())
            if not _within(now, before, cross_machine_bound):
                failures.append((OVER_LIMIT, f"{name} ulp {ulp_text(now)} > {ulp_text(cross_machine_bound(before))}, "
                                             f"{CROSS_MACHINE_FACTOR:g}x + {CROSS_MACHINE_ABS:g} the golden of every "
                                             f"other machine ({_listing(elsewhere, name)})"))
    flagged = result["verdict"] == "flagged"
    if flagged:
        detail = result.get("verdict_detail", "")
        if own is not None and own.free_benchmark != "flagged":
            failures.append((NEWLY_FLAGGED, f"free_benchmark flags it now ({detail}); this machine's golden verdict "
                                            f"was {own.free_benchmark!r}"))
        elif own is not None or any(r.free_benchmark == "flagged" for r in elsewhere.values()):
            known.append("flagged by free_benchmark, as in the golden")
        else:
            failures.append((FLAGGED, f"free_benchmark flags it ({detail}); no golden had it flagged"))
    elif own is not None and own.free_benchmark == "flagged":
        known.append("flagged in the golden")
    if failures:
        failures.sort(key=lambda f: STATUS_RANK[f[0]])
        result["status"] = failures[0][0]
        result["message"] = f"{what} {failures[0][0]}: " + "; ".join(text for _, text in failures)
    elif known:
        result["status"], result["message"] = ACCEPTED, f"{what}: known error, holds its number ({'; '.join(known)})"
    elif own is not None:
        result["status"], result["message"] = OK, ""
    elif golden.own is not None:
        result["status"], result["message"] = NEW, f"{what}: not in this machine's golden yet; --msprobe-regen-golden adds it"
    else:
        against = f", against the golden of {', '.join(sorted(elsewhere))}" if elsewhere else ""
        result["status"] = MEASURED
        result["message"] = (f"{what}: no golden for this machine ({golden.identity}): judged by the "
                             f"machine-independent limits{against}")
    return result


def _judge_ratio(result: dict[str, Any], own: GoldenRow | None, elsewhere: dict[str, GoldenRow],
                 listed: KnownError | None, failures: list[tuple[str, str]], known: list[str]) -> None:
    ratio = result.get("ratio")
    if not isinstance(ratio, (int, float)):
        return
    limit = ratio_limit(result["dtype"])
    if not ratio > limit:
        return
    text = (f"accumulation test ratio {ratio_text(ratio)} > limit {limit:g} (error beyond any summation order in "
            f"{ACCUMULATES_IN.get(result['dtype'], result['dtype'])})")
    if own is not None and own.ratio is not None and own.ratio > limit:
        if _within(ratio, own.ratio, ulp_bound):
            known.append(f"accumulation test ratio {ratio_text(ratio)} over the limit, as in the golden "
                         f"({ratio_text(own.ratio)})")
        else:
            failures.append((REGRESSED, f"{text}, the golden's {ratio_text(own.ratio)} allowed up to "
                                        f"{ratio_text(ulp_bound(own.ratio))}"))
        return
    if own is None and listed is not None and _within(ratio, listed.ratio, cross_machine_bound):
        known.append(f"accumulation test ratio {ratio_text(ratio)} over the limit, listed in {KNOWN_FILE}: "
                     f"{listed.reason}")
        return
    over_elsewhere = [r.ratio for r in elsewhere.values() if r.ratio is not None and r.ratio > limit]
    if own is None and over_elsewhere and _within(ratio, max(over_elsewhere), cross_machine_bound):
        known.append(f"accumulation test ratio {ratio_text(ratio)} over the limit, as in another machine's golden "
                     f"({ratio_text(max(over_elsewhere))})")
        return
    if own is None:
        text += (f"; if this is a known kernel property you accept on every machine, list it in "
                 f"golden/{DEVICE_FOLDER.format(device=result['device'])}/{KNOWN_FILE} "
                 f"({','.join(KNOWN_HEADER)}), or create this machine's golden")
    failures.append((OVER_LIMIT, text))


def _most_lenient(rows: dict[str, GoldenRow]) -> GoldenRow | None:
    return max(rows.values(), key=lambda r: ulp_sort_value(r.max_ulp)) if rows else None


def _identity_of(rows: dict[str, GoldenRow], row: GoldenRow) -> str:
    return next(ident for ident, r in rows.items() if r is row)


def _listing(rows: dict[str, GoldenRow], name: str) -> str:
    return ", ".join(f"{ident} {ulp_text(getattr(r, f'{name}_ulp'))}" for ident, r in sorted(rows.items()))


def _within(now: float, golden: float, bound: Any = ulp_bound) -> bool:
    if math.isnan(now):
        return math.isnan(golden)
    return now <= bound(golden) or (math.isinf(golden) and math.isinf(now))
