"""What a tool is to the plugin: one `Tool` descriptor per tool, and the run a fixture hands a test.

A descriptor says everything the plugin, the reports and the golden checks need of its tool:
its names and keys, how a test's probe starts and stops, what the session keeps of a result
(plain dictionaries: xdist workers send them back as JSON), its verdict, its session table and
terminal lines, what its golden kind reads, how one rank's files read back, and the report
sections that draw it. Nothing outside the descriptors branches on a tool's name:
adding a tool is one module in this package, its entry in `pytest_msprobe.tools.TOOLS`, and its
keys in summary.json in `probes.core.tool_keys.TOOL_KEYS` (which the command line reads without
the plugin).

Every result has the keys the session's account reads (probes.core.session_tables.ProbeAccount):
"checked", "not_checked" (reason -> calls), "nothing_checked" (why the test gave the probe
nothing, or None) and "errors" (ProbeError dictionaries), whatever the tool calls them.
"""

from __future__ import annotations

import contextlib
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Callable

from probes.core.session_tables import ProbeError
from probes.core.table_text import short_reason
from probes.core.tool_keys import TOOL_KEYS, ToolKeys

KEPT = 50  # findings a test's result keeps (summary.json and the report count every one)

Results = list[tuple[str, dict[str, Any]]]  # (nodeid or "rank{R}", result) of a session


class ToolRun:
    """A context manager around test code; results are read after the block."""

    tool = ""

    def __init__(self, framework: str, config: Any, label: str) -> None:
        self.framework = framework
        self.config = config
        self.label = label
        self.dump_path = Path(config.dump_path)
        self.handle: Any = None
        self.closed = False
        self.summary: dict[str, Any] = {}

    def __enter__(self) -> ToolRun:
        self.start()
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def close(self) -> None:
        """Finish the run (idempotent): hooks removed, results read."""
        if self.handle is not None and not self.closed:
            self.closed = True
            self.finish()

    def start(self) -> None:  # pragma: no cover - abstract
        raise NotImplementedError

    def finish(self) -> None:  # pragma: no cover - abstract
        raise NotImplementedError


class Tool:
    """One tool as the plugin sees it (module docstring). Subclasses fill every member."""

    name = ""
    table_title = ""  # the terminal section's title
    run_class: type[ToolRun] = ToolRun  # what the tool's fixture hands a test
    # the report's sections that draw its findings, in order (pytest_msprobe.reports.sections.findings)
    report_sections: tuple[str, ...] = ()

    # -- its keys and labels in summary.json: probes.core.tool_keys states them once, for the CLI too --
    @property
    def keys(self) -> ToolKeys:
        return TOOL_KEYS[self.name]

    @property
    def table_key(self) -> str:
        return self.keys.table_key

    @property
    def checked_label(self) -> str:
        return self.keys.checked_label

    @property
    def findings_key(self) -> str:
        return self.keys.findings_key

    @property
    def findings_label(self) -> str:
        return self.keys.findings_label

    def session_config_problem(self, config: Any) -> str | None:
        """Why `config` cannot drive a whole pytest session under this tool (each test one probe
        run), with what is allowed instead; None when it can."""
        return None

    # -- a test under the session's probe -------------------------------------------------------
    def start(self, framework: str, config: Any) -> Any:
        """The test's probe, started (None: the test runs unprobed, `read` says why)."""
        return entered(self.run_class(framework, config, ""))

    def stop(self, run: Any) -> None:
        """Stop the test's probe (hooks removed, pending checks settled, files written)."""
        if run is not None:
            run.close()

    def read(self, run: Any) -> dict[str, Any]:
        """The result of a stopped run, as the session keeps it."""
        return self.result_of(run.summary)

    def result_of(self, summary: Mapping[str, Any]) -> dict[str, Any]:  # pragma: no cover - abstract
        """What the session keeps of the tool's summary (a test's, or a rank's)."""
        raise NotImplementedError

    def blank(self, framework: str, config: Any) -> dict[str, Any]:  # pragma: no cover - abstract
        """The result of a test that gave the probe nothing (its probe failed, or never ran)."""
        raise NotImplementedError

    def failed(self, framework: str, config: Any, stage: str, exc: BaseException) -> dict[str, Any]:
        """The result of a test whose probe raised at `stage` (start, stop, results): a probe error."""
        result = self.blank(framework, config)
        add_failure(result, stage, exc)
        result["nothing_checked"] = f"the probe failed at its {stage} ({result['probe_failure'].splitlines()[0][:200]})"
        return result

    # -- its verdict and entries ----------------------------------------------------------------
    def flagged(self, result: dict[str, Any]) -> list[str]:  # pragma: no cover - abstract
        raise NotImplementedError

    def failure(self, nodeid: str, result: dict[str, Any]) -> str | None:  # pragma: no cover - abstract
        """The test's failure message when its rule tripped, else None."""
        raise NotImplementedError

    def properties(self, result: dict[str, Any]) -> list[tuple[str, Any]]:  # pragma: no cover - abstract
        """JUnit XML properties of a test (what a CI dashboard shows without opening files)."""
        raise NotImplementedError

    def test_entry(self, result: dict[str, Any]) -> dict[str, Any]:  # pragma: no cover - abstract
        raise NotImplementedError

    def entry(self, result: dict[str, Any]) -> dict[str, Any]:
        """A test's entry in summary.json: its findings and evidence, and its account."""
        return {**self.test_entry(result), "errors": result["errors"], "checked": result["checked"],
                "not_checked": result["not_checked"], "nothing_checked": result["nothing_checked"]}

    # -- the session ----------------------------------------------------------------------------
    def table(self, results: Results) -> dict[str, Any]:  # pragma: no cover - abstract
        raise NotImplementedError

    def table_lines(self, table: dict[str, Any], results: Results) -> list[str]:  # pragma: no cover - abstract
        raise NotImplementedError

    def golden_input(self, outcome: dict[str, Any], dump: Any) -> Any:  # pragma: no cover - abstract
        """What its golden kind (pytest_msprobe.golden.kinds.KINDS[name]) reads of a test's result
        under the session's probe (`dump`: the test's folder)."""
        raise NotImplementedError

    def run_golden_input(self, run: Any) -> Any:  # pragma: no cover - abstract
        """What its golden kind reads of a fixture's run."""
        raise NotImplementedError

    def read_rank(self, summaries: list[dict[str, Any]], paths: list[Path], rank: int
                  ) -> tuple[dict[str, Any], list[dict[str, Any]], list[dict[str, Any]]]:  # pragma: no cover - abstract
        """One rank of a multi-rank dump read back (pytest_msprobe.reports.ranks): from its summary
        files (`paths`, read as `summaries`), the result the session would keep, the rank's findings
        in order (rank, what, name, step, order, figure, threshold, figure_text, evidence) and its
        probe errors."""
        raise NotImplementedError

    def make_run(self, framework: str, config_for: Callable[..., Any], dump: Path, label: str,
                 overrides: dict[str, Any]) -> ToolRun:
        """The fixture's run: `config_for(task, dump_path, overrides)` gives the effective config;
        keyword arguments of the fixture are config keys."""
        return self.run_class(framework, config_for(self.name, dump, overrides), label)


def entered(run: Any) -> Any:
    """A tool run started; one that fails to start is closed again, so no hook stays behind."""
    try:
        return run.__enter__()
    except Exception:
        with contextlib.suppress(Exception):
            run.close()
        raise


def add_failure(result: dict[str, Any], stage: str, exc: BaseException) -> None:
    """Record that the probe itself raised at `stage` as a probe error of the test's result."""
    text = f"{type(exc).__name__}: {exc}"
    result["errors"] = result["errors"] + [ProbeError(f"probe {stage}", text, 1).to_dict()]
    result["probe_failure"] = text


def shown(v: Any) -> str:
    """A figure as a finding's text shows it."""
    return f"{v:.6g}" if isinstance(v, float) else str(v)


def nothing_checked(not_checked: Mapping[str, int], none: str) -> str:
    """Why a test gave the probe nothing: `none` when it made no call the probe saw, else the
    commonest reason its calls were left unchecked."""
    if not not_checked:
        return none
    reason = max(not_checked, key=lambda r: not_checked[r])
    more = ", ..." if len(not_checked) > 1 else ""
    return f"none of its {sum(not_checked.values())} call(s) could be checked ({short_reason(reason)}{more})"
