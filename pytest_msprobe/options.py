"""The plugin's options, validated once at configure time and frozen, and where each test's files go.

A leaf of the plugin: the plugin, the catalogue's test runner and the reports read these without
importing the plugin module (no import cycle through the hooks). It imports no framework. What
changes during a run (results, outcomes) is the session's (pytest_msprobe.session).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from probes.backends.devices import DEVICES
from probes.core.config import TASKS
from probes.core.rules import FREE_BENCHMARK_RULES
from probes.core.tool_keys import TOOL_KEYS

__all__ = ["FAIL_ON", "OPTIONS_KEY", "MsprobeOptions", "options_of", "test_dump_path"]

#: --msprobe-fail-on: fail the tests that trip a rule, or only report them
FAIL_ON = ("risk", "never")
OPTIONS_KEY = pytest.StashKey["MsprobeOptions"]()


def options_of(config: pytest.Config) -> MsprobeOptions:
    """The plugin's validated options of this pytest run."""
    return config.stash[OPTIONS_KEY]


def _option(config: pytest.Config, name: str) -> Any:
    value = config.getoption(f"--msprobe-{name.replace('_', '-')}")
    if value is None:
        value = config.getini(f"msprobe_{name}") or None
    return value


class MsprobeOptions:
    """The plugin's options after validation; the probe config is read lazily (fixtures).
    Frozen once validated: assigning an attribute raises."""

    _frozen = False

    def __setattr__(self, name: str, value: Any) -> None:
        if self._frozen:
            raise AttributeError(f"MsprobeOptions are frozen once validated ({name!r}); session state belongs to "
                                 "pytest_msprobe.session.PluginSession")
        object.__setattr__(self, name, value)

    def __init__(self, config: pytest.Config) -> None:
        self.pytest_config = config
        self.task: str | None = _option(config, "task")
        self.cfg_file: str | None = _option(config, "config")
        self.fail_on: str = _option(config, "fail_on") or "risk"
        self.device_choice: str = _option(config, "device") or "auto"
        self.regen_golden = bool(_option(config, "regen_golden"))
        self.rule_given: str | None = _option(config, "rule")
        if self.rule_given is not None and self.rule_given not in FREE_BENCHMARK_RULES:
            raise pytest.UsageError(f"--msprobe-rule={self.rule_given!r}; allowed: {', '.join(FREE_BENCHMARK_RULES)}")
        dump = _option(config, "dump_path")
        # absolute: summary.json's evidence paths must resolve from the report's folder, not the shell's
        self.root = Path(dump).absolute() if dump is not None else Path(config.rootpath) / ".msprobe"
        self.dump_given = dump is not None
        self._device: str | None = None
        if self.task is not None and self.task not in TASKS:
            raise pytest.UsageError(f"--msprobe-task={self.task!r} is not a task; allowed: {', '.join(TASKS)}")
        if self.fail_on not in FAIL_ON:
            raise pytest.UsageError(f"--msprobe-fail-on={self.fail_on!r}; allowed: {', '.join(FAIL_ON)}")
        if self.device_choice not in DEVICES:
            raise pytest.UsageError(f"--msprobe-device={self.device_choice!r}; allowed: {', '.join(DEVICES)}")
        if self.task is not None and self.cfg_file is not None:
            self._check_config_task()
        if self.device_choice in ("cuda", "npu"):  # asked for explicitly: it must be there
            self.device  # noqa: B018 - resolve now, so a missing device stops the run before any test
        self._frozen = True

    def _file_has_dump_path(self) -> bool:
        """Whether the config file names its own dump_path (else the plugin's default applies)."""
        if self.cfg_file is None:
            return False
        try:
            raw = json.loads(Path(self.cfg_file).read_text(encoding="utf-8"))
        except (OSError, ValueError):
            return True  # load_config reports the file's problem itself
        return isinstance(raw, dict) and raw.get("dump_path") is not None

    def _check_config_task(self) -> None:
        """A config written for another task does not fit: say so before any test runs."""
        try:
            raw = json.loads(Path(self.cfg_file).read_text(encoding="utf-8"))
        except (OSError, ValueError):
            return  # load_config reports unreadable files with the key and the reason
        file_task = raw.get("task") if isinstance(raw, dict) else None
        if file_task is not None and file_task != self.task:
            raise pytest.UsageError(
                f"--msprobe-config {self.cfg_file} is a {file_task!r} config (its \"task\" key) but "
                f"--msprobe-task={self.task}; allowed: a config whose task is {self.task!r} or has no task key")

    @property
    def device(self) -> str:
        if self._device is None:
            from probes.backends.devices import DeviceUnavailable, resolve_device

            try:
                object.__setattr__(self, "_device", resolve_device(self.device_choice))
            except DeviceUnavailable as exc:
                raise pytest.UsageError(f"--msprobe-device={self.device_choice}: {exc}") from None
        return self._device

    def probe_config(self, task: str | None, dump_path: Path | str | None = None, overrides: dict | None = None,
                     root: Path | None = None) -> Any:
        """The effective config for `task`: the config file (if any), `overrides`, the dump path
        (default: `root`, the session's results folder, else the configured one)."""
        from probes.core.config import load_config
        from probes.core.errors import ConfigError

        raw_dump = dump_path
        if raw_dump is None and (self.dump_given or not self._file_has_dump_path()):
            raw_dump = self.root if root is None else root
        effective = self._with_rule(task, overrides)
        try:
            return load_config(self.cfg_file, task=task, overrides=effective or None,
                               dump_path=None if raw_dump is None else str(raw_dump))
        except ConfigError as exc:
            where = f"--msprobe-config {self.cfg_file}" if self.cfg_file else "--msprobe-task"
            if overrides:
                raise
            raise pytest.UsageError(f"{where}: {exc}") from None


    def _with_rule(self, task: str | None, overrides: dict | None) -> dict | None:
        """A tool that gates on its own rule under pytest (probes.core.tool_keys: free_benchmark's
        scaled rule) gets it unless told otherwise: by --msprobe-rule / msprobe_rule (wins), a
        test's own override, or the config file's "rule"; a key that keeps the config's rule
        (free_benchmark's if_preheat) keeps it."""
        keys = TOOL_KEYS.get(task) if task is not None else None
        if keys is None or keys.pytest_rule is None:
            return overrides
        given = dict(overrides or {})
        if self.rule_given is not None:
            return {**given, "rule": self.rule_given}
        if "rule" in given or f"{task}.rule" in given:
            return overrides
        section = self._file_section(task)
        if "rule" in section:
            return overrides
        if any(given.get(k, given.get(f"{task}.{k}", section.get(k))) is True for k in keys.rule_kept_by):
            return overrides
        return {**given, "rule": keys.pytest_rule}

    def _file_section(self, name: str) -> dict:
        if self.cfg_file is None:
            return {}
        try:
            raw = json.loads(Path(self.cfg_file).read_text(encoding="utf-8"))
        except (OSError, ValueError):
            return {}
        section = raw.get(name) if isinstance(raw, dict) else None
        return section if isinstance(section, dict) else {}


def test_dump_path(root: Path, nodeid: str) -> Path:
    """`{root}/tests/<nodeid made safe>`: one folder per test, so xdist workers never share a file
    (probes.results maps the folder back to the node id)."""
    from probes.results import folder_of_test

    return root / "tests" / folder_of_test(nodeid)
