"""`@pytest.mark.msprobe_api(...)`: one generated test per API x dtype x perturbation mode.

Each generated test draws inputs with Hypothesis (pytest_msprobe.api.inputs), calls the API under
free_benchmark with `list` set to that API only, and fails an example whose output moves past the
dtype's threshold; Hypothesis then shrinks it to a minimal input and prints how to reproduce it.
The probe is started once per test, not per example, so an elementwise API on small tensors runs
dozens of examples a second. The decorated function's body runs afterwards (extra assertions).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from probes.core.hints import did_you_mean
from pytest_msprobe.api.reproducible import without_local_constants

MARKER = "msprobe_api"
CASE_ARG = "msprobe_api_case"
DEFAULT_DTYPES = ("float32", "float16", "bfloat16")
DEFAULT_EXAMPLES = 30
_LOW = ("float16", "bfloat16")


@dataclass(frozen=True)
class ApiCase:
    """One generated test: what to check and how."""

    api: str
    dtype: str
    pert_mode: str
    shapes: Any = None
    kwargs: dict[str, Any] = field(default_factory=dict)
    examples: int = DEFAULT_EXAMPLES
    skip_reason: str | None = None
    online_dispatch: bool | None = None  # None: on when the device under test is an accelerator

    @property
    def id(self) -> str:
        return f"{self.api.rsplit('.', 1)[-1]}-{self.dtype}-{self.pert_mode}"


class ApiFlagged(AssertionError):
    """A flagged example of a per-API check, with its inputs described (shape, dtype, values), so
    the report and the failure show what the API got without a traceback through Hypothesis."""

    def __init__(self, message: str, inputs: list[dict[str, Any]]) -> None:
        super().__init__(message)
        self.inputs = inputs


#: values shown per input tensor (the smallest failing input after shrinking is usually tiny)
VALUES_SHOWN = 12


def describe_inputs(args: tuple, kwargs: dict[str, Any]) -> list[dict[str, Any]]:
    """One entry per argument: where it is, and its shape, dtype and first values for a tensor."""
    out = []
    for where, value in [*((f"args[{i}]", a) for i, a in enumerate(args)), *kwargs.items()]:
        if hasattr(value, "shape") and hasattr(value, "dtype"):
            flat = value.detach().reshape(-1)[:VALUES_SHOWN].to("cpu")
            values = ", ".join(f"{float(v):.6g}" for v in flat.float().tolist())
            more = f", \u2026 ({value.numel()} values)" if value.numel() > VALUES_SHOWN else ""
            out.append({"arg": where, "shape": list(value.shape), "dtype": str(value.dtype).replace("torch.", ""),
                        "values": f"[{values}{more}]"})
        else:
            out.append({"arg": where, "value": repr(value)[:200]})
    return out


def inputs_lines(inputs: list[dict[str, Any]]) -> list[str]:
    return [f"{i['arg']}: {i['dtype']} {tuple(i['shape'])} {i['values']}" if "shape" in i else f"{i['arg']}: {i['value']}"
            for i in inputs]


def failure_text(exc: BaseException, nodeid: str) -> str:
    """The one-screen failure of a flagged per-API check: the verdict, the minimal inputs, how
    Hypothesis replays it, and the command that reruns it."""
    import shlex

    lines = [str(exc).splitlines()[0]]
    inputs = getattr(exc, "inputs", None)
    if inputs:
        lines += ["minimal failing inputs:"] + ["  " + line for line in inputs_lines(inputs)]
    notes = [n for n in getattr(exc, "__notes__", []) if not n.startswith("Highest target score")]
    lines += [n for n in notes if n.strip()]
    lines.append(f"rerun: pytest {shlex.quote(nodeid)}")
    return "\n".join(lines)


def default_mode(dtype: str) -> str:
    """improve_precision where there is something to upcast; one-ulp noise for fp32/fp64."""
    return "improve_precision" if dtype in _LOW else "add_noise"


class MarkerError(ValueError):
    """A bad argument of the marker: raised while the tests are collected, shown as one line."""


def _dtype_of(api: str, entry: Any) -> str:
    """The canonical float dtype name of a `dtypes` entry (aliases such as "bf16" or "half" and
    torch dtypes accepted), so test ids and thresholds see one spelling."""
    from probes.core.errors import ConfigError
    from pytest_msprobe.api.exact_tensors import DTYPE_ALIASES, FLOAT_DTYPES, dtype_name

    try:
        name = dtype_name(entry)
    except ConfigError:
        name = None
    if name in FLOAT_DTYPES:
        return name
    floats = [a for a, d in DTYPE_ALIASES.items() if d in FLOAT_DTYPES]
    hint = did_you_mean(entry, (*FLOAT_DTYPES, *floats)) if isinstance(entry, str) else ""
    raise MarkerError(f"@pytest.mark.{MARKER}({api!r}): dtypes entry {entry!r}; allowed: {', '.join(FLOAT_DTYPES)} "
                      f"(or {', '.join(floats)}, in any case)" + (f"; {hint}" if hint else ""))


def cases_from_marker(mark: pytest.Mark) -> list[ApiCase]:
    """Validate the marker's arguments and expand them. A bad argument raises MarkerError naming
    it and what is allowed, before any test of the module runs."""
    from probes.core.config import PERT_MODES
    from probes.core.errors import ConfigError
    from pytest_msprobe.api.inputs import api_spec, known_apis, suggest_api

    if len(mark.args) != 1 or not isinstance(mark.args[0], str):
        raise MarkerError(f"@pytest.mark.{MARKER}: give exactly one API name, e.g. "
                          f"@pytest.mark.{MARKER}(\"torch.nn.functional.softmax\"); got {mark.args!r}")
    allowed = {"dtypes", "pert_modes", "shapes", "kwargs", "examples", "online_dispatch"}
    unknown = set(mark.kwargs) - allowed
    if unknown:
        hints = [h for h in (did_you_mean(u, sorted(allowed)) for u in sorted(unknown)) if h]
        raise MarkerError(f"@pytest.mark.{MARKER}: unknown argument(s) {sorted(unknown)}; "
                          f"allowed: {', '.join(sorted(allowed))}" + (f"; {' '.join(hints)}" if hints else ""))
    api = mark.args[0]
    try:
        api_spec(api)
    except ConfigError:
        close = suggest_api(api)
        raise MarkerError(f"@pytest.mark.{MARKER}({api!r}): not an API of the input table "
                          f"({len(known_apis())} names, see pytest_msprobe.api.inputs.known_apis())"
                          + (f"; {close}" if close else "")) from None
    given = mark.kwargs.get("dtypes", DEFAULT_DTYPES)
    if isinstance(given, str) or not hasattr(given, "__iter__"):
        raise MarkerError(f"@pytest.mark.{MARKER}({api!r}): dtypes={given!r}; allowed: a list of dtype names, "
                          f"e.g. dtypes=[\"float32\", \"bf16\"]")
    dtypes = tuple(dict.fromkeys(_dtype_of(api, d) for d in given))  # "bf16" and "bfloat16": one test
    modes = mark.kwargs.get("pert_modes")
    for m in modes or ():
        if m not in PERT_MODES:
            hint = did_you_mean(m, PERT_MODES) if isinstance(m, str) else ""
            raise MarkerError(f"@pytest.mark.{MARKER}({api!r}): pert_modes entry {m!r}; allowed: {', '.join(PERT_MODES)}"
                              + (f"; {hint}" if hint else ""))
    examples = mark.kwargs.get("examples", DEFAULT_EXAMPLES)
    if not isinstance(examples, int) or isinstance(examples, bool) or examples < 1:
        raise MarkerError(f"@pytest.mark.{MARKER}({api!r}): examples={examples!r}; allowed: a positive int")
    kwargs = dict(mark.kwargs.get("kwargs") or {})
    od = mark.kwargs.get("online_dispatch")
    if od is not None and not isinstance(od, bool):
        raise MarkerError(f"@pytest.mark.{MARKER}({api!r}): online_dispatch={od!r}; allowed: True, False "
                          "or leave it out (on when the device under test is an accelerator)")
    out = []
    for dtype in dtypes:
        for mode in modes or (default_mode(dtype),):
            skip = None
            if mode == "improve_precision" and dtype == "float64":
                skip = "improve_precision has nothing to upcast in float64; use add_noise/bit_noise for float64"
            out.append(ApiCase(api, dtype, mode, mark.kwargs.get("shapes"), kwargs, examples, skip, od))
    return out


def generate(metafunc: pytest.Metafunc) -> None:
    """pytest_generate_tests: parametrize a test carrying the marker over its cases.

    A bad marker argument fails the collection with one line naming the test, the argument and
    what is allowed: a traceback through pytest's hook machinery would bury it."""
    marks = list(metafunc.definition.iter_markers(MARKER))
    if not marks:
        return
    try:
        cases = [c for mark in marks for c in cases_from_marker(mark)]
        error = None
    except MarkerError as exc:
        error = f"{metafunc.definition.nodeid}: {exc}"
    if error is not None:  # raised outside the except: no "during handling" chain in the output
        pytest.fail(error, pytrace=False)
    if CASE_ARG not in metafunc.fixturenames:
        metafunc.fixturenames.append(CASE_ARG)
    metafunc.parametrize(CASE_ARG, cases, ids=[c.id for c in cases])


def run_case(case: ApiCase, options: Any, nodeid: str, dump_path: Any) -> None:
    """The property test of one case: raises AssertionError (after shrinking) on a flagged example."""
    import zlib

    from hypothesis import HealthCheck, Phase, given, settings, target
    from hypothesis import seed as hseed

    from probes.core.records import rule_figures
    from pytest_msprobe.api.inputs import api_inputs, api_spec, canonical_name, resolve_api

    if case.skip_reason:
        pytest.skip(case.skip_reason)
    spec = api_spec(case.api)
    if options.device == "cpu" and case.dtype in spec.no_cpu:
        pytest.skip(f"{case.api} has no CPU kernel for {case.dtype} in this torch")
    from probes.backends.patching import suspended
    from probes.pytorch import PrecisionDebugger

    key = canonical_name(case.api)
    overrides: dict[str, Any] = {"pert_mode": case.pert_mode, "list": [key]}
    if case.pert_mode == "to_cpu":
        overrides["fuzz_device"] = "cpu"
    config = options.probe_config("free_benchmark", dump_path, overrides)
    if case.pert_mode == "improve_precision" and case.dtype not in _LOW and config.free_benchmark.rule == "reference":
        pytest.skip(f"improve_precision under the reference rule has nothing to upcast in {case.dtype} (as msprobe); "
                    "the scaled rule (--msprobe-rule=scaled, the default) re-runs it in float64")
    strategy = api_inputs(case.api, case.dtype, shapes=case.shapes, kwargs=case.kwargs, device=options.device)
    debugger = PrecisionDebugger(config=config)
    dispatch = None
    if case.online_dispatch or (case.online_dispatch is None and options.device != "cpu"):
        from probes.pytorch.online_dispatch import PtdbgDispatch

        dispatch = PtdbgDispatch(dump_mode="auto", dump_path=str(Path(dump_path) / "online_dispatch"))
    original = resolve_api(case.api)  # before the probe starts: the API itself

    # seeded per case: a precision gate gives the same verdict on every run (an unseeded search
    # found a seeded defect in most runs, not all); no "explain" phase: it re-runs a failing example
    # hundreds of times (~10 s) to annotate lines
    @hseed(zlib.crc32(f"{case.api}|{case.dtype}|{case.pert_mode}".encode()))
    @settings(max_examples=case.examples, deadline=None, database=None, print_blob=True,
              phases=[Phase.explicit, Phase.reuse, Phase.generate, Phase.target, Phase.shrink],
              suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large,
                                     HealthCheck.function_scoped_fixture])
    @given(inputs=strategy)
    def check(inputs: tuple[tuple, dict]) -> None:
        args, kwargs = inputs
        before = len(debugger.rows)
        probe = debugger.probe
        if probe is not None:
            probe.last_score = 0.0
        resolve_api(case.api)(*args, **kwargs)  # looked up now: the probe's wrapper
        rows = debugger.rows[before:]  # settles the call's check (and sets last_score)
        if probe is not None:  # targeted search: Hypothesis climbs towards the API's worst inputs
            target(float(probe.last_score), label="error / threshold")
        if rows:
            row = rows[0]
            both = rule_figures(row.detail)
            raise ApiFlagged(
                f"{row.api_name} ({case.dtype}, {case.pert_mode}): max_rel {row.max_rel} > threshold "
                f"{row.threshold} at output {row.output_index or 0} (shape {row.shape})" + (f"; {both}" if both else ""),
                describe_inputs(args, kwargs))
        if dispatch is not None:  # the same inputs, every aten op against the CPU reference
            failed = len(dispatch.results.failed_ops) if dispatch.results is not None else 0
            with suspended(), dispatch:
                original(*args, **kwargs)
            new = dispatch.results.failed_ops[failed:]
            if new:
                leaf = new[0].leaves[0] if new[0].leaves else {}
                raise ApiFlagged(
                    f"online_dispatch: {new[0].name} ({new[0].op}, {case.dtype}) disagrees with the CPU reference: "
                    f"Cosine {leaf.get('cosine')}, MaxAbsErr {leaf.get('max_abs_err')} "
                    f"(evidence: {dispatch.results.csv_path})", describe_inputs(args, kwargs))

    debugger.start()
    try:
        with without_local_constants():  # the same search whatever else this process imported
            check()
    finally:
        debugger.stop()
        if dispatch is not None:
            dispatch.close()
        summary = debugger.summary()
    if summary["apis"].get(key, {}).get("checked", 0) == 0:
        reasons = [r for r, apis in summary["not_checked"].items() if key in apis] + [
            e["error"] for e in summary["errors"]]
        pytest.fail(f"{case.api} was never checked under {case.pert_mode} ({case.dtype}): "
                    f"{'; '.join(reasons) or 'the API was not called through its public name'}", pytrace=False)
