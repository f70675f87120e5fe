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


def check_run(store: GoldenStore, name: str, run: Any) -> GoldenOutcome:
    """One tool run (a fixture's run object, a grad_probe dump path, or failing ops) against golden `name`."""
    from pytest_msprobe.tool_runs import FreeBenchmarkRun, GradProbeRun

    if isinstance(run, FreeBenchmarkRun):
        return store.check_free_benchmark(name, run.summary.get("apis", {}))
    if isinstance(run, GradProbeRun):
        return store.check_grad_run(name, run.dump_path)
    if isinstance(run, (str, Path)):
        return store.check_grad_run(name, run)
    failing = getattr(run, "failing_ops", run)
    if isinstance(failing, list):
        return store.check_online_dispatch(name, failing)
    raise TypeError(f"msprobe_golden.check() takes a free_benchmark/grad_probe/online_dispatch run, a grad_probe "
                    f"dump path or a list of failing ops; got {type(run).__name__}")


def check_marked_test(item: pytest.Item, mark: pytest.Mark, options: Any, suite: tuple | None,
                      fixture_runs: list[tuple[str, list[Any]]]) -> list[str]:
    """@pytest.mark.msprobe_golden(name): the whole-suite result and every fixture run of the test.
    Several results get `name/<tool><k>` (`name/suite` for the whole-suite one); a single one, `name`."""
    name = mark.args[0] if mark.args else default_name(item)
    targets: list[tuple[str, Any, Any]] = []  # (suffix, kind, payload)
    if suite is not None:
        task, outcome, dump = suite
        if task == "free_benchmark":
            targets.append(("suite", "apis", outcome["apis"]))
        elif task == "grad_probe":
            targets.append(("suite", "grad", dump))
        else:
            targets.append(("suite", "ops", outcome["failing_ops"]))
    for tool, runs in fixture_runs:
        for k, run in enumerate(runs):
            targets.append((f"{tool}{k}", "run", run))
    if not targets:
        return [f"@pytest.mark.msprobe_golden({name!r}): the test produced no probe result to compare; run it under "
                "--msprobe-task or use the free_benchmark / grad_probe / online_dispatch fixtures"]
    store = store_for(options)
    failures = []
    for suffix, kind, payload in targets:
        golden_name = name if len(targets) == 1 else f"{name}/{suffix}"
        if kind == "apis":
            outcome = store.check_free_benchmark(golden_name, payload)
        elif kind == "grad":
            outcome = store.check_grad_run(golden_name, payload)
        elif kind == "ops":
            outcome = store.check_online_dispatch(golden_name, payload)
        else:
            outcome = check_run(store, golden_name, payload)
        item.user_properties.append((f"msprobe_golden:{golden_name}", "regenerated" if outcome.regenerated
                                     else "ok" if outcome.ok else "regressed"))
        if suite is not None:
            similarities = report_similarities(golden_name, outcome)
            if similarities:
                suite[1].setdefault("similarities", {}).update(similarities)
        if not outcome.ok:
            failures.append(outcome.message)
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
