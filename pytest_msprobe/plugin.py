"""The pytest plugin: `pytest --msprobe-task=free_benchmark` runs every test under the probe.

Thin and lazy, like Hypothesis's plugin: options and validation at configure time import only the
framework-free core; a framework is touched only when a test that already imported it runs under
a probe. Which framework a test is probed in (`_framework_of`): the one its module uses (module
globals that are, or come from, `torch` / `mindspore`); a module using both, or neither while torch
is imported, is probed with PyTorch; a module using neither runs under MindSpore when only
MindSpore is imported, and unprobed when no framework is.
"""

from __future__ import annotations

import contextlib
import datetime
import inspect
import json
import os
import shutil
import sys
from pathlib import Path
from typing import Any

import pytest

from probes.backends.devices import DEVICES
from probes.core.config import TASKS
from probes.core.rules import FREE_BENCHMARK_RULES
from pytest_msprobe.options import FAIL_ON, OPTIONS_KEY, MsprobeOptions, test_dump_path

# fixtures that run a probe themselves: a test using one is not also run under the session's probe
TOOL_FIXTURES = ("free_benchmark", "grad_probe", "online_dispatch", "msprobe_api_case", "msprobe_distributed")
_SESSION_KEY = pytest.StashKey["MsprobeSession"]()
_RUNS_KEY = pytest.StashKey[list]()  # the tool fixtures' runs of a test, for its golden check
_SIMULATION_KEY = pytest.StashKey[contextlib.ExitStack]()  # --msprobe-simulated-npu, closed at unconfigure


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("msprobe", "precision probes (pytest-msprobe)")
    group.addoption("--msprobe-task", default=None, help=f"run every test under a probe: {', '.join(TASKS)}")
    group.addoption("--msprobe-config", default=None, help="msprobe config.json (same keys as msprobe 8.3.3)")
    group.addoption("--msprobe-dump-path", default=None, help="where results go (default: .msprobe/ under rootdir)")
    group.addoption("--msprobe-device", default=None,
                    help=f"{' | '.join(DEVICES)}: the device under test (auto: npu, else cuda, else cpu)")
    group.addoption("--msprobe-fail-on", default=None,
                    help=f"{' | '.join(FAIL_ON)}: fail tests that trip a rule (risk, default) or only report (never)")
    group.addoption("--msprobe-regen-golden", action="store_true", default=None,
                    help="(re)write the golden files tests compare against; those tests fail once")
    group.addoption("--msprobe-rule", default=None,
                    help=f"{' | '.join(FREE_BENCHMARK_RULES)}: free_benchmark's verdict (default scaled: each output judged at "
                         "its own scale; reference: msprobe's element-wise ratio rule)")
    group.addoption("--msprobe-simulated-npu", action="store_true", default=None,
                    help="run on a simulated NPU (pytest_msprobe.testing.simulated_npu): device 'npu' and "
                         "import torch_npu work on a CPU-only machine, to dry-run an NPU job")
    group.addoption("--msprobe-simulated-npu-defect", action="append", default=None, metavar="OP=DEFECT",
                    help="seed a defect into a simulated fused operator, e.g. npu_rms_norm=reduced_precision "
                         "(repeatable; implies --msprobe-simulated-npu)")
    for name in ("task", "config", "dump_path", "device", "fail_on", "rule"):
        parser.addini(f"msprobe_{name}", f"default for --msprobe-{name.replace('_', '-')}", default=None)
    parser.addini("msprobe_regen_golden", "default for --msprobe-regen-golden", type="bool", default=False)
    parser.addini("msprobe_simulated_npu", "default for --msprobe-simulated-npu", type="bool", default=False)


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "msprobe_off: run this test without the session's probe")
    config.addinivalue_line(
        "markers", "msprobe_api(api, dtypes=[...], pert_modes=[...], shapes=..., kwargs={...}, examples=30): "
        "generate one free_benchmark property test per dtype and perturbation mode, inputs from Hypothesis")
    config.addinivalue_line(
        "markers", "msprobe_golden(name): compare this test's probe results with golden/<name> "
        "(--msprobe-regen-golden writes it)")
    _start_simulated_npu(config)  # before the options: --msprobe-device resolves against it
    options = MsprobeOptions(config)
    config.stash[OPTIONS_KEY] = options
    if options.task is None:
        return
    probe_config = options.probe_config(options.task)
    if options.task == "free_benchmark" and probe_config.free_benchmark.if_preheat:
        raise pytest.UsageError(
            f"--msprobe-config {options.cfg_file}: free_benchmark.if_preheat=true does not fit --msprobe-task: "
            "each test is one probe run without training steps, and preheat needs a census step and "
            "preheat_step sampling steps; allowed: if_preheat false here (use preheat in a training script)")
    config.stash[_SESSION_KEY] = MsprobeSession(config, probe_config, options.fail_on)


class MsprobeSession:
    """What the plugin keeps for one pytest run."""

    def __init__(self, config: pytest.Config, probe_config: Any, fail_on: str) -> None:
        from pytest_msprobe.tasks import TASK_RUNNERS

        self.config = config
        self.probe_config = probe_config
        self.fail_on = fail_on
        self.task = TASK_RUNNERS[probe_config.task]()
        self.root = Path(probe_config.dump_path)
        self.results: list[tuple[str, dict[str, Any]]] = []  # (nodeid, per-test result)
        self.outcomes: dict[str, str] = {}  # nodeid -> passed/failed/skipped (for the report)
        self.unprobed: dict[str, int] = {}  # why a test ran without the session's probe -> tests
        self.report: Path | None = None
        self.report_error: str | None = None

    def test_dump_path(self, nodeid: str) -> Path:
        return test_dump_path(self.root, nodeid)

    def test_config(self, item: pytest.Item) -> Any:
        from dataclasses import replace

        return replace(self.probe_config, dump_path=str(self.test_dump_path(item.nodeid)))

    def table(self) -> dict[str, Any]:
        return self.task.table(self.results)

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
            from pytest_msprobe.tasks import add_failure

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


def _runs_own_probes(item: pytest.Item) -> bool:
    """A test using a probe fixture, or generated by @msprobe_api, is not also run under the session's probe."""
    callspec = getattr(item, "callspec", None)
    if callspec is not None and "msprobe_api_case" in callspec.params:
        return True
    return any(name in TOOL_FIXTURES for name in getattr(item, "fixturenames", ()))


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


def _unprobed_reason(item: pytest.Item, framework: str | None) -> str | None:
    """Why a test runs without the session's probe, or None when it runs under it."""
    if item.get_closest_marker("msprobe_off"):
        return "marked msprobe_off"
    if _runs_own_probes(item):
        return "ran their own probes (a probe fixture or @msprobe_api)"
    if framework is None:
        return "imported neither torch nor mindspore"
    return None


def _writes_own_folder(item: pytest.Item) -> bool:
    """A test that writes probe results into its folder even without --msprobe-task."""
    module = getattr(getattr(item, "module", None), "__name__", "")
    return (_runs_own_probes(item) or "msprobe_compiled" in getattr(item, "fixturenames", ())
            or module.startswith("pytest_msprobe.catalogue."))


def _ranks_launched() -> bool:
    """One pytest per rank (torchrun): the ranks share each test's folder."""
    try:
        return int(os.environ.get("WORLD_SIZE", "1")) > 1
    except ValueError:
        return False


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_setup(item: pytest.Item) -> None:
    """A test whose results this session records starts with an empty folder: files an earlier
    session left there (another task's, a search's examples) are not this session's findings.
    Folders of tests this session does not run stay, and probes.results marks them earlier."""
    options: MsprobeOptions | None = item.config.stash.get(OPTIONS_KEY, None)
    if options is None or (item.config.stash.get(_SESSION_KEY, None) is None and not _writes_own_folder(item)):
        return
    options.session_folders.append(item.nodeid)
    if not _ranks_launched():  # under torchrun another rank may already be writing there
        shutil.rmtree(test_dump_path(options.root, item.nodeid), ignore_errors=True)


@pytest.hookimpl(wrapper=True)
def pytest_runtest_call(item: pytest.Item) -> Any:
    session: MsprobeSession | None = item.config.stash.get(_SESSION_KEY, None)
    options: MsprobeOptions = item.config.stash[OPTIONS_KEY]
    catalogued = len(options.catalogue_results)
    try:
        return (yield from _run_call(item, session, options))
    finally:  # the catalogue's rows name their test, so a summary tells its searches' rows apart
        for row in options.catalogue_results[catalogued:]:
            row.setdefault("test", item.nodeid)


def _run_call(item: pytest.Item, session: MsprobeSession | None, options: MsprobeOptions) -> Any:
    golden = item.get_closest_marker("msprobe_golden")
    framework = _framework_of(item)
    unprobed = _unprobed_reason(item, framework) if session is not None else "no session probe"
    if session is not None and unprobed is not None:
        session.unprobed[unprobed] = session.unprobed.get(unprobed, 0) + 1
    whole_suite = unprobed is None
    if not whole_suite and golden is None:
        return (yield)
    outcome = None
    if whole_suite:
        config = session.test_config(item)
        run, start_error = session.start(framework, config)
    try:
        result = yield
    finally:
        if whole_suite:
            outcome = session.finish(item.nodeid, framework, config, run, start_error)
    failures = session.verdict(item, outcome, golden is not None) if whole_suite else []
    if golden is not None:
        from pytest_msprobe.golden.checks import check_marked_test

        suite = (session.task.name, outcome, session.test_dump_path(item.nodeid)) if whole_suite else None
        failures += check_marked_test(item, golden, options, suite, item.stash.get(_RUNS_KEY, []))
    if failures:
        pytest.fail("\n\n".join(failures), pytrace=False)
    return result


# per-API tests ---------------------------------------------------------------------------------
def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    if metafunc.definition.get_closest_marker("msprobe_api") is None:
        return
    from pytest_msprobe.api.marker import generate

    generate(metafunc)


@pytest.hookimpl(wrapper=True)
def pytest_pyfunc_call(pyfuncitem: pytest.Function) -> Any:
    callspec = getattr(pyfuncitem, "callspec", None)
    if callspec is not None and "msprobe_api_case" in callspec.params:
        from pytest_msprobe.api.marker import failure_text, run_case

        options: MsprobeOptions = pyfuncitem.config.stash[OPTIONS_KEY]
        case = callspec.params["msprobe_api_case"]
        entry = {"test": pyfuncitem.nodeid, "api": case.api, "dtype": case.dtype, "pert_mode": case.pert_mode,
                 "device": options.device, "flagged": None}
        failure = None
        try:
            run_case(case, options, pyfuncitem.nodeid, test_dump_path(options.root, pyfuncitem.nodeid))
        except AssertionError as exc:
            entry["flagged"] = str(exc).splitlines()[0]
            entry["inputs"] = getattr(exc, "inputs", None)
            options.api_results.append(entry)
            if options.fail_on == "risk":
                failure = failure_text(exc, pyfuncitem.nodeid)
            else:
                pyfuncitem.user_properties.append(("msprobe_flagged_api", entry["flagged"]))
        else:
            options.api_results.append(entry)
        if failure is not None:  # one screen, no chained traceback: the verdict, the inputs, how to rerun it
            pytest.fail(failure, pytrace=False)
    return (yield)


@pytest.fixture
def msprobe_api_case(request: pytest.FixtureRequest) -> Any:
    """The case (api, dtype, pert_mode, ...) of a test generated by @pytest.mark.msprobe_api."""
    return request.param


# fixtures -------------------------------------------------------------------------------------
@pytest.fixture
def msprobe_config(request: pytest.FixtureRequest) -> Any:
    """The effective probe config: the session's (with --msprobe-task), else --msprobe-config's
    (or the defaults) with the dump path of this run."""
    session: MsprobeSession | None = request.config.stash.get(_SESSION_KEY, None)
    if session is not None:
        return session.probe_config
    options: MsprobeOptions = request.config.stash[OPTIONS_KEY]
    return options.probe_config(options.task or (None if options.cfg_file else "free_benchmark"))


@pytest.fixture
def msprobe_device(request: pytest.FixtureRequest) -> str:
    """The device under test ("npu", "cuda" or "cpu"), from --msprobe-device (default auto)."""
    return request.config.stash[OPTIONS_KEY].device


def _tool_factory(request: pytest.FixtureRequest, tool: str) -> Any:
    from pytest_msprobe.tool_runs import RUNS

    options: MsprobeOptions = request.config.stash[OPTIONS_KEY]
    item = request.node
    made: list[Any] = []
    item.stash.setdefault(_RUNS_KEY, []).append((tool, made))

    def make(*, framework: str | None = None, **overrides: Any) -> Any:
        """A run of the tool around a `with` block; keyword arguments override config keys."""
        dump = test_dump_path(options.root, item.nodeid) / f"{tool}{len(made)}"
        fw = framework or _framework_of(item) or "pytorch"
        if fw not in ("pytorch", "mindspore"):
            raise ValueError(f"framework={fw!r}; allowed: pytorch, mindspore")
        label = f"{item.nodeid} [{tool}{len(made)}]"
        if tool == "online_dispatch":  # keyword arguments are PtdbgDispatch's
            run = RUNS[tool](fw, options.probe_config(tool, dump), label, overrides)
        else:
            run = RUNS[tool](fw, options.probe_config(tool, dump, overrides), label)
        made.append(run)
        return run

    def close_all() -> None:  # a run left open by the test must not leave hooks behind
        for run in made:
            run.close()

    request.addfinalizer(close_all)
    return make


@pytest.fixture
def msprobe_golden(request: pytest.FixtureRequest) -> Any:
    """`msprobe_golden.check(run_or_result, name=None)`: compare a tool run (or a grad_probe dump
    path, or a list of online_dispatch failing ops) with golden/<name>; fails the test when it
    regressed, is missing, or was just regenerated."""
    from pytest_msprobe.golden.checks import GoldenFixture

    return GoldenFixture(request.node, request.config.stash[OPTIONS_KEY])


@pytest.fixture
def free_benchmark(request: pytest.FixtureRequest) -> Any:
    """`with free_benchmark(pert_mode="bit_noise", list=["softmax"]) as fb: ...; fb.assert_clean()`"""
    return _tool_factory(request, "free_benchmark")


@pytest.fixture
def online_dispatch(request: pytest.FixtureRequest) -> Any:
    """`with online_dispatch(dump_mode="auto") as od: model(x)`; `od.assert_clean()`"""
    return _tool_factory(request, "online_dispatch")


@pytest.fixture
def grad_probe(request: pytest.FixtureRequest) -> Any:
    """`with grad_probe() as run: train(...)`; `run.assert_directions_close(other_run)`"""
    return _tool_factory(request, "grad_probe")


@pytest.fixture
def msprobe_compiled(request: pytest.FixtureRequest) -> Any:
    """`check = msprobe_compiled(fn, *inputs, backend="inductor", backward=False)`: fn compiled with
    torch.compile and run once, each captured graph judged against float64 (probes.compiled);
    `check.assert_clean()` fails naming the graph, the failing node and the reproduction."""
    from probes.compiled import check_compiled

    options: MsprobeOptions = request.config.stash[OPTIONS_KEY]
    folder = test_dump_path(options.root, request.node.nodeid)
    made: list[int] = []

    def check(fn: Any, *inputs: Any, **kwargs: Any) -> Any:
        made.append(len(made))
        return check_compiled(fn, *inputs, dump_path=folder / f"compiled{made[-1]}", **kwargs)

    return check


@pytest.fixture
def msprobe_distributed(request: pytest.FixtureRequest) -> Any:
    """`run = msprobe_distributed(fn, *args, world_size=2)`: fn(dump_path, *args) on every rank of a
    gloo process group (spawned ranks, local port, timeout); `run.merged`, `run.assert_clean()`"""
    from pytest_msprobe.distributed import DistributedRunner

    return DistributedRunner(test_dump_path(request.config.stash[OPTIONS_KEY].root, request.node.nodeid) / "distributed")


def _start_simulated_npu(config: pytest.Config) -> None:
    defects_given = config.getoption("--msprobe-simulated-npu-defect") or []
    if not (config.getoption("--msprobe-simulated-npu") or config.getini("msprobe_simulated_npu") or defects_given):
        return
    defects = {}
    for item in defects_given:
        op, sep, kind = item.partition("=")
        if not sep or not op or not kind:
            raise pytest.UsageError(f"--msprobe-simulated-npu-defect={item!r}; expected OP=DEFECT, "
                                    "e.g. npu_rms_norm=reduced_precision")
        defects[op.strip()] = kind.strip()
    from pytest_msprobe.testing.simulated_npu import SimulatedNPUError, simulated_npu

    stack = contextlib.ExitStack()
    try:
        stack.enter_context(simulated_npu(defects=defects))
    except (ValueError, SimulatedNPUError) as exc:
        raise pytest.UsageError(f"--msprobe-simulated-npu: {exc}") from None
    config.stash[_SIMULATION_KEY] = stack


def pytest_unconfigure(config: pytest.Config) -> None:
    stack = config.stash.get(_SIMULATION_KEY, None)
    if stack is not None:
        stack.close()


def pytest_sessionfinish(session: pytest.Session) -> None:
    options: MsprobeOptions | None = session.config.stash.get(OPTIONS_KEY, None)
    state: MsprobeSession | None = session.config.stash.get(_SESSION_KEY, None)
    workeroutput = getattr(session.config, "workeroutput", None)
    if workeroutput is not None:  # an xdist worker: the controller writes the session files
        if state is not None:
            workeroutput["msprobe"] = json.dumps({"results": state.results, "unprobed": state.unprobed})
        if options is not None and options.session_folders:
            workeroutput["msprobe_folders"] = json.dumps(options.session_folders)
        if options is not None and options.api_results:
            workeroutput["msprobe_api"] = json.dumps(options.api_results)
        if options is not None and options.catalogue_results:
            workeroutput["msprobe_catalogue"] = json.dumps(options.catalogue_results)
        return
    if options is not None and options.api_results:
        from probes.core.writers import write_json_atomic

        write_json_atomic(options.root / "api_checks.json", {"tests": options.api_results})
    if options is not None and options.catalogue_results:
        from pytest_msprobe.catalogue.run import finish_session

        options.catalogue_info = finish_session(options)
    if state is not None:
        _write_session_files(state)
    elif options is not None and (options.catalogue_results or options.api_results):
        _write_plugin_report(options)


@pytest.hookimpl(optionalhook=True)
def pytest_testnodedown(node: Any, error: Any) -> None:
    state: MsprobeSession | None = node.config.stash.get(_SESSION_KEY, None)
    output = getattr(node, "workeroutput", None) or {}
    if state is not None and "msprobe" in output:
        sent = json.loads(output["msprobe"])
        state.results.extend((nodeid, s) for nodeid, s in sent["results"])
        for reason, n in sent["unprobed"].items():
            state.unprobed[reason] = state.unprobed.get(reason, 0) + n
    options: MsprobeOptions | None = node.config.stash.get(OPTIONS_KEY, None)
    if options is not None and "msprobe_folders" in output:
        options.session_folders.extend(json.loads(output["msprobe_folders"]))
    if options is not None and "msprobe_api" in output:
        options.api_results.extend(json.loads(output["msprobe_api"]))
    if options is not None and "msprobe_catalogue" in output:
        options.catalogue_results.extend(json.loads(output["msprobe_catalogue"]))


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


def _write_session_files(state: MsprobeSession) -> None:
    """summary.json and report.html of a session under --msprobe-task, also when no test ran
    under the probe (so neither file is left over from an earlier session)."""
    from probes.core.writers import write_json_atomic
    from pytest_msprobe.reports.tables import ProbeAccount, write_table

    task = state.task
    tests = {nodeid: dict(task.entry(r), outcome=state.outcomes.get(nodeid, "unknown")) for nodeid, r in state.results}
    options: MsprobeOptions = state.config.stash[OPTIONS_KEY]
    summary = {
        "tool": task.name,
        "date": _now(),
        "versions": _versions(),
        "device": options.device,
        "config": state.probe_config.to_dict(),
        "tests": tests,
        task.table_key: write_table(state.table()),
        "probe": ProbeAccount.of(tests).to_dict(),
        "unprobed": dict(state.unprobed),
    }
    similarities = {k: v for _, r in state.results for k, v in r.get("similarities", {}).items()}
    if similarities:
        summary["similarities"] = similarities
    if options.api_results:
        summary["api_checks"] = options.api_results
    if options.catalogue_results:
        summary["catalogue"] = options.catalogue_results
    summary["session"] = session_outcomes(options.outcomes)
    summary["test_folders"] = sorted(set(options.session_folders))
    where = session_files_dir(state.root)
    write_json_atomic(where / "summary.json", summary)
    try:
        from pytest_msprobe.reports.html import render_html

        state.report = render_html(summary, where / "report.html")
    except Exception as exc:  # the report is a view of summary.json: never fail the session for it
        state.report_error = f"{type(exc).__name__}: {exc}"


def _now() -> str:
    return datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M:%S UTC")


def _write_plugin_report(options: MsprobeOptions) -> None:
    """summary.json and report.html of a session without --msprobe-task that ran the catalogue or
    per-API checks (so neither file is left over from an earlier session next to the other)."""
    from probes.core.writers import write_json_atomic

    session = {"tool": "catalogue", "date": _now(), "versions": _versions(), "device": options.device,
               "catalogue": options.catalogue_results, "api_checks": options.api_results,
               "session": session_outcomes(options.outcomes), "test_folders": sorted(set(options.session_folders))}
    where = session_files_dir(options.root)
    write_json_atomic(where / "summary.json", session)
    try:
        from pytest_msprobe.reports.html import render_html

        options.report = render_html(session, where / "report.html")
    except Exception as exc:  # a view of the session's results: never fail the session for it
        options.report_error = f"{type(exc).__name__}: {exc}"
    if options.catalogue_info is not None:  # the catalogue's summary lines name the report
        options.catalogue_info.update(report=options.report, report_error=options.report_error)


def _versions() -> dict[str, str]:
    """The versions a session's numbers depend on (frameworks only when this process imported them)."""
    from probes.core.versions import imported_frameworks, versions

    return versions("pytest-msprobe", "pytest", *imported_frameworks())


@pytest.hookimpl(tryfirst=True)
def pytest_report_teststatus(report: pytest.TestReport, config: pytest.Config) -> None:
    if not (report.when == "call" or report.outcome != "passed"):
        return
    state: MsprobeSession | None = config.stash.get(_SESSION_KEY, None)
    if state is not None:
        state.outcomes[report.nodeid] = report.outcome
    options: MsprobeOptions | None = config.stash.get(OPTIONS_KEY, None)
    if options is not None and options.outcomes.get(report.nodeid) != "failed":  # a failed teardown stays failed
        options.outcomes[report.nodeid] = report.outcome


def session_outcomes(outcomes: dict[str, str]) -> dict[str, int]:
    """How many tests the session ran, by outcome (the report's cards count these, so they agree
    with pytest's own line: model tests, per-API checks and catalogue tests alike)."""
    counts = {"tests": len(outcomes)}
    for outcome in outcomes.values():
        counts[outcome] = counts.get(outcome, 0) + 1
    return counts


def pytest_terminal_summary(terminalreporter: Any, exitstatus: int, config: pytest.Config) -> None:
    if getattr(config, "workeroutput", None) is not None:
        return
    options: MsprobeOptions | None = config.stash.get(OPTIONS_KEY, None)
    if options is not None and options.catalogue_info is not None:
        from pytest_msprobe.catalogue.summary import catalogue_lines

        terminalreporter.section("msprobe API precision catalogue")
        for line in catalogue_lines(options.catalogue_results, options.catalogue_info):
            terminalreporter.write_line(line)
    if options is not None and options.api_results:
        from pytest_msprobe.reports.text import api_check_lines

        terminalreporter.section("msprobe per-API checks")
        for line in api_check_lines(options.api_results):
            terminalreporter.write_line(line)
        terminalreporter.write_line(f"details: {os.fspath(options.root / 'api_checks.json')}")
        if options.catalogue_info is None and options.report is not None:
            terminalreporter.write_line(f"report: {os.fspath(options.report)}")
        elif options.catalogue_info is None and options.report_error:
            terminalreporter.write_line(f"report.html could not be written: {options.report_error}")
    state: MsprobeSession | None = config.stash.get(_SESSION_KEY, None)
    if state is None:
        return
    from pytest_msprobe.reports.tables import ProbeAccount
    from pytest_msprobe.reports.text import account_lines

    tr = terminalreporter
    tr.section(f"msprobe {state.task.name}: {state.task.table_title}")
    unprobed = ", ".join(f"{n} {reason}" for reason, n in sorted(state.unprobed.items(), key=lambda kv: -kv[1]))
    if not state.results:
        tr.write_line("no test ran under the probe" + (f": {unprobed}" if unprobed else "")
                      + " (a test runs under it when its module uses torch or mindspore, unless it is marked "
                        "msprobe_off or runs its own probes)")
    else:
        for line in state.task.table_lines(state.table(), state.results):
            tr.write_line(line)
        entries = {nodeid: state.task.entry(r) for nodeid, r in state.results}
        for line in account_lines(ProbeAccount.of(entries), state.task.checked_label):
            tr.write_line(line)
        if unprobed:
            tr.write_line(f"without the session's probe: {unprobed}")
    summary_path = session_files_dir(state.root) / "summary.json"
    tr.write_line(f"details: {os.fspath(summary_path)} and per-test files under {state.root / 'tests'}")
    if state.report is not None:
        tr.write_line(f"report: {os.fspath(state.report)}")
    elif state.report_error:
        tr.write_line(f"report.html could not be written: {state.report_error}")
