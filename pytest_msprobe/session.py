"""Everything one pytest run of the plugin keeps, in one object: the session probe's per-test
results (with --msprobe-task), the per-API and catalogue rows, every test's outcome and folder;
what an xdist worker sends back and how the controller merges it; and the end of the session:
summary.json, report.html and the terminal lines, all written from one summary.

The options (pytest_msprobe.options) are validated once and never change; what changes during
the run lives here. Only the controller writes the session's files (a worker sends its part).
"""

from __future__ import annotations

import datetime
import json
import os
from collections.abc import Mapping
from dataclasses import replace
from pathlib import Path
from typing import Any, TypedDict

import pytest

from pytest_msprobe.options import MsprobeOptions, test_dump_path
from pytest_msprobe.stash import SESSION_KEY, session_of

__all__ = ["PAYLOAD_KEY", "SESSION_KEY", "PluginSession", "ProbeSession", "WorkerPayload", "session_files_dir",
           "session_of", "session_outcomes"]

PAYLOAD_KEY = "msprobe"  # the key of an xdist worker's part in its workeroutput


class WorkerPayload(TypedDict):
    """What an xdist worker sends back at its end (JSON), merged by the controller."""

    results: list[tuple[str, dict[str, Any]]]  # the session probe's (nodeid, result), if any
    unprobed: dict[str, int]
    folders: list[str]
    api_results: list[dict[str, Any]]
    catalogue_results: list[dict[str, Any]]


class ProbeSession:
    """The session's probe (--msprobe-task): started around each test, its results judged."""

    def __init__(self, probe_config: Any, fail_on: str) -> None:
        from pytest_msprobe.tools import tool

        self.probe_config = probe_config
        self.fail_on = fail_on
        self.task = tool(probe_config.task)
        self.root = Path(probe_config.dump_path)
        self.results: list[tuple[str, dict[str, Any]]] = []  # (nodeid, per-test result)
        self.unprobed: dict[str, int] = {}  # why a test ran without the session's probe -> tests

    def test_dump_path(self, nodeid: str) -> Path:
        return test_dump_path(self.root, nodeid)

    def test_config(self, item: pytest.Item) -> Any:
        return replace(self.probe_config, dump_path=str(self.test_dump_path(item.nodeid)))

    def table(self) -> dict[str, Any]:
        return self.task.table(self.results)

    def count_unprobed(self, reason: str) -> None:
        self.unprobed[reason] = self.unprobed.get(reason, 0) + 1

    def start(self, framework: str, config: Any) -> tuple[Any, BaseException | None]:
        """The test's probe run, or the exception that kept it from starting (the test then runs
        without it: a probe failure is the probe's, not the test's)."""
        try:
            return self.task.start(framework, config), None
        except Exception as exc:
            return None, exc

    def finish(self, nodeid: str, framework: str, config: Any, run: Any, start_error: BaseException | None) -> dict:
        """Stop the test's probe and keep its result; a probe that fails here (or failed to start)
        leaves a result with that failure as its probe error, so the test is still in the
        session's summary and report."""
        task = self.task
        if start_error is not None:
            outcome = task.failed(framework, config, "start", start_error)
        else:
            stage = "stop"
            try:
                task.stop(run)
                stage = "results"
                outcome = task.read(run)
            except Exception as exc:
                outcome = task.failed(framework, config, stage, exc)
        self.results.append((nodeid, outcome))
        return outcome

    def verdict(self, item: pytest.Item, outcome: dict[str, Any], judged_by_golden: bool) -> list[str]:
        """The failures the probe adds to the test: its rule tripped (unless --msprobe-fail-on=never
        or a golden judges the test), or, in strict mode only, the probe itself failed."""
        task, failures = self.task, []
        try:
            item.user_properties.extend(task.properties(outcome))
            message = task.failure(item.nodeid, outcome) if task.flagged(outcome) else None
        except Exception as exc:  # reading a result is the plugin's work: never the test's failure
            from pytest_msprobe.tools.base import add_failure

            add_failure(outcome, "verdict", exc)
            message = None
        if message and self.fail_on == "risk" and not judged_by_golden:
            failures.append(message)
        failure = outcome.get("probe_failure")
        if failure is not None:
            item.user_properties.append(("msprobe_probe_error", failure))
            if self.probe_config.strict:
                failures.append(
                    f"msprobe {task.name}: the probe failed in {item.nodeid}: {failure}\n"
                    "\"strict\": true in the config makes a probe failure fail its test; without it the failure is "
                    "recorded as a probe error (summary.json, report.html) and the test keeps its own outcome.")
        return failures

    def summary_part(self, outcomes: Mapping[str, str]) -> dict[str, Any]:
        """The session probe's keys of summary.json."""
        from probes.core.session_tables import ProbeAccount, write_table

        task = self.task
        tests = {nodeid: dict(task.entry(r), outcome=outcomes.get(nodeid, "unknown")) for nodeid, r in self.results}
        part: dict[str, Any] = {
            "config": self.probe_config.to_dict(),
            "tests": tests,
            task.table_key: write_table(self.table()),
            "probe": ProbeAccount.of(tests).to_dict(),
            "unprobed": dict(self.unprobed),
        }
        similarities = {k: v for _, r in self.results for k, v in r.get("similarities", {}).items()}
        if similarities:
            part["similarities"] = similarities
        return part

    def lines(self) -> tuple[str, list[str]]:
        """The terminal section's title and lines."""
        from probes.core.session_tables import ProbeAccount
        from probes.core.table_text import account_lines

        task, lines = self.task, []
        unprobed = ", ".join(f"{n} {reason}" for reason, n in sorted(self.unprobed.items(), key=lambda kv: -kv[1]))
        if not self.results:
            lines.append("no test ran under the probe" + (f": {unprobed}" if unprobed else "")
                         + " (a test runs under it when its module uses torch or mindspore, unless it is marked "
                           "msprobe_off or runs its own probes)")
        else:
            lines += task.table_lines(self.table(), self.results)
            entries = {nodeid: task.entry(r) for nodeid, r in self.results}
            lines += account_lines(ProbeAccount.of(entries), task.checked_label)
            if unprobed:
                lines.append(f"without the session's probe: {unprobed}")
        return f"msprobe {task.name}: {task.table_title}", lines


class PluginSession:
    """The plugin's state for one pytest run (module docstring)."""

    def __init__(self, pytest_config: pytest.Config, options: MsprobeOptions, probe: ProbeSession | None) -> None:
        self.pytest_config = pytest_config
        self.options = options
        self.probe = probe
        self.root = options.root  # where results go; the repository's own suite points it at a temporary folder
        self.api_results: list[dict[str, Any]] = []  # one per @msprobe_api test that ran
        self.catalogue_results: list[dict[str, Any]] = []  # one per API precision catalogue test
        self.catalogue_info: dict[str, Any] | None = None  # the catalogue's files, for the terminal
        self.outcomes: dict[str, str] = {}  # nodeid -> outcome of every test the session ran
        self.folders: list[str] = []  # the tests whose folders hold this session's files (emptied at start)
        self.report: Path | None = None
        self.report_error: str | None = None

    # -- during the run ----------------------------------------------------------------------
    def test_dump_path(self, nodeid: str) -> Path:
        return test_dump_path(self.root, nodeid)

    def probe_config(self, task: str | None, dump_path: Path | str | None = None,
                     overrides: dict | None = None) -> Any:
        """The effective config for `task` (the options' config file and rule), under this session's root."""
        return self.options.probe_config(task, dump_path, overrides, root=self.root)

    def record_outcome(self, report: pytest.TestReport) -> None:
        if not (report.when == "call" or report.outcome != "passed"):
            return
        if self.outcomes.get(report.nodeid) != "failed":  # a failed teardown stays failed
            self.outcomes[report.nodeid] = report.outcome

    # -- xdist -------------------------------------------------------------------------------
    def worker_payload(self) -> str:
        payload: WorkerPayload = {
            "results": self.probe.results if self.probe is not None else [],
            "unprobed": self.probe.unprobed if self.probe is not None else {},
            "folders": self.folders, "api_results": self.api_results, "catalogue_results": self.catalogue_results,
        }
        return json.dumps(payload)

    def merge(self, sent: str) -> None:
        """A worker's payload, added to the controller's session."""
        payload: WorkerPayload = json.loads(sent)
        if self.probe is not None:
            self.probe.results.extend((nodeid, r) for nodeid, r in payload["results"])
            for reason, n in payload["unprobed"].items():
                self.probe.unprobed[reason] = self.probe.unprobed.get(reason, 0) + n
        self.folders.extend(payload["folders"])
        self.api_results.extend(payload["api_results"])
        self.catalogue_results.extend(payload["catalogue_results"])

    # -- the end -----------------------------------------------------------------------------
    def finish(self) -> None:
        """The session's files (controller only): api_checks.json, the catalogue's files, and
        summary.json with report.html whenever the session had something to summarise, so neither
        is left over from an earlier session next to the other."""
        from probes.core.writers import write_json_atomic

        if self.api_results:
            write_json_atomic(self.root / "api_checks.json", {"tests": self.api_results})
        if self.catalogue_results:
            from pytest_msprobe.catalogue.run import finish_session

            self.catalogue_info = finish_session(self)
        if self.probe is None and not (self.catalogue_results or self.api_results):
            return
        summary = self.summary()
        # the probe's results go where its config says (a config file may name its dump_path)
        where = session_files_dir(self.probe.root if self.probe is not None else self.root)
        write_json_atomic(where / "summary.json", summary)
        try:
            from pytest_msprobe.reports.html import render_html

            self.report = render_html(summary, where / "report.html")
        except Exception as exc:  # the report is a view of summary.json: never fail the session for it
            self.report_error = f"{type(exc).__name__}: {exc}"
        if self.catalogue_info is not None and self.probe is None:  # the catalogue's lines name the report
            self.catalogue_info.update(report=self.report, report_error=self.report_error)

    def summary(self) -> dict[str, Any]:
        """summary.json: one skeleton for every session (a probe's, or the catalogue / per-API checks')."""
        summary: dict[str, Any] = {"tool": self.probe.task.name if self.probe is not None else "catalogue",
                                   "date": _now(), "versions": _versions(), "device": self.options.device}
        if self.probe is not None:
            summary.update(self.probe.summary_part(self.outcomes))
        for key, rows in (("api_checks", self.api_results), ("catalogue", self.catalogue_results)):
            if rows or self.probe is None:
                summary[key] = rows
        summary["session"] = session_outcomes(self.outcomes)
        summary["test_folders"] = sorted(set(self.folders))
        return summary

    def display(self, tr: Any) -> None:
        """The session's terminal sections."""
        if self.catalogue_info is not None:
            from pytest_msprobe.catalogue.summary import catalogue_lines

            tr.section("msprobe API precision catalogue")
            for line in catalogue_lines(self.catalogue_results, self.catalogue_info):
                tr.write_line(line)
        if self.api_results:
            from probes.core.table_text import api_check_lines

            tr.section("msprobe per-API checks")
            for line in api_check_lines(self.api_results):
                tr.write_line(line)
            tr.write_line(f"details: {os.fspath(self.root / 'api_checks.json')}")
            if self.probe is None and self.catalogue_info is None:
                self._report_line(tr)
        if self.probe is None:
            return
        title, lines = self.probe.lines()
        tr.section(title)
        for line in lines:
            tr.write_line(line)
        summary_path = session_files_dir(self.probe.root) / "summary.json"
        tr.write_line(f"details: {os.fspath(summary_path)} and per-test files under {self.probe.root / 'tests'}")
        self._report_line(tr)

    def _report_line(self, tr: Any) -> None:
        if self.report is not None:
            tr.write_line(f"report: {os.fspath(self.report)}")
        elif self.report_error:
            tr.write_line(f"report.html could not be written: {self.report_error}")


def session_files_dir(root: Path) -> Path:
    """Where a session's summary.json and report.html go: the dump root, or its ``rank{R}``
    folder when a launcher (torchrun) started one pytest per rank, so that the ranks' sessions
    never write the same file (their per-test files are already split by rank)."""
    try:
        world = int(os.environ.get("WORLD_SIZE", "1"))
        rank = int(os.environ.get("RANK", "0"))
    except ValueError:
        return root
    return root / f"rank{rank}" if world > 1 else root


def session_outcomes(outcomes: Mapping[str, str]) -> dict[str, int]:
    """How many tests the session ran, by outcome (the report's cards count these, so they agree
    with pytest's own line: model tests, per-API checks and catalogue tests alike)."""
    counts = {"tests": len(outcomes)}
    for outcome in outcomes.values():
        counts[outcome] = counts.get(outcome, 0) + 1
    return counts


def _now() -> str:
    return datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M:%S UTC")


def _versions() -> dict[str, str]:
    """The versions a session's numbers depend on (frameworks only when this process imported them)."""
    from probes.core.versions import imported_frameworks, versions

    return versions("pytest-msprobe", "pytest", *imported_frameworks())
