"""Golden checks as the plugin runs them: which results of a test are compared with which golden,
and the store made with this run's provenance (versions, device)."""

from __future__ import annotations

import functools
import re
from pathlib import Path
from typing import Any

import pytest

from probes.core.versions import imported_frameworks, versions
from pytest_msprobe.golden.store import GoldenOutcome, GoldenStore


def store_for(options: Any, device: str | None = None) -> GoldenStore:
    """The session's golden store, recording the versions and the hardware identity of `device`
    (the device under test by default)."""
    from probes.backends.hardware import software

    device = device or options.device
    # torch_npu's version is the NPU device's software (software() records it), not a CPU run's
    frameworks = [m for m in imported_frameworks() if m != "torch_npu"]
    provenance: dict[str, Any] = {"device": device, **versions(*frameworks, python=False)}
    provenance.update(software(device))
    return GoldenStore(golden_root(options), regen=options.regen_golden,
                       provenance=provenance, hardware=machine(device).to_dict())


def golden_root(options: Any) -> Path:
    """``golden/`` beside the rootdir: where the session's goldens live."""
    return Path(options.pytest_config.rootpath) / "golden"


@functools.cache
def machine(device: str) -> Any:
    """The hardware identity of `device` on this machine (probes.backends.hardware), asked once."""
    from probes.backends.hardware import hardware_identity

    return hardware_identity(device)


def default_name(item: pytest.Item) -> str:
    """`<module stem>/<test name>`, made safe for a golden name."""
    module = Path(str(getattr(item, "path", "tests"))).stem
    return re.sub(r"[^A-Za-z0-9._/-]+", "_", f"{module}/{item.name}").strip("_")


def run_result(run: Any) -> tuple[str, Any]:
    """(task, what its golden kind reads) of a fixture's run object, a grad_probe dump path, or
    failing ops (a list, or anything with a ``failing_ops`` list)."""
    from pytest_msprobe.tools import TOOLS
    from pytest_msprobe.tools.base import ToolRun

    if isinstance(run, ToolRun) and run.tool in TOOLS:  # what its golden kind reads: the tool's descriptor says
        return run.tool, TOOLS[run.tool].run_golden_input(run)
    if isinstance(run, (str, Path)):
        return "grad_probe", run
    failing = getattr(run, "failing_ops", run)
    if isinstance(failing, list):
        return "online_dispatch", failing
    raise TypeError(f"msprobe_golden.check() takes a free_benchmark/grad_probe/online_dispatch run, a grad_probe "
                    f"dump path or a list of failing ops; got {type(run).__name__}")


def check_run(store: GoldenStore, name: str, run: Any) -> GoldenOutcome:
    """One tool run (a fixture's run object, a grad_probe dump path, or failing ops) against golden `name`."""
    task, result = run_result(run)
    return store.check(task, name, result)


def check_marked_test(item: pytest.Item, mark: pytest.Mark, options: Any, suite: tuple | None,
                      fixture_runs: list[tuple[str, list[Any]]]) -> list[str]:
    """@pytest.mark.msprobe_golden(name): the whole-suite result and every fixture run of the test.
    Several results get `name/<tool><k>` (`name/suite` for the whole-suite one); a single one, `name`."""
    name = mark.args[0] if mark.args else default_name(item)
    targets: list[tuple[str, str, Any]] = []  # (suffix, task, result)
    if suite is not None:
        from pytest_msprobe.tools import TOOLS

        task, outcome, dump = suite
        targets.append(("suite", task, TOOLS[task].golden_input(outcome, dump)))
    for tool, runs in fixture_runs:
        for k, run in enumerate(runs):
            targets.append((f"{tool}{k}", *run_result(run)))
    if not targets:
        return [f"@pytest.mark.msprobe_golden({name!r}): the test produced no probe result to compare; run it under "
                "--msprobe-task or use the free_benchmark / grad_probe / online_dispatch fixtures"]
    store = store_for(options)
    failures = []
    for suffix, task, result in targets:
        golden_name = name if len(targets) == 1 else f"{name}/{suffix}"
        checked = store.check(task, golden_name, result)
        item.user_properties.append((f"msprobe_golden:{golden_name}", "regenerated" if checked.regenerated
                                     else "ok" if checked.ok else "regressed"))
        if suite is not None:
            similarities = report_similarities(golden_name, checked)
            if similarities:
                suite[1].setdefault("similarities", {}).update(similarities)
        if not checked.ok:
            failures.append(checked.message)
    return failures


def report_similarities(name: str, outcome: GoldenOutcome) -> dict[str, Any]:
    """The HTML report's gradient-similarity series of a grad golden check (per rank folder: the
    summary over parameters and the lowest parameter, per step)."""
    out = {}
    for unit, data in ((outcome.details.get("data") or {}).get("similarity") or {}).items():
        out[f"{name} {unit} vs golden"] = {"steps": data["steps"], "summary": data["summary"],
                                           "params": {"lowest parameter": data["lowest"]}}
    return out


class GoldenFixture:
    """The `msprobe_golden` fixture."""

    def __init__(self, item: pytest.Item, options: Any) -> None:
        self.item = item
        self.options = options
        self.store = store_for(options)

    def check(self, run: Any, name: str | None = None) -> GoldenOutcome:
        outcome = check_run(self.store, name or default_name(self.item), run)
        if not outcome.ok:
            pytest.fail(outcome.message, pytrace=False)
        return outcome
