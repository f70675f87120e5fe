"""The pytest plugin: `pytest --msprobe-task=free_benchmark` runs every test under the probe.

Thin and lazy, like Hypothesis's plugin: hooks and fixtures only. Options and validation at
configure time import only the framework-free core (pytest_msprobe.options); a framework is
touched only when a test that already imported it runs under a probe (which tests, in which
framework: pytest_msprobe.selection); what the run keeps, sends back from xdist workers and writes
at its end is the session's (pytest_msprobe.session).
"""

from __future__ import annotations

import contextlib
import shutil
from typing import Any

import pytest

from probes.backends.devices import DEVICES
from probes.core.config import TASKS
from probes.core.rules import FREE_BENCHMARK_RULES
from pytest_msprobe.options import FAIL_ON, OPTIONS_KEY, MsprobeOptions
from pytest_msprobe.selection import framework_of, ranks_launched, unprobed_reason, writes_own_folder
from pytest_msprobe.session import PAYLOAD_KEY, SESSION_KEY, PluginSession, ProbeSession, session_of

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
    probe = None
    if options.task is not None:
        probe_config = options.probe_config(options.task)
        from pytest_msprobe.tools import tool

        problem = tool(options.task).session_config_problem(probe_config)
        if problem:
            raise pytest.UsageError(f"--msprobe-config {options.cfg_file}: {problem}")
        probe = ProbeSession(probe_config, options.fail_on)
    config.stash[SESSION_KEY] = PluginSession(config, options, probe)


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_setup(item: pytest.Item) -> None:
    """A test whose results this session records starts with an empty folder: files an earlier
    session left there (another task's, a search's examples) are not this session's findings.
    Folders of tests this session does not run stay, and probes.results marks them earlier."""
    session: PluginSession | None = item.config.stash.get(SESSION_KEY, None)
    if session is None or (session.probe is None and not writes_own_folder(item)):
        return
    session.folders.append(item.nodeid)
    if not ranks_launched():  # under torchrun another rank may already be writing there
        shutil.rmtree(session.test_dump_path(item.nodeid), ignore_errors=True)


@pytest.hookimpl(wrapper=True)
def pytest_runtest_call(item: pytest.Item) -> Any:
    session = session_of(item.config)
    catalogued = len(session.catalogue_results)
    try:
        return (yield from _run_call(item, session))
    finally:  # the catalogue's rows name their test, so a summary tells its searches' rows apart
        for row in session.catalogue_results[catalogued:]:
            row.setdefault("test", item.nodeid)


def _run_call(item: pytest.Item, session: PluginSession) -> Any:
    golden = item.get_closest_marker("msprobe_golden")
    probe = session.probe
    framework = framework_of(item)
    unprobed = unprobed_reason(item, framework) if probe is not None else "no session probe"
    if probe is not None and unprobed is not None:
        probe.count_unprobed(unprobed)
    whole_suite = unprobed is None
    if not whole_suite and golden is None:
        return (yield)
    outcome = None
    if whole_suite:
        config = probe.test_config(item)
        run, start_error = probe.start(framework, config)
    try:
        result = yield
    finally:
        if whole_suite:
            outcome = probe.finish(item.nodeid, framework, config, run, start_error)
    failures = probe.verdict(item, outcome, golden is not None) if whole_suite else []
    if golden is not None:
        from pytest_msprobe.golden.checks import check_marked_test

        suite = (probe.task.name, outcome, probe.test_dump_path(item.nodeid)) if whole_suite else None
        failures += check_marked_test(item, golden, session.options, suite, item.stash.get(_RUNS_KEY, []))
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

        session = session_of(pyfuncitem.config)
        options = session.options
        case = callspec.params["msprobe_api_case"]
        entry = {"test": pyfuncitem.nodeid, "api": case.api, "dtype": case.dtype, "pert_mode": case.pert_mode,
                 "device": options.device, "flagged": None}
        failure = None
        try:
            run_case(case, options, pyfuncitem.nodeid, session.test_dump_path(pyfuncitem.nodeid))
        except AssertionError as exc:
            entry["flagged"] = str(exc).splitlines()[0]
            entry["inputs"] = getattr(exc, "inputs", None)
            session.api_results.append(entry)
            if options.fail_on == "risk":
                failure = failure_text(exc, pyfuncitem.nodeid)
            else:
                pyfuncitem.user_properties.append(("msprobe_flagged_api", entry["flagged"]))
        else:
            session.api_results.append(entry)
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
    session = session_of(request.config)
    if session.probe is not None:
        return session.probe.probe_config
    options = session.options
    return session.probe_config(options.task or (None if options.cfg_file else "free_benchmark"))


@pytest.fixture
def msprobe_device(request: pytest.FixtureRequest) -> str:
    """The device under test ("npu", "cuda" or "cpu"), from --msprobe-device (default auto)."""
    return request.config.stash[OPTIONS_KEY].device


def _tool_factory(request: pytest.FixtureRequest, tool: str) -> Any:
    from pytest_msprobe.tools import tool as descriptor

    session = session_of(request.config)
    item = request.node
    made: list[Any] = []
    item.stash.setdefault(_RUNS_KEY, []).append((tool, made))

    def make(*, framework: str | None = None, **overrides: Any) -> Any:
        """A run of the tool around a `with` block; keyword arguments override config keys."""
        dump = session.test_dump_path(item.nodeid) / f"{tool}{len(made)}"
        fw = framework or framework_of(item) or "pytorch"
        if fw not in ("pytorch", "mindspore"):
            raise ValueError(f"framework={fw!r}; allowed: pytorch, mindspore")
        label = f"{item.nodeid} [{tool}{len(made)}]"
        run = descriptor(tool).make_run(fw, session.probe_config, dump, label, overrides)
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

    folder = session_of(request.config).test_dump_path(request.node.nodeid)
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

    return DistributedRunner(session_of(request.config).test_dump_path(request.node.nodeid) / "distributed")


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
    state: PluginSession | None = session.config.stash.get(SESSION_KEY, None)
    if state is None:
        return
    workeroutput = getattr(session.config, "workeroutput", None)
    if workeroutput is not None:  # an xdist worker: the controller writes the session files
        workeroutput[PAYLOAD_KEY] = state.worker_payload()
        return
    state.finish()


@pytest.hookimpl(optionalhook=True)
def pytest_testnodedown(node: Any, error: Any) -> None:
    state: PluginSession | None = node.config.stash.get(SESSION_KEY, None)
    output = getattr(node, "workeroutput", None) or {}
    if state is not None and PAYLOAD_KEY in output:
        state.merge(output[PAYLOAD_KEY])


@pytest.hookimpl(tryfirst=True)
def pytest_report_teststatus(report: pytest.TestReport, config: pytest.Config) -> None:
    state: PluginSession | None = config.stash.get(SESSION_KEY, None)
    if state is not None:
        state.record_outcome(report)


def pytest_terminal_summary(terminalreporter: Any, exitstatus: int, config: pytest.Config) -> None:
    state: PluginSession | None = config.stash.get(SESSION_KEY, None)
    if state is not None and getattr(config, "workeroutput", None) is None:
        state.display(terminalreporter)
