"""The pytest plugin: `pytest --msprobe-task=free_benchmark` runs every test under the probe.

Thin and lazy, like Hypothesis's plugin: options and validation at configure time import only the
framework-free core; a framework is touched only when a test that already imported it runs under
a probe. Which framework a test is probed in (`_framework_of`): the one its module uses (module
globals that are, or come from, `torch` / `mindspore`); a module using both, or neither while torch
is imported, is probed with PyTorch; a module using neither runs under MindSpore when only
MindSpore is imported, and unprobed when no framework is.
"""

from __future__ import annotations

import hashlib
import inspect
import json
import os
import re
import sys
from pathlib import Path
from typing import Any

import pytest

TASKS = ("free_benchmark", "grad_probe", "online_dispatch")
AVAILABLE_TASKS = ("free_benchmark", "grad_probe")
FAIL_ON = ("risk", "never")
_SESSION_KEY = pytest.StashKey["MsprobeSession"]()


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("msprobe", "precision probes (pytest-msprobe)")
    group.addoption("--msprobe-task", default=None, help=f"run every test under a probe: {', '.join(TASKS)}")
    group.addoption("--msprobe-config", default=None, help="msprobe config.json (same keys as msprobe 8.3.3)")
    group.addoption("--msprobe-dump-path", default=None, help="where results go (default: .msprobe/ under rootdir)")
    group.addoption("--msprobe-fail-on", default=None,
                    help=f"{' | '.join(FAIL_ON)}: fail tests that trip a rule (risk, default) or only report (never)")
    parser.addini("msprobe_task", "default for --msprobe-task", default=None)
    parser.addini("msprobe_config", "default for --msprobe-config", default=None)
    parser.addini("msprobe_dump_path", "default for --msprobe-dump-path", default=None)
    parser.addini("msprobe_fail_on", "default for --msprobe-fail-on", default=None)


def _option(config: pytest.Config, name: str) -> Any:
    value = config.getoption(f"--msprobe-{name.replace('_', '-')}")
    if value is None:
        value = config.getini(f"msprobe_{name}") or None
    return value


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "msprobe_off: run this test without the session's probe")
    task = _option(config, "task")
    if task is None:
        return
    if task not in TASKS:
        raise pytest.UsageError(f"--msprobe-task={task!r} is not a task; allowed: {', '.join(TASKS)}")
    if task not in AVAILABLE_TASKS:
        raise pytest.UsageError(
            f"--msprobe-task={task} is not available in this version yet; allowed now: {', '.join(AVAILABLE_TASKS)}")
    fail_on = _option(config, "fail_on") or "risk"
    if fail_on not in FAIL_ON:
        raise pytest.UsageError(f"--msprobe-fail-on={fail_on!r}; allowed: {', '.join(FAIL_ON)}")
    from probes.core.config import load_config
    from probes.core.errors import ConfigError

    dump = _option(config, "dump_path")
    cfg_file = _option(config, "config")
    try:
        raw_dump = dump
        if raw_dump is None and cfg_file is None:
            raw_dump = str(Path(config.rootpath) / ".msprobe")
        probe_config = load_config(cfg_file, task=task, dump_path=raw_dump)
        if probe_config.task != task:
            raise ConfigError("task", probe_config.task, f"--msprobe-task={task} needs a {task} config")
    except ConfigError as exc:
        where = f"--msprobe-config {cfg_file}" if cfg_file else "--msprobe-task"
        raise pytest.UsageError(f"{where}: {exc}") from None
    config.stash[_SESSION_KEY] = MsprobeSession(config, probe_config, fail_on)


class MsprobeSession:
    """What the plugin keeps for one pytest run."""

    def __init__(self, config: pytest.Config, probe_config: Any, fail_on: str) -> None:
        from pytest_msprobe.tasks import TASKS as RUNNERS

        self.config = config
        self.probe_config = probe_config
        self.fail_on = fail_on
        self.task = RUNNERS[probe_config.task]()
        self.root = Path(probe_config.dump_path)
        self.results: list[tuple[str, dict[str, Any]]] = []  # (nodeid, per-test result)

    def test_dump_path(self, nodeid: str) -> Path:
        safe = re.sub(r"[^A-Za-z0-9_.-]+", "_", nodeid).strip("_")
        if len(safe) > 120:
            safe = safe[:100] + "_" + hashlib.sha1(nodeid.encode()).hexdigest()[:10]
        return self.root / "tests" / safe

    def test_config(self, item: pytest.Item) -> Any:
        from dataclasses import replace

        return replace(self.probe_config, dump_path=str(self.test_dump_path(item.nodeid)))

    def table(self) -> dict[str, dict[str, Any]]:
        return self.task.table(self.results)


def _framework_of(item: pytest.Item) -> str | None:
    """"pytorch", "mindspore", or None (no framework imported: nothing to probe)."""
    roots = set()
    module = getattr(item, "module", None)
    for value in vars(module).values() if module is not None else ():
        try:
            name = value.__name__ if inspect.ismodule(value) else getattr(value, "__module__", None)
        except Exception:  # objects with exotic __getattr__ (mocks, lazy proxies)
            continue
        if isinstance(name, str):
            roots.add(name.partition(".")[0])
    if "torch" in roots:
        return "pytorch"
    if "mindspore" in roots:
        return "mindspore"
    if "torch" in sys.modules:
        return "pytorch"
    if "mindspore" in sys.modules:
        return "mindspore"
    return None


@pytest.hookimpl(wrapper=True)
def pytest_runtest_call(item: pytest.Item) -> Any:
    session: MsprobeSession | None = item.config.stash.get(_SESSION_KEY, None)
    if session is None or item.get_closest_marker("msprobe_off"):
        return (yield)
    framework = _framework_of(item)
    if framework is None:
        return (yield)
    task = session.task
    handle = task.start(framework, session.test_config(item))
    try:
        result = yield
    finally:
        outcome = task.finish(handle)
        session.results.append((item.nodeid, outcome))
    flagged = task.flagged(outcome)
    if flagged:
        item.user_properties.append((f"msprobe_{task.name}_flagged", ",".join(flagged)))
        message = task.failure(item.nodeid, outcome)
        if message and session.fail_on == "risk":
            pytest.fail(message, pytrace=False)
    return result


def pytest_sessionfinish(session: pytest.Session) -> None:
    state: MsprobeSession | None = session.config.stash.get(_SESSION_KEY, None)
    if state is None:
        return
    workeroutput = getattr(session.config, "workeroutput", None)
    if workeroutput is not None:  # an xdist worker: the controller writes the session files
        workeroutput["msprobe"] = json.dumps(state.results)
        return
    _write_session_files(state)


@pytest.hookimpl(optionalhook=True)
def pytest_testnodedown(node: Any, error: Any) -> None:
    state: MsprobeSession | None = node.config.stash.get(_SESSION_KEY, None)
    output = getattr(node, "workeroutput", None) or {}
    if state is not None and "msprobe" in output:
        state.results.extend((nodeid, s) for nodeid, s in json.loads(output["msprobe"]))


def _write_session_files(state: MsprobeSession) -> None:
    from probes.core.writers import write_json_atomic

    if not state.results:
        return
    table = state.table()
    write_json_atomic(state.root / "summary.json", {
        "tool": state.task.name,
        "config": state.probe_config.to_dict(),
        "tests": {nodeid: state.task.test_entry(r) for nodeid, r in state.results},
        "apis" if state.task.name == "free_benchmark" else "params": table,
    })
    state.table_cache = table  # type: ignore[attr-defined]


def pytest_terminal_summary(terminalreporter: Any, exitstatus: int, config: pytest.Config) -> None:
    state: MsprobeSession | None = config.stash.get(_SESSION_KEY, None)
    if state is None or getattr(config, "workeroutput", None) is not None:
        return
    tr = terminalreporter
    tr.section(f"msprobe {state.task.name}: {state.task.table_title}")
    if not state.results:
        tr.write_line("no test ran under the probe (none imported torch or mindspore)")
        return
    for line in state.task.table_lines(state.table(), state.results):
        tr.write_line(line)
    tr.write_line(f"details: {os.fspath(state.root / 'summary.json')} and per-test files under {state.root / 'tests'}")
