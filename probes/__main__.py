"""Command line: ``python -m probes <subcommand> ...`` (also installed as ``msprobe-probes``).

Subcommands:

* ``grad-compare DIR_A DIR_B OUT [--first-step-min 0.97] [--max-drop 0.03] [--no-plots]``:
  compare two grad_probe dumps (two dump roots holding ``rank{R}`` folders, or two rank folders),
  write similarities.csv / similarities_picture / summary.json under OUT, print the flagged
  parameters and the summary per step. Exit status: 0 clean, 1 when the 0.97/0.03 rule flags
  anything or something could not be compared (a rank, step set or parameter present in one run
  only, shape/dtype mismatch), 2 on usage errors.
* ``summary DIR [--csv OUT]``: what a dump directory holds. For a pytest session's folder, first
  the latest session as its report shows it (from its summary.json: tests by outcome, the tests
  the probe flagged, its per-API / per-op / per-parameter table, the probe's own account of errors
  and unchecked calls, the flagged per-API checks, the catalogue's failing rows); then the tables
  of :func:`probes.results.load` (the DataFrames a notebook gets): per table its rows, tests, ranks
  and steps, and the findings of the latest session's tests (inconsistent APIs, failing ops, lowest
  gradient similarities, worst catalogue APIs), with the rows of earlier sessions, of per-API
  searches and of the catalogue's measurements counted apart. ``--csv`` writes every non-empty table to
  OUT/<table>.csv. Exit status 0, 2 on usage errors.
"""

from __future__ import annotations

import argparse
import sys
from collections import Counter
from collections.abc import Sequence
from pathlib import Path

from probes.results import EARLIER, SESSION_TABLES

EXIT_OK = 0
EXIT_FLAGGED = 1
EXIT_USAGE = 2
MAX_LINES = 20


def _fmt(value: float | None) -> str:
    from probes.core.number_format import short_number

    return short_number(value, digits=6, fixed=True)


def _print_rank(res, label: str, out) -> None:
    from probes.grad_probe.direction_rule import rule_text

    print(f"{label}: {res.dir_a} vs {res.dir_b}", file=out)
    if not res.steps:
        print("  no step present in both runs: nothing compared", file=out)
        return
    steps = res.steps
    width = max(8, *(len(str(s)) for s in steps))
    print("  " + "step".ljust(9) + " ".join(str(s).rjust(width) for s in steps[:MAX_LINES])
          + (" ..." if len(steps) > MAX_LINES else ""), file=out)
    print("  " + "summary".ljust(9) + " ".join(_fmt(res.summary[s]).rjust(width) for s in steps[:MAX_LINES]),
          file=out)
    if res.flags:
        print(f"  flagged ({rule_text(res.first_step_min, res.max_drop)}); first flagged step "
              f"{res.first_flagged_step()}:", file=out)
        for f in res.flags[:MAX_LINES]:
            print(f"    step {f.step}  {f.param}: {f.describe(res.first_step_min, res.max_drop)}", file=out)
        if len(res.flags) > MAX_LINES:
            print(f"    ... {len(res.flags) - MAX_LINES} more in {res.out}", file=out)
    else:
        print("  no parameter flagged", file=out)
    problems = res.problems()
    if problems:
        print(f"  {len(problems)} cells not comparable:", file=out)
        for row, step, status in problems[:MAX_LINES]:
            print(f"    step {step}  {row}: {status}", file=out)
    if res.steps_only_a or res.steps_only_b:
        print(f"  steps in one run only: a={res.steps_only_a} b={res.steps_only_b}", file=out)


def _grad_compare(args: argparse.Namespace) -> int:
    from probes.grad_probe.comparator import GradComparator, is_dump_root
    from probes.grad_probe.direction_rule import check_thresholds

    err = sys.stderr
    for label, path in (("DIR_A", args.dir_a), ("DIR_B", args.dir_b)):
        if not Path(path).exists():
            print(f"grad-compare: error: {label} does not exist: {path}", file=err)
            return EXIT_USAGE
        if not Path(path).is_dir():
            print(f"grad-compare: error: {label} is not a directory: {path}", file=err)
            return EXIT_USAGE
    try:
        check_thresholds(args.first_step_min, args.max_drop)
    except ValueError as exc:
        print(f"grad-compare: error: {exc}", file=err)
        return EXIT_USAGE
    root_a, root_b = is_dump_root(args.dir_a), is_dump_root(args.dir_b)
    if root_a != root_b:
        print(f"grad-compare: error: DIR_A is a {'dump root' if root_a else 'rank folder'} but DIR_B is a "
              f"{'dump root' if root_b else 'rank folder'}; pass two of the same kind", file=err)
        return EXIT_USAGE
    kw = dict(first_step_min=args.first_step_min, max_drop=args.max_drop, plots=not args.no_plots)
    out = sys.stdout
    if root_a:
        dist = GradComparator.compare_distributed(args.dir_a, args.dir_b, args.out, **kw)
        for rank, status in sorted(dist.rank_status.items()):
            if rank in dist:
                _print_rank(dist[rank], f"rank{rank}", out)
            else:
                print(f"rank{rank}: {status} (present in one run only)", file=out)
        clean = dist.ok
    else:
        res = GradComparator.compare(args.dir_a, args.dir_b, args.out, **kw)
        _print_rank(res, "rank", out)
        clean = res.ok
    print(f"results: {args.out}", file=out)
    return EXIT_OK if clean else EXIT_FLAGGED


def _summary(args: argparse.Namespace) -> int:
    from probes.core.errors import ConfigError
    from probes.results import latest_session, load, session_tests

    try:
        res = load(args.dir)
    except ConfigError as exc:
        print(f"summary: error: {exc}", file=sys.stderr)
        return EXIT_USAGE
    out = sys.stdout
    print(f"{res.root}", file=out)
    session = latest_session(res.summaries)
    scope = None
    if session is not None:
        for line in _session_lines(*session):
            print(f"  {line}", file=out)
        scope = session_tests(session[1])
    for name, frame in res.tables().items():
        if not len(frame) or name in SESSION_TABLES:  # the session's own tables are in its lines above
            continue
        facets = [f"{len(frame)} rows"]
        for column in ("test", "rank", "step"):
            if column in frame.columns:
                values = frame[column].dropna()
                values = values[values != ""] if column == "test" else values
                if len(values):
                    facets.append(f"{values.nunique()} {column}{'s' if values.nunique() != 1 else ''}")
        judged, apart = _in_scope(frame, scope)
        if apart and not len(judged):
            facets.append("none of them findings of the latest session")
        print(f"  {name}: {', '.join(facets)}", file=out)
        for line in _findings(name, judged):
            print(f"    {line}", file=out)
        if apart:
            print("    not findings of the latest session: " + ", ".join(f"{n} rows {what}" for what, n in apart),
                  file=out)
    if not any(len(f) for f in res.tables().values()):
        print("  no probe results found (free_benchmark.csv, grad_summary_*.csv, compare_result_rank*.csv, "
              "similarities.csv, catalogue.csv)", file=out)
    if args.csv:
        target = Path(args.csv)
        target.mkdir(parents=True, exist_ok=True)
        for name, frame in res.tables().items():
            if len(frame):
                frame.to_csv(target / f"{name}.csv", index=False)
        print(f"tables: {target}", file=out)
    return EXIT_OK


def _in_scope(frame, scope: dict[str, set[str]] | None):  # noqa: ANN001, ANN202 - pandas DataFrames
    """The rows that are findings of the latest session, and what the others are: a per-API
    check's rows are its search's examples (its verdict is the check's), the catalogue's are its
    measurements (its statuses are the catalogue's), and the rest are of earlier sessions."""
    if scope is None or "session" not in frame.columns:
        return frame, []
    earlier = frame["session"] == EARLIER
    none = earlier & False
    searches = frame["test"].isin(scope["api_checks"]) & ~earlier if "test" in frame.columns else none
    catalogue = frame["test"].isin(scope["catalogue"]) & ~earlier if "test" in frame.columns else none
    apart = [(what, int(mask.sum())) for what, mask in (
        ("of the per-API checks' Hypothesis searches (their verdicts are above)", searches),
        ("of the catalogue's measurements (its statuses are above)", catalogue),
        ("of earlier sessions (their tests did not run in the latest one)", earlier)) if mask.any()]
    return frame[~(earlier | searches | catalogue)], apart


def _session_lines(path: str, data: dict) -> list[str]:
    """The latest session as its report.html shows it: the same counts, the same tables, the same
    flagged checks, the probe's own account."""
    from probes.core.catalogue_status import STATUS_ORDER, failing
    from probes.core.session_tables import ApiRow, OpRow, ParamRow, ProbeAccount, read_table
    from probes.core.table_text import account_lines, risky_table_lines
    from probes.core.tool_keys import TOOL_KEYS

    counts = data.get("session") or {}
    by_outcome = ", ".join(f"{counts[k]} {k}" for k in ("passed", "failed", "skipped", "error") if counts.get(k))
    lines = [f"session {data.get('date', '')} ({path}): {counts.get('tests', 0)} tests"
             + (f": {by_outcome}" if by_outcome else "")]
    tool, tests = data.get("tool"), data.get("tests")
    keys = TOOL_KEYS.get(tool) if isinstance(tool, str) else None
    if keys is not None and isinstance(tests, dict):
        hit = {t: e.get(keys.findings_key) for t, e in tests.items() if isinstance(e, dict) and e.get(keys.findings_key)}
        lines.append(f"{tool}: {len(tests)} tests under the probe, {len(hit)} with {keys.findings_label}")
        for test, names in list(hit.items())[:MAX_LINES // 2]:
            lines.append(f"  {test}: {', '.join(map(str, names[:5]))}" + (" ..." if len(names) > 5 else ""))
        table = read_table(keys.row, data.get(keys.table_key))
        if keys.row is ApiRow:
            lines += [f"  {line}" for line in risky_table_lines(table)]
        elif keys.row is OpRow:
            bad = sorted((op for op, r in table.items() if r.failed), key=lambda op: -table[op].failed)
            lines.append(f"  {len(table)} ops compared, {len(bad)} failing"
                         + (": " + ", ".join(f"{op} ({table[op].failed} calls)" for op in bad[:5]) if bad else ""))
        elif keys.row is ParamRow:
            lines.append(f"  {len(table)} parameter(s) with non-finite gradients"
                         + (": " + ", ".join(list(table)[:5]) if table else ""))
        if "probe" in data:
            account = ProbeAccount.from_dict("probe", data["probe"])
            lines += [f"  {line}" for line in account_lines(account, keys.checked_label)]
    checks = [r for r in data.get("api_checks") or [] if isinstance(r, dict)]
    if checks:
        flagged = [r for r in checks if r.get("flagged")]
        lines.append(f"per-API checks: {len(checks)} run, {len(flagged)} flagged")
        for r in sorted(flagged, key=lambda r: (str(r.get("api")), str(r.get("dtype")), str(r.get("pert_mode")))):
            lines.append(f"  {r.get('api')} [{r.get('dtype')}, {r.get('pert_mode')}]: {r.get('flagged')}")
    rows = [r for r in data.get("catalogue") or [] if isinstance(r, dict)]
    if rows:
        statuses = Counter(str(r.get("status", "")) for r in rows)
        order = [s for s in STATUS_ORDER if statuses.get(s)] + sorted(set(statuses) - set(STATUS_ORDER))
        lines.append(f"catalogue: {len(rows)} API x dtype: " + ", ".join(f"{statuses[s]} {s}" for s in order))
        for r in [r for r in rows if failing(r)][:MAX_LINES // 2]:
            lines.append(f"  {r.get('api')} {r.get('dtype')}: {r.get('status')}: {r.get('message', '')}"[:200])
    return lines


def _free_benchmark_lines(frame) -> list[str]:  # noqa: ANN001 - a pandas DataFrame
    calls = frame.assign(where=frame["test"] + ":" + frame["call"].astype(str))
    top = (calls.groupby("api").agg(calls=("where", "nunique"), worst=("max_rel", "max"))
           .sort_values("worst", ascending=False))
    return [f"{a}: {int(r['calls'])} inconsistent call{'s' if r['calls'] != 1 else ''}, worst max_rel {r['worst']:.4g}"
            for a, r in top.head(MAX_LINES // 2).iterrows()]


def _online_dispatch_lines(frame) -> list[str]:  # noqa: ANN001
    if "Accuracy Reached or Not" not in frame.columns:
        return []
    failing = frame[frame["Accuracy Reached or Not"].isin(["No", "Unmatched"])]
    lines = [f"{len(failing)} failing output leaves"]
    for _, r in failing.head(MAX_LINES // 2).iterrows():
        lines.append(f"{r.get('NPU Name', '')}: Cosine {r.get('Cosine', '')}, MaxAbsErr {r.get('MaxAbsErr', '')}")
    return lines


def _similarity_lines(frame) -> list[str]:  # noqa: ANN001
    low = frame[frame["param"] != "summary"].sort_values("similarity").head(5)
    return [f"lowest: {r['param']} at step {r['step']}: {r['similarity']:.4f}" for _, r in low.iterrows()]


def _catalogue_lines(frame) -> list[str]:  # noqa: ANN001
    from probes.core.catalogue_status import STATUS_RANK

    counts = frame["status"].value_counts().to_dict()
    # failing statuses (regressed, over limit, ...) first, then the largest max ulp
    order = frame.assign(rank=frame["status"].map(STATUS_RANK).fillna(len(STATUS_RANK)))
    worst = order.sort_values(["rank", "max_ulp"], ascending=[True, False]).head(5)
    return [", ".join(f"{v} {k}" for k, v in counts.items())] + [
        f"{r['api']} {r['dtype']}: max {r['max_ulp']:.4g} ulp, p99 {r['p99_ulp']:.4g} ({r['status']})"
        for _, r in worst.iterrows()]


def _grad_stats_lines(frame) -> list[str]:  # noqa: ANN001
    return [f"{frame['param'].nunique()} parameters, statistics: {', '.join(sorted(frame['stat'].unique())[:8])}"]


# per table of probes.results: a few lines on what to look at first
_FINDINGS = {"free_benchmark": _free_benchmark_lines, "online_dispatch": _online_dispatch_lines,
             "grad_similarities": _similarity_lines, "catalogue": _catalogue_lines, "grad_stats": _grad_stats_lines}


def _findings(name: str, frame) -> list[str]:  # noqa: ANN001 - a pandas DataFrame
    lines = _FINDINGS.get(name)
    return lines(frame) if lines is not None and len(frame) else []


def build_parser() -> argparse.ArgumentParser:
    from probes.grad_probe.direction_rule import FIRST_STEP_MIN, MAX_DROP

    parser = argparse.ArgumentParser(prog="python -m probes", description="pytest-msprobe command line tools")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    gc = sub.add_parser("grad-compare", help="compare the gradient directions of two grad_probe dumps",
                        description="Compare two grad_probe dumps (dump roots or rank folders). Exit status 0 when "
                                    "clean, 1 when the rule flags a step or data could not be compared, 2 on "
                                    "usage errors.")
    gc.add_argument("dir_a", metavar="DIR_A", help="first dump (root with rank{R} folders, or one rank folder)")
    gc.add_argument("dir_b", metavar="DIR_B", help="second dump, same kind as DIR_A")
    gc.add_argument("out", metavar="OUT", help="output folder (created)")
    gc.add_argument("--first-step-min", type=float, default=FIRST_STEP_MIN,
                    help=f"flag a similarity below this at the first compared step (default {FIRST_STEP_MIN})")
    gc.add_argument("--max-drop", type=float, default=MAX_DROP,
                    help=f"flag a drop larger than this from the previous compared step (default {MAX_DROP})")
    gc.add_argument("--no-plots", action="store_true", help="do not write similarities_picture/*.png")
    gc.set_defaults(func=_grad_compare)
    sm = sub.add_parser("summary", help="what a dump directory holds (the tables of probes.results.load)",
                        description="Read every probe result under DIR (probes.results.load) and print its tables "
                                    "and findings.")
    sm.add_argument("dir", metavar="DIR", help="a dump_path, a multi-rank dump, or a pytest session's .msprobe/")
    sm.add_argument("--csv", metavar="OUT", default=None, help="also write each table to OUT/<table>.csv")
    sm.set_defaults(func=_summary)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    try:
        args = parser.parse_args(argv)
    except SystemExit as exc:  # argparse: usage errors exit 2, --help exits 0
        return int(exc.code or 0)
    if getattr(args, "func", None) is None:
        parser.print_help(sys.stderr)
        return EXIT_USAGE
    return args.func(args)


if __name__ == "__main__":
    sys.exit(main())
